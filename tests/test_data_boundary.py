"""The data boundary: every chunk is read whole or the run stops by name.

For each reader (``embed``, ``job incremental``, ``stream run`` over a Zarr array, a directory
of ``.npy`` files and one ``.npy`` file): a stored chunk overwritten with random bytes of the
same size, truncated or missing is exit 2 naming the array and the chunk key; no output row of
a later source row is written, the watermark stays before it, the input's bytes are unchanged;
once the chunk is restored a rerun gives the clean run's output bit for bit. Metadata claiming
an absurd shape is refused fast and in little memory; a directory file still being written is
waited for; rows rewritten in place after a job mapped them are found.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from dr_dask.cli import main
from dr_dask.datasets.swiss_roll import shift_scenario
from dr_dask.io.inputs import InputError
from dr_dask.methods.gp_isomap import GPIsomap
from dr_dask.methods.gp_isomap_io import save_gp_isomap
from dr_dask.stream import STATUS, StreamRunner, read_output
from dr_dask.stream.sources import DirectorySource

T = ("--scheduler", "threads")
ROWS = 50  # rows per stored chunk
JOB = ("--n-batch", "200", "--n-s", "40", "--chunk-size", "50", "--no-report")
HOW = ["random", "truncated", "missing"]


@pytest.fixture(scope="module")
def X():
    sc = shift_scenario(100, random_state=3)
    return np.vstack([sc.batch, sc.stream])[:400]


@pytest.fixture(scope="module")
def model_path(X, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("model") / "model.zarr")
    save_gp_isomap(GPIsomap(n_neighbors=10, random_state=0).fit(X[:200]), path)
    return path


def _store(path: Path, rows: np.ndarray) -> str:
    """A Zarr group at ``path`` whose array X holds ``rows`` in chunks of ROWS rows (zstd, the
    default codec); returns ``path:X``."""
    g = zarr.open_group(str(path), mode="a")
    arr = g.create_array("X", shape=rows.shape, chunks=(ROWS, rows.shape[1]), dtype="f8",
                         dimension_names=("sample", "feature"))
    arr[:] = rows
    return f"{path}:X"


def _damage(chunk: Path, how: str) -> bytes:
    """Damage the stored chunk file; returns its original bytes (to restore it)."""
    good = chunk.read_bytes()
    if how == "random":
        chunk.write_bytes(np.random.default_rng(0).bytes(len(good)))
    elif how == "truncated":
        chunk.write_bytes(good[: len(good) // 2])
    else:
        chunk.unlink()
    return good


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, [*T, *args])
    return res.exit_code, res.output


def _same_output(a: str, b: str) -> None:
    """Bit for bit: every output array and the source offset."""
    oa, ob = read_output(a), read_output(b)
    for name in ("embedding", "variance", "first_variance", "manifold", "version", "status"):
        np.testing.assert_array_equal(oa[name], ob[name], err_msg=name)
    assert oa["checkpoint"]["source"] == ob["checkpoint"]["source"]


# ------------------------------------------------------------------------ damaged chunks
@pytest.mark.parametrize("how", HOW)
def test_embed_stops_naming_the_chunk_and_a_fixed_rerun_equals_a_clean_run(X, tmp_path, how):
    src = _store(tmp_path / "in.zarr", X[:200])
    clean = _store(tmp_path / "clean.zarr", X[:200])
    before = _digest(tmp_path / "in.zarr")
    chunk = tmp_path / "in.zarr" / "X" / "c" / "2" / "0"
    good = _damage(chunk, how)
    damaged = _digest(tmp_path / "in.zarr")
    embed = ("embed", "ikd", "-n", "2")
    code, out = _cli(*embed, "--input", src, "--out", str(tmp_path / "o.zarr"))
    assert code == 2, out
    assert "in.zarr:X: chunk c/2/0" in out and "Traceback" not in out
    assert not (tmp_path / "o.zarr").exists()  # nothing written for a rejected input
    assert _digest(tmp_path / "in.zarr") == damaged  # the input is never modified
    chunk.write_bytes(good)
    assert _digest(tmp_path / "in.zarr") == before
    assert _cli(*embed, "--input", src, "--out", str(tmp_path / "o.zarr"))[0] == 0
    assert _cli(*embed, "--input", clean, "--out", str(tmp_path / "c.zarr"))[0] == 0
    emb = [_embedding(tmp_path / o) for o in ("o.zarr", "c.zarr")]
    np.testing.assert_array_equal(*emb)


def _embedding(out: Path) -> np.ndarray:
    root = zarr.open_group(str(out), mode="r", use_consolidated=False)
    (name,) = list(root.group_keys())
    return np.asarray(root[name]["embedding"][:])


@pytest.fixture(scope="module")
def night1(X, tmp_path_factory):
    """A source of 250 rows and a job state after its first run (every row mapped)."""
    root = tmp_path_factory.mktemp("night1")
    src = _store(root / "land.zarr", X[:250])
    code, out = _cli("job", "incremental", src, "--state", str(root / "state"), *JOB)
    assert code == 0, out
    return root


def _copy(night1: Path, to: Path) -> tuple[str, str]:
    shutil.copytree(night1 / "land.zarr", to / "land.zarr")
    shutil.copytree(night1 / "state", to / "state")
    job = to / "state" / "job.json"
    job.write_text(json.dumps({**json.loads(job.read_text()),
                               "source": str(to / "land.zarr" / "X")}))
    return f"{to / 'land.zarr'}:X", str(to / "state")


def _append(src: str, rows: np.ndarray) -> None:
    arr = zarr.open_array(src.replace(":X", "/X"), mode="a")
    n = arr.shape[0]
    arr.resize((n + len(rows), arr.shape[1]))
    arr[n:] = rows


@pytest.mark.parametrize("how", HOW)
def test_job_incremental_stops_before_a_bad_chunk_and_resumes_equal_to_clean(
        X, night1, tmp_path, how):
    (tmp_path / "bad").mkdir()
    (tmp_path / "clean").mkdir()
    src, state = _copy(night1, tmp_path / "bad")
    clean_src, clean_state = _copy(night1, tmp_path / "clean")
    for s in (src, clean_src):
        _append(s, X[250:400])  # rows 250..399: chunks 5 (half consumed) to 7
    chunk = tmp_path / "bad" / "land.zarr" / "X" / "c" / "6" / "0"  # rows 300..349
    good = _damage(chunk, how)
    damaged = _digest(tmp_path / "bad" / "land.zarr")
    code, out = _cli("job", "incremental", src, "--state", state, *JOB)
    assert code == 2, out
    assert re.search(r"land\.zarr[:/]X: chunk c/6/0", out) and "Traceback" not in out
    ck = read_output(state)["checkpoint"]
    # the rows before the chunk are committed, none after it; the watermark stays before it
    # (a missing chunk is found in the listing when the source is opened: nothing is mapped)
    assert ck["source"] == ck["n_rows"] == (250 if how == "missing" else 300)
    history = json.loads((Path(state) / "drift_history.json").read_text())
    assert history[-1]["watermark_after"] == 250  # no entry claims rows it did not map
    assert _digest(tmp_path / "bad" / "land.zarr") == damaged
    chunk.write_bytes(good)
    code, out = _cli("job", "incremental", src, "--state", state, *JOB)
    assert code == 0 and json.loads(out)["watermark_after"] == 400, out
    assert _cli("job", "incremental", clean_src, "--state", clean_state, *JOB)[0] == 0
    _same_output(state, clean_state)
    assert not (read_output(state)["status"] == STATUS["quarantined"]).any()


@pytest.mark.parametrize("how", HOW)
def test_stream_over_a_zarr_array_stops_before_a_bad_chunk(X, model_path, tmp_path, how):
    _store(tmp_path / "in.zarr", X[200:400])
    _store(tmp_path / "clean.zarr", X[200:400])
    chunk = tmp_path / "in.zarr" / "X" / "c" / "2" / "0"  # rows 100..149
    good = _damage(chunk, how)
    damaged = _digest(tmp_path / "in.zarr")
    run = ("stream", "run", "--n-s", "40", "--chunk-size", "30")  # reads straddle chunks
    out = str(tmp_path / "out")
    code, text = _cli(*run, str(tmp_path / "in.zarr" / "X"), "--out", out, "--model",
                      model_path)
    assert code == 2, text
    assert "in.zarr/X: chunk c/2/0" in text and "Traceback" not in text
    ck = read_output(out)["checkpoint"]
    assert ck["source"] == ck["n_rows"] == 90  # rows 90..119 touch the chunk: not written
    assert _digest(tmp_path / "in.zarr") == damaged
    chunk.write_bytes(good)
    code, text = _cli(*run, str(tmp_path / "in.zarr" / "X"), "--out", out)
    assert code == 0 and json.loads(text)["n_rows"] == 200, text
    clean = str(tmp_path / "clean_out")
    assert _cli(*run, str(tmp_path / "clean.zarr" / "X"), "--out", clean, "--model",
                model_path)[0] == 0
    _same_output(out, clean)


def _npy_dir(path: Path, rows: np.ndarray, size: int = 40) -> Path:
    path.mkdir()
    for i in range(0, len(rows), size):
        np.save(path / f"{i // size:03d}.npy", rows[i : i + size])
    return path


@pytest.mark.parametrize("how", ["random", "trailing", "truncated"])
def test_stream_over_a_directory_stops_at_a_bad_file(X, model_path, tmp_path, how, dr_config):
    dr_config({"stream.settle": "0.2s"})
    src = _npy_dir(tmp_path / "chunks", X[200:400])
    clean = _npy_dir(tmp_path / "clean", X[200:400])
    bad = src / "002.npy"  # rows 80..119
    good = bad.read_bytes()
    if how == "trailing":
        bad.write_bytes(good + b"\0" * 16)
    else:
        _damage(bad, how)
    damaged = _digest(src)
    run = ("stream", "run", "--n-s", "40", "--poll", "0.05")
    out = str(tmp_path / "out")
    code, text = _cli(*run, str(src), "--out", out, "--model", model_path)
    assert code == 2, text
    assert "chunks/002.npy" in text and "Traceback" not in text
    assert {"random": "not a .npy file", "trailing": "corrupt",
            "truncated": "is truncated"}[how] in text
    ck = read_output(out)["checkpoint"]
    assert ck["n_rows"] == 80 and "002.npy" not in ck["source"]["done"]
    assert _digest(src) == damaged
    bad.write_bytes(good)
    assert _cli(*run, str(src), "--out", out)[0] == 0
    assert _cli(*run, str(clean), "--out", str(tmp_path / "c"), "--model", model_path)[0] == 0
    _same_output(out, str(tmp_path / "c"))


def test_a_single_npy_file_is_streamed_like_the_same_rows_in_zarr(X, model_path, tmp_path):
    np.save(tmp_path / "rows.npy", X[200:400])
    _store(tmp_path / "in.zarr", X[200:400])
    run = ("stream", "run", "--n-s", "40", "--chunk-size", "30", "--model", model_path)
    code, text = _cli(*run, str(tmp_path / "rows.npy"), "--out", str(tmp_path / "a"))
    assert code == 0 and json.loads(text)["n_rows"] == 200, text
    assert _cli(*run, str(tmp_path / "in.zarr" / "X"), "--out", str(tmp_path / "b"))[0] == 0
    _same_output(str(tmp_path / "a"), str(tmp_path / "b"))
    # cut short: refused by name before the stream writes anything
    good = (tmp_path / "rows.npy").read_bytes()
    (tmp_path / "cut.npy").write_bytes(good[:-100])
    code, text = _cli(*run, str(tmp_path / "cut.npy"), "--out", str(tmp_path / "c"))
    assert code == 2 and "cut.npy holds" in text and "truncated" in text, text
    assert not (tmp_path / "c").exists()


def test_quarantine_keeps_the_rows_it_could_not_map(X, model_path, tmp_path):
    """Output rows = source rows: a chunk that was read but cannot be mapped keeps its rows."""
    src = _npy_dir(tmp_path / "chunks", X[200:280])
    np.save(src / "000.npy", X[200:240, :2])  # wrong width
    np.save(src / "001.npy", X[240:250, 0])  # one value per row: 1-D
    out = str(tmp_path / "out")
    code, text = _cli("stream", "run", str(src), "--out", out, "--model", model_path)
    assert code == 0, text
    o = read_output(out)
    assert o["checkpoint"]["n_rows"] == 40 + 10 == len(o["status"])
    assert (o["status"] == STATUS["quarantined"]).all()
    assert [q["n_rows"] for q in o["quarantine"]] == [40, 10]


# ------------------------------------------------------------------------ iterator sources
def _producer(rows: np.ndarray, fails_at: int | None = None):
    """A callable giving a fresh generator of 20-row items (as a resumable iterator source
    must be), whose item ``fails_at`` raises."""
    def items():
        for i, lo in enumerate(range(0, len(rows), 20)):
            if i == fails_at:
                raise RuntimeError("sensor 7 offline")
            yield rows[lo : lo + 20]
    return items


def test_a_producer_that_raises_stops_the_stream_by_item_and_a_fixed_rerun_resumes_there(
        X, model_path, tmp_path):
    from dr_dask.methods.gp_isomap_io import load_gp_isomap

    model = load_gp_isomap(model_path)[0]
    out = str(tmp_path / "out")
    with pytest.raises(InputError, match=r"raised RuntimeError\('sensor 7 offline'\) "
                                         r"producing item 4; .* resume at item 4") as err:
        StreamRunner(out, _producer(X[200:400], fails_at=4), model, n_s=40).run()
    assert isinstance(err.value.__cause__, RuntimeError)  # the producer's own traceback
    ck = read_output(out)["checkpoint"]
    assert ck["source"] == 4 and ck["n_rows"] == 80 and ck["n_quarantined"] == 0
    StreamRunner(out, _producer(X[200:400]), n_s=40).run()
    StreamRunner(str(tmp_path / "ref"), _producer(X[200:400]), model, n_s=40).run()
    _same_output(out, str(tmp_path / "ref"))
    assert read_output(out)["checkpoint"]["n_rows"] == 200


def test_a_produced_item_that_is_not_numeric_keeps_its_rows_or_stops_by_name(
        X, model_path, tmp_path):
    from dr_dask.methods.gp_isomap_io import load_gp_isomap

    model = load_gp_isomap(model_path)[0]
    words = [["a", "b", "c"]] * 7  # 7 rows a sensor sent as text
    out = str(tmp_path / "out")
    StreamRunner(out, [X[200:220], words, X[220:240]], model, n_s=40).run()
    o = read_output(out)
    assert o["checkpoint"]["n_rows"] == 47 == len(o["status"])  # output rows = source rows
    assert (o["status"][20:27] == STATUS["quarantined"]).all()
    assert not (o["status"][[*range(20), *range(27, 47)]] == STATUS["quarantined"]).any()
    (record,) = o["quarantine"]
    assert record["n_rows"] == 7 and record["first_row"] == 20
    assert record["name"] == "chunk 1" and "not numeric" in record["reason"]
    # no length: its rows cannot be counted, so it is refused, not quarantined as 0 rows
    out = str(tmp_path / "out2")
    with pytest.raises(InputError, match=r"item 1 of the stream's iterator \(object\) is not "
                                         r"numeric .* has no length"):
        StreamRunner(out, [X[200:220], object(), X[220:240]], model, n_s=40).run()
    ck = read_output(out)["checkpoint"]
    assert ck["source"] == 1 and ck["n_rows"] == 20 and ck["n_quarantined"] == 0


# ------------------------------------------------------------- a file still being written
class _Writer(DirectorySource):
    """A directory source whose file ``name`` is completed (as its writer would) the first
    time the source finds it short of its header's size."""

    def __init__(self, path, name: str, rest: bytes):
        super().__init__(path)
        self.name, self.rest, self.waited = name, rest, []

    def _settling(self, name, size, expected):
        super()._settling(name, size, expected)
        self.waited.append((name, size))
        if name == self.name and len(self.waited) == 1:
            with open(os.path.join(self.path.path, name), "ab") as fh:
                fh.write(self.rest)


