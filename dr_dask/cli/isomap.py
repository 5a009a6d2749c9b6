"""``dr-dask embed isomap`` and ``dr-dask bench isomap``."""

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
    n_neighbors_option,
    run_options,
    seed_option,
    storage_options,
)

logger = logging.getLogger(__name__)


@embed.command("isomap")
@run_options
@click.option("-n", "--n-components", type=POSITIVE, default=2, show_default=True,
              help="Embedding dimension (below the number of samples).")
@n_neighbors_option("Neighbours per point in the kNN graph.")
@click.option("--radius", type=POSITIVE_REAL, default=None,
              help="Epsilon rule instead of k (full only).")
@click.option("--landmarks", "n_landmarks", type=click.IntRange(min=2), default=None,
              help="Landmark Isomap with this many landmarks (large T).")
@click.option("--landmark-method", type=click.Choice(["maxmin", "random"]), default="maxmin",
              show_default=True, help="How landmarks are chosen.")
@click.option("--on-disconnected", type=click.Choice(["bridge", "raise", "ignore"]),
              default="bridge", show_default=True,
              help="A disconnected kNN graph: bridge its components, fail, or embed as is.")
@click.option("--geodesic-store", default=None,
              help="Zarr path or URL for the geodesic rows (T x T squared, or L x T) instead of "
                   "memory (--storage-option applies).")
@seed_option("Random seed of every randomized step.", dest="random_state")
@knn_options
@click.pass_context
def embed_isomap(ctx, source, out, name, overwrite, drop_cache, n_components, n_neighbors, radius,
                 n_landmarks, landmark_method, on_disconnected, geodesic_store, random_state,
                 knn, n_probe, knn_tol):
    """Fit Isomap (or Landmark Isomap with --landmarks) and write the embedding into OUT."""
    from dr_dask.io.inputs import InputError, open_dataset
    from dr_dask.io.storage import location
    from dr_dask.runs.group import run_attr, run_embedding

    if n_landmarks is not None and radius is not None:
        fail("--radius is only supported by full Isomap (drop --landmarks)")
    if geodesic_store is not None:
        geodesic_store = location(geodesic_store, storage_options(ctx))
    try:
        with cluster(ctx) as client:
            # the input's boundary before an estimator loads: a bad input is refused fast
            inp = open_dataset(source, None, storage_options(ctx))
            if n_landmarks is None:
                from dr_dask.methods.isomap import Isomap

                est = Isomap(n_neighbors=None if radius is not None else n_neighbors,
                             radius=radius, n_components=n_components,
                             on_disconnected=on_disconnected, random_state=random_state,
                             client=client, geodesic_store=geodesic_store, knn=knn,
                             n_probe=n_probe, knn_tol=knn_tol)
                method = "isomap"
            else:
                from dr_dask.methods.landmark_isomap import LandmarkIsomap

                est = LandmarkIsomap(n_neighbors=n_neighbors, n_components=n_components,
                                     n_landmarks=n_landmarks, landmark_method=landmark_method,
                                     on_disconnected=on_disconnected, random_state=random_state,
                                     client=client, geodesic_store=geodesic_store, knn=knn,
                                     n_probe=n_probe, knn_tol=knn_tol)
                method = "landmark_isomap"
            run = run_embedding(est, inp, out, method=method, name=name, overwrite=overwrite,
                                storage_options=storage_options(ctx), drop_cache=drop_cache)
    except (InputError, ValueError) as exc:
        fail(str(exc))
    # stdout is the JSON summary alone, for scripts; the human note goes to stderr
    click.echo(f"embedding written to {run.path} (array 'embedding')", err=True)
    click.echo(json.dumps({"path": run.path, **run_attr(run.group, "summary")}, indent=2))


@bench.command("isomap")
@click.option("--quick", is_flag=True, help="Small sizes (a smoke run).")
@click.option("--only", multiple=True,
              help="Run only these cases (default: all of dr_dask.bench.isomap.CASES).")
