"""``dr-dask bench scale``: the scaling table and plot of the landmark variants and the exact
methods."""

from __future__ import annotations

import logging

import click

from dr_dask.cli._app import bench, cluster, fail, json_option, knn_options

logger = logging.getLogger(__name__)


@bench.command("scale")
@click.option("--quick", is_flag=True,
              help="T = 2k, 5k, 10k for every method (instead of 10k ... 1M for the landmark "
                   "variants, 10k, 20k, 30k for the exact methods).")
@click.option("--min-T", "min_T", type=click.IntRange(min=1), default=None,
              help="Skip the sizes below this T.")
@click.option("--max-T", "max_T", type=click.IntRange(min=1), default=None,
              help="Skip the sizes above this T.")
@click.option("--T", "sizes", type=click.IntRange(min=100), multiple=True,
              help="Exactly these sizes for every method (repeatable), instead of the ladders "
                   "(e.g. --T 2000000 for the client's peak at T = 2 x 10^6).")
@click.option("--landmarks", "n_landmarks", type=click.IntRange(min=2), default=500,
              show_default=True, help="L (capped at T/10).")
@click.option("--method", "methods",
              type=click.Choice(["landmark_ikd", "landmark_isomap", "full_ikd", "geodesic_ikd",
                                 "isomap"]),
              multiple=True, help="Run only these methods (repeatable; default: all five).")
@click.option("--workdir", default=None, help="Where the datasets go (default: a temp dir).")
@click.option("--json", "json_path", default="scale.json", show_default=True,
              help="The table as JSON.")
@click.option("--png", "png_path", default="scale.png", show_default=True,
              help="The log-log plot of time and peak RSS against T.")
@click.option("--peer", type=click.Choice(["umap"]), default=None,
              help="Also fit umap-learn (the [umap] extra) at every size, timed the same way, "
                   "and report each method's time as a ratio to it.")
@click.option("--search-alone/--no-search-alone", default=True, show_default=True,
              help="Also time the kNN search alone at each size, with its recall on 5,000 rows "
                   "(off for the largest sizes: it costs as much as a fit's own search, and "
                   "every fit reports its estimated recall).")
@click.option("--as-user", "as_user", is_flag=True,
              help="Time instead exactly the users' calls of the scaling targets: landmark IKD "
                   "and Landmark Isomap with their defaults on the NumPy float32 rows, with no "
                   "client and on Client() (--workers processes), each in a fresh process, "
                   "at --T (default 1,000,000).")
@knn_options
@click.pass_context
def bench_scale(ctx, quick, min_T, max_T, sizes, n_landmarks, methods, workdir, json_path,
                png_path, peer, search_alone, as_user, knn, n_probe, knn_tol):
    """Landmark IKD and Landmark Isomap at T = 10k ... 1M, full IKD, geodesic IKD and Isomap
    at T = 10k ... 30k (sinusoidal, N=100, from Zarr): time, peak RSS of the process tree,
    R^2, trustworthiness on 5,000 sampled rows and the fitted slopes."""
    from dr_dask.bench._common import write_report
    from dr_dask.bench.scale import METHODS, plot_scale, run_scale, size_ladder

    if peer == "umap":
        try:
            import umap  # noqa: F401  (an optional extra: checked before any fit)
        except ImportError as exc:
            fail(f"--peer umap needs umap-learn, which is not installed ({exc}): "
                 "pip install 'dr-dask[umap]'")
    if as_user:
        from dr_dask.bench.scale import AS_USER_METHODS, run_scale_as_user
        from dr_dask.graph.knn_tol import DEFAULT_KNN_TOL

        if (quick or peer or min_T or max_T or knn != "auto" or n_probe is not None
                or knn_tol != DEFAULT_KNN_TOL):
            fail("--as-user times the defaults at --T: --quick, --peer, --min-T, --max-T, "
                 "--knn, --n-probe and --knn-tol do not apply")
        bad = [m for m in methods if m not in AS_USER_METHODS]
        if bad:
            fail(f"--as-user runs {', '.join(AS_USER_METHODS)}, not {', '.join(bad)}")
        workers = (ctx.find_root().obj or {}).get("workers") or 2
        click.echo(write_report(run_scale_as_user(
            workers, sizes=tuple(sizes) or (1_000_000,), n_landmarks=n_landmarks,
            methods=tuple(methods) or AS_USER_METHODS, workdir=workdir), json_path))
        return
    methods = tuple(methods) or METHODS
    if not any(size_ladder(m, quick, min_T, max_T, sizes) for m in methods):
        ladder = sorted(set().union(*(size_ladder(m, quick, None, None) for m in methods)))
        bounds = " and ".join(f"{flag} {v}" for flag, v in (("--min-T", min_T), ("--max-T", max_T))
                              if v is not None)
        fail(f"no size of {ladder} is within {bounds}")
    with cluster(ctx) as client:
        results = run_scale(client, quick=quick, min_T=min_T, max_T=max_T,
                            n_landmarks=n_landmarks,
                            methods=methods, workdir=workdir, knn=knn, n_probe=n_probe,
                            peer=peer, sizes=sizes, search_alone=search_alone,
                            knn_tol=knn_tol)
    click.echo(write_report(results, json_path))
    click.echo(f"plot: {plot_scale(results, png_path)}", err=True)


