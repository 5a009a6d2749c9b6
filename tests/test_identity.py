"""Identity from content: an input whose bytes changed is a new run however its size and
modification time look; the same bytes reopened are the same run."""

from __future__ import annotations

import os

import dask
import numpy as np
import pytest
import zarr

from dr_dask.io.inputs import open_dataset
from dr_dask.io.storage import Location
from dr_dask.methods.ikd import IKD
from dr_dask.runs.group import run_embedding


def _data(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.tanh(rng.normal(size=(90, 2)) @ rng.normal(size=(2, 8)))


def _write(url: str, X: np.ndarray) -> None:
    """Uncompressed chunks: a rewrite with other values keeps every object's size."""
    g = zarr.open_group(store=Location(url).zarr_store(), mode="w")
    g.create_array("X", data=X, chunks=(30, 8), compressors=None)


def _sizes(url: str) -> dict:
    return {k: v["size"] for k, v in Location(url).find().items()}


def _embed(src: str, out: str):
    return run_embedding(IKD(n_components=2, random_state=0), src + ":X", out, method="ikd")


@pytest.mark.parametrize("where", ["memory", "local-mtime-kept"])
def test_rewritten_bytes_are_a_new_run(where, tmp_path):
    src = (f"memory://identity-{os.getpid()}/in.zarr" if where == "memory"
           else str(tmp_path / "in.zarr"))
    out = str(tmp_path / "out.zarr")
    _write(src, _data(0))
    first = _embed(src, out)
    again = _embed(src, out)  # the same bytes reopened: the same, complete run
    assert again.name == first.name and again.complete
    sizes = _sizes(src)
    stamps = {}
    if where != "memory":
        for dirpath, _, files in os.walk(src):
            for f in files:
                st = os.stat(os.path.join(dirpath, f))
                stamps[os.path.join(dirpath, f)] = (st.st_atime_ns, st.st_mtime_ns)
    _write(src, _data(1))  # other values, same shape, chunks, dtype and object sizes
    for path, (atime, mtime) in stamps.items():  # as `cp -p` / `rsync -t` leave them
        os.utime(path, ns=(atime, mtime))
    assert _sizes(src) == sizes
    if stamps:
        assert all(os.stat(p).st_mtime_ns == m for p, (_, m) in stamps.items())
    second = _embed(src, out)
    assert second.name != first.name and second.complete
    assert not np.allclose(second.read("embedding"), first.read("embedding"))
    if where == "memory":
        Location(src).delete()


def test_fingerprint_does_not_depend_on_the_fit_chunking(tmp_path):
    src = str(tmp_path / "in.zarr")
    _write(src, np.vstack([_data(0)] * 7))
    a = open_dataset(src + ":X").identify()["fingerprint"]
    with dask.config.set({"dr_dask.input.chunk-bytes": 2048}):
        inp = open_dataset(src + ":X")
        assert inp.data.numblocks[0] > 1
        assert inp.identify()["fingerprint"] == a


def test_in_memory_arrays_of_one_shape_are_told_apart():
    a, b = _data(0), _data(1)
    fa = open_dataset(a).identify()["fingerprint"]
    assert open_dataset(a.copy()).identify()["fingerprint"] == fa
    assert open_dataset(b).identify()["fingerprint"] != fa


def test_s3_fingerprint_comes_from_the_etags(s3_bucket, monkeypatch):
    """On S3 the listing's ETags are content tags: no byte is read to fingerprint, and a
    same-size rewrite changes the fingerprint."""
    import dr_dask.io.inputs as inputs

    def no_read(*args, **kwargs):
        raise AssertionError("the input was read to fingerprint it")

    monkeypatch.setattr(inputs, "_hash_pieces", no_read)
    url = f"s3://{s3_bucket}/in.zarr"
    _write(url, _data(0))
    first = open_dataset(url + ":X").identify()["fingerprint"]
    assert open_dataset(url + ":X").identify()["fingerprint"] == first
    sizes = _sizes(url)
    _write(url, _data(1))
    assert _sizes(url) == sizes
    assert open_dataset(url + ":X").identify()["fingerprint"] != first
