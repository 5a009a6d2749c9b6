"""``dr_dask.runtime.blas.single_blas_thread``: one BLAS thread while any caller is inside, restored
after the last, whichever threads enter and leave first."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from dr_dask.runtime.blas import blas_threads, single_blas_thread


@pytest.fixture
def multithreaded_blas():
    before = blas_threads()
    if max(before, default=1) < 2:
        pytest.skip("BLAS runs one thread here: nothing to limit")
    return before


def test_limit_holds_until_the_last_overlapping_caller_leaves(multithreaded_blas):
    """Thread A enters first and leaves first; B, inside meanwhile, must keep one BLAS thread,
    and B (not the thread that set the limit) must restore it on leaving."""
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, list[int]] = {}

    def a():
        with single_blas_thread():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def b():
        a_in.wait(10)
        with single_blas_thread():
            b_in.set()
            a_out.wait(10)
            np.ones((50, 50)) @ np.ones((50, 50))  # still works while limited
            seen["b_after_a_left"] = blas_threads()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen["b_after_a_left"] == [1] * len(multithreaded_blas)
    assert blas_threads() == multithreaded_blas


def test_decorator_and_nesting_restore_on_error(multithreaded_blas):
    @single_blas_thread()
    def task():
        with single_blas_thread():
            assert blas_threads() == [1] * len(multithreaded_blas)
        assert blas_threads() == [1] * len(multithreaded_blas)  # the outer scope still holds
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        task()
    assert blas_threads() == multithreaded_blas
