"""``dr-dask stream ...``: scenarios, the runner, reports; and ``dr-dask bench stream``."""

from __future__ import annotations

import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

import click

from dr_dask.cli._app import (
    POSITIVE,
    POSITIVE_REAL,
    bench,
    cluster,
    fail,
    json_option,
    mapping_options,
    n_neighbors_option,
    seed_option,
    storage_options,
    stream,
)

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)


@stream.command("make-scenario")
@click.argument("out")
@click.option("--scenario", type=click.Choice(["shift", "drift"]), default="shift",
              show_default=True,
              help="shift: the stream moves to unseen patches; drift: it drifts gradually.")
@click.option("--n-per-patch", type=POSITIVE, default=1000, show_default=True,
              help="shift: train and test points per patch (paper: 1000).")
@click.option("--n-batch", type=POSITIVE, default=1000, show_default=True,
              help="drift: batch size.")
@click.option("--n-stream", type=POSITIVE, default=3000, show_default=True,
              help="drift: stream size.")
@click.option("--ambient-dim", type=click.IntRange(min=3), default=3, show_default=True,
              help="Dimension the 2-D swiss roll is embedded in (>= 3).")
@click.option("--kind", type=click.Choice(["npy-dir", "zarr"]), default="npy-dir",
              show_default=True, help="Stream source format.")
@click.option("--chunk-size", type=POSITIVE, default=250, show_default=True,
              help="Rows per stream chunk.")
@seed_option()
@click.pass_context
def make_scenario(ctx, out, scenario, n_per_patch, n_batch, n_stream, ambient_dim, kind,
                  chunk_size, seed):
    """Write the Euler swiss-roll SCENARIO (batch, stream source, ground truth) to OUT (a
    directory or URL)."""
    from dr_dask.datasets.swiss_roll import (
        drift_scenario,
        shift_scenario,
        write_scenario,
    )

    if scenario == "shift":
        sc = shift_scenario(n_per_patch, ambient_dim=ambient_dim, random_state=seed)
    else:
        sc = drift_scenario(n_batch, n_stream, ambient_dim=ambient_dim, random_state=seed)
    meta = write_scenario(sc, out, kind=kind, chunk_size=chunk_size,
                          storage_options=storage_options(ctx))
    click.echo(json.dumps(meta, indent=2))


def _load_batch(path: str, storage_options: dict) -> np.ndarray:
    import numpy as np

    from dr_dask.io.inputs import InputError, open_dataset
    from dr_dask.runtime.cluster import compute

    try:
        data = open_dataset(path, None, storage_options).data
    except (InputError, ValueError) as exc:
        fail(str(exc))
    (rows,) = compute(data)  # never waits forever on a cluster without workers
    return np.asarray(rows, dtype=np.float64)


def _new_model(so: dict, client: Any, model_path: str | None, batch: str | None,
               holdout: str | None, sigma_t: float | None, **fit: Any) -> Any:
    """A new stream's model: loaded from --model or fitted on --batch, its threshold from
    --sigma-t or calibrated on --holdout (each failure exit 2, naming the option)."""

    from dr_dask.io.storage import location
    from dr_dask.methods.gp_isomap import GPIsomap

    if model_path:
        from dr_dask.methods.gp_isomap_io import ModelFormatError, load_gp_isomap

        try:
            model, _ = load_gp_isomap(location(model_path, so))
        except ModelFormatError as exc:
            fail(str(exc))
    else:
        assert batch is not None  # the command refused a new stream with neither option
        rows = _load_batch(batch, so)
        try:
            model = GPIsomap(
                n_neighbors=fit["n_neighbors"], kernel=fit["kernel"],
                length_scale=fit["length_scale"], noise_variance=fit["noise_variance"],
                sigma_t=sigma_t, random_state=fit["seed"], client=client,
            ).fit(rows)
        except ValueError as exc:  # rejected rows or parameters (--kernel, ...)
            fail(f"the model fitted on --batch {batch}: {exc}")
    if holdout and sigma_t is None:
        rows = _load_batch(holdout, so)
        try:
            model.calibrate_threshold(rows)
        except ValueError as exc:
            fail(f"--holdout {holdout}: {exc}")
    elif sigma_t is not None:
        model.sigma_t_, model.threshold_source_ = float(sigma_t), "manual"
    return model


