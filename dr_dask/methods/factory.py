"""The one factory that builds the estimators (and the baselines) by method name."""

from __future__ import annotations

from typing import Any

#: Method names accepted by ``dr-dask compare`` and the weekly refit job.
METHODS = ("ikd", "ikd-geodesic", "isomap", "pca", "lsdr", "umap", "tsne")


class MethodUnavailable(Exception):
    """An optional method (package or module) is not installed."""


def make_method(name: str, n_components: int, *, n_neighbors: int, seed: int,
                client: Any = None) -> Any:
    """Estimator for a ``compare`` method name; MethodUnavailable when it cannot be built."""
    # lazy: `dr-dask --help` lists METHODS and loads no estimator (tests/test_cli_start.py)
    from dr_dask.methods.ikd import IKD
    from dr_dask.methods.isomap import Isomap
    from dr_dask.methods.lsdr import LSDR

    try:
        if name in ("ikd", "ikd-geodesic"):
            solver = "geodesic" if name == "ikd-geodesic" else "full"
            return IKD(n_components=n_components, solver=solver, n_neighbors=n_neighbors,
                       random_state=seed, client=client)
        if name == "isomap":
            return Isomap(n_neighbors=n_neighbors, n_components=n_components, random_state=seed,
                          client=client)
        if name == "pca":
            from sklearn.decomposition import PCA  # lazy: the baselines load only when asked for

            return PCA(n_components, random_state=seed)
        if name == "lsdr":
            return LSDR(n_components=n_components, random_state=seed, client=client)
        if name == "umap":
            import umap  # lazy: an optional extra

            return umap.UMAP(n_components=n_components, n_neighbors=n_neighbors,
                             random_state=seed)
        if name == "tsne":
            from sklearn.manifold import TSNE  # lazy: the baselines load only when asked for

            return TSNE(n_components, random_state=seed, init="pca",
                        method="barnes_hut" if n_components < 4 else "exact")
    except ImportError as exc:
        raise MethodUnavailable(f"{name} skipped: {exc.name or exc} is not installed") from exc
    raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
