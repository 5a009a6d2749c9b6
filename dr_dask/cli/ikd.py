"""``dr-dask embed ikd``, ``dr-dask quickstart`` and ``dr-dask bench ikd``."""

from __future__ import annotations

import json
import logging

import click

from dr_dask.cli._app import (
    POSITIVE,
    POSITIVE_REAL,
    bench,
    cluster,
    embed,
    fail,
    json_option,
    knn_options,
    main,
    n_neighbors_option,
    options,
    run_options,
    seed_option,
    storage_options,
)

logger = logging.getLogger(__name__)


#: The options of an IKD estimator (``embed ikd``).
ikd_options = options(
    click.option("-n", "--n-components", type=POSITIVE, required=True,
                 help="Latent dimension M (at most the number of features - 1)."),
    click.option("--kernel", default="se", show_default=True,
                 help="se | rational_quadratic | gamma_exponential | matern"),
    click.option("--alpha", type=POSITIVE_REAL, default=1.0, show_default=True,
                 help="Rational-quadratic alpha (> 0)."),
    click.option("--gamma", type=click.FloatRange(0, 2, min_open=True), default=1.0,
                 show_default=True, help="Gamma-exponential gamma, in (0, 2]."),
    click.option("--nu", type=POSITIVE_REAL, default=1.5, show_default=True,
                 help="Matérn nu (> 0)."),
    click.option("--similarity", type=click.Choice(["correlation", "covariance"]),
                 default="correlation", show_default=True,
                 help="Sample similarity S = Xn Xn^T from correlations or covariances."),
    click.option("--reference", type=click.Choice(["min_max", "min_mean", "center"]),
                 default=None, help="Reference point (default: per solver)."),
    click.option("--solver", type=click.Choice(["full", "geodesic", "blockwise"]),
                 default="full", show_default=True,
                 help="full: all T x T distances (tiled); geodesic: along a kNN graph; "
                 "blockwise: per-clique solves merged."),
    n_neighbors_option("Geodesic solver: kNN graph size.", default=5, short=False),
    knn_options,
    click.option("--landmarks", "n_landmarks", type=click.IntRange(min=2), default=None,
                 help="Landmark IKD with this many landmarks (large T)."),
    click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float64",
                 show_default=True,
                 help="Precision of the distance tiles (float32 halves memory and disk)."),
    click.option("--tile-size", type=POSITIVE, default=4096, show_default=True,
                 help="Rows per tile of the T x T distance matrix (memory per task grows "
                 "with its square)."),
    click.option("--tile-cache", type=click.Choice(["auto", "memory", "disk"]), default="auto",
                 show_default=True, help="Where distance tiles live between passes."),
    seed_option("Random seed of every randomized step.", dest="random_state"),
)


def make_ikd(**kw):
    from dr_dask.methods.ikd import IKD

    return IKD(**kw)


@embed.command("ikd")
@run_options
@ikd_options
@click.pass_context
def embed_ikd(ctx, source, out, name, overwrite, drop_cache, **params):
    """Fit IKD on a stored dataset and write the embedding into OUT."""
    from dr_dask.io.inputs import InputError, open_dataset
    from dr_dask.runs.group import run_attr, run_embedding

    try:
        with cluster(ctx) as client:
            # the input's boundary before an estimator loads: a bad input is refused fast
            inp = open_dataset(source, None, storage_options(ctx))
            est = make_ikd(**params, client=client, progress=True)
            run = run_embedding(est, inp, out, method="ikd", name=name, overwrite=overwrite,
                                storage_options=storage_options(ctx), drop_cache=drop_cache)
    except (InputError, ValueError) as exc:
        fail(str(exc))
    # stdout is the JSON summary alone, for scripts; the human note goes to stderr
    click.echo(f"embedding written to {run.path} (array 'embedding')", err=True)
    click.echo(json.dumps({"path": run.path, **run_attr(run.group, "summary")}, indent=2))


@main.command()
@click.option("--out", default="dr_dask_quickstart", show_default=True,
              help="Directory or URL for the dataset, the run, the metrics and the plot.")