def test_a_file_being_written_is_waited_for_not_quarantined(X, model_path, tmp_path):
    from dr_dask.methods.gp_isomap_io import load_gp_isomap

    src = _npy_dir(tmp_path / "chunks", X[200:280])
    whole = (src / "001.npy").read_bytes()
    (src / "001.npy").write_bytes(whole[:300])  # the writer got this far
    source = _Writer(str(src), "001.npy", whole[300:])
    out = str(tmp_path / "out")
    model = load_gp_isomap(model_path)[0]
    StreamRunner(out, source, model, n_s=40, poll_interval=0.01).run()
    assert source.waited == [("001.npy", 300)]
    o = read_output(out)
    assert o["checkpoint"]["n_rows"] == 80 and not o["quarantine"]
    StreamRunner(str(tmp_path / "ref"), str(_npy_dir(tmp_path / "ref_src", X[200:280])),
                 model, n_s=40).run()
    _same_output(out, str(tmp_path / "ref"))


# ---------------------------------------------------------------------- hostile metadata
def _hostile(path: Path) -> None:
    """An array whose zarr.json claims 10^12 x 10^6 float64 in 1000 x 1000 chunks, with no
    chunk stored."""
    path.mkdir(parents=True)
    (path / "zarr.json").write_text(json.dumps({
        "zarr_format": 3, "node_type": "array", "shape": [10**12, 10**6],
        "data_type": "float64", "chunk_grid": {"name": "regular",
                                               "configuration": {"chunk_shape": [1000, 1000]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0.0, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "attributes": {}, "dimension_names": None}))


#: The CLI, which prints its peak RSS (its VmHWM line) to stderr as it exits.
_PEAK_RSS_CLI = """
import atexit, sys
from dr_dask.cli import main
atexit.register(lambda: sys.stderr.write(
    next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))))
sys.exit(main())
"""


@pytest.mark.parametrize("command", ["embed", "incremental", "stream"])
def test_hostile_metadata_is_refused_fast_in_little_memory(command, model_path, tmp_path):
    root = tmp_path / "in.zarr"
    zarr.open_group(str(root), mode="w")
    _hostile(root / "X")
    args = {
        "embed": ["embed", "ikd", "-n", "2", "--input", f"{root}:X", "--out", str(tmp_path / "o")],
        "incremental": ["job", "incremental", f"{root}:X", "--state", str(tmp_path / "s")],
        "stream": ["stream", "run", str(root / "X"), "--out", str(tmp_path / "o"), "--model",
                   model_path],
    }[command]
    # in this process (imports done): the refusal itself, timed, its allocations traced
    tracemalloc.start()
    started = time.perf_counter()
    code, text = _cli(*args)
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    assert code == 2 and "claims 1,000,000,000,000 rows" in text, text
    print(f"{command}: refused in {seconds:.2f} s, {peak:.1f} MiB allocated at the peak")
    assert seconds < 5 and peak < 50
    if command != "embed":
        return
    # a command of its own (embed was killed at 19 GB walking the grid): its whole peak RSS,
    # most of it the imports, read by the command itself as it exits (the rusage of a child
    # forked from this process counts this process's pages too)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _PEAK_RSS_CLI, *T, *args],
                          capture_output=True, text=True)
    seconds = time.perf_counter() - started
    assert proc.returncode == 2, proc.stderr
    assert "claims 1,000,000,000,000 rows" in proc.stderr, proc.stderr
    assert "dr_dask.input.max-rows" in proc.stderr, proc.stderr
    peak_mb = int(re.search(r"VmHWM:\s+(\d+) kB", proc.stderr).group(1)) / 1024
    print(f"{command}: exit 2 in {seconds:.1f} s, peak RSS {peak_mb:.0f} MB")
    assert peak_mb < 300
    assert not (tmp_path / "o").exists() and not (tmp_path / "s").exists()


def test_chunk_count_and_size_bounded_before_listing(tmp_path, dr_config):
    """A grid of more chunks than dr_dask.input.max-chunks, or chunks larger than
    max-chunk-bytes, is refused from the metadata; a missing chunk is found from the listing
    by count, naming its key."""
    from dr_dask.io.inputs import open_dataset

    src = _store(tmp_path / "in.zarr", np.ones((500, 3)))
    dr_config({"input.max-chunks": 9})
    with pytest.raises(InputError, match=r"claims 10 chunks .* dr_dask.input.max-chunks"):
        open_dataset(src)
    dr_config({"input.max-chunks": 10, "input.max-chunk-bytes": 1000})
    with pytest.raises(InputError, match=r"chunks of \(50, 3\) \(1,200 bytes each\)"):
        open_dataset(src)
    dr_config({"input.max-chunk-bytes": "1 MiB"})
    (tmp_path / "in.zarr" / "X" / "c" / "7" / "0").unlink()
    with pytest.raises(InputError, match=r"chunk c/7/0 is missing .*9 of 10 chunks stored"):
        open_dataset(src)


# ------------------------------------------------------------------ rows rewritten in place
def test_rows_rewritten_after_the_job_mapped_them_are_refused(X, night1, tmp_path):
    src, state = _copy(night1, tmp_path)
    arr = zarr.open_array(str(tmp_path / "land.zarr" / "X"), mode="r+")
    arr[120:150] = arr[120:150]  # the same values written again: not a rewrite
    _append(src, X[250:300])  # the half-consumed last chunk (rows 200..249 of 250) grows
    code, out = _cli("job", "incremental", src, "--state", state, *JOB)
    assert code == 0 and json.loads(out)["rows_mapped"] == 50, out
    checkpoint = (Path(state) / "checkpoint.json").read_bytes()
    arr[120:130] = X[120:130] + 1.0  # a correction of consumed rows
    code, out = _cli("job", "incremental", src, "--state", state, *JOB)
    assert code == 2, out
    assert "rows 100:150 (chunk c/2/0) were rewritten" in out and "--state" in out
    assert (Path(state) / "checkpoint.json").read_bytes() == checkpoint


# ----------------------------------------------------- arrays read beside the input
@pytest.mark.parametrize("how", HOW)
def test_evaluate_and_report_stop_at_a_bad_chunk_of_labels(X, tmp_path, how):
    src = _store(tmp_path / "in.zarr", X[:200])
    labels = zarr.open_group(str(tmp_path / "in.zarr"), mode="a").create_array(
        "y", shape=(200,), chunks=(ROWS,), dtype="i8")
    labels[:] = np.arange(200) % 3
    out = str(tmp_path / "runs.zarr")
    assert _cli("embed", "ikd", "-n", "2", "--input", src, "--out", out, "--name", "r")[0] == 0
    assert _cli("evaluate", "--store", out, "--embedding", "r", "--labels", "y")[0] == 0
    np.save(tmp_path / "y.npy", np.arange(200) % 3)
    _damage(tmp_path / "in.zarr" / "y" / "c" / "1", how)
    damaged = _digest(tmp_path / "in.zarr")
    code, text = _cli("evaluate", "--store", out, "--embedding", "r", "--labels", "y")
    assert code == 2 and "in.zarr:y: chunk c/1" in text and "Traceback" not in text, text
    code, text = _cli("report", f"{out}/r", "--html", str(tmp_path / "r.html"), "--color", "y")
    assert code == 2 and "in.zarr:y: chunk c/1" in text, text
    assert not (tmp_path / "r.html").exists()
    (tmp_path / "y.npy").write_bytes((tmp_path / "y.npy").read_bytes()[:-40])
    code, text = _cli("report", f"{out}/r", "--html", str(tmp_path / "r.html"), "--color",
                      str(tmp_path / "y.npy"))
    assert code == 2 and "y.npy holds" in text and "truncated" in text, text
    assert _digest(tmp_path / "in.zarr") == damaged
