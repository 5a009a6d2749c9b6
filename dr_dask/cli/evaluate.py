"""``dr-dask evaluate``, ``dr-dask compare`` and ``dr-dask bench metrics``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import click

from dr_dask.cli._app import (
    POSITIVE,
    bench,
    cluster,
    fail,
    json_option,
    main,
    n_neighbors_option,
    seed_option,
    storage_options,
    truth_options,
)
from dr_dask.methods.factory import METHODS, MethodUnavailable, make_method

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)

#: Methods ``compare`` knows, in display order.
#: LSDR inside ``compare``: inputs above this dimension are first reduced by PCA (Delaunay is
#: exponential in p; the reduction is recorded in the report).
LSDR_INPUT_DIM = 3


# ------------------------------------------------------------------------------ input helpers
def load_values(spec: str, default_store: Any, storage_options: dict | None = None) -> np.ndarray:
    """Load labels or a latent: ``VAR`` (of ``default_store``), ``PATH:VAR``, ``file.npy``."""

    from dr_dask.io.boundary import read_values
    from dr_dask.io.inputs import InputError, open_netcdf, parse_source
    from dr_dask.io.storage import location

    path, var = parse_source(spec, storage_options)
    loc = location(path, storage_options)
    if not loc.exists():
        if default_store is None:
            raise InputError(f"{spec!r} is neither a path nor a variable of a known input store")
        loc, var = location(default_store, storage_options), spec
    if loc.url.endswith((".nc", ".nc4", ".netcdf", ".h5")):
        with open_netcdf(loc) as ds:
            if var not in ds:
                raise InputError(f"{loc} has no variable {var!r} (has {sorted(ds.data_vars)})")
            return ds[var].values
    if loc.url.endswith(".npy"):
        return read_values(loc)
    import zarr

    try:
        group = zarr.open_group(store=loc.zarr_store(read_only=True), mode="r")
    except Exception as exc:
        raise InputError(f"cannot open {loc} as a Zarr group: {exc}") from exc
    if var is None or var not in group:
        raise InputError(f"{loc} has no array {var!r} (has {sorted(group.array_keys())})")
    return read_values(loc, var)


def _open_input(source: str, storage_options: dict | None = None) -> tuple[Any, Any]:
    from dr_dask.io.inputs import open_dataset

    inp = open_dataset(source, None, storage_options)
    return inp, inp.location


# ------------------------------------------------------------------------------- evaluate
@main.command()
@click.option("--store", required=True, help="Output store holding the run group.")
@click.option("--embedding", "name", required=True, help="Run group name inside STORE.")
@click.option("--input", "source", default=None,
              help="Input data STORE[:VAR] (default: the input recorded in the run).")
@truth_options
@click.option("--out", default=None, help="Report directory (default: STORE/NAME.report).")
@n_neighbors_option("k of trustworthiness/continuity/kNN preservation.")
@click.pass_context
def evaluate(ctx, store, name, source, labels, latent, out, n_neighbors):
    """Score a stored embedding: metrics JSON and a PNG (embedding, spectrum, metric table)."""
    from dr_dask.io.inputs import InputError
    from dr_dask.io.jsonio import write_json
    from dr_dask.io.storage import location, read_array
    from dr_dask.metrics import evaluate_embedding
    from dr_dask.report import plot
    from dr_dask.runs.group import open_run, run_attr

    so = storage_options(ctx)
    try:
        group = open_run(store, name, so)
        if "embedding" not in group:
            raise InputError(f"{store}/{name} has no 'embedding' array")
        emb = read_array(group, "embedding")
        recorded = run_attr(group, "input")
        if source is None and recorded.get("path"):
            source = recorded["path"] + (f":{recorded['variable']}" if recorded.get("variable")
                                         else "")
        inp, in_store = _open_input(source, so) if source else (None, None)
        lab = load_values(labels, in_store, so) if labels else None
        lat = load_values(latent, in_store, so) if latent else None
    except (InputError, FileNotFoundError, KeyError, ValueError) as exc:
        fail(str(exc))
    out = location(out, so) if out else location(store, so).child(f"{name}.report")
    try:
        with cluster(ctx) as client:
            metrics = evaluate_embedding(emb, X=None if inp is None else inp.data, labels=lab,
                                         latent=lat, n_neighbors=n_neighbors, client=client)
    except ValueError as exc:
        fail(str(exc))
    result = {"store": store, "embedding": name, "input": source, "n_samples": emb.shape[0],
              "n_components": emb.shape[1], "metrics": metrics}
    eigenvalues = run_attr(group, "summary").get("eigenvalues")
    if eigenvalues is not None:
        result["eigenvalues"] = eigenvalues
    write_json(result, out.child("metrics.json"))
    panels = [plot.embedding(emb, lab if lab is not None else lat, title=name,
                               label="label" if lab is not None else "latent z1")]
    if eigenvalues is not None:
        panels.append(plot.spectrum(eigenvalues, title=f"{name}: eigenvalues"))
    plot.report_page(out.child("embedding.png"), panels, metrics, title=f"{name} (k={n_neighbors})")
    for key, value in metrics.items():
        click.echo(f"{key:>22}: {value:.4f}")
    click.echo(f"report written to {out}")


# -------------------------------------------------------------------------------- compare
def _fit_lsdr(est: Any, X: np.ndarray) -> tuple[np.ndarray, str | None]:
    """LSDR on X after the reduction it needs: PCA above LSDR_INPUT_DIM (duplicate rows are
    LSDR's own business: it keeps them, with their twin's embedding)."""
    note = []
    if X.shape[1] > est.max_delaunay_dim:
        from sklearn.decomposition import PCA

        X = PCA(LSDR_INPUT_DIM, random_state=est.random_state).fit_transform(X)
        note.append(f"input reduced by PCA to {LSDR_INPUT_DIM} dims first")
    return est.fit_transform(X), "; ".join(note) or None


def run_method(name: str, est: Any, X: np.ndarray, Xd: Any) -> dict:
    """Fit one method, timing it and sampling the peak RSS of the process tree."""
    import numpy as np

    from dr_dask.runtime.resources import PeakRSS, timed

    note = None
    with PeakRSS() as mem, timed() as t:
        if name == "lsdr":
            emb, note = _fit_lsdr(est, X)
        elif name.startswith("ikd"):
            emb = est.fit_transform(Xd)
        else:
            emb = est.fit_transform(X)
    emb = np.asarray(emb.compute() if hasattr(emb, "compute") else emb, dtype=np.float64)
    return {"embedding": emb, "seconds": t["seconds"], "peak_rss_gb": mem.peak_gb, "note": note}


@main.command()
@click.option("--input", "source", required=True, help="Input data STORE[:VAR], file.nc or .npy.")
@click.option("-n", "--n-components", type=POSITIVE, required=True, help="Output dimension.")
@click.option("--methods", default="ikd,ikd-geodesic,isomap,pca,lsdr", show_default=True,
              help=f"Comma-separated, from: {', '.join(METHODS)}.")
@truth_options
@click.option("--out", required=True, help="Output directory (compare.json, compare.png, .npz).")
@n_neighbors_option("Graph k of the methods and k of the neighbourhood metrics.")
@seed_option("Random seed of every method.")
@click.pass_context
def compare(ctx, source, n_components, methods, labels, latent, out, n_neighbors, seed):
    """Run several methods on the same data; table and figure of their metrics side by side."""
    import numpy as np

    from dr_dask.io.inputs import InputError
    from dr_dask.io.jsonio import write_json
    from dr_dask.io.storage import location
    from dr_dask.metrics import evaluate_embedding
    from dr_dask.report import plot

    so = storage_options(ctx)
    names = [m.strip() for m in methods.split(",") if m.strip()]
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        fail(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    try:
        inp, in_store = _open_input(source, so)
        lab = load_values(labels, in_store, so) if labels else None
        lat = load_values(latent, in_store, so) if latent else None
    except (InputError, FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    X = np.asarray(inp.data.compute(), dtype=np.float64)
    for what, v in (("labels", lab), ("latent", lat)):
        if v is not None and len(v) != X.shape[0]:
            fail(f"{what} has {len(v)} rows but the input has {X.shape[0]} samples")
    results: dict[str, dict] = {}
    skipped: dict[str, str] = {}
    embeddings: dict[str, np.ndarray] = {}
    with cluster(ctx) as client:
        for name in names:
            try:
                est = make_method(name, n_components, n_neighbors=n_neighbors, seed=seed,
                                  client=client)
                run = run_method(name, est, X, inp.data)
            except (MethodUnavailable, ImportError) as exc:  # optional or not yet available
                skipped[name] = (str(exc) if isinstance(exc, MethodUnavailable)
                                 else f"{name} skipped: {exc}")
                click.echo(skipped[name], err=True)
                continue
            except (ValueError, RuntimeError, MemoryError) as exc:
                skipped[name] = f"{name} failed: {exc}"
                click.echo(skipped[name], err=True)
                continue
            emb = embeddings[name] = run.pop("embedding")
            run["metrics"] = evaluate_embedding(emb, X=X, labels=lab, latent=lat,
                                                n_neighbors=n_neighbors, client=client)
            results[name] = run
            click.echo(f"{name}: {run['seconds']:.2f} s, peak RSS {run['peak_rss_gb']:.2f} GB",
                       err=True)
    out = location(out, so)
    report = {"input": inp.name, "n_samples": X.shape[0], "n_features": X.shape[1],
              "n_components": n_components, "methods": results, "skipped": skipped}
    write_json(report, out.child("compare.json"))
    if embeddings:
        with out.child("embeddings.npz").open("wb") as fh:
            np.savez(fh, allow_pickle=False, **embeddings)
        table = {m: {"seconds": r["seconds"], "peak_rss_gb": r["peak_rss_gb"], **r["metrics"]}
                 for m, r in results.items()}
        colour, label = (lab, "label") if lab is not None else (lat, "latent z1")
        plot.report_page(out.child("compare.png"), [
            plot.embedding(e, colour, label=label, title=m, random_state=seed)
            for m, e in embeddings.items()], table, title=f"{inp.name}: methods compared")
    else:
        fail(f"no method ran ({'; '.join(skipped.values())}); report written to {out}")
    click.echo(f"comparison written to {out}")


# ---------------------------------------------------------------------------- bench metrics
@bench.command("metrics")
@click.option("--quick", is_flag=True, help="Small sizes (a smoke run).")
@json_option
@click.pass_context
def bench_metrics(ctx, quick, json_path):
    """Blockwise trustworthiness at T=50,000 (peak RSS) and LSDR at n=20,000 in 2-D and 3-D."""
    from dr_dask.bench._common import write_report
    from dr_dask.bench.metrics import run_bench

    with cluster(ctx) as client:
        results = run_bench(client, quick=quick)
    click.echo(write_report(results, json_path))