@bench.command("dijkstra")
@click.option("--max-T", "max_T", type=click.IntRange(min=1000), default=None,
              help="Skip the sizes above this T (default: up to 100,000).")
@click.option("--workdir", default=None, help="Where the dataset goes (default: a temp dir).")
@click.option("--graph", "graph", default=None, metavar="STORE",
              help="Instead, time one whole-graph path task over this stored graph (a fit's "
                   "scratch graph/): its opening, heap, and each sweep pass.")
@click.option("--sources", type=click.IntRange(min=1), default=63, show_default=True,
              help="Sources of the --graph task.")
@json_option
def bench_dijkstra(max_T, workdir, graph, sources, json_path):
    """Shortest paths' cost per source against T on one thread (kNN graphs of the sinusoid,
    k=10): ms per source with the sweeps and with the heap alone, their ratio, ns per T log T
    and the bytes each search touches. With --graph, one path task over a stored graph."""
    from dr_dask.bench._common import write_report
    from dr_dask.bench.dijkstra import SIZES, run_dijkstra, run_stored

    if graph is not None:
        from dr_dask.graph.stored import StoredGraph

        try:  # the store is read, never written
            stored = StoredGraph.at(graph)
        except (OSError, ValueError) as exc:
            raise click.BadParameter(f"no stored graph at {graph}: {exc}",
                                     param_hint="--graph") from None
        click.echo(write_report(run_stored(stored, sources), json_path))
        return
    sizes = tuple(T for T in SIZES if max_T is None or max_T >= T) or (max_T,)
    click.echo(write_report(run_dijkstra(sizes, workdir=workdir), json_path))


@bench.command("paths-memory")
@click.option("--T", "T", type=click.IntRange(min=10_000), default=2_000_000, show_default=True,
              help="Rows of the sinusoid (N=100).")
@click.option("--landmarks", "n_landmarks", type=click.IntRange(min=1), default=128,
              show_default=True, help="Sources of the shortest paths.")
@click.option("--whole", is_flag=True, help="Also run the paths with whole-graph tasks.")
@click.option("--workdir", default=None, help="Where the dataset goes (default: a temp dir).")
@json_option
def bench_paths_memory(T, n_landmarks, whole, workdir, json_path):
    """The partitioned graph's stages (k=10 on the sinusoid, N=100, from Zarr, on 2 worker
    processes): bytes of task specs through the scheduler and store requests and bytes per
    stage; then the landmark shortest paths by row blocks on LocalClusters of 1, 2 and 4
    worker processes of one thread, which this command starts itself: the largest worker's
    peak RSS above idle and its ratio to W=1 (target: about 1/W), rounds and bytes exchanged
    per round."""
    from dr_dask.bench._common import write_report
    from dr_dask.bench.paths_memory import run_paths_memory

    click.echo(write_report(run_paths_memory(T, n_landmarks=n_landmarks, whole=whole,
                                             workdir=workdir), json_path))


@bench.command("search-memory")
@click.option("--T", "T", type=click.IntRange(min=10_000), default=2_000_000, show_default=True,
              help="Rows of the sinusoid (N=100).")
@click.option("--workdir", default=None, help="Where the dataset goes (default: a temp dir).")
@json_option
def bench_search_memory(T, workdir, json_path):
    """The partitioned (IVF) neighbour search's memory per worker: k=10 on the sinusoid
    (N=100, from Zarr) on LocalClusters of 1, 2 and 4 worker processes of one thread, which
    this command starts itself (--scheduler and --workers do not apply): the largest worker's
    peak RSS and its ratio to the peak on one worker (target: about 1/W), the client's peak
    and the time."""
    from dr_dask.bench._common import write_report
    from dr_dask.bench.search_memory import run_search_memory

    click.echo(write_report(run_search_memory(T, workdir=workdir), json_path))


@bench.command("knn")
@click.option("--T", "sizes", type=click.IntRange(min=1000), multiple=True,
              help="Sizes (repeatable; default 100,000 and 1,000,000).")
@click.option("--k", "k", type=click.IntRange(min=1), default=10, show_default=True,
              help="Neighbours per row.")
@click.option("--peer", "peers", type=click.Choice(["faiss-ivf", "faiss-hnsw", "hnswlib",
                                                    "pynndescent"]), multiple=True,
              help="Peers to run (repeatable; default all; each one not installed is skipped).")
