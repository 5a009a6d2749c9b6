"""The model versions of a stream: the worker tasks that map a chunk and fit the next version
(aligned to the last one's frame), and what a version is refitted from."""

from __future__ import annotations

from typing import Any

import numpy as np

from dr_dask.methods.gp_isomap import GPIsomap


def map_chunk(model: Any, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Embedding, variance and manifold of a chunk (a worker task)."""
    return model.map_points(np.asarray(X, dtype=np.float64))


def refit_model(params: dict, batch: np.ndarray, reference: np.ndarray):
    """Batch phase on ``batch`` (old batch first), aligned to ``reference`` (a worker task)."""

    model = GPIsomap(**params).fit(batch)
    model.align_to(reference)
    return model


def refit_params(model: Any) -> dict:
    """Parameters for the next version: the same, except what only fitted the old batch."""
    params = model.get_params()
    # the refit runs as a task on any scheduler: a live client must not travel with it (it
    # cannot be serialized), and on a worker the fit runs in-process
    params["client"] = None
    if not (isinstance(params["clusterer"], str) or callable(params["clusterer"])):
        params["clusterer"] = "tangent"  # user labels cover the old batch only
    if getattr(model, "threshold_source_", "manual") != "manual":
        # a calibrated threshold does not survive new hyper-parameters: recalibrate by
        # leave-one-out on the new batch at the same quantile
        params["sigma_t"] = None
        params["threshold_quantile"] = getattr(model, "threshold_quantile_",
                                               model.threshold_quantile)
    else:
        params["sigma_t"] = model.sigma_t_
    return params


def batch_of(model: Any) -> np.ndarray:
    """The batch a fitted GPIsomap was trained on, in its original row order."""
    X = np.empty((len(model.labels_), model.n_features_in_))
    for i, gp in enumerate(model.manifolds_):
        X[model.labels_ == i] = gp.points
    X[model.labels_ < 0] = model.outliers_
    return X
