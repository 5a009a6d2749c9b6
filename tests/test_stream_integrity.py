"""A stream's committed rows carry their content: each checkpoint records the SHA-256 of every
committed row block of every output array, and every reader compares. A finished stream whose
embedding chunk was overwritten with random bytes of the same size, or truncated, is refused
by name (``read_output``; ``stream report`` and ``report`` exit 2, no traceback) and by a run
that would resume it; a clean stream still reads, and so does one whose publication was torn
by a crash (its buffered rows may already be remapped); a checkpoint written before
checksums is read unverified, with a warning; the same holds for the incremental job's
state."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from test_jobs import NIGHT1, SMALL, X, _copy_night1, _land, night1  # noqa: F401  (fixtures)
from test_result_integrity import _corrupt
from test_stream import (  # noqa: F401  (fixtures)
    N_S,
    _assert_same,
    _check_complete,
    model,
    reference,
    scenario,
    source_dir,
    tear_publication,
)

from dr_dask.cli import main
from dr_dask.runs.group import ResultCorrupted
from dr_dask.stream import StreamRunner, StreamStore, read_output
from dr_dask.stream.store import CHECKSUMS, OUTPUT_ARRAYS

CHUNK = "chunk embedding/c/0/0"


@pytest.fixture(scope="module")
def finished(model, source_dir, tmp_path_factory):  # noqa: F811  (pytest fixtures imported from test_stream and test_jobs)
    """A finished strict-sequential stream (with a refit, so remapped and buffered rows)."""
    out = tmp_path_factory.mktemp("finished") / "out"
    StreamRunner(str(out), source_dir, model, n_s=N_S, strict_sequential=True).run()
    return out


@pytest.fixture
def out(finished, tmp_path):
    copy = tmp_path / "out"
    shutil.copytree(finished, copy)
    return str(copy)


def _embedding_chunk(out: str) -> str:
    return os.path.join(out, "embedding", "c", "0", "0")


def test_a_clean_stream_records_and_passes_its_checksums(out, reference):  # noqa: F811  (pytest fixtures imported from test_stream and test_jobs)
    ck = StreamStore(out).read_checkpoint()
    sums = ck[CHECKSUMS]
    assert set(sums["arrays"]) == set(OUTPUT_ARRAYS)
    assert all(len(v) == 1 and len(v[0]) == 64 for v in sums["arrays"].values())
    assert len(sums["open_rows"]) == len(ck["pending"])
    o = read_output(out)
    _assert_same(o, reference)


@pytest.mark.parametrize("how", ["random", "truncated"])
def test_readers_refuse_a_corrupted_chunk_naming_it(out, source_dir, tmp_path, how):  # noqa: F811  (pytest fixtures imported from test_stream and test_jobs)
    chunk = _embedding_chunk(out)
    _corrupt(chunk, how)
    before = Path(chunk).read_bytes()
    ck_before = Path(out, "checkpoint.json").read_bytes()
    with pytest.raises(ResultCorrupted, match=CHUNK):
        read_output(out)
    page = str(tmp_path / "page.html")
    for args in (["stream", "report", out, "--out", str(tmp_path / "r.png")],
                 ["report", out, "--html", page]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2, (args, res.output)
        errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and CHUNK in errors[0], res.stderr
        assert "Traceback" not in res.output
    assert not os.path.exists(page) and not os.path.exists(tmp_path / "r.png")
    # a run that would resume it refuses before writing anything
    with pytest.raises(ResultCorrupted, match=CHUNK):
        StreamRunner(out, source_dir, n_s=N_S, strict_sequential=True,
                     handle_signals=False).run()
    assert Path(chunk).read_bytes() == before  # nobody repairs or deletes
    assert Path(out, "checkpoint.json").read_bytes() == ck_before


def test_changed_values_in_a_decodable_chunk_are_named(out):
    """Rows rewritten with other values through Zarr (a chunk that decodes): the block's
    checksum tells, naming the array and rows."""
    store = StreamStore(out)
    n = store.read_checkpoint()["n_rows"]
    store["variance"][5] = 123.0
    with pytest.raises(ResultCorrupted, match=rf"variance rows 0\.\.{n} \(chunk variance/c/0\)"):
        read_output(out)


def test_a_torn_publication_still_reads_and_resumes_identical(model, source_dir, reference,  # noqa: F811  (pytest fixtures imported from test_stream and test_jobs)
                                                              scenario, tmp_path,  # noqa: F811  (pytest fixtures imported from test_stream and test_jobs)
                                                              monkeypatch):
    """Killed after remapping the buffered rows, before the checkpoint: the rows the
    checkpoint left buffered differ from what it committed, which is no corruption."""
    out = str(tmp_path / "out")
    tear_publication(model, source_dir, out, monkeypatch)
    torn = read_output(out)  # no false alarm
    assert torn["checkpoint"]["version"] == 0 and torn["checkpoint"]["pending"]
    StreamRunner(out, source_dir, n_s=N_S, strict_sequential=True).run()
    o = read_output(out)
    _check_complete(o, len(scenario.stream))
    _assert_same(o, reference)


def test_a_checkpoint_without_checksums_reads_unverified_and_resuming_records_them(
        out, source_dir, scenario, caplog):  # noqa: F811  (pytest fixtures imported from test_stream and test_jobs)
    store = StreamStore(out)
    ck = store.read_checkpoint()
    del ck[CHECKSUMS]
    Path(out, "checkpoint.json").write_text(json.dumps(ck))
    with caplog.at_level(logging.WARNING, logger="dr_dask.stream.store"):
        read_output(out)
    assert "read unverified" in caplog.text
    # a new chunk: the resumed run commits it, with the checksums of every committed row
    src = Path(out).parent / "src"
    shutil.copytree(source_dir, src)
    np.save(src / "zzz.npy", scenario.stream[:20])
    StreamRunner(out, str(src), n_s=N_S, strict_sequential=True).run()
    after = StreamStore(out).read_checkpoint()
    assert after["n_rows"] == len(scenario.stream) + 20 and CHECKSUMS in after
    _corrupt(_embedding_chunk(out), "random")
    with pytest.raises(ResultCorrupted, match=CHUNK):
        read_output(out)


def test_the_incremental_jobs_next_run_refuses_a_corrupted_state(night1, X, tmp_path):  # noqa: F811  (pytest fixtures imported from test_stream and test_jobs)
    src, state, _ = _copy_night1(night1, tmp_path)
    _corrupt(_embedding_chunk(state), "random")

    def job():
        return CliRunner().invoke(main, ["--scheduler", "threads", "job", "incremental",
                                         f"{src}:X", "--state", state, "--n-batch",
                                         str(SMALL["n_batch"]), "--n-s", str(SMALL["n_s"]),
                                         "--chunk-size", str(SMALL["chunk_size"])])

    for _ in ("nothing new", "new rows"):
        res = job()
        assert res.exit_code == 2, res.output
        assert CHUNK in res.output and "Traceback" not in res.output, res.output
        _land(src, X[:NIGHT1 + 100])  # the second pass: rows to map, so the runner resumes
    assert StreamStore(state).read_checkpoint()["n_rows"] == NIGHT1


def test_many_blocks_torn_and_resumed_verify_block_by_block(model, source_dir, reference,  # noqa: F811  (pytest fixtures imported from test_stream and test_jobs)
                                                             scenario, tmp_path,  # noqa: F811  (pytest fixtures imported from test_stream and test_jobs)
                                                             monkeypatch):
    """Blocks of 50 rows: refits remap rows of blocks committed long before (read back once,
    rehashed), a torn publication is resumed, and a changed block is named by its rows."""
    monkeypatch.setattr("dr_dask.stream.store.ROW_CHUNK", 50)
    out = str(tmp_path / "out")
    tear_publication(model, source_dir, out, monkeypatch)
    read_output(out)
    StreamRunner(out, source_dir, n_s=N_S, strict_sequential=True).run()
    o = read_output(out)
    _assert_same(o, reference)
    sums = o["checkpoint"][CHECKSUMS]
    assert sums["block"] == 50 and len(sums["arrays"]["embedding"]) == -(-len(o["status"]) // 50)
    _corrupt(os.path.join(out, "embedding", "c", "3", "0"), "truncated")
    with pytest.raises(ResultCorrupted) as err:
        read_output(out)
    assert "embedding rows 150..200 (chunk embedding/c/3/0)" in str(err.value)
    assert "c/2/0" not in str(err.value) and "c/4/0" not in str(err.value)


def test_a_removed_output_array_is_named(out):
    shutil.rmtree(os.path.join(out, "status"))
    with pytest.raises(ResultCorrupted, match="array status is gone"):
        read_output(out)


@pytest.fixture(scope="module")
def buffered(model, source_dir, tmp_path_factory):  # noqa: F811  (pytest fixtures imported from test_stream and test_jobs)
    """A stream of the first three chunks: it ends with a row buffered and no refit."""
    root = tmp_path_factory.mktemp("buffered")
    (root / "src").mkdir()
    for name in sorted(os.listdir(source_dir))[:3]:
        shutil.copy(os.path.join(source_dir, name), root / "src")
    StreamRunner(str(root / "out"), str(root / "src"), model, n_s=N_S,
                 strict_sequential=True).run()
    return root


def test_a_changed_row_still_buffered_at_the_checkpoint_is_named(buffered, tmp_path):
    """The rows buffered at the checkpoint carry their content too: one changed through Zarr
    (a chunk that decodes), even to claim the next model version, is refused by name by the
    readers and a resuming run; only a stored next model makes it a publication in
    progress."""
    shutil.copytree(buffered, tmp_path / "b")
    out, src = str(tmp_path / "b" / "out"), str(tmp_path / "b" / "src")
    store = StreamStore(out)
    ck = store.read_checkpoint()
    open_rows = ck[CHECKSUMS]["open_rows"]
    assert open_rows and len(ck[CHECKSUMS]["open_digests"]) == len(open_rows)
    r = open_rows[len(open_rows) // 2]
    named = f"row {r}, buffered at the checkpoint (chunks embedding/c/0/0, variance/c/0"
    checkpoint = Path(out, "checkpoint.json").read_bytes()
    store["embedding"][r] = store["embedding"][r] + 1e-9
    with pytest.raises(ResultCorrupted, match=re.escape(named)):
        read_output(out)
    res = CliRunner().invoke(main, ["stream", "report", out, "--out", str(tmp_path / "r.png")])
    assert res.exit_code == 2 and named in res.stderr and "Traceback" not in res.output
    with pytest.raises(ResultCorrupted, match=re.escape(named)):
        StreamRunner(out, src, n_s=N_S, strict_sequential=True, handle_signals=False).run()
    store["version"][r] = ck["version"] + 1  # what a publication writes first, but none is
    with pytest.raises(ResultCorrupted, match=re.escape(named)):
        read_output(out)
    assert Path(out, "checkpoint.json").read_bytes() == checkpoint