@click.option("--workdir", default=None, help="Scratch directory (default: a temp dir).")
@json_option
@click.pass_context
def bench_isomap(ctx, quick, only, workdir, json_path):
    """Isomap vs scikit-learn at T=20,000; Landmark Isomap at T=200,000, L=2,000."""
    from dr_dask.bench._common import write_report
    from dr_dask.bench.isomap import CASES, run_bench

    unknown = set(only) - set(CASES)
    if unknown:
        fail(f"unknown case(s) {sorted(unknown)}; choose from {sorted(CASES)}")
    with cluster(ctx) as client:
        results = run_bench(client, quick=quick, only=set(only), workdir=workdir)
    click.echo(write_report(results, json_path))


@bench.command("geodesic")
@click.option("--T", "T", type=click.IntRange(min=600), default=10_000, show_default=True,
              help="Rows of the sinusoid (N=1,000 features).")
@click.option("--repeats", type=POSITIVE, default=3, show_default=True,
              help="Timed fits per method (the median is reported).")
@click.option("--full-T", "full_T", type=click.IntRange(min=600), multiple=True,
              help="Sizes of the full-IKD rows (default: T and 2T).")
@click.option("--skip-sklearn", is_flag=True, help="Leave out the scikit-learn baseline.")
@click.option("--only", multiple=True,
              help="Time only these methods (default: all of dr_dask.bench.geodesic.METHODS; "
                   "full IKD's rows are kept).")
@click.option("--workdir", default=None, help="Where the data go (default: a temp dir).")
@click.option("--as-user", "as_user", is_flag=True,
              help="Time exactly a user's calls instead: Isomap and geodesic IKD "
                   "fit_transform on a NumPy array, each in a fresh process, with no client "
                   "(dask's threads) and on a LocalCluster of --workers processes, against "
                   "scikit-learn's Isomap, and each method's first call after install (an "
                   "empty compiled-kernel cache) against its later ones (--full-T and "
                   "--skip-sklearn do not apply).")
@json_option
@click.pass_context
def bench_geodesic(ctx, T, repeats, full_T, skip_sklearn, only, as_user, workdir,
                   json_path):
    """scikit-learn's Isomap, our Isomap and geodesic IKD on the same sinusoid (k=5), with
    time ratios to scikit-learn and peak RSS of the process tree; full IKD at T and 2T.

    Each method runs in a fresh process tree of its own (a LocalCluster of --workers
    processes, or dask's threads with --scheduler threads): it measures this machine, so it
    joins no other scheduler."""
    from dr_dask.bench._common import write_report
    from dr_dask.bench.geodesic import METHODS, run_as_user, run_geodesic
    from dr_dask.runtime.cluster import local_cluster_kwargs

    obj = ctx.find_root().obj or {}
    threads = obj.get("scheduler") == "threads"
    if (obj.get("scheduler") and not threads) or obj.get("scheduler_file"):
        fail("bench geodesic starts a LocalCluster per method (it measures this machine's "
             "process trees): size it with --workers, not --scheduler")
    n_workers = obj.get("workers") or local_cluster_kwargs()["n_workers"]
    unknown = set(only) - set(METHODS)
    if unknown:
        fail(f"unknown method(s) {sorted(unknown)}; choose from {list(METHODS)}")
    methods = tuple(m for m in METHODS if not only or m in only)
    if as_user:
        if full_T or skip_sklearn:
            fail("--as-user times the user's calls against scikit-learn: --full-T and "
                 "--skip-sklearn do not apply")
        click.echo(write_report(run_as_user(n_workers, T=T, repeats=repeats, methods=methods,
                                            workdir=workdir), json_path))
        return
    results = run_geodesic(n_workers, threads=threads, T=T, repeats=repeats,
                           full_sizes=tuple(full_T) or None, skip_sklearn=skip_sklearn,
                           methods=methods, workdir=workdir)
    click.echo(write_report(results, json_path))
