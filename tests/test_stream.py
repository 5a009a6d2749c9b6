"""The GP-Isomap stream runner: exactly-once output across crashes, quarantine, SIGTERM,
Zarr and directory sources, and the same result on a multi-process cluster as on threads."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
import zarr
from _faults import Fault, Rows, Task, Written, cli

from dr_dask.datasets.swiss_roll import shift_scenario, write_scenario
from dr_dask.io.inputs import InputError
from dr_dask.methods.gp_isomap import GPIsomap
from dr_dask.methods.gp_isomap_io import save_gp_isomap
from dr_dask.stream import STATUS, StreamRunner, StreamStore, read_output

FINAL = {STATUS["confident"], STATUS["buffered"], STATUS["remapped"]}
N_S = 60


@pytest.fixture(scope="module")
def scenario():
    return shift_scenario(120, random_state=3)


@pytest.fixture(scope="module")
def model(scenario):
    return GPIsomap(n_neighbors=10, random_state=0).fit(scenario.batch)


@pytest.fixture(scope="module")
def source_dir(scenario, tmp_path_factory):
    path = tmp_path_factory.mktemp("scenario")
    write_scenario(scenario, str(path), kind="npy-dir", chunk_size=20)
    return str(path / "stream")


@pytest.fixture(scope="module")
def reference(model, source_dir, tmp_path_factory):
    """Uninterrupted strict-sequential run on threads."""
    out = str(tmp_path_factory.mktemp("ref") / "out")
    StreamRunner(out, source_dir, model, n_s=N_S, strict_sequential=True).run()
    return read_output(out)


def _check_complete(o, n_total):
    assert o["checkpoint"]["n_rows"] == n_total == len(o["status"])
    assert set(np.unique(o["status"])) <= FINAL
    # buffered rows are exactly the pending buffer entries, each once
    assert np.sum(o["status"] == STATUS["buffered"]) == len(o["checkpoint"]["pending"])


def _assert_same(a, b):
    np.testing.assert_array_equal(a["status"], b["status"])
    np.testing.assert_array_equal(a["version"], b["version"])
    np.testing.assert_array_equal(a["manifold"], b["manifold"])
    np.testing.assert_allclose(a["variance"], b["variance"], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(a["embedding"], b["embedding"], rtol=1e-5, atol=1e-7)


def test_reference_run_is_complete_and_refits(reference, scenario):
    _check_complete(reference, len(scenario.stream))
    assert len(reference["checkpoint"]["refits"]) >= 1
    assert np.any(reference["status"] == STATUS["remapped"])


def _rows_committed(out):
    try:
        return StreamStore(out).read_checkpoint()["n_rows"]
    except (FileNotFoundError, ValueError):
        return -1


def _run_args(model_path, source_dir, out, *extra):
    return ("--scheduler", "threads", "stream", "run", source_dir, "--out", out, "--model",
            model_path, "--n-s", str(N_S), "--strict", *extra)


@pytest.fixture(scope="module")
def model_path(model, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("model") / "model.zarr")
    save_gp_isomap(model, path)
    return path


def test_sigkill_and_resume_gives_every_row_once(model_path, source_dir, reference, scenario,
                                                  tmp_path):
    out = str(tmp_path / "out")
    n = len(scenario.stream)
    # killed by its own commit of row 200: mid-stream, before the refit (unseen rows from 360)
    fault = Fault(tmp_path / "fault", Rows(200))
    proc = fault.cli(*_run_args(model_path, source_dir, out))
    assert proc.wait(timeout=300) == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert fault.fired is not None and _rows_committed(out) == 200 < n
    # restart (in-process: the store alone carries the state, the model comes from it)
    StreamRunner(out, source_dir, n_s=N_S, strict_sequential=True).run()
    o = read_output(out)
    _check_complete(o, n)
    _assert_same(o, reference)


def test_sigterm_checkpoints_and_exits_zero(model_path, source_dir, reference, scenario, tmp_path):
    out = str(tmp_path / "out")
    # SIGTERM from its own commit of row 100, while it follows the source
    fault = Fault(tmp_path / "fault", Rows(100), signum=signal.SIGTERM)
    proc = fault.cli(*_run_args(model_path, source_dir, out, "--follow", "--poll", "0.1"))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert fault.fired is not None
    st = StreamStore(out).read_checkpoint()
    assert 100 <= st["n_rows"] <= len(scenario.stream)
    # the checkpoint is consistent: a restart completes the stream with every row once
    StreamRunner(out, source_dir, n_s=N_S, strict_sequential=True).run()
    o = read_output(out)
    _check_complete(o, len(scenario.stream))
    _assert_same(o, reference)


def tear_publication(model, source_dir, out, monkeypatch) -> int:
    """Run a stream into ``out`` that crashes after its first publication remapped the
    buffered rows, before that publication's checkpoint; returns the checkpoints written."""
    calls = {"n": 0}
    original = StreamStore.write_checkpoint

    def crash_after_remap(self, state):
        if state["version"] >= 1:
            raise KeyboardInterrupt("simulated crash")
        calls["n"] += 1
        original(self, state)

    monkeypatch.setattr(StreamStore, "write_checkpoint", crash_after_remap)
    with pytest.raises(KeyboardInterrupt):
        StreamRunner(out, source_dir, model, n_s=N_S, strict_sequential=True,
                     handle_signals=False).run()
    monkeypatch.setattr(StreamStore, "write_checkpoint", original)
    return calls["n"]