@click.option("--dataset", "datasets", type=click.Choice(["sinusoid-0.1", "sinusoid-0.01",
                                                          "digits"]), multiple=True,
              help="Datasets (repeatable; default all).")
@click.option("--workdir", default=None, help="Where the datasets go (default: a temp dir).")
@json_option
@click.pass_context
def bench_knn(ctx, sizes, k, peers, datasets, workdir, json_path):
    """Our neighbour search (adaptive probe, and n_probe=6) against faiss's IVF and HNSW,
    hnswlib and pynndescent (as umap-learn builds it) on the same rows (the sinusoid at noise
    0.1 and 0.01, N=100, and augmented digits, N=64; float32): seconds, recall and distance
    error on 5,000 rows against their exact neighbours, each peer's knob raised until it
    reaches our recall and our distance error, with the load average."""
    from dr_dask.bench._common import write_report
    from dr_dask.bench.knn import DATASETS, PEERS, SIZES, run_knn

    with cluster(ctx) as client:
        results = run_knn(client, sizes=tuple(sizes) or SIZES, k=k,
                          peers=tuple(peers) or PEERS, datasets=tuple(datasets) or DATASETS,
                          workdir=workdir)
    click.echo(write_report(results, json_path))


@bench.command("knn-floor")
@click.option("--T", "T", type=click.IntRange(min=1000), default=1_000_000, show_default=True,
              help="Rows of the sinusoid (N=100).")
@click.option("--queries", type=click.IntRange(min=10), default=150, show_default=True,
              help="Rows whose error curves are measured (each a pass over all T rows).")
@click.option("--k", "k", type=click.IntRange(min=1), default=10, show_default=True,
              help="Neighbours per row.")
@click.option("--tol", "tolerances", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              multiple=True, help="Distance errors (repeatable; default 0.001, 0.003, 0.01).")
@click.option("--noise", type=click.FloatRange(0, min_open=True), default=0.1,
              show_default=True, help="The sinusoid's noise in every feature.")
@click.option("--workdir", default=None, help="Where the dataset goes (default: a temp dir).")
@json_option
def bench_knn_floor(T, queries, k, tolerances, noise, workdir, json_path):
    """The least a neighbour search must scan to hold the k-th neighbour's distance error:
    an oracle index that knows every row's latent coordinate scans rows in order of latent
    distance; per tolerance, the share of T it scans per row (the same for all, and allocated
    row by row) and the whole search's flops and seconds at this machine's float32 GEMM rate.
    Runs in this process (--scheduler and --workers do not apply)."""
    from dr_dask.bench._common import write_report
    from dr_dask.bench.knn_floor import MAX_SHARE, TOLERANCES, run_knn_floor

    if queries >= T:
        fail(f"--queries ({queries}) must be fewer than --T ({T})")
    if k >= MAX_SHARE * T:
        fail(f"--k ({k}) must be under {MAX_SHARE:.0%} of --T ({T}), the most the oracle scans")
    click.echo(write_report(run_knn_floor(T, queries=queries, k=k,
                                          tolerances=tuple(sorted(tolerances)) or TOLERANCES,
                                          noise=noise, workdir=workdir), json_path))


@bench.command("knn-tol")
@click.option("--T", "T", type=click.IntRange(min=1000, max=100_000), default=20_000,
              show_default=True, help="Rows of each dataset.")
@click.option("--tol", "tolerances", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              multiple=True, help="Tolerances (repeatable; default 0.001 ... 0.1).")
@click.option("--dataset", "datasets", type=click.Choice(["sinusoid-0.1", "sinusoid-0.01",
                                                          "digits"]), multiple=True,
              help="Datasets (repeatable; default all).")
@click.option("--seeds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Seeds 0 ... n-1 per dataset; each tolerance is judged on the mean.")
@json_option
@click.pass_context
def bench_knn_tol(ctx, T, tolerances, datasets, seeds, json_path):
    """Landmark Isomap's embedding with the exact search and with the adaptive probe at each
    --knn-tol: R^2 to the latent on the sinusoid (noise 0.1 and 0.01), trustworthiness and
    10-NN label accuracy on augmented digits, each against the exact search's, and the largest
    tolerance within 0.003 of it on every score (the mean over --seeds)."""
    from dr_dask.bench._common import write_report
    from dr_dask.bench.knn_tol import DATASETS, TOLERANCES, run_knn_tol

    with cluster(ctx) as client:
        results = run_knn_tol(client, T=T, tolerances=tuple(sorted(tolerances)) or TOLERANCES,
                              datasets=tuple(datasets) or DATASETS, seeds=tuple(range(seeds)),
                              progress=lambda row: click.echo(row, err=True))
    click.echo(write_report(results, json_path))
