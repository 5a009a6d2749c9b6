"""The data boundary on a real S3 server (moto) and a real multi-process cluster.

The same properties as ``test_data_boundary``, ``test_result_integrity`` and
``test_stream_integrity``, with every input and output an ``s3://`` object: a chunk of an
input overwritten with random bytes of its size, or truncated, stops ``embed`` (on the
session's cluster), ``job incremental`` and ``stream run`` by name (exit 2), nothing of a later
row is written, the input objects keep their bytes, and once the chunk is restored the rerun
equals a clean run; a finished run's result chunk corrupted on S3 is refused by ``report`` and
``evaluate`` (exit 2, naming the chunk) and redone by the rerun (on the cluster); a stream's
output block corrupted on S3 is refused by ``stream report`` and by a resuming ``stream run``,
naming array, rows and chunk. One clean run of each kind per module.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

import numpy as np
import pytest
import zarr
from click.testing import CliRunner
from conftest import S3_SECRET
from test_data_boundary import ROWS, X, model_path  # noqa: F401  (fixtures)

from dr_dask.cli import main
from dr_dask.io.storage import Location
from dr_dask.stream import read_output

HOW = ["random", "truncated"]
EMBED = ("embed", "ikd", "-n", "2")
# a read per stored chunk; no refit (every model version is several S3 objects: the refits'
# stores are tested on local disk and in test_stream_resume)
STREAM = ("stream", "run", "--n-s", "1000", "--chunk-size", "50")
JOB = ("--n-batch", "200", "--n-s", "1000", "--chunk-size", "50", "--no-report")


def _on(scheduler: str) -> list[str]:
    """``--scheduler``, and for a cluster the storage options its workers need (they started
    before AWS_* was set; the run delivers them)."""
    if scheduler == "threads":
        return ["--scheduler", "threads"]
    return ["--scheduler", scheduler, "--storage-option", "key=testing-key-id",
            "--storage-option", f"secret={S3_SECRET}", "--storage-option",
            f"endpoint_url={os.environ['AWS_ENDPOINT_URL']}"]


def _cli(*args: str, scheduler: str = "threads") -> tuple[int, str]:
    res = CliRunner().invoke(main, [*_on(scheduler), *args])
    return res.exit_code, res.output


def _store(url: str, rows: np.ndarray) -> str:
    """A Zarr group at ``url`` whose array X holds ``rows`` in chunks of ROWS rows."""
    g = zarr.open_group(store=Location(url).zarr_store(), mode="w")
    arr = g.create_array("X", shape=rows.shape, chunks=(ROWS, rows.shape[1]), dtype="f8",
                         dimension_names=("sample", "feature"))
    arr[:] = rows
    return f"{url}:X"


def _digest(url: str) -> dict[str, str]:
    """Every object under ``url`` by its SHA-1."""
    fs = Location(url).fs
    return {p: hashlib.sha1(fs.cat_file(p)).hexdigest() for p in sorted(fs.find(url))}


def _damage(url: str, how: str) -> bytes:
    """Overwrite the object at ``url`` with random bytes of its size or its first half;
    returns its original bytes (to restore it)."""
    where = Location(url)
    good = where.read_bytes()
    where.write_bytes(np.random.default_rng(0).bytes(len(good)) if how == "random"
                      else good[: len(good) // 2])
    return good


def _embedding(out: str) -> np.ndarray:
    root = zarr.open_group(store=Location(out).zarr_store(read_only=True), mode="r",
                           use_consolidated=False)
    return np.asarray(root["r"]["embedding"][:])


def _same(o: dict, ref: dict) -> None:
    """Bit for bit: every output array and the source offset."""
    for name in ("embedding", "variance", "first_variance", "manifold", "version", "status"):
        np.testing.assert_array_equal(o[name], ref[name], err_msg=name)
    assert o["checkpoint"]["source"] == ref["checkpoint"]["source"]


# --------------------------------------------------------------- embed, on the cluster
@pytest.fixture(scope="module")
def clean_run(X, s3_module_bucket, cluster_client):  # noqa: F811  (pytest fixtures imported from test_data_boundary)
    """A finished embed run on the cluster, input and output on S3, and its embedding."""
    src = _store(f"s3://{s3_module_bucket}/in.zarr", X[:200])
    out = f"s3://{s3_module_bucket}/runs.zarr"
    code, text = _cli(*EMBED, "--input", src, "--out", out, "--name", "r",
                      scheduler=cluster_client.scheduler.address)
    assert code == 0, text
    return out, _embedding(out)


@pytest.mark.cluster
def test_embed_on_the_cluster_stops_at_a_bad_s3_chunk_and_a_fixed_rerun_equals_clean(
        X, s3_module_bucket, cluster_client, clean_run):  # noqa: F811  (pytest fixtures imported from test_data_boundary)
    addr = cluster_client.scheduler.address
    src = _store(f"s3://{s3_module_bucket}/bad.zarr", X[:200])
    before = _digest(f"s3://{s3_module_bucket}/bad.zarr")
    out = f"s3://{s3_module_bucket}/bad-out.zarr"
    chunk = f"s3://{s3_module_bucket}/bad.zarr/X/c/2/0"
    for how in HOW:
        good = _damage(chunk, how)
        damaged = _digest(f"s3://{s3_module_bucket}/bad.zarr")
        code, text = _cli(*EMBED, "--input", src, "--out", out, "--name", "r", scheduler=addr)
        assert code == 2, (how, text)
        assert "bad.zarr:X: chunk c/2/0" in text and "Traceback" not in text, text
        assert not Location(out).exists()  # nothing written for a rejected input
        assert _digest(f"s3://{s3_module_bucket}/bad.zarr") == damaged  # never modified
        Location(chunk).write_bytes(good)
    assert _digest(f"s3://{s3_module_bucket}/bad.zarr") == before
    code, text = _cli(*EMBED, "--input", src, "--out", out, "--name", "r", scheduler=addr)
    assert code == 0, text
    # the cluster's reductions may sum in another order: equal to rounding
    np.testing.assert_allclose(_embedding(out), clean_run[1], rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------- job incremental
def test_job_incremental_on_s3_stops_before_a_bad_chunk_and_resumes_equal_to_clean(
        X, s3_module_bucket, tmp_path):  # noqa: F811  (pytest fixtures imported from test_data_boundary)
    """Night one (250 rows) on S3; 100 rows land, chunk c/6/0 (rows 300..349) damaged."""
    src = _store(f"s3://{s3_module_bucket}/land.zarr", X[:250])
    state = f"s3://{s3_module_bucket}/state"
    assert _cli("job", "incremental", src, "--state", state, *JOB)[0] == 0
    arr = zarr.open_group(store=Location(src[:-2]).zarr_store(), mode="a")["X"]
    arr.append(X[250:350])
    chunk = f"{src[:-2]}/X/c/6/0"
    good = b""
    for how in HOW:
        good = _damage(chunk, how)
        damaged = _digest(src[:-2])
        code, out = _cli("job", "incremental", src, "--state", state, *JOB)
        assert code == 2, (how, out)
        assert re.search(r"land\.zarr[:/]X: chunk c/6/0", out) and "Traceback" not in out, out
        ck = read_output(state)["checkpoint"]
        assert ck["source"] == ck["n_rows"] == 300  # the rows before the chunk, none after
        history = json.loads(Location(state).child("drift_history.json").read_bytes())
        assert history[-1]["watermark_after"] == 250
        assert _digest(src[:-2]) == damaged
        Location(chunk).write_bytes(good)
    code, out = _cli("job", "incremental", src, "--state", state, *JOB)
    assert code == 0 and json.loads(out)["watermark_after"] == 350, out
    # the clean reference: the same two nights, on local disk, undisturbed
    clean_src, clean_state = _store(str(tmp_path / "land.zarr"), X[:250]), str(tmp_path / "s")
    for rows in (None, X[250:350]):
        if rows is not None:
            zarr.open_array(str(tmp_path / "land.zarr" / "X"), mode="a").append(rows)
        assert _cli("job", "incremental", clean_src, "--state", clean_state, *JOB)[0] == 0
    _same(read_output(state), read_output(clean_state))


# ------------------------------------------------------------------------ stream run
@pytest.fixture(scope="module")
def clean_stream(X, model_path, s3_module_bucket):  # noqa: F811  (pytest fixtures imported from test_data_boundary)
    """A stream over an S3 Zarr array into an S3 output, and its output as read."""
    _store(f"s3://{s3_module_bucket}/sin.zarr", X[200:350])
    out = f"s3://{s3_module_bucket}/stream-out"
    code, text = _cli(*STREAM, f"s3://{s3_module_bucket}/sin.zarr/X", "--out", out,
                      "--model", model_path)
    assert code == 0, text
    return out, read_output(out)


def test_stream_run_on_s3_stops_before_a_bad_chunk_and_resumes_equal_to_clean(
        X, model_path, s3_module_bucket, clean_stream):  # noqa: F811  (pytest fixtures imported from test_data_boundary)
    root = f"s3://{s3_module_bucket}/sbad.zarr"
    _store(root, X[200:350])
    out = f"s3://{s3_module_bucket}/sbad-out"
    chunk = f"{root}/X/c/1/0"  # rows 50..99
    for how in HOW:
        good = _damage(chunk, how)
        damaged = _digest(root)
        code, text = _cli(*STREAM, f"{root}/X", "--out", out, "--model", model_path)
        assert code == 2, (how, text)
        assert "sbad.zarr/X: chunk c/1/0" in text and "Traceback" not in text, text
        ck = read_output(out)["checkpoint"]
        assert ck["source"] == ck["n_rows"] == 50  # the rows before the chunk, none after
        assert _digest(root) == damaged
        Location(chunk).write_bytes(good)
    code, text = _cli(*STREAM, f"{root}/X", "--out", out)
    assert code == 0 and json.loads(text)["n_rows"] == 150, text
    _same(read_output(out), clean_stream[1])


def test_a_corrupted_s3_stream_block_is_refused_by_report_and_resume(
        s3_module_bucket, clean_stream, tmp_path):
    out = clean_stream[0]
    chunk = f"{out}/embedding/c/0/0"
    named = "embedding rows 0..150 (chunk embedding/c/0/0)"
    checkpoint = Location(out).child("checkpoint.json").read_bytes()
    for how in HOW:
        _damage(chunk, how)
        damaged = Location(chunk).read_bytes()
        for args in (["stream", "report", out, "--out", str(tmp_path / "r.png")],
                     [*STREAM, f"s3://{s3_module_bucket}/sin.zarr/X", "--out", out]):
            res = CliRunner().invoke(main, ["--scheduler", "threads", *args])
            assert res.exit_code == 2, (how, args, res.output)
            errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
            assert len(errors) == 1 and named in errors[0], res.stderr
            assert "Traceback" not in res.output
        assert not (tmp_path / "r.png").exists()
        assert Location(chunk).read_bytes() == damaged  # nobody repairs or deletes
        assert Location(out).child("checkpoint.json").read_bytes() == checkpoint



@pytest.mark.cluster
def test_a_corrupted_s3_result_is_refused_by_readers_and_latest_and_redone_on_the_cluster(
        clean_run, cluster_client, s3_module_bucket, tmp_path, caplog):
    """A refit job's run on S3, on the cluster, its embedding chunk corrupted: ``report`` of
    the run and of the run store (what ``latest`` names) and ``evaluate`` exit 2 naming the
    chunk; the job's rerun refits the run latest names, to the same embedding."""
    addr = cluster_client.scheduler.address
    runs = f"s3://{s3_module_bucket}/refit-runs.zarr"
    refit = ("job", "refit", f"s3://{s3_module_bucket}/in.zarr:X", "--runs", runs,
             "--eval-rows", "50", "--tci-candidates", "1")
    res = CliRunner().invoke(main, [*_on(addr), *refit])
    assert res.exit_code == 0, res.output
    first = json.loads(res.stdout)
    run = f"{runs}/{first['run']}"
    emb = np.asarray(zarr.open_array(store=Location(run).child("embedding").zarr_store(),
                                     mode="r")[:])
    chunk = f"{run}/embedding/c/0/0"
    good = Location(chunk).read_bytes()
    page = str(tmp_path / "page.html")
    for how in HOW:
        _damage(chunk, how)
        damaged = Location(chunk).read_bytes()
        for args, scheduler in (
                (["report", run, "--html", page], "threads"),
                (["report", runs, "--html", page], "threads"),  # latest names the run
                (["evaluate", "--store", runs, "--embedding", first["run"], "--out",
                  str(tmp_path / "ev")], addr)):
            res = CliRunner().invoke(main, [*_on(scheduler), *args])
            assert res.exit_code == 2, (how, args, res.output)
            errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
            assert len(errors) == 1 and "chunk embedding/c/0/0" in errors[0], res.stderr
            assert "Traceback" not in res.output
        assert not (tmp_path / "page.html").exists() and not (tmp_path / "ev").exists()
        assert Location(chunk).read_bytes() == damaged  # a reader never repairs or deletes
    res = CliRunner().invoke(main, [*_on(addr), *refit])
    assert res.exit_code == 0, res.output
    again = json.loads(res.stdout)
    assert again["status"] == "done" and again["run"] == first["run"]
    assert "latest names" in caplog.text and "refitting it" in caplog.text
    np.testing.assert_allclose(
        zarr.open_array(store=Location(run).child("embedding").zarr_store(), mode="r")[:],
        emb, rtol=1e-10, atol=1e-12)
    assert len(Location(chunk).read_bytes()) == len(good)