def test_crash_during_publication_is_repaired(model, source_dir, reference, scenario, tmp_path,
                                              monkeypatch):
    """A crash after the re-mapped rows were written but before the checkpoint: restart
    restores the buffered rows, redoes the refit and ends identical to the reference."""
    out = str(tmp_path / "out")
    assert tear_publication(model, source_dir, out, monkeypatch) > 0
    torn = StreamStore(out)
    assert torn.read_checkpoint()["version"] == 0
    StreamRunner(out, source_dir, n_s=N_S, strict_sequential=True).run()
    o = read_output(out)
    _check_complete(o, len(scenario.stream))
    _assert_same(o, reference)


def test_quarantine_bad_chunks_stream_continues(model, scenario, tmp_path):
    src = tmp_path / "chunks"
    src.mkdir()
    S = scenario.stream
    np.save(src / "000.npy", S[:30])
    np.save(src / "001.npy", S[30:40, :2])  # wrong width
    bad = S[40:50].copy()
    bad[3, 1] = np.nan
    np.save(src / "002.npy", bad)  # NaN
    (src / "003.npy").write_bytes(b"this is not an npy file")  # unreadable
    np.save(src / "004.npy", S[50:80])
    out = str(tmp_path / "out")
    # a file that is not a .npy stops the stream by name, after the files before it
    with pytest.raises(InputError, match=r"003\.npy is not a \.npy file"):
        StreamRunner(out, str(src), model, n_s=1000).run()
    assert read_output(out)["checkpoint"]["n_rows"] == 30 + 10 + 10
    (src / "003.npy").unlink()
    summary = StreamRunner(out, str(src), n_s=1000).run()
    assert summary["n_quarantined"] == 2
    o = read_output(out)
    assert o["checkpoint"]["n_rows"] == 30 + 10 + 10 + 30
    reasons = [q["reason"] for q in o["quarantine"]]
    assert "wrong width" in reasons[0] and "NaN" in reasons[1] and "rows [3]" in reasons[1]
    assert [q["name"] for q in o["quarantine"]] == ["001.npy", "002.npy"]
    q = o["status"] == STATUS["quarantined"]
    np.testing.assert_array_equal(np.flatnonzero(q), np.arange(30, 50))
    assert set(np.unique(o["status"][~q])) <= FINAL
    emb, _, _ = model.map_points(np.vstack([S[:30], S[50:80]]))
    np.testing.assert_allclose(o["embedding"][~q], emb, rtol=1e-6, atol=1e-9)


