"""``dr-dask bench knn-tol``: the embedding's quality at each distance tolerance of the search.

The adaptive probe stops on the k-th neighbour's distance (:mod:`dr_dask.graph.knn_tol`);
its default tolerance is the largest whose embedding stays within ``QUALITY_MARGIN`` of the
exact search's on every measure here. Per dataset, one Landmark Isomap fit with the exact
search and one with the partitioned search at each tolerance, the same seed for all:

- the sinusoid (N = 100, noise in all features, at noise 0.1 and 0.01): R^2 of the
  1-D embedding to the latent (:func:`dr_dask.metrics.r2_affine`);
- augmented digits (:func:`dr_dask.datasets.augmented_digits`, N = 64): trustworthiness of
  the ``DIGITS_COMPONENTS``-D embedding on ``TRUST_ROWS`` seeded rows and its 10-NN label
  accuracy
  (:func:`dr_dask.metrics.knn_accuracy`).

Quality, not speed: the fits are timed, but the table's use is the difference to the exact row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

TOLERANCES = (0.001, 0.003, 0.01, 0.03, 0.1)
N_NEIGHBORS = 10
N_LANDMARKS = 500
#: The digits' embedding dimension: in 2 dimensions Isomap's 10-NN label accuracy on them is
#: mostly the embedding's overlaps, which a change in a few edges moves by about the margin
#: (docs/scaling.md, "The distance tolerance"); in 10 it measures what the graph keeps.
DIGITS_COMPONENTS = 10
TRUST_ROWS = 4000
#: A tolerance passes when every measure is within this of the exact search's.
QUALITY_MARGIN = 0.003
DATASETS = ("sinusoid-0.1", "sinusoid-0.01", "digits")


def _dataset(name: str, T: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows (float64) and what the embedding is scored against: the latent or the labels."""
    if name == "digits":
        from dr_dask.datasets import augmented_digits

        X, labels, _ = augmented_digits(T, random_state=seed)
        return X.astype(np.float64), labels
    from dr_dask.datasets import make_dataset

    noise = float(name.split("-", 1)[1])
    ds = make_dataset("sinusoidal", n_samples=T, n_features=100, random_state=seed,
                      noise=noise)
    assert not isinstance(ds, str)  # no path: the dataset in memory
    return np.asarray(ds["X"].values, dtype=np.float64), np.asarray(ds["latent"].values)


def _scores(name: str, X: np.ndarray, target: np.ndarray, emb: np.ndarray,
            trust_rows: np.ndarray) -> dict[str, float]:
    from dr_dask.metrics import knn_accuracy, r2_affine, trustworthiness

    if name != "digits":
        return {"r2": float(r2_affine(target, emb))}
    return {"trustworthiness": float(trustworthiness(X[trust_rows], emb[trust_rows],
                                                     n_neighbors=N_NEIGHBORS)),
            "knn_accuracy": float(knn_accuracy(emb, target, n_neighbors=N_NEIGHBORS))}


def run_knn_tol(client: Any, *, T: int = 20_000, tolerances: tuple[float, ...] = TOLERANCES,
                datasets: tuple[str, ...] = DATASETS, seeds: tuple[int, ...] = (0, 1, 2),
                progress: Callable[[dict], None] | None = None) -> dict:
    """Each dataset's scores with the exact search and at each tolerance (see the module),
    for each seed (the dataset's draw and the fit's ``random_state``).

    A tolerance is judged on its mean difference to the exact search over the seeds: on a few
    thousand rows one seed's 10-NN label accuracy moves by 0.005 with which of two equally near
    rows the search finds, more than the margin (docs/scaling.md, "The distance tolerance").

    Returns
    -------
    dict
        ``rows``: per dataset, seed and search (``"exact"`` or the tolerance), the scores, the
        search's estimated recall and distance error and the fit's seconds; ``mean_vs_exact``:
        per dataset and tolerance, the scores' mean differences to the exact search's;
        ``largest_passing``: per dataset, the largest tolerance at and below which every mean
        difference is within ``QUALITY_MARGIN`` (None: not even the smallest's).
    """
    from dr_dask.methods.landmark_isomap import LandmarkIsomap

    rows: list[dict] = []
    means: dict[str, dict[float, dict[str, float]]] = {}
    passing: dict[str, float | None] = {}
    for name in datasets:
        gaps_by_tol: dict[float, list[dict[str, float]]] = {tol: [] for tol in tolerances}
        for seed in seeds:
            X, target = _dataset(name, T, seed)
            trust_rows = np.sort(np.random.default_rng(seed).choice(T, min(T, TRUST_ROWS),
                                                                    replace=False))
            n_components = DIGITS_COMPONENTS if name == "digits" else 1
            exact: dict[str, float] = {}
            for tol in (None, *tolerances):
                est = LandmarkIsomap(n_neighbors=N_NEIGHBORS, n_components=n_components,
                                     n_landmarks=N_LANDMARKS, random_state=seed, client=client,
                                     knn="exact" if tol is None else "ivf",
                                     knn_tol=0 if tol is None else tol)
                scores = _scores(name, X, target, est.fit_transform(X), trust_rows)
                if tol is None:
                    exact = scores
                gaps = {key: round(v - exact[key], 4) for key, v in scores.items()}
                row = {"dataset": name, "T": T, "seed": seed,
                       "search": "exact" if tol is None else tol,
                       **scores, "vs_exact": gaps, "knn_recall": est.knn_recall_,
                       "knn_distance_error": est.knn_distance_error_,
                       "seconds": sum(v for key, v in est.timings_.items() if "." not in key)}
                rows.append(row)
                if progress is not None:
                    progress(row)
                if tol is not None:
                    gaps_by_tol[tol].append(gaps)
        means[name] = {tol: {key: round(float(np.mean([g[key] for g in gs])), 4)
                             for key in gs[0]} for tol, gs in gaps_by_tol.items()}
        ok = [all(abs(g) <= QUALITY_MARGIN for g in means[name][tol].values())
              for tol in tolerances]
        # the largest tolerance below which every one passes
        passed = [tol for tol, good in zip(tolerances, np.cumprod(ok, dtype=bool)) if good]
        passing[name] = max(passed) if passed else None
    return {"T": T, "n_neighbors": N_NEIGHBORS, "n_landmarks": N_LANDMARKS,
            "seeds": list(seeds), "margin": QUALITY_MARGIN, "rows": rows,
            "mean_vs_exact": means, "largest_passing": passing}
