"""The scheduled jobs: the nightly incremental GP-Isomap job (watermark, drift history, refit in
the same run, exactly-once rows across a SIGKILL, S3) and the weekly refit (evaluation report,
``latest`` moved only after success)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal

import numpy as np
import pytest
import zarr
from _faults import Fault, Rows, Written
from click.testing import CliRunner
from conftest import idle_rss_gb, plausible_peak

from dr_dask.cli import main
from dr_dask.datasets.swiss_roll import shift_scenario
from dr_dask.io.storage import Location
from dr_dask.jobs import run_incremental, run_refit
from dr_dask.stream import STATUS, StreamStore, read_output

#: Batch 300 rows (patches 1-3), then 300 more of those patches, then 100 of an unseen patch.
NIGHT1, ALL = 400, 700
SMALL = {"n_batch": 300, "n_s": 40, "chunk_size": 50}


@pytest.fixture(scope="module")
def X():
    sc = shift_scenario(100, random_state=3)
    assert sc.first_unseen + len(sc.batch) == 600
    return np.vstack([sc.batch, sc.stream])


@pytest.fixture(scope="module")
def night1(X, tmp_path_factory):
    """A landing store holding the first night's rows and the job state after its first run
    (the model fit on the first 300 rows); tests copy both."""
    root = tmp_path_factory.mktemp("night1")
    src, state = str(root / "land.zarr"), str(root / "state")
    _land(src, X[:NIGHT1])
    summary = run_incremental(f"{src}:X", state, **SMALL)
    return src, state, summary


def _copy_night1(night1, tmp_path) -> tuple[str, str, dict]:
    src, state, summary = night1
    shutil.copytree(src, tmp_path / "land.zarr")
    shutil.copytree(state, tmp_path / "state")
    # the state records the source it follows: the copy follows the copied source
    Location(str(tmp_path / "state")).child("job.json").write_json(
        {"source": str(tmp_path / "land.zarr" / "X"), "n_features": X_WIDTH})
    return str(tmp_path / "land.zarr"), str(tmp_path / "state"), summary


X_WIDTH = 3


def _land(url: str, rows: np.ndarray) -> None:
    """Append ``rows`` to the array X of the Zarr store at ``url`` (a night's landing)."""
    g = zarr.open_group(store=Location(url).zarr_store(), mode="a")
    if "X" not in g:
        g.create_array("X", shape=(0, rows.shape[1]), chunks=(50, rows.shape[1]), dtype="f8",
                       dimension_names=("sample", "feature"))
    arr = g["X"]
    n = arr.shape[0]
    arr.resize((n + len(rows), rows.shape[1]))
    arr[n:] = rows


def _models(state: str, storage_options=None) -> dict:
    store = StreamStore(state, storage_options)
    ck = store.read_checkpoint()
    return {v: store.load_model(v)[0] for v in range(ck["version"] + 1)}


def _check_every_row_once(state: str, X: np.ndarray, storage_options=None) -> dict:
    """Output row i is source row i, mapped by the model version recorded for it."""
    out = read_output(state, storage_options)
    assert out["checkpoint"]["n_rows"] == len(out["status"]) == len(X)
    assert set(np.unique(out["status"])) <= {STATUS["confident"], STATUS["buffered"],
                                            STATUS["remapped"]}
    for v, model in _models(state, storage_options).items():
        rows = np.flatnonzero(out["version"] == v)
        if len(rows):
            emb, var, _ = model.map_points(X[rows])
            np.testing.assert_allclose(out["embedding"][rows], emb, rtol=1e-6, atol=1e-8)
            np.testing.assert_allclose(out["variance"][rows], var, rtol=1e-6, atol=1e-10)
    return out


def _history(state: str, storage_options=None) -> list[dict]:
    return Location(state, storage_options).child("drift_history.json").read_json()


def _contiguous(history: list[dict], n: int) -> None:
    bounds = [(h["watermark_before"], h["watermark_after"]) for h in history]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds)), bounds
    assert sum(h["rows"] for h in history) == n


