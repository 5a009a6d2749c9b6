"""``dr-dask bench io``: the same IKD fit read from local disk and from an S3 server.

The S3 side is a real S3 protocol server: ``AWS_ENDPOINT_URL`` if set (MinIO, a cloud bucket
given as ``--bucket``), else moto in server mode started here on 127.0.0.1 (moto is a test
dependency). Requests are counted at the server when it is ours (every client and worker
request reaches it), which is what an object store bills and rate-limits.

It also measures what results carrying their content costs (``docs/decisions.md``
RUN-CHECKSUMS): the fit's embedding written as a run's result on each side, then the
completion mark's checksums of it (a read of every chunk) and a reader's comparison, against
reading the embedding itself and against the fit; and the same for an embedding of
``checksum_rows`` rows on local disk, for the hashing rate.
"""

from __future__ import annotations

import logging
import tempfile
import uuid

import numpy as np
import zarr

from dr_dask.bench._common import n_workers
from dr_dask.datasets.toy import tanh_lowrank
from dr_dask.io.storage import Location
from dr_dask.runtime.resources import measure

logger = logging.getLogger(__name__)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a local S3 server)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _RequestCounter(logging.Handler):
    """Counts the access-log lines of the in-process S3 server (one per HTTP request)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def _write(loc: Location, X: np.ndarray, chunk_rows: int) -> None:
    g = zarr.open_group(store=loc.zarr_store(), mode="w")
    g.create_array("X", data=X, chunks=(chunk_rows, X.shape[1]),
                   dimension_names=("sample", "feature"))


def _fit(loc: Location, n_components: int, client) -> np.ndarray:
    from dr_dask.io.inputs import open_dataset
    from dr_dask.methods.ikd import IKD

    est = IKD(n_components=n_components, dtype="float32", random_state=0, client=client)
    return est.fit(open_dataset(loc, "X")).embedding_


def checksum_cost(out: Location, emb: np.ndarray, repeats: int) -> dict:
    """What checksums add to a run whose result is ``emb``, in a run group of ``out``: the
    median seconds of the completion mark's checksums (``mark``), of a reader's comparison
    (``verify``) and of reading the embedding without either (``read``)."""
    from dr_dask.runs.group import RunGroup, result_problems

    run = RunGroup(out, "bench", params={}, identity={})
    run.write("sample", np.arange(len(emb)), ("sample",))
    run.write("component", np.arange(emb.shape[1]), ("component",))
    run.write("embedding", emb, ("sample", "component"))
    arrays = ("sample", "component", "embedding")
    mark = measure(lambda: {a: run.child(a).digests() for a in arrays}, repeats, rss=False)
    run.mark_complete(arrays=arrays)
    where = out.child("bench")
    verify = measure(lambda: result_problems(where, run.group.attrs), repeats, rss=False)
    assert verify.result == []  # just written: nothing differs
    read = measure(lambda: run.read("embedding"), repeats, rss=False)
    return {"bytes": int(emb.nbytes), "mark_seconds": mark.seconds,
            "verify_seconds": verify.seconds, "read_seconds": read.seconds}


def run_bench(client, *, T: int = 20_000, N: int = 1_000, repeats: int = 1,
              bucket: str | None = None, checksum_rows: int = 1_000_000) -> dict:
    """Time the IKD fit from local disk and from S3 in this one run: every repeat's seconds
    and their medians, the ratio of the medians, the peak RSS of the process tree for each
    side, and the S3 requests made by one S3 fit."""
    server = None
    counter = _RequestCounter()
    options: dict = {}
    if bucket is None:
        from moto.server import ThreadedMotoServer

        port = free_port()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        # explicit options, not the environment: they travel to workers started before this
        options = {"key": "dr-dask-bench-key", "secret": "dr-dask-bench-secret",
                   "endpoint_url": f"http://127.0.0.1:{port}"}
        bucket = f"dr-dask-bench-{uuid.uuid4().hex[:8]}"
        Location(f"s3://{bucket}", options).fs.mkdir(bucket)
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.addHandler(counter)
    old_level, old_propagate = werkzeug.level, werkzeug.propagate
    werkzeug.setLevel(logging.INFO)
    werkzeug.propagate = False  # counted, not printed: a line per request on stderr
    X = tanh_lowrank(T, N, random_state=0)
    chunk_rows = max(1, min(T, 2_000))
    try:
        with tempfile.TemporaryDirectory(prefix="dr_dask_bench_io_") as tmp:
            local = Location(tmp).child("x.zarr")
            remote = Location(f"s3://{bucket}/bench-io/x.zarr", options)
            _write(local, X, chunk_rows)
            _write(remote, X, chunk_rows)
            _fit(local, 2, client)  # warm up: numba, imports, worker caches
            on_disk = measure(lambda: _fit(local, 2, client), repeats)
            counter.count = 0
            on_s3 = measure(lambda: _fit(remote, 2, client), repeats)
            requests = counter.count // repeats if server is not None else None
            remote.delete()
            emb = np.asarray(on_disk.result)
            cost_local = checksum_cost(Location(tmp).child("runs.zarr"), emb, repeats)
            runs = Location(f"s3://{bucket}/bench-io/runs.zarr", options)
            cost_s3 = checksum_cost(runs, emb, repeats)
            runs.delete()
            big = np.random.default_rng(0).normal(size=(checksum_rows, emb.shape[1]))
            cost_big = checksum_cost(Location(tmp).child("big.zarr"), big, repeats)
    finally:
        werkzeug.removeHandler(counter)
        werkzeug.setLevel(old_level)
        werkzeug.propagate = old_propagate
        if server is not None:
            server.stop()
    return {
        "case": "IKD fit (full solver, float32) from local Zarr vs from S3",
        "T": T, "N": N, "chunk_rows": chunk_rows, "repeats": repeats,
        "workers": n_workers(client),
        "local_seconds_median": on_disk.seconds, "s3_seconds_median": on_s3.seconds,
        "local_seconds": on_disk.times, "s3_seconds": on_s3.times,
        "ratio_s3_to_local": on_s3.seconds / on_disk.seconds,
        "local_peak_rss_gb": on_disk.peak_rss_gb, "s3_peak_rss_gb": on_s3.peak_rss_gb,
        "target_ratio": 1.3, "s3_requests_per_fit": requests,
        "server": "moto (in-process, 127.0.0.1)" if server is not None else "AWS_ENDPOINT_URL",
        "same_embedding": bool(np.allclose(on_disk.result, on_s3.result, rtol=1e-4, atol=1e-5)),
        "checksums": {
            "local": cost_local, "s3": cost_s3, f"local_{checksum_rows}_rows": cost_big,
            # what a run pays once (its mark) and each reader once, against the fit
            "local_share_of_fit": (cost_local["mark_seconds"] + cost_local["verify_seconds"])
            / on_disk.seconds,
            "s3_share_of_fit": (cost_s3["mark_seconds"] + cost_s3["verify_seconds"])
            / on_s3.seconds,
            "hash_mb_per_s": cost_big["bytes"] / 1e6 / cost_big["mark_seconds"],
        },
    }