@stream.command("run")
@click.argument("source")
@click.option("--out", required=True, help="Output store, path or URL (resumed if present).")
@click.option("--model", "model_path",
              help="A fitted GPIsomap saved by dr_dask.methods.gp_isomap_io (a Zarr group: path "
              "or URL).")
@click.option("--batch", help="Batch to fit the model on (Zarr/NetCDF/.npy), if no --model.")
@click.option("--holdout", help="Held-out batch-distribution points to calibrate sigma_t.")
@click.option("--sigma-t", type=POSITIVE_REAL, default=None,
              help="Novelty threshold (overrides calibration).")
@mapping_options
@click.option("--follow", is_flag=True, help="Keep polling the source for new data.")
@click.option("--poll", type=POSITIVE_REAL, default=1.0, show_default=True,
              help="Seconds between polls.")
@n_neighbors_option("Graph k of the model fitted on --batch.", short=False)
@click.option("--kernel", default="geodesic_se", show_default=True,
              help="GP kernel of the model fitted on --batch.")
@click.option("--length-scale", type=POSITIVE_REAL, default=None,
              help="GP length scale (default: fitted).")
@click.option("--noise-variance", type=click.FloatRange(min=0), default=0.01,
              show_default=True, help="GP noise variance.")
@seed_option("Random seed of the model fit.")
@click.pass_context
def run(ctx, source, out, model_path, batch, holdout, sigma_t, n_s, chunk_size, max_in_flight,
        strict, follow, poll, n_neighbors, kernel, length_scale,
        noise_variance, seed):
    """Stream SOURCE (directory of .npy chunks, Zarr array) through GP-Isomap into --out.

    SIGTERM or Ctrl-C finishes the chunks in flight, checkpoints and exits 0; rerunning the
    same command resumes.
    """
    from dr_dask.io.storage import location
    from dr_dask.stream.runner import StreamRunner
    from dr_dask.stream.store import StreamStore

    so = storage_options(ctx)
    try:
        if not location(source, so).exists():
            fail(f"stream source {source!r} does not exist")
        resuming = StreamStore(out, so).exists()
    except ValueError as exc:  # an unusable location: scheme, credentials, endpoint
        fail(str(exc))
    if not resuming and not (model_path or batch):
        fail("a new stream needs --model or --batch")
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(cluster(ctx))  # None with --scheduler threads
        model = None if resuming else _new_model(
            so, client, model_path, batch, holdout, sigma_t, n_neighbors=n_neighbors,
            kernel=kernel, length_scale=length_scale, noise_variance=noise_variance, seed=seed)
        runner = StreamRunner(
            out, source, model, n_s=n_s, chunk_size=chunk_size, strict_sequential=strict,
            max_in_flight=max_in_flight, follow=follow, poll_interval=poll, client=client,
            storage_options=so,
        )
        summary = runner.run()
    click.echo(json.dumps(summary))


@stream.command("report")
@click.argument("store")
@click.option("--out", "out_png", default=None, help="PNG path (default STORE/report.png).")
@click.option("--window", type=POSITIVE, default=50, show_default=True, help="Running-mean window.")
@click.pass_context
def report(ctx, store, out_png, window):
    """Plot variance over stream time (running mean, refits) and the embedding by version."""
    from dr_dask.io.storage import location
    from dr_dask.report.stream import stream_report
    from dr_dask.stream.store import StreamStore

    store = location(store, storage_options(ctx))
    if not StreamStore(store).exists():
        fail(f"{store} is not a stream output store (no checkpoint.json)")
    summary = stream_report(store, location(out_png, store.storage_options) if out_png
                            else store.child("report.png"), window)
    click.echo(json.dumps(summary, indent=2))


@bench.command("stream")
@click.option("--quick", is_flag=True, help="Small sizes, one repeat (smoke run).")
@json_option
@click.option("--workdir", default=None, help="Scratch directory (default: a temporary one).")
@click.pass_context
def bench_stream(ctx, quick, json_path, workdir):
    """Mapping throughput vs sklearn, refit latency, runner RSS, shift detection."""
    from dr_dask.bench.stream import run_benchmarks

    with cluster(ctx) as client:
        report = run_benchmarks(client, quick=quick, out=json_path, workdir=workdir)
    click.echo(report)