@click.option("-T", "n_samples", type=click.IntRange(min=10), default=1000, show_default=True,
              help="Samples (rows) of the generated dataset.")
@click.option("-N", "n_features", type=click.IntRange(min=3), default=500, show_default=True,
              help="Features (columns) of the generated dataset.")
@click.option("--warm/--no-warm", default=True, show_default=True,
              help="Then compile the kernels of a notebook's first fits (Isomap, geodesic "
                   "IKD of a NumPy array, no client) into numba's cache, once.")
@seed_option("Random seed of the data and the fit.")
@click.pass_context
def quickstart(ctx, out, n_samples, n_features, warm, seed):
    """Generate the paper's GP-mapping dataset, run IKD on a LocalCluster, report.

    Writes OUT/data.zarr (X and the true latent), OUT/runs.zarr (the embedding), OUT/metrics.json
    (R^2 against the latent for IKD and the PCA baseline, IKD's eigenvalues) and
    OUT/embedding.png (the embedding coloured by the latent, the spectrum, the numbers).
    """
    from dr_dask.io.storage import StorageError
    from dr_dask.jobs.quickstart import quickstart_run, warm_kernels

    try:
        with cluster(ctx) as client:
            result = quickstart_run(out, n_samples, n_features, seed, client,
                                    storage_options(ctx))
    except StorageError as exc:  # an unusable --out: scheme, credentials, endpoint, bucket
        fail(str(exc))
    click.echo(json.dumps(result["metrics"], indent=2))
    for label, path in result["paths"].items():
        click.echo(f"{label:>10}: {path}")
    if warm:  # after the cluster: the fits of a notebook with no client
        click.echo(f"kernels compiled for a first fit in a notebook ({warm_kernels(seed):.1f} s; "
                   "cached, once)", err=True)


@bench.command("ikd")
@click.option("--quick", is_flag=True, help="Small sizes (a smoke run, minutes -> seconds).")
@click.option("--only", type=click.Choice(["similarity", "incore", "outofcore"]), multiple=True,
              help="Run only these cases (default: all).")
@click.option("--out-of-core-T", "ooc_T", type=click.IntRange(min=100), default=60_000,
              show_default=True, help="Samples of the out-of-core case.")
@click.option("--workdir", default=None,
              help="Where the out-of-core tiles go (default: a temp dir).")
@json_option
@click.pass_context
def bench_ikd(ctx, quick, only, ooc_T, workdir, json_path):
    """IKD: distance-tile throughput vs GEMM, in-core vs dense NumPy, out-of-core peak RSS."""
    from dr_dask.bench._common import write_report
    from dr_dask.bench.ikd import run_bench

    with cluster(ctx) as client:
        results = run_bench(client, quick=quick, only=set(only), ooc_T=ooc_T, workdir=workdir)
    click.echo(write_report(results, json_path))


@bench.command("io")
@click.option("-T", "n_samples", type=click.IntRange(min=10), default=20_000, show_default=True,
              help="Samples.")
@click.option("-N", "n_features", type=click.IntRange(min=3), default=1_000, show_default=True,
              help="Features.")
@click.option("--repeats", type=POSITIVE, default=1, show_default=True, help="Timed fits per side.")
@click.option("--bucket", default=None,
              help="Use this bucket at $AWS_ENDPOINT_URL (default: a local moto S3 server).")
@click.option("--checksum-rows", type=POSITIVE, default=1_000_000, show_default=True,
              help="Rows of the local embedding the result checksums are also timed on.")
@json_option
@click.pass_context
def bench_io(ctx, n_samples, n_features, repeats, bucket, checksum_rows, json_path):
    """The same IKD fit from local disk and from S3: both times, the ratio, S3 requests; and
    the cost of a result's checksums (its completion mark, a reader's check) on each side."""
    from dr_dask.bench._common import write_report
    from dr_dask.bench.io import run_bench

    with cluster(ctx) as client:
        results = run_bench(client, T=n_samples, N=n_features, repeats=repeats, bucket=bucket,
                            checksum_rows=checksum_rows)
    click.echo(write_report(results, json_path))