def test_zarr_source_picks_up_appended_rows(model, scenario, tmp_path):
    path = str(tmp_path / "in.zarr")
    S = scenario.stream[:200]
    arr = zarr.create_array(path, shape=(120, S.shape[1]), chunks=(50, S.shape[1]), dtype="f8")
    arr[:] = S[:120]
    out = str(tmp_path / "out")
    StreamRunner(out, path, model, n_s=1000, chunk_size=50).run()
    assert read_output(out)["checkpoint"]["n_rows"] == 120
    arr.resize((200, S.shape[1]))
    arr[120:] = S[120:]
    StreamRunner(out, path, n_s=1000, chunk_size=50).run()  # resumes at row 120
    o = read_output(out)
    _check_complete(o, 200)
    emb, var, _ = model.map_points(S)
    np.testing.assert_allclose(o["embedding"], emb, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(o["variance"], var, rtol=1e-6, atol=1e-12)


def test_parallel_mode_every_row_once_with_refit(model, scenario, tmp_path):
    chunks = [scenario.stream[i : i + 20] for i in range(0, len(scenario.stream), 20)]
    out = str(tmp_path / "out")
    summary = StreamRunner(out, chunks, model, n_s=N_S, max_in_flight=3).run()
    o = read_output(out)
    _check_complete(o, len(scenario.stream))
    assert summary["n_refits"] >= 1
    remapped = o["status"] == STATUS["remapped"]
    assert remapped.sum() >= N_S and np.all(o["version"][remapped] >= 1)
    # the report: variance with the threshold in force, refits, manifold assignment
    from click.testing import CliRunner
    from matplotlib.image import imread

    from dr_dask.cli import main

    res = CliRunner().invoke(main, ["stream", "report", out, "--out", str(tmp_path / "r.png")])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["refits"] == summary["n_refits"] and rep["rows"] == len(scenario.stream)
    # the refitted model gave the unseen patch a manifold of its own
    assert len(rep["manifold_rows"]) == 4
    # the numbers the picture marks: thresholds in force in turn, refit rows, status counts
    ck = o["checkpoint"]
    assert rep["thresholds"] == pytest.approx(ck["sigma_t"])
    assert rep["refit_rows"] == [[r["trigger_row"], r["publish_row"]] for r in ck["refits"]]
    assert rep["status"]["remapped"] == remapped.sum()
    img = imread(str(tmp_path / "r.png"))  # a wide variance panel and the embedding, readable
    assert img.ndim == 3 and img.shape[0] >= 480 and img.shape[1] > 1000 + 640


@pytest.mark.cluster
def test_cluster_run_matches_threaded_run(cluster_client, model, scenario, reference, tmp_path):
    chunks = [scenario.stream[i : i + 20] for i in range(0, len(scenario.stream), 20)]
    out = str(tmp_path / "out")
    StreamRunner(out, chunks, model, n_s=N_S, strict_sequential=True,
                 client=cluster_client).run()
    o = read_output(out)
    _check_complete(o, len(scenario.stream))
    _assert_same(o, reference)


# ---------------------------------------------------------------- drift detection: runner
@pytest.mark.cluster
def test_cli_run_on_local_cluster_refits(scenario, tmp_path):
    """`stream run --batch` on a multi-process LocalCluster: the refit runs as a task (no
    live client in its parameters) and the run completes with every row once."""
    sc_dir = tmp_path / "sc"
    write_scenario(scenario, str(sc_dir), kind="npy-dir", chunk_size=40)
    out = str(tmp_path / "out")
    proc = cli("--workers", "2", "stream", "run", str(sc_dir / "stream"), "--out", out,
                "--batch", str(sc_dir / "batch.npy"), "--n-s", str(N_S))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-3000:]
    o = read_output(out)
    _check_complete(o, len(scenario.stream))
    assert len(o["checkpoint"]["refits"]) >= 1
    assert o["checkpoint"]["version"] >= 1
    assert np.any(o["status"] == STATUS["remapped"])


