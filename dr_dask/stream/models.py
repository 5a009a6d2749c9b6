"""The model versions of a stream: the worker tasks that map a chunk and fit the next version
(aligned to the last one's frame), what a version is refitted from, and the executor that runs
the tasks (on a cluster or this process's threads)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from dr_dask.methods.gp_isomap import GPIsomap
from dr_dask.runtime.cluster import gather, share


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


class Executor:
    """``client.submit`` on a cluster, a thread pool for dask's threaded (client=None) mode.

    On a cluster each model version goes to the workers once through
    :func:`dr_dask.runtime.cluster.share`: a recomputable future, so a worker killed while holding
    it or mapping a chunk costs dask a recomputation, never rows; results come back through
    :func:`dr_dask.runtime.cluster.gather`, which never waits forever on a cluster that is gone.
    """

    def __init__(self, client: Any, n_threads: int):
        self.client = client
        self.pool = ThreadPoolExecutor(n_threads) if client is None else None
        self.handle: Any = None

    def put_model(self, model: Any) -> None:
        self.handle = share(model, self.client)

    def submit(self, fn, *args):
        if self.pool is not None:  # no client: this process's threads
            return self.pool.submit(fn, *args)
        return self.client.submit(fn, *args, pure=False)

    def map(self, X: np.ndarray) -> Any:
        """Submit ``map_chunk`` of X with the current model version."""
        return self.submit(map_chunk, self.handle, X)

    def result(self, future: Any) -> Any:
        if self.client is None:
            return future.result()
        return gather([future], self.client)[0]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
