"""The README's first command, ``dr-dask quickstart``: the paper's GP-mapping data -> IKD on the
cluster -> the embedding, its metrics and one picture (the embedding coloured by the true
latent and the eigenvalue spectrum, beside the numbers)."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np
import zarr
from sklearn.decomposition import PCA

from dr_dask.datasets import Sinusoidal, make_dataset
from dr_dask.io.inputs import open_dataset
from dr_dask.io.jsonio import write_json
from dr_dask.io.storage import location, read_array
from dr_dask.methods.ikd import IKD
from dr_dask.methods.isomap import Isomap
from dr_dask.metrics import r2_affine
from dr_dask.report import plot
from dr_dask.runs.group import run_embedding
from dr_dask.runtime import config
from dr_dask.runtime.resources import timed

logger = logging.getLogger(__name__)

#: The generator's settings (the paper's GP-mapping data, 3 latent dimensions).
LATENT_DIM, LENGTH_SCALE = 3, 3.0


def gp_dataset(path: Any, T: int, N: int, *, dtype: str = "float64", seed: int = 0) -> Any:
    """The GP-mapping dataset (``X`` and its ``latent``) at ``path``, generated unless there."""

    if not location(path).exists():
        make_dataset(
            "gp", path, n_samples=T, n_features=N, n_components=LATENT_DIM,
            length_scale=LENGTH_SCALE, dtype=dtype, random_state=seed,
        )
    return path


def read_latent(path: Any) -> np.ndarray:
    """The true latent of shape (T, LATENT_DIM) stored with a generated dataset."""

    return read_array(zarr.open_group(location(path).zarr_store(read_only=True), mode="r"),
                      "latent")


def quickstart_run(out: Any, T: int, N: int, seed: int, client: Any,
                   storage_options: dict | None = None) -> dict:
    """Generate data, fit IKD on ``client``, write metrics JSON and the report PNG.

    Parameters
    ----------
    out : str or Location
        A local directory or URL (with ``storage_options``); everything goes under it.
    T, N : int
        Rows and features of the generated data.
    seed : int
        Seeds the data, IKD and the PCA baseline.
    client : distributed.Client or None

    Returns
    -------
    dict
        ``metrics`` (what metrics.json holds) and ``paths`` (data, embedding, metrics, plot).
    """


    out = location(out, storage_options)
    data = out.child("data.zarr")
    gp_dataset(data, T, N, seed=seed)
    inp = open_dataset(data, "X")
    with timed() as took:
        run = run_embedding(
            IKD(n_components=LATENT_DIM, similarity="correlation", random_state=seed, client=client,
                progress=True),
            inp, out.child("runs.zarr"), method="ikd",
        )
    seconds = took["seconds"]
    emb = run.read("embedding")
    eigenvalues = run.summary["eigenvalues"]
    Z = read_latent(data)
    pca = PCA(LATENT_DIM, random_state=seed).fit_transform(inp.data.compute())
    metrics: dict[str, dict[str, Any]] = {
        "dataset": {"generator": "gp", "T": T, "N": N, "latent_dim": LATENT_DIM,
                    "length_scale": LENGTH_SCALE},
        "ikd": {"r2": r2_affine(Z, emb), "seconds": seconds, "eigenvalues": eigenvalues,
                "run": run.path},
        "pca": {"r2": r2_affine(Z, pca)},
    }
    metrics_path = write_json(metrics, out.child("metrics.json"))
    table = {"samples T": T, "features N": N, "R² IKD": metrics["ikd"]["r2"],
             "R² PCA": metrics["pca"]["r2"], "IKD seconds": seconds}
    png = plot.report_page(out.child("embedding.png"), [
        plot.embedding(emb, Z, label="true latent z1", title="IKD embedding, GP-mapping data",
                         random_state=seed),
        plot.spectrum(eigenvalues, title="IKD eigenvalues"),
    ], table, title="quickstart (R² against the true latent)")
    return {
        "metrics": metrics,
        "paths": {"data": data.url, "embedding": run.path, "metrics": metrics_path, "plot": png},
    }


def warm_kernels(seed: int = 0) -> float:
    """Compile into numba's on-disk cache the kernels of the fits a notebook makes first:
    Isomap and geodesic IKD of a float64 and a float32 NumPy array, with no client, on fewer
    and on more rows than the cell search takes (``dr_dask.knn.cells-min-rows``). The first
    such call after install otherwise compiles them: about 5 of the 8 seconds of an Isomap
    of 10,000 rows. Worker processes on this machine read the same cache. Returns the
    seconds taken."""
    cells_min = min(int(config.get("knn.cells-min-rows")), 20_000)
    # below the cell search's rows (the exact search) and above it: the kernels, not the sizes,
    # are what is warmed, so a smaller threshold warms on fewer rows
    small, T = min(1_000, cells_min // 2), cells_min + 1_000
    gen = Sinusoidal(T, 50, seed)
    latent = gen.latents()
    X = gen.block(gen.mapping(latent), latent, 0)
    with timed() as took, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a small graph's repairs are not the user's concern
        for rows in (X[:small], X, X[:small].astype(np.float32), X.astype(np.float32)):
            Isomap(n_neighbors=5, n_components=1).fit_transform(rows)
            IKD(n_components=1, solver="geodesic", n_neighbors=5,
                random_state=seed).fit_transform(rows)
    logger.info("kernels compiled into numba's cache in %.1f s", took["seconds"])
    return took["seconds"]
