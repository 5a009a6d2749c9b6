"""Exit classes, table-driven: bad inputs to the commands, the jobs, the stream and the API.

Each case asserts its class (2: the user must change something, a retry fails the same way;
1: a retry may help), one ``error:`` line that names what is wrong, no traceback, and no store
left behind where the command would have written one. The API cases run their call under the
command line's own exception mapping (:class:`dr_dask.cli._app.App`), so an exception type
that a scheduler would retry is caught here as well as an exit code.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click
import numpy as np
import pytest
import zarr
from click.testing import CliRunner
from conftest import tls_files

from dr_dask.cli import main
from dr_dask.cli._app import App
from dr_dask.datasets.swiss_roll import shift_scenario
from dr_dask.methods.gp_isomap import GPIsomap
from dr_dask.methods.gp_isomap_io import save_gp_isomap


@dataclass
class Case:
    """``args`` (strings with ``{name}`` of the :func:`paths` fixture) or an API call taking the
    paths; the expected class; a fragment the error line names; paths that must not exist
    after (the output it would have created)."""

    id: str
    args: tuple[str, ...] | Callable[[dict], Any]
    code: int
    names: str
    leaves: tuple[str, ...] = ()
    setup: Callable[[dict], None] | None = None
    #: the tmpfs the case writes to: ``ro`` (read-only) or ``full`` (no space left)
    mount: str | None = None


def _lease(content: str, where: str = "leased") -> Callable[[dict], None]:
    """A directory (``where``: the output, or the job's state) holding only a lease object
    with ``content``."""

    def write(p: dict) -> None:
        os.makedirs(p[where], exist_ok=True)
        with open(os.path.join(p[where], "lease.json"), "w") as fh:
            fh.write(content)
    return write


def _other_source(p: dict) -> None:
    os.makedirs(p["state"], exist_ok=True)
    with open(os.path.join(p["state"], "job.json"), "w") as fh:
        json.dump({"source": "/elsewhere/land.zarr/X", "n_features": 3}, fh)


T = ("--scheduler", "threads")
STREAM = (*T, "stream", "run", "{stream}", "--out", "{out}")
INCR = (*T, "job", "incremental", "{src}:X", "--state", "{state}", "--n-batch", "120",
        "--no-report")
REFIT = (*T, "job", "refit", "{src}:X", "--runs", "{runs}")
EMBED = (*T, "embed", "ikd", "-n", "2", "--input", "{src}:X", "--out", "{out}")
LIVE = json.dumps({"owner": "another-host:1:abc", "token": 3, "expires": 4e9})


def _api_stream(**kw: Any) -> Callable[[dict], Any]:
    def call(p: dict) -> Any:
        from dr_dask.io.storage import Location
        from dr_dask.methods.gp_isomap_io import load_gp_isomap
        from dr_dask.stream import StreamRunner

        model = load_gp_isomap(Location(p["model"]))[0] if kw.pop("model", True) else None
        return StreamRunner(p["out"], p["stream"], model, **kw).run()
    return call


def _api_incremental(source: str = "{src}:X", **kw: Any) -> Callable[[dict], Any]:
    def call(p: dict) -> Any:
        from dr_dask.jobs import run_incremental

        return run_incremental(source.format(**p), p["state"], client=None,
                               **{"n_batch": 120, "report": False, **kw})
    return call


def _api_refit(**kw: Any) -> Callable[[dict], Any]:
    def call(p: dict) -> Any:
        from dr_dask.jobs import run_refit

        return run_refit(f"{p['src']}:X", p["runs"], client=None, **kw)
    return call


def _corrupted(how: str, latest: bool = False) -> Callable[[dict], None]:
    """A copy of the complete run ``{run}/r`` at ``{tmp}/copy.zarr`` whose embedding chunk was
    overwritten with random bytes of its size (``random``) or truncated; with ``latest``, a
    refit job's ``latest.json`` naming it."""

    def setup(p: dict) -> None:
        import shutil

        shutil.copytree(p["run"], os.path.join(p["tmp"], "copy.zarr"))
        chunk = os.path.join(p["tmp"], "copy.zarr", "r", "embedding", "c", "0", "0")
        size = os.path.getsize(chunk)
        with open(chunk, "r+b") as fh:
            if how == "random":
                fh.write(np.random.default_rng(3).bytes(size))
            else:
                fh.truncate(size // 2)
        if latest:
            with open(os.path.join(p["tmp"], "copy.zarr", "latest.json"), "w") as fh:
                json.dump({"run": "r", "metrics": {}}, fh)
    return setup


def _api_embed(out: str) -> Callable[[dict], Any]:
    def call(p: dict) -> Any:
        from dr_dask.methods.ikd import IKD
        from dr_dask.runs.group import run_embedding

        return run_embedding(IKD(n_components=2), f"{p['src']}:X", out.format(**p),
                             method="ikd")
    return call


def _api_html(out: str) -> Callable[[dict], Any]:
    def call(p: dict) -> Any:
        from dr_dask.report.html import html_report

        return html_report(f"{p['run']}/r", out.format(**p))
    return call


def _unfitted_model(p: dict) -> Any:
    from dr_dask.stream import StreamRunner

    return StreamRunner(p["out"], p["stream"], GPIsomap()).run()


CASES = [
    # ------------------------------------------------------------------ stream run (CLI)
    Case("stream-kernel-evil", (*STREAM, "--batch", "{batch}", "--kernel", "evil"), 2,
         "kernel", ("{out}",)),
    Case("stream-no-model", STREAM, 2, "--model or --batch", ("{out}",)),
    Case("stream-missing-source", (*T, "stream", "run", "{tmp}/nope", "--out", "{out}",
                                   "--model", "{model}"), 2, "nope", ("{out}",)),
    Case("stream-model-not-a-model", (*STREAM, "--model", "{src}"), 2, "src.zarr",
         ("{out}",)),
    Case("stream-batch-missing", (*STREAM, "--batch", "{tmp}/none.npy"), 2, "none.npy",
         ("{out}",)),
    Case("stream-batch-nan", (*STREAM, "--batch", "{nan}:X"), 2, "NaN", ("{out}",)),
    Case("stream-n-s-zero", (*STREAM, "--model", "{model}", "--n-s", "0"), 2, "--n-s",
         ("{out}",)),
    Case("stream-chunk-negative", (*STREAM, "--model", "{model}", "--chunk-size", "-1"), 2,
         "--chunk-size", ("{out}",)),
    Case("stream-sigma-zero", (*STREAM, "--model", "{model}", "--sigma-t", "0"), 2,
         "--sigma-t", ("{out}",)),
    Case("stream-noise-negative", (*STREAM, "--batch", "{batch}", "--noise-variance", "-1"), 2,
         "--noise-variance", ("{out}",)),
    Case("stream-poll-zero", (*STREAM, "--model", "{model}", "--follow", "--poll", "0"), 2,
         "--poll", ("{out}",)),
    Case("stream-seed-negative", (*STREAM, "--batch", "{batch}", "--seed", "-3"), 2, "--seed",
         ("{out}",)),
    Case("stream-lease-expires-soon", (*T, "stream", "run", "{stream}", "--out", "{leased}",
                                       "--model", "{model}"), 2, "lease.json",
         ("{leased}/checkpoint.json",),
         setup=_lease(json.dumps({"owner": "h:1:a", "token": 1, "expires": "soon"}))),
    Case("stream-lease-token-abc", (*T, "stream", "run", "{stream}", "--out", "{leased}",
                                    "--model", "{model}"), 2, "lease.json",
         ("{leased}/checkpoint.json",),
         setup=_lease(json.dumps({"owner": "h:1:a", "token": "abc", "expires": 0}))),
    Case("stream-lease-not-json", (*T, "stream", "run", "{stream}", "--out", "{leased}",
                                   "--model", "{model}"), 2, "lease.json",
         ("{leased}/checkpoint.json",), setup=_lease("{not json")),
    Case("stream-lease-owner-number", (*T, "stream", "run", "{stream}", "--out", "{leased}",
                                       "--model", "{model}"), 2, "lease.json",
         ("{leased}/checkpoint.json",),
         setup=_lease(json.dumps({"owner": 5, "token": 1, "expires": 0}))),
    Case("stream-lease-held", (*T, "stream", "run", "{stream}", "--out", "{leased}",
                               "--model", "{model}"), 1, "another-host",
         ("{leased}/checkpoint.json",), setup=_lease(LIVE)),
    Case("stream-report-not-a-store", (*T, "stream", "report", "{src}"), 2, "checkpoint.json"),
    # ------------------------------------------------------------ job incremental (CLI)
    Case("incr-missing-source", (*T, "job", "incremental", "{tmp}/gone.zarr:X", "--state",
                                 "{state}"), 2, "gone.zarr", ("{state}",)),
    Case("incr-group-two-arrays", (*T, "job", "incremental", "{two}", "--state", "{state}"), 2,
         "name the variable", ("{state}",)),
    Case("incr-missing-variable", (*T, "job", "incremental", "{src}:Y", "--state", "{state}"), 2,
         "'Y'", ("{state}",)),
    Case("incr-one-d", (*T, "job", "incremental", "{src}:ids", "--state", "{state}"), 2,
         "ids", ("{state}",)),
    Case("incr-n-batch-zero", (*INCR, "--n-batch", "0"), 2, "--n-batch", ("{state}",)),
    Case("incr-nan-batch", (*T, "job", "incremental", "{nan}:X", "--state", "{state}",
                            "--n-batch", "120"), 2, "n_batch", ("{state}",)),
    Case("incr-other-source", INCR, 2, "another --state", ("{state}/checkpoint.json",),
         setup=_other_source),
    Case("incr-lease-expires-soon", INCR, 2, "lease.json", ("{state}/checkpoint.json",),
         setup=_lease(json.dumps({"owner": "h:1:a", "token": 1, "expires": "soon"}),
                      "state")),
    Case("incr-lease-held", INCR, 1, "another-host", ("{state}/checkpoint.json",),
         setup=_lease(LIVE, "state")),
    Case("incr-sigma-negative", (*INCR, "--sigma-t", "-1"), 2, "--sigma-t", ("{state}",)),
    # ------------------------------------------------------------------ job refit (CLI)
    Case("refit-method-umap", (*REFIT, "--method", "umap"), 2, "--method", ("{runs}",)),
    Case("refit-missing-source", (*T, "job", "refit", "{tmp}/gone.zarr:X", "--runs", "{runs}"),
         2, "gone.zarr", ("{runs}",)),
    Case("refit-n-components-zero", (*REFIT, "-n", "0"), 2, "--n-components", ("{runs}",)),
    Case("refit-eval-rows-zero", (*REFIT, "--eval-rows", "0"), 2, "--eval-rows", ("{runs}",)),
    Case("refit-one-d", (*T, "job", "refit", "{src}:ids", "--runs", "{runs}"), 2, "ids",
         ("{runs}",)),
    # ------------------------------------------------------------------ embed (CLI)
    Case("embed-missing-input", (*T, "embed", "ikd", "-n", "2", "--input", "{tmp}/gone.zarr",
                                 "--out", "{out}"), 2, "gone.zarr", ("{out}",)),
    Case("embed-nan-input", (*T, "embed", "ikd", "-n", "2", "--input", "{nan}:X", "--out",
                             "{out}"), 2, "NaN", ("{out}",)),
    Case("embed-out-inside-input", (*T, "embed", "ikd", "-n", "2", "--input", "{src}:X",
                                    "--out", "{src}/inner.zarr"), 2, "would overwrite the input",
         ("{src}/inner.zarr",)),
    Case("embed-n-zero", (*EMBED, "-n", "0"), 2, "--n-components", ("{out}",)),
    Case("embed-isomap-k-zero", (*T, "embed", "isomap", "-k", "0", "--input", "{src}:X",
                                 "--out", "{out}"), 2, "--n-neighbors", ("{out}",)),
    Case("embed-not-zarr", (*T, "embed", "ikd", "-n", "2", "--input", "{text}", "--out",
                            "{out}"), 2, "notes.txt", ("{out}",)),
    # ------------------------------------------------------------ options every command shares
    Case("storage-option-unknown-local", ("--storage-option", "endpont_url=http://x", *EMBED),
         2, "endpont_url", ("{out}",)),
    Case("storage-option-unknown-s3", ("--storage-option", "regoin=eu", *T, "embed", "ikd",
                                       "-n", "2", "--input", "s3://no-bucket/x.zarr:X",
                                       "--out", "{out}"), 2, "regoin", ("{out}",)),
    Case("storage-option-no-equals", ("--storage-option", "anon", *EMBED), 2, "KEY=VALUE",
         ("{out}",)),
    Case("wait-for-workers-word", ("--wait-for-workers", "soon", *EMBED), 2,
         "--wait-for-workers", ("{out}",)),
    Case("wait-for-workers-negative", ("--wait-for-workers", "-5", *EMBED), 2,
         "--wait-for-workers", ("{out}",)),
    Case("workers-zero", ("--workers", "0", *EMBED), 2, "--workers", ("{out}",)),
    Case("scheduler-file-missing", ("--scheduler-file", "{tmp}/sched.json", "job", "refit",
                                    "{src}:X", "--runs", "{runs}"), 2, "sched.json",
         ("{runs}",)),
    Case("tls-scheduler-without-tls", ("--scheduler", "tls://127.0.0.1:1", "job", "refit",
                                       "{src}:X", "--runs", "{runs}"), 2, "--tls-ca-file",
         ("{runs}",)),
    Case("tls-ca-not-a-certificate", ("--scheduler", "tls://127.0.0.1:1", "--tls-ca-file",
                                      "{text}", "--tls-cert", "{cert}", "--tls-key", "{key}",
                                      "job", "refit", "{src}:X", "--runs", "{runs}"), 2,
         "--tls-ca-file", ("{runs}",)),
    Case("tls-cert-not-a-certificate", ("--scheduler", "tls://127.0.0.1:1", "--tls-ca-file",
                                        "{ca}", "--tls-cert", "{text}", "--tls-key", "{key}",
                                        "job", "refit", "{src}:X", "--runs", "{runs}"), 2,
         "--tls-cert", ("{runs}",)),
    Case("tls-key-of-another-cert", ("--scheduler", "tls://127.0.0.1:1", "--tls-ca-file",
                                     "{ca}", "--tls-cert", "{cert}", "--tls-key", "{otherkey}",
                                     "job", "refit", "{src}:X", "--runs", "{runs}"), 2,
         "--tls-key", ("{runs}",)),
    Case("tls-missing-key", ("--scheduler", "tls://127.0.0.1:1", "--tls-ca-file", "{ca}",
                             "--tls-cert", "{cert}", "job", "refit", "{src}:X", "--runs",
                             "{runs}"), 2, "--tls-key", ("{runs}",)),
    Case("scheduler-unreachable", ("--scheduler", "tcp://127.0.0.1:{closed}", "job", "refit",
                                   "{src}:X", "--runs", "{runs}"), 1, "127.0.0.1:{closed}",
         ("{runs}",)),
    Case("datasets-unknown-name", (*T, "datasets", "make", "nonesuch", "--out", "{out}"), 2,
         "nonesuch", ("{out}",)),
    Case("unknown-command", ("nonesuch",), 2, "nonesuch"),
    # ------------------------------------------------------------------ the API
    Case("api-stream-n-s-zero", _api_stream(n_s=0), 2, "n_s", ("{out}",)),
    Case("api-stream-chunk-size-zero", _api_stream(chunk_size=0), 2, "chunk_size", ("{out}",)),
    Case("api-stream-no-model", _api_stream(model=False), 2, "fitted model", ("{out}",)),
    Case("api-stream-unfitted-model", _unfitted_model, 2, "sigma_t_", ("{out}",)),
    Case("api-incr-unknown-param", _api_incremental(n_bach=5), 2, "n_bach", ("{state}",)),
    Case("api-incr-n-s-zero", _api_incremental(n_s=0), 2, "n_s", ("{state}",)),
    Case("api-incr-sigma-negative", _api_incremental(sigma_t=-1.0), 2, "sigma_t", ("{state}",)),
    Case("api-incr-missing-source", _api_incremental(source="{tmp}/gone.zarr:X"), 2,
         "gone.zarr", ("{state}",)),
    Case("api-refit-method", _api_refit(method="umap"), 2, "umap", ("{runs}",)),
    Case("api-refit-n-components", _api_refit(n_components=0), 2, "n_components", ("{runs}",)),
    Case("api-refit-unknown-param", _api_refit(tci=3), 2, "tci", ("{runs}",)),
    # ------------------------------------------- outputs that cannot be written (named, 2)
    Case("embed-out-proc", (*T, "embed", "ikd", "-n", "2", "--input", "{src}:X", "--out",
                            "/proc/dr-dask-out.zarr"), 2, "/proc/dr-dask-out.zarr"),
    Case("embed-out-sys", (*T, "embed", "ikd", "-n", "2", "--input", "{src}:X", "--out",
                           "/sys/dr-dask-out.zarr"), 2, "/sys/dr-dask-out.zarr"),
    Case("embed-out-under-a-file", (*T, "embed", "ikd", "-n", "2", "--input", "{src}:X",
                                    "--out", "{text}/out.zarr"), 2, "notes.txt/out.zarr"),
    Case("embed-out-read-only", (*T, "embed", "ikd", "-n", "2", "--input", "{src}:X",
                                 "--out", "{ro}/out.zarr"), 2, "Read-only file system",
         ("{ro}/out.zarr",), mount="ro"),
    Case("embed-out-full-disk", (*T, "embed", "ikd", "-n", "2", "--input", "{src}:X",
                                 "--out", "{full}/out.zarr"), 2, "bytes free there", mount="full"),
    Case("embed-isomap-out-proc", (*T, "embed", "isomap", "--input", "{src}:X", "--out",
                                   "/proc/dr-dask-out.zarr"), 2, "/proc/dr-dask-out.zarr"),
    Case("refit-runs-proc", (*T, "job", "refit", "{src}:X", "--runs", "/proc/runs.zarr"), 2,
         "/proc/runs.zarr"),
    Case("refit-runs-under-a-file", (*T, "job", "refit", "{src}:X", "--runs",
                                     "{text}/runs.zarr"), 2, "notes.txt/runs.zarr"),
    Case("incr-state-proc", (*T, "job", "incremental", "{src}:X", "--state", "/proc/state",
                             "--n-batch", "120", "--no-report"), 2, "/proc/state"),
    Case("stream-out-proc", (*T, "stream", "run", "{stream}", "--out", "/proc/stream-out",
                             "--model", "{model}"), 2, "/proc/stream-out"),
    Case("stream-out-read-only", (*T, "stream", "run", "{stream}", "--out", "{ro}/s",
                                  "--model", "{model}"), 2, "{ro}/s", ("{ro}/s",), mount="ro"),
    Case("datasets-out-proc", (*T, "datasets", "make", "gp", "-T", "20", "-N", "5", "--out",
                               "/proc/d.zarr"), 2, "/proc/d.zarr"),
    Case("datasets-out-read-only", (*T, "datasets", "make", "gp", "-T", "20", "-N", "5",
                                    "--out", "{ro}/d.zarr"), 2, "{ro}/d.zarr",
         ("{ro}/d.zarr",), mount="ro"),
    Case("api-embed-out-proc", _api_embed("/proc/dr-dask-api.zarr"), 2,
         "/proc/dr-dask-api.zarr"),
    Case("api-embed-out-full-disk", _api_embed("{full}/api.zarr"), 2, "bytes free there",
         mount="full"),
    Case("embed-out-sys-block", (*T, "embed", "ikd", "-n", "2", "--input", "{src}:X",
                                 "--out", "/sys/block/dr-dask.zarr"), 2,
         "/sys/block/dr-dask.zarr"),
    Case("datasets-out-under-a-file", (*T, "datasets", "make", "gp", "-T", "20", "-N", "5",
                                       "--out", "{text}/d.zarr"), 2, "notes.txt/d.zarr"),
    Case("stream-out-under-a-file", (*T, "stream", "run", "{stream}", "--out", "{text}/s",
                                     "--model", "{model}"), 2, "notes.txt/s"),
    Case("incr-state-under-a-file", (*T, "job", "incremental", "{src}:X", "--state",
                                     "{text}/state", "--n-batch", "120", "--no-report"), 2,
         "notes.txt/state"),
    Case("incr-state-read-only", (*T, "job", "incremental", "{src}:X", "--state",
                                  "{ro}/state", "--n-batch", "120", "--no-report"), 2,
         "{ro}/state", ("{ro}/state",), mount="ro"),
    Case("refit-runs-read-only", (*T, "job", "refit", "{src}:X", "--runs", "{ro}/runs.zarr"),
         2, "{ro}/runs.zarr", ("{ro}/runs.zarr",), mount="ro"),
    Case("refit-runs-full-disk", (*T, "job", "refit", "{src}:X", "--runs",
                                  "{full}/runs.zarr"), 2, "bytes free there", mount="full"),
    # ------------------------------------------ a report path that cannot be written (2)
    Case("report-html-sys", ("report", "{run}/r", "--html", "/sys/page.html"), 2,
         "/sys/page.html"),
    Case("report-stream-html-proc", ("report", "{stream_out}", "--html", "/proc/s.html"), 2,
         "/proc/s.html"),
    Case("evaluate-out-under-a-file", (*T, "evaluate", "--store", "{run}", "--embedding", "r",
                                       "--input", "{src}:X", "--out", "{text}/ev"), 2,
         "notes.txt/ev"),
    Case("report-html-proc", ("report", "{run}/r", "--html", "/proc/page.html"), 2,
         "/proc/page.html"),
    Case("report-html-under-a-file", ("report", "{run}/r", "--html", "{text}/page.html"), 2,
         "notes.txt/page.html"),
    Case("report-html-read-only", ("report", "{run}/r", "--html", "{ro}/page.html"), 2,
         "{ro}/page.html", ("{ro}/page.html",), mount="ro"),
    Case("report-html-full-disk", ("report", "{run}/r", "--html", "{full}/page.html"), 2,
         "bytes free there", ("{full}/page.html",), mount="full"),
    Case("api-report-html-proc", _api_html("/proc/api-page.html"), 2, "/proc/api-page.html"),
    Case("evaluate-out-proc", (*T, "evaluate", "--store", "{run}", "--embedding", "r",
                               "--input", "{src}:X", "--out", "/proc/ev"), 2, "/proc/ev"),
    Case("stream-report-out-proc", (*T, "stream", "report", "{stream_out}", "--out",
                                    "/proc/stream.png"), 2, "/proc/stream.png"),
    # ------------------------------------ a result changed since it was written (2, named)
    Case("report-corrupted-chunk", ("report", "{tmp}/copy.zarr/r", "--html",
                                    "{tmp}/page.html"), 2, "chunk embedding/c/0/0",
         ("{tmp}/page.html",), setup=_corrupted("random")),
    Case("report-truncated-chunk", ("report", "{tmp}/copy.zarr/r", "--html",
                                    "{tmp}/page.html"), 2, "chunk embedding/c/0/0",
         ("{tmp}/page.html",), setup=_corrupted("truncated")),
    Case("report-latest-names-a-corrupted-run", ("report", "{tmp}/copy.zarr", "--html",
                                                 "{tmp}/page.html"), 2,
         "chunk embedding/c/0/0", ("{tmp}/page.html",), setup=_corrupted("random", True)),
    Case("evaluate-corrupted-chunk", (*T, "evaluate", "--store", "{tmp}/copy.zarr",
                                      "--embedding", "r", "--input", "{src}:X"), 2,
         "chunk embedding/c/0/0", ("{tmp}/copy.zarr/r.report",), setup=_corrupted("random")),
    Case("evaluate-truncated-chunk", (*T, "evaluate", "--store", "{tmp}/copy.zarr",
                                      "--embedding", "r", "--input", "{src}:X"), 2,
         "chunk embedding/c/0/0", ("{tmp}/copy.zarr/r.report",),
         setup=_corrupted("truncated")),
    Case("evaluate-missing-run", (*T, "evaluate", "--store", "{run}", "--embedding", "nope",
                                  "--input", "{src}:X"), 2, "nope", ("{run}/nope.report",)),
]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    """The inputs every case reads (never written by a case)."""
    root = tmp_path_factory.mktemp("inputs")
    sc = shift_scenario(40, random_state=1)
    X = np.vstack([sc.batch, sc.stream])
    src = root / "src.zarr"
    g = zarr.open_group(str(src), mode="w")
    g.create_array("X", data=X, chunks=(40, 3))
    g.create_array("ids", data=np.arange(len(X)), chunks=(40,))
    zarr.consolidate_metadata(str(src))
    two = zarr.open_group(str(root / "two.zarr"), mode="w")
    two.create_array("A", data=X, chunks=(40, 3))
    two.create_array("B", data=X, chunks=(40, 3))
    bad = X.copy()
    bad[5, 1] = np.nan
    zarr.open_group(str(root / "nan.zarr"), mode="w").create_array("X", data=bad, chunks=(40, 3))
    np.save(root / "batch.npy", sc.batch)
    stream = root / "stream"
    stream.mkdir()
    np.save(stream / "000.npy", sc.stream[:20])
    model = str(root / "model.zarr")
    save_gp_isomap(GPIsomap(n_neighbors=10, random_state=0).fit(sc.batch), model)
    # a complete run (r) and a stream's output: what report and evaluate read
    run = str(root / "run.zarr")
    res = CliRunner().invoke(main, [*T, "embed", "ikd", "-n", "2", "--input", f"{src}:X",
                                    "--out", run, "--name", "r"])
    assert res.exit_code == 0, res.output
    stream_out = str(root / "stream-out")
    res = CliRunner().invoke(main, [*T, "stream", "run", str(stream), "--out", stream_out,
                                    "--model", model])
    assert res.exit_code == 0, res.output
    (root / "notes.txt").write_text("not a certificate, not a store\n")
    (root / "tls1").mkdir()
    (root / "tls2").mkdir()
    tls, other = tls_files(root / "tls1"), tls_files(root / "tls2")
    return {"src": str(src), "two": str(root / "two.zarr"), "nan": str(root / "nan.zarr"),
            "batch": str(root / "batch.npy"), "stream": str(stream), "model": model,
            "text": str(root / "notes.txt"), "ca": tls["ca_file"], "cert": tls["cert"],
            "key": tls["key"], "otherkey": other["key"], "run": run,
            "stream_out": stream_out}


def _mount_tmpfs(where: str, options: str) -> bool:
    """A tmpfs at ``where`` (root only); False where it cannot be mounted."""
    import subprocess

    os.makedirs(where, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", where],
                              capture_output=True, check=False, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@pytest.fixture(scope="module")
def mounts(tmp_path_factory):
    """A read-only filesystem (EROFS) and a full one (ENOSPC), both real tmpfs mounts; None
    for each that cannot be mounted here (not root, no mount): their cases skip."""
    import subprocess

    root = tmp_path_factory.mktemp("mounts")
    ro, full = str(root / "ro"), str(root / "full")
    found = {"ro": ro if _mount_tmpfs(ro, "ro,size=64k") else None,
             "full": full if _mount_tmpfs(full, "size=64k") else None}
    if found["full"]:
        try:  # fill it
            with open(os.path.join(full, "filler"), "wb") as fh:
                while True:
                    fh.write(b"\0" * 4096)
                    fh.flush()
        except OSError:
            pass
    yield found
    for where in found.values():
        if where:
            subprocess.run(["umount", "-l", where], capture_output=True, check=False,
                           timeout=30)


def _snapshot(path: str) -> dict:
    return {os.path.join(d, f): os.path.getmtime(os.path.join(d, f))
            for d, _, fs in os.walk(path) for f in fs}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_exit_class(case: Case, files, mounts, tmp_path, dr_config):
    dr_config({"storage.read-attempts": 1, "cluster.wait-for-workers": 1})
    import dask

    if case.mount is not None and mounts[case.mount] is None:
        pytest.skip(f"no tmpfs could be mounted here for a {case.mount} filesystem")
    p = {**files, **mounts, "tmp": str(tmp_path), "out": str(tmp_path / "out.zarr"),
         "state": str(tmp_path / "state"), "runs": str(tmp_path / "runs.zarr"),
         "leased": str(tmp_path / "leased"), "closed": str(_closed_port())}
    if case.setup is not None:
        case.setup(p)
    before = {k: _snapshot(files[k]) for k in ("src", "stream", "model", "run")}
    if callable(case.args):
        call = case.args

        @click.group(cls=App)
        def api() -> None:
            pass

        @api.command()
        def go() -> None:
            call(p)

        command, args = api, ["go"]
    else:
        command, args = main, [a.format(**p) for a in case.args]
    with dask.config.set({"distributed.comm.timeouts.connect": "2s"}):
        res = CliRunner().invoke(command, args)
    err = res.stderr
    assert res.exit_code == case.code, (args, res.output)
    assert "Traceback" not in res.output, res.output
    errors = [line for line in err.splitlines() if line.lower().startswith("error:")]
    assert len(errors) == 1, err
    assert case.names.format(**p) in errors[0], err
    assert "internal error" not in err
    for path in case.leaves:
        assert not os.path.exists(path.format(**p)), f"{path} left behind"
    # the inputs are never modified
    assert before == {k: _snapshot(files[k]) for k in ("src", "stream", "model", "run")}


def test_the_table_covers_every_surface():
    assert len(CASES) >= 100
    assert {c.code for c in CASES} == {1, 2}
    kinds = {"stream": 0, "incr": 0, "refit": 0, "api": 0, "embed": 0, "report": 0,
             "evaluate": 0}
    for c in CASES:
        for k in kinds:
            kinds[k] += c.id.startswith(k)
    assert min(kinds.values()) >= 4, kinds


@pytest.mark.cluster
@pytest.mark.parametrize("command", ["incremental", "stream"])
def test_no_worker_exits_1_naming_the_scheduler(command, files, tmp_path, caplog, monkeypatch,
                                                dr_config):
    """A scheduler without workers: the command waits --wait-for-workers with a progress line,
    then exits 1 naming the scheduler (the nightly job used to hang on it)."""
    import time

    from distributed import LocalCluster

    # what --wait-for-workers sets for the rest of the process, restored after the test
    monkeypatch.setenv("DASK_DR_DASK__CLUSTER__WAIT_FOR_WORKERS", "60s")
    dr_config({"cluster.wait-for-workers": 60})

    with LocalCluster(n_workers=0, processes=False, protocol="tcp", dashboard_address=None) as lc, \
            caplog.at_level(logging.WARNING, logger="dr_dask.runtime.cluster"):
        address = lc.scheduler_address
        state = str(tmp_path / "state")
        args = (["job", "incremental", f"{files['src']}:X", "--state", state, "--n-batch", "120"]
                if command == "incremental" else
                ["stream", "run", files["stream"], "--out", state, "--batch", files["batch"]])
        t0 = time.perf_counter()
        res = CliRunner().invoke(main, ["--scheduler", address, "--wait-for-workers", "2s",
                                        *args])
        took = time.perf_counter() - t0
    assert res.exit_code == 1, res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and address in errors[0] and "within 2 s" in errors[0], res.stderr
    assert f"no worker on the scheduler {address}: waiting up to 2 s" in caplog.text  # progress
    assert "Traceback" not in res.output and not os.path.exists(state)
    assert took < 60


def _pool_race_error() -> RuntimeError:
    """The RuntimeError distributed's connection pool raises when a connection it is making
    is removed twice (the scheduler going away): real pool, a real server that never answers."""
    import asyncio

    from distributed.core import ConnectionPool

    async def race() -> RuntimeError:
        async def silent(reader: Any, writer: Any) -> None:
            await asyncio.sleep(30)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        addr = f"tcp://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        pool = ConnectionPool()
        await pool.start()
        connecting = asyncio.ensure_future(pool.connect(addr, timeout=10))
        await asyncio.sleep(0.5)
        pool.remove(addr)
        await asyncio.sleep(0)  # the first removal's timeout fires: the scope is expiring
        try:
            pool.remove(addr)
        except RuntimeError as exc:
            return exc
        finally:
            await asyncio.gather(connecting, return_exceptions=True)
            await pool.close()
            server.close()
        raise AssertionError("the second removal did not raise")

    return asyncio.run(race())


def test_connection_pool_race_is_a_lost_cluster_not_a_bug():
    """The scheduler killed as a command joins it can surface as distributed's "Cannot change
    state of expiring Timeout": exit 1 saying the cluster was lost, never "internal error"."""
    from dr_dask.runtime.cluster import cluster_gone

    exc = _pool_race_error()
    assert "expiring" in str(exc) and cluster_gone(exc)
    assert not cluster_gone(RuntimeError("Cannot change state of expiring Timeout"))

    @click.group(cls=App)
    def app() -> None:
        pass

    @app.command()
    def fit() -> None:
        raise exc

    res = CliRunner().invoke(app, ["fit"])
    assert res.exit_code == 1
    assert "the Dask cluster was lost" in res.output and "internal error" not in res.output


def test_one_table_of_exit_codes():
    """The CLI's --help, the workflow runner, the Kubernetes submitter and the docs take their
    codes from dr_dask.runtime.exits; the docs hold its table verbatim."""
    import importlib.util
    import pathlib

    from dr_dask.cli._app import EXIT_CODES
    from dr_dask.jobs import workflow
    from dr_dask.runtime import exits

    root = pathlib.Path(__file__).parent.parent
    assert exits.markdown_table() in (root / "docs" / "workflows.md").read_text()
    assert exits.help_text() == EXIT_CODES and main.epilog == EXIT_CODES
    res = CliRunner().invoke(main, ["--help"])
    assert "Exit codes:" in res.output and "full disk" in res.output
    assert workflow.retried is exits.retried
    spec = importlib.util.spec_from_file_location(
        "submit_daskjob", root / "deploy" / "kubernetes" / "submit_daskjob.py")
    assert spec is not None and spec.loader is not None
    submit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(submit)
    assert submit.classed is exits.classed
    assert (submit.EXIT_OK, submit.EXIT_TRANSIENT, submit.EXIT_BAD_INPUT) == (0, 1, 2)
    assert [exits.classed(c) for c in (0, 1, 2, 3, 137, -9, None)] == [0, 1, 2, 1, 1, 1, 1]