def test_kill_during_final_refit_restart_finishes_it(model, model_path, source_dir, scenario,
                                                     tmp_path):
    """Parallel mode, n_s = every point the model flags: the buffer fills with the last
    chunk, so the only refit is the final one. Killed by its own first write of the new model
    (refit done, not yet published); the restart refits."""
    n = len(scenario.stream)
    n_s = int(model.is_novel(scenario.stream).sum())
    out = str(tmp_path / "out")
    fault = Fault(tmp_path / "fault", Written(r"(^|/)models/v1/"))
    proc = fault.cli("--scheduler", "threads", "stream", "run", source_dir, "--out", out,
                     "--model", model_path, "--n-s", str(n_s))
    assert proc.wait(timeout=300) == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert fault.fired is not None
    st = StreamStore(out).read_checkpoint()
    assert st["n_rows"] == n and st["version"] == 0 and len(st["pending"]) == n_s
    summary = StreamRunner(out, source_dir, n_s=n_s).run()
    assert summary["version"] == 1 and summary["n_refits"] == 1
    o = read_output(out)
    _check_complete(o, n)
    assert np.sum(o["status"] == STATUS["remapped"]) >= 0.95 * n_s
    assert len(o["checkpoint"]["pending"]) < n_s


@pytest.mark.cluster
def test_worker_killed_mid_stream_loses_no_row(model, scenario, reference, tmp_path):
    """SIGKILL a worker of a 2-process LocalCluster as it starts mapping the sixth chunk: its
    tasks and the shared model are recomputed, nothing hangs, and the output equals the
    threaded run."""
    import threading

    from distributed import Client, LocalCluster

    chunks = [scenario.stream[i : i + 20] for i in range(0, len(scenario.stream), 20)]
    out = str(tmp_path / "out")
    fault = Fault(tmp_path / "fault", Task(6, prefix="map_chunk"))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, memory_limit="2GB") as cluster, \
            Client(cluster, set_as_default=False) as client:
        fault.register(client)
        result = {}
        runner = StreamRunner(out, chunks, model, n_s=N_S, strict_sequential=True,
                              client=client, handle_signals=False)
        th = threading.Thread(target=lambda: result.update(runner.run()))
        th.start()
        th.join(timeout=300)
        assert not th.is_alive(), "runner hung after a worker was killed"
    assert fault.fired is not None, "no worker started mapping a sixth chunk"
    assert result["n_rows"] == len(scenario.stream)
    o = read_output(out)
    _check_complete(o, len(scenario.stream))
    _assert_same(o, reference)