def test_nightly_maps_new_rows_refits_on_drift_and_a_rerun_does_nothing(X, night1, tmp_path):
    src, state, s1 = _copy_night1(night1, tmp_path)
    assert (s1["status"], s1["rows_mapped"], s1["watermark_before"], s1["watermark_after"],
            s1["model_version"], s1["refit"]) == ("done", NIGHT1, 0, NIGHT1, 0, False)
    assert s1["drift_statistic"] < 0.05  # rows of the batch's patches are explained
    json.dumps(s1)  # a plain JSON-able summary

    ck = Location(state).child("checkpoint.json").read_bytes()
    again = run_incremental(f"{src}:X", state, **SMALL)
    assert again["status"] == "nothing to do" and again["rows_mapped"] == 0
    assert Location(state).child("checkpoint.json").read_bytes() == ck
    assert len(_history(state)) == 1

    _land(src, X[NIGHT1:])  # the next night: more known rows, then an unseen patch
    s2 = run_incremental(f"{src}:X", state, **SMALL)
    assert (s2["watermark_before"], s2["watermark_after"], s2["rows_mapped"]) == (NIGHT1, ALL,
                                                                                   ALL - NIGHT1)
    assert s2["refit"] and s2["new_versions"] == [1] and s2["model_version"] == 1
    assert s2["drift_statistic"] > 0.2  # the unseen patch: a third of the night's rows
    out = _check_every_row_once(state, X)
    # the refit mapped the unseen patch: its rows end up explained by version 1
    assert np.all(out["version"][600:] == 1)
    assert np.all(out["variance"][600:] <= out["checkpoint"]["sigma_t"][-1])
    history = _history(state)
    _contiguous(history, ALL)
    assert [h["refit"] for h in history] == [False, True]
    # v1 was saved beside v0, in v0's frame: it maps v0's batch where v0 put it
    models = _models(state)
    spread = np.ptp(models[0].embedding_, axis=0).max()
    assert np.abs(models[1].embedding_[:300] - models[0].embedding_).max() < 0.01 * spread
    with open(tmp_path / "state" / "report.png", "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def _rejected(res, *needles):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output, res.output
    for needle in needles:
        assert needle in res.output, (needle, res.output)


def test_nightly_bad_input_is_exit_2_and_writes_nothing(X, tmp_path):
    src, other, state = (str(tmp_path / n) for n in ("land.zarr", "other.zarr", "state"))
    _land(src, X[:100])
    _land(other, X[:NIGHT1])

    def job(*args):
        return CliRunner().invoke(main, ["--scheduler", "threads", "job", "incremental", *args])

    # too few rows for the first fit: nothing to do yet, nothing written
    res = job(f"{src}:X", "--state", state, "--n-batch", "300")
    assert res.exit_code == 0 and json.loads(res.output)["status"] == "waiting", res.output
    _rejected(job(str(tmp_path / "missing.zarr"), "--state", state), "does not exist")
    _rejected(job(f"{src}:Y", "--state", state), "no variable 'Y'")
    _rejected(job(f"{src}:X", "--state", state, "--n-s", "0"), "--n-s")
    bad = X[:NIGHT1].copy()
    bad[7, 1] = np.nan
    nan_src = str(tmp_path / "nan.zarr")
    _land(nan_src, bad)
    before = np.asarray(zarr.open_group(nan_src, mode="r")["X"][...])
    _rejected(job(f"{nan_src}:X", "--state", state, "--n-batch", "300"), "n_batch", "rows 0..300")
    np.testing.assert_array_equal(zarr.open_group(nan_src, mode="r")["X"][...], before)
    assert not os.path.exists(state)
    # a state follows one source
    res = job(f"{other}:X", "--state", state, "--n-batch", "300", "--n-s", "40")
    assert res.exit_code == 0, res.output
    listing = sorted(os.listdir(state))
    ck = Location(state).child("checkpoint.json").read_bytes()
    _rejected(job(f"{src}:X", "--state", state), "follows", "another --state")
    # the weekly refit rejects the same way, before it writes anything
    runs = tmp_path / "runs.zarr"
    res = CliRunner().invoke(main, ["--scheduler", "threads", "job", "refit",
                                    str(tmp_path / "missing.zarr"), "--runs", str(runs)])
    _rejected(res, "does not exist")
    res = CliRunner().invoke(main, ["--scheduler", "threads", "job", "refit", f"{nan_src}:X",
                                    "--runs", str(runs), "--method", "isomap"])
    _rejected(res, "refit: isomap on", "nan.zarr:X")
    assert not os.path.exists(runs / "latest.json")
    assert sorted(os.listdir(state)) == listing
    assert Location(state).child("checkpoint.json").read_bytes() == ck


def _rows_committed(state: str) -> int:
    return (Location(state).child("checkpoint.json").read_json() or {}).get("n_rows", -1)


@pytest.mark.cluster
def test_nightly_killed_midway_and_rerun_loses_and_duplicates_nothing(X, night1, tmp_path,
                                                                       cluster_client):
    """SIGKILL the CLI mid-night on a multi-process cluster; the rerun finishes the night and
    the result equals an uninterrupted run's, row for row."""
    params = {**SMALL, "chunk_size": 20, "strict": True}
    src, state, _ = _copy_night1(night1, tmp_path)
    ref = str(tmp_path / "ref-state")
    shutil.copytree(state, ref)  # the same first night for both
    _land(src, X[NIGHT1:])
    run_incremental(f"{src}:X", ref, **params)  # the uninterrupted second night

    # killed by its own commit of the night's second chunk (rows NIGHT1+20..NIGHT1+40)
    fault = Fault(tmp_path / "fault", Rows(NIGHT1 + 40))
    proc = fault.cli("--scheduler", cluster_client.scheduler.address, "job", "incremental",
                     f"{src}:X", "--state", state, "--n-batch", "300", "--n-s", "40",
                     "--chunk-size", "20", "--strict", "--no-report")
    assert proc.wait(timeout=300) == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert fault.fired is not None and _rows_committed(state) == NIGHT1 + 40

    # the rerun (in-process: the state alone carries the job), on the same cluster
    summary = run_incremental(f"{src}:X", state, client=cluster_client, **params)
    assert (summary["watermark_before"], summary["watermark_after"]) == (NIGHT1, ALL)
    assert summary["refit"] and summary["model_version"] == 1
    got, want = _check_every_row_once(state, X), read_output(ref)
    for name in ("status", "version", "manifold"):
        np.testing.assert_array_equal(got[name], want[name])
    np.testing.assert_allclose(got["embedding"], want["embedding"], rtol=1e-6, atol=1e-8)
    history = _history(state)
    _contiguous(history, ALL)
    assert len(history) == 2  # the killed attempt and its rerun are one night
    again = run_incremental(f"{src}:X", state, client=cluster_client, **params)
    assert again["status"] == "nothing to do"


@pytest.mark.cluster
def test_weekly_refit_reports_against_the_previous_run_and_moves_latest_last(X, tmp_path,
                                                                              cluster_client):
    src, runs = str(tmp_path / "land.zarr"), str(tmp_path / "runs.zarr")
    _land(src, X[:NIGHT1])
    kw = {"method": "isomap", "n_components": 2, "client": cluster_client, "eval_rows": 150,
          "tci_candidates": 4}
    idle = idle_rss_gb()  # this process and the cluster's workers, before the refit
    first = run_refit(f"{src}:X", runs, **kw)
    assert first["status"] == "done" and first["previous"] is None
    latest = Location(runs).child("latest.json")
    assert latest.read_json()["run"] == first["run"]
    m = first["metrics"]
    assert m["trustworthiness"] > 0.9 and m["ti"] >= 0 and m["tci"] >= 0
    assert first["fit_seconds"] > 0 and plausible_peak(first["peak_rss_gb"], idle)
    report = Location(first["report"]).read_json()
    assert report["run"] == first["run"] and report["metrics"]["ti"] == m["ti"]
    assert os.path.getsize(tmp_path / "runs.zarr" / f"{first['run']}.report" / "report.png")

    # a new week: the refit runs on all rows; killed by its own write of the new run's report,
    # the last write before latest moves: latest stays
    _land(src, X[NIGHT1:])
    pointer = latest.read_bytes()
    known = set(os.listdir(runs))
    fault = Fault(tmp_path / "fault", Written(r"\.report/report\.json$"))
    proc = fault.cli("--scheduler", cluster_client.scheduler.address, "job", "refit",
                     f"{src}:X", "--runs", runs, "--method", "isomap", "--eval-rows", "150",
                     "--tci-candidates", "4")
    assert proc.wait(timeout=300) == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert fault.fired is not None
    assert latest.read_bytes() == pointer
    (new,) = {f for f in set(os.listdir(runs)) - known if not f.endswith(".report")}
    assert zarr.open_group(runs, mode="r")[new].attrs["complete"]
    completed = (tmp_path / "runs.zarr" / new / "zarr.json").read_bytes()

    second = run_refit(f"{src}:X", runs, **kw)
    assert second["status"] == "done" and second["previous"] == first["run"]
    assert second["n_samples"] == ALL and latest.read_json()["run"] == second["run"] == new
    # the run finished before the kill was reused, not fitted again
    assert (tmp_path / "runs.zarr" / new / "zarr.json").read_bytes() == completed
    # the same rows embedded twice by the same method: nearly the same picture
    assert second["metrics"]["procrustes_disparity_vs_previous"] < 0.1
    assert os.path.exists(tmp_path / "runs.zarr" / first["run"])  # the old run is kept
    again = run_refit(f"{src}:X", runs, **kw)
    assert again["status"] == "nothing to do" and again["run"] == second["run"]
    assert latest.read_json() == second

    res = CliRunner().invoke(main, ["--scheduler", "threads", "job", "refit", f"{src}:X",
                                    "--runs", runs, "--method", "umap"])
    _rejected(res, "'umap' is not one of")


def test_nightly_on_s3(X, s3_bucket):
    """Source and state on an S3 server (moto): two nights, a rerun that does nothing."""
    src, state = f"s3://{s3_bucket}/land.zarr", f"s3://{s3_bucket}/state"

    def job(*extra):
        res = CliRunner().invoke(main, ["--scheduler", "threads", "job", "incremental",
                                        f"{src}:X", "--state", state, "--n-batch", "300",
                                        "--n-s", "40", "--chunk-size", "100", *extra])
        assert res.exit_code == 0, res.output
        return json.loads(res.output)

    _land(src, X[:NIGHT1])
    zarr.consolidate_metadata(Location(src).zarr_store())  # as `datasets make` leaves a store
    assert job("--no-report")["watermark_after"] == NIGHT1
    assert job()["status"] == "nothing to do"
    # appended through the consolidated group, not re-consolidated: the job reads the array's
    # current shape, never the root's snapshot
    zarr.open_group(store=Location(src).zarr_store(), mode="r+")["X"].append(X[NIGHT1:])
    s2 = job()
    assert s2["watermark_after"] == ALL and s2["refit"]
    _check_every_row_once(state, X)
    _contiguous(_history(state), ALL)
    assert Location(state).child("report.png").exists()
    assert Location(state).child("models", "v1", "zarr.json").exists()


@pytest.mark.parametrize("how", ["zarr-append", "xarray-append-dim"])
def test_nightly_sees_rows_appended_without_reconsolidating(X, night1, tmp_path, how):
    """A source whose root carries consolidated metadata (as `dr-dask datasets make` writes):
    rows appended with zarr-python's ``append`` or xarray's ``to_zarr(append_dim=...)`` and
    never re-consolidated are all mapped by the next run."""
    import xarray as xr

    src, state, _ = _copy_night1(night1, tmp_path)
    zarr.consolidate_metadata(src)
    if how == "zarr-append":
        zarr.open_group(src, mode="r+")["X"].append(X[NIGHT1:])
    else:
        xr.Dataset({"X": (("sample", "feature"), X[NIGHT1:])}).to_zarr(
            src, append_dim="sample", consolidated=False)
    summary = run_incremental(f"{src}:X", state, **SMALL, report=False)
    assert summary["status"] == "done"
    assert summary["rows_mapped"] == ALL - NIGHT1 and summary["watermark_after"] == ALL
    _check_every_row_once(state, X)


def test_nightly_short_of_the_source_exits_1(X, night1, tmp_path, monkeypatch):
    """A run that ends with source rows it did not process (a reader that stopped early) never
    reports done: exit 1 naming the rows, and the next run maps them."""
    from dr_dask.stream import sources

    src, state, _ = _copy_night1(night1, tmp_path)
    _land(src, X[NIGHT1:])
    real = sources.ZarrSource.read
    monkeypatch.setattr(sources.ZarrSource, "read",
                        lambda self, offset: None if offset >= NIGHT1 + 100 else real(self, offset))
    monkeypatch.setattr(sources.ZarrSource, "exhausted", lambda self, offset: True)
    res = CliRunner().invoke(main, ["--scheduler", "threads", "job", "incremental", f"{src}:X",
                                    "--state", state, "--n-batch", "300", "--n-s", "40",
                                    "--chunk-size", "50", "--no-report"])
    assert res.exit_code == 1, res.output
    assert f"rows {NIGHT1 + 100}..{ALL} were not processed" in res.stderr
    monkeypatch.undo()
    summary = run_incremental(f"{src}:X", state, **SMALL, report=False)
    assert summary["watermark_after"] == ALL
    _check_every_row_once(state, X)
