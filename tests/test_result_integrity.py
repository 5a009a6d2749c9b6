"""Results carry their content: a complete run's completion mark records the checksum of every
chunk it vouches for, and every reader compares them. A finished run whose embedding chunk was
overwritten with random bytes of the same size, or truncated, is redone by a rerun (to the
same embedding as a clean run) and refused by name, exit 2, by ``report`` and ``evaluate``; a
clean run still says complete; a run completed before marks carried checksums is read,
unverified, with a warning."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dr_dask.cli import main
from dr_dask.runs.group import CHECKSUMS, RunGroup, open_run


@pytest.fixture(scope="module")
def npy(tmp_path_factory):
    path = tmp_path_factory.mktemp("integrity") / "x.npy"
    rng = np.random.default_rng(0)
    np.save(path, np.tanh(rng.normal(size=(60, 2)) @ rng.normal(size=(2, 6))))
    return str(path)


def _embed(npy: str, out: str, *extra: str):
    return CliRunner().invoke(main, ["--scheduler", "threads", "embed", "ikd", "-n", "2",
                                     "--input", npy, "--out", out, "--name", "r", *extra])


@pytest.fixture(scope="module")
def clean(npy, tmp_path_factory):
    """A clean run's embedding, the reference every redo must reproduce."""
    out = str(tmp_path_factory.mktemp("clean") / "o.zarr")
    res = _embed(npy, out)
    assert res.exit_code == 0, res.output
    return np.asarray(open_run(out, "r")["embedding"][...])


@pytest.fixture
def done(npy, tmp_path):
    out = str(tmp_path / "o.zarr")
    res = _embed(npy, out)
    assert res.exit_code == 0, res.output
    return out


def _chunks(out: str, array: str = "embedding") -> list[str]:
    root = os.path.join(out, "r", array)
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                  if f != "zarr.json")


def _corrupt(path: str, how: str) -> None:
    size = os.path.getsize(path)
    if how == "random":  # same size: only the content tells
        with open(path, "wb") as fh:
            fh.write(np.random.default_rng(7).bytes(size))
    else:
        with open(path, "r+b") as fh:
            fh.truncate(size // 2)


def test_the_mark_records_every_chunk_it_vouches_for(done):
    attrs = open_run(done, "r").attrs
    recorded = attrs[CHECKSUMS]
    assert sorted(recorded) == sorted(attrs["arrays"]) == ["component", "embedding", "sample"]
    for array, chunks in recorded.items():
        on_disk = [os.path.relpath(p, os.path.join(done, "r", array)) for p in _chunks(done, array)]
        assert sorted(chunks) == sorted(on_disk) and on_disk
        assert all(len(d) == 64 for d in chunks.values())


def test_a_clean_run_still_says_complete(npy, done, clean, caplog):
    with caplog.at_level(logging.INFO, logger="dr_dask.runs.group"):
        res = _embed(npy, done)
    assert res.exit_code == 0, res.output
    assert "is already complete" in caplog.text and "redoing" not in caplog.text
    np.testing.assert_array_equal(np.asarray(open_run(done, "r")["embedding"][...]), clean)


@pytest.mark.parametrize("how", ["random", "truncated"])
def test_a_rerun_redoes_a_corrupted_run(npy, done, clean, how, caplog):
    (chunk,) = _chunks(done)
    _corrupt(chunk, how)
    with caplog.at_level(logging.WARNING, logger="dr_dask.runs.group"):
        res = _embed(npy, done)
    assert res.exit_code == 0, res.output
    assert "chunk embedding/c/0/0 does not match its checksum" in caplog.text
    assert "redoing it" in caplog.text
    emb = np.asarray(open_run(done, "r")["embedding"][...])
    np.testing.assert_allclose(emb, clean, rtol=1e-10, atol=1e-12)
    # and the redone run is complete again, verified
    with caplog.at_level(logging.INFO, logger="dr_dask.runs.group"):
        caplog.clear()
        assert _embed(npy, done).exit_code == 0
    assert "is already complete" in caplog.text and "redoing" not in caplog.text


@pytest.mark.parametrize("how", ["random", "truncated"])
def test_report_and_evaluate_refuse_a_corrupted_run_naming_the_chunk(done, tmp_path, how):
    (chunk,) = _chunks(done)
    _corrupt(chunk, how)
    before = Path(chunk).read_bytes()
    page = str(tmp_path / "page.html")
    for args in (["report", f"{done}/r", "--html", page],
                 ["--scheduler", "threads", "evaluate", "--store", done, "--embedding", "r",
                  "--out", str(tmp_path / "ev")]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2, (args, res.output)
        errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "chunk embedding/c/0/0" in errors[0], res.stderr
        assert "Traceback" not in res.output
    assert not os.path.exists(page) and not os.path.exists(tmp_path / "ev")
    assert Path(chunk).read_bytes() == before  # a reader never repairs or deletes


def test_a_chunk_added_after_completion_is_named(done):
    """Another chunk key where the mark recorded none (an array resized and written since)."""
    stray = os.path.join(done, "r", "sample", "c", "7")
    with open(stray, "wb") as fh:
        fh.write(b"\0" * 8)
    res = CliRunner().invoke(main, ["report", f"{done}/r", "--html", f"{done}.html"])
    assert res.exit_code == 2 and "chunk sample/c/7 was not written by the run" in res.output


def test_a_run_completed_before_checksums_is_read_unverified(npy, done, clean, caplog):
    """The decision for old runs: complete, unverified, with a warning; never redone
    silently (its result may have taken hours) nor refused."""
    group = RunGroup(done, "r", params=open_run(done, "r").attrs["params"],
                     identity=open_run(done, "r").attrs["input"])
    del group.group.attrs[CHECKSUMS]
    group.consolidate()
    with caplog.at_level(logging.INFO, logger="dr_dask.runs.group"):
        res = _embed(npy, done)
    assert res.exit_code == 0, res.output
    assert "completed before runs recorded checksums" in caplog.text
    assert "is already complete" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dr_dask.runs.group"):
        res = CliRunner().invoke(main, ["report", f"{done}/r", "--html", f"{done}.html"])
    assert res.exit_code == 0, res.output
    assert "read unverified" in caplog.text
    assert json.loads(res.stdout.splitlines()[-1])["rows"] == len(clean)