def test_model_format_is_safe_and_versioned(model, scenario, tmp_path):
    import zarr

    from dr_dask.methods.gp_isomap_io import ModelFormatError, load_gp_isomap

    path = str(tmp_path / "m.zarr")
    save_gp_isomap(model, path, scenario.batch)
    assert not any(f.endswith((".pkl", ".pickle")) for _, _, fs in os.walk(path) for f in fs)
    loaded, batch = load_gp_isomap(path)
    np.testing.assert_array_equal(batch, scenario.batch)
    for a, b in zip(loaded.map_points(scenario.stream), model.map_points(scenario.stream)):
        np.testing.assert_array_equal(a, b)
    zarr.open_group(path, mode="a").attrs["format_version"] = 0
    with pytest.raises(ModelFormatError, match="format version 0"):
        load_gp_isomap(path)
    # the CLI refuses it with exit code 2 and no traceback
    proc = cli("--scheduler", "threads", "stream", "run", str(tmp_path), "--out",
                str(tmp_path / "o"), "--model", path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and b"Traceback" not in err and b"format version 0" in err
    assert not os.path.exists(tmp_path / "o")


# ------------------------------------------------------------ a stream that never stalls or lies
def test_empty_chunk_is_consumed_not_blocking(model, scenario, tmp_path):
    """A (0, D) chunk is recorded by the checkpoint and writes nothing; the stream goes on
    (it used to fail on every restart: mapping refuses zero rows)."""
    S = scenario.stream
    src = tmp_path / "chunks"
    src.mkdir()
    np.save(src / "000.npy", S[:20])
    np.save(src / "001.npy", np.zeros((0, S.shape[1])))
    np.save(src / "002.npy", S[20:45])
    out = str(tmp_path / "out")
    summary = StreamRunner(out, str(src), model, n_s=1000).run()
    assert summary["n_rows"] == 45 and summary["n_chunks"] == 3
    o = read_output(out)
    assert o["checkpoint"]["n_empty"] == 1 and not o["quarantine"]
    np.testing.assert_allclose(o["embedding"], model.map_points(S[:45])[0], rtol=1e-6,
                               atol=1e-9)
    # an iterator source too, with the empty chunk last
    out2 = str(tmp_path / "out2")
    summary = StreamRunner(out2, [S[:20], np.zeros((0, S.shape[1]))], model, n_s=1000).run()
    assert summary["n_rows"] == 20 and summary["n_chunks"] == 2


def test_late_file_sorting_before_the_checkpoint_is_processed(model, scenario, tmp_path,
                                                               request, caplog):
    """Processed names, not a high-water mark: a chunk file that appears after the
    checkpoint with a name sorting before it is processed with a warning; the checkpoint
    stays small (names move to archive objects) and a restart reads the archives."""
    import dask

    compact = dask.config.set({"dr_dask.stream.compact-after": 3})
    request.addfinalizer(lambda: compact.__exit__(None, None, None))
    S = scenario.stream
    src = tmp_path / "chunks"
    src.mkdir()
    for i in range(2, 9):
        np.save(src / f"{i:03d}.npy", S[10 * i:10 * i + 10])
    out = str(tmp_path / "out")
    StreamRunner(out, str(src), model, n_s=1000).run()
    ck = StreamStore(out).read_checkpoint()
    assert ck["n_rows"] == 70 and len(ck["source"]["done"]) < 3 and ck["source"]["archives"]
    np.save(src / "000.npy", S[:10])  # late, and sorting before every processed name
    np.save(src / "001.npy", S[10:20])
    with caplog.at_level("WARNING", logger="dr_dask.stream.sources"):
        summary = StreamRunner(out, str(src), n_s=1000).run()
    assert summary["n_rows"] == 90 and summary["n_chunks"] == 9
    assert "000.npy arrived after 008.npy was processed" in caplog.text
    o = read_output(out)
    late = np.vstack([S[20:90], S[:20]])  # rows in the order they were processed
    np.testing.assert_allclose(o["embedding"], model.map_points(late)[0], rtol=1e-6, atol=1e-9)
    # nothing new: nothing done (every name is known, archived or listed)
    assert StreamRunner(out, str(src), n_s=1000).run()["n_rows"] == 90


def test_high_water_mark_checkpoint_still_resumes(model, scenario, tmp_path):
    """A checkpoint written by the name-offset format resumes after its name."""
    S = scenario.stream
    src = tmp_path / "chunks"
    src.mkdir()
    for i in range(3):
        np.save(src / f"{i:03d}.npy", S[10 * i:10 * i + 10])
    out = str(tmp_path / "out")
    StreamRunner(out, str(src), model, n_s=1000).run()
    store = StreamStore(out)
    ck = store.read_checkpoint()
    ck["source"] = "002.npy"
    store.write_checkpoint(ck)
    np.save(src / "003.npy", S[30:40])
    assert StreamRunner(out, str(src), n_s=1000).run()["n_rows"] == 40


def _tampered(model, path, edit):
    save_gp_isomap(model, path)
    edit(zarr.open_group(path, mode="a"))
    return path


@pytest.mark.parametrize(("field", "edit"), [
    ("kernel", lambda g: g.attrs.update(params={**g.attrs["params"], "kernel": "evil_kernel"})),
    ("n_neighbors", lambda g: g.attrs.update(params={**g.attrs["params"], "n_neighbors": "ten"})),
    ("manifold_1/beta", lambda g: g["manifold_1"]["beta"].__setitem__((0, 0), np.nan)),
    ("stitch_translation_", lambda g: g["stitch_translation"].__setitem__((0, 0), np.inf)),
    ("sigma_t_", lambda g: g.attrs.update(fitted={**g.attrs["fitted"], "sigma_t_": -1.0})),
    ("manifold_0 length_scale",
     lambda g: g["manifold_0"].attrs.update(length_scale="NaN")),
])
def test_loaded_model_is_validated_like_a_fitted_one(model, tmp_path, field, edit):
    from dr_dask.methods.gp_isomap_io import ModelFormatError, load_gp_isomap

    path = _tampered(model, str(tmp_path / "m.zarr"), edit)
    with pytest.raises(ModelFormatError, match=field):
        load_gp_isomap(path)
    # the CLI: exit 2 naming the file and the field, no traceback, nothing written
    proc = cli("--scheduler", "threads", "stream", "run", str(tmp_path), "--out",
                str(tmp_path / "o"), "--model", path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err.decode()
    assert b"Traceback" not in err and b"m.zarr" in err and field.encode() in err
    assert not os.path.exists(tmp_path / "o")


def test_rows_mapped_to_nan_are_quarantined_not_written(model, scenario, tmp_path):
    """A model whose weights of one manifold turn NaN once the run holds it (a model given
    or stored like it is refused before anything is written): its rows are quarantined with
    the reason, the others written; no result row is NaN."""
    import copy

    from dr_dask.methods.gp_isomap_io import ModelFormatError

    bad = copy.deepcopy(model)
    bad.manifolds_[1].beta[:] = np.nan
    S = scenario.stream[:120]
    chunks = [S[i:i + 40] for i in range(0, len(S), 40)]
    refused = tmp_path / "refused"
    with pytest.raises(ModelFormatError, match="beta"):
        StreamRunner(str(refused), chunks, bad, n_s=1000).run()
    assert not refused.exists()

    class Corrupted(StreamRunner):
        def _setup(self):
            super()._setup()
            self.model.manifolds_[1].beta[:] = np.nan

    out = str(tmp_path / "out")
    Corrupted(out, chunks, model, n_s=1000).run()
    o = read_output(out)
    q = o["status"] == STATUS["quarantined"]
    _, _, manifold = model.map_points(S)
    np.testing.assert_array_equal(q, manifold == 1)
    assert q.any() and not q.all()
    assert np.isfinite(o["embedding"][~q]).all() and np.isfinite(o["variance"][~q]).all()
    records = o["quarantine"]
    assert sum(r["n_rows"] for r in records) == q.sum()
    assert sorted(r for rec in records for r in rec["rows"]) == np.flatnonzero(q).tolist()
    assert all("non-finite" in r["reason"] for r in records)


def test_resume_with_a_tampered_stored_model_exits_2(model, scenario, tmp_path):
    """The model a stream resumes with is checked as strictly as a given one."""
    src = tmp_path / "chunks"
    src.mkdir()
    np.save(src / "000.npy", scenario.stream[:20])
    out = str(tmp_path / "out")
    StreamRunner(out, str(src), model, n_s=1000).run()
    zarr.open_group(os.path.join(out, "models", "v0"), mode="a")["manifold_0"]["beta"][0, 0] = \
        np.inf
    proc = cli("--scheduler", "threads", "stream", "run", str(src), "--out", out)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err.decode()
    assert b"v0" in err and b"manifold_0/beta" in err and b"Traceback" not in err
