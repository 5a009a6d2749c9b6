"""Run an estimator on a stored input into its own, resumable run group of an output store."""

from __future__ import annotations

import inspect
import logging
import time
from typing import Any

import numpy as np

from dr_dask.cluster import active_client
from dr_dask.store import (
    InputData,
    InputError,
    Lease,
    RunGroup,
    check_output_path,
    check_workers_can_read,
    open_dataset,
    run_name,
)

logger = logging.getLogger(__name__)

#: Estimator parameters that say how to run, not what to compute: not part of a run's identity.
_EXECUTION_PARAMS = {"client", "progress", "tile_cache", "tile_size", "scratch"}


def run_params(estimator: Any) -> dict:
    return {
        k: v for k, v in estimator.get_params().items()
        if k not in _EXECUTION_PARAMS and not k.startswith("_")
    }


def run_embedding(
    estimator: Any,
    source: Any,
    out: Any,
    *,
    method: str,
    name: str | None = None,
    overwrite: bool = False,
    storage_options: dict | None = None,
    drop_cache: bool = False,
) -> RunGroup:
    """Fit ``estimator`` on ``source`` and write its embedding into a run group of ``out``.

    The run group is named from the method, parameters and input identity, so rerunning the
    same command after an interruption resumes it (estimators whose ``fit`` takes ``run=``
    resume stage by stage) and rerunning a finished one returns at once.

    Parameters
    ----------
    estimator : estimator with ``fit_transform``
        Estimators whose ``fit`` takes ``run=`` (IKD) keep their stages in the run group.
    source : str or array-like
        Anything :func:`dr_dask.store.open_dataset` accepts, or an :class:`InputData`.
    out : str or Location
        Output Zarr store, local path or URL (never the input).
    method : str
        Method label recorded in the run.
    name : str, optional
        Run group name (default: derived from method, parameters and input).
    overwrite : bool
        Discard an existing run of that name.
    storage_options : dict, optional
        For the filesystems of ``source`` and ``out`` when they are URLs.
    drop_cache : bool
        Delete the run's tile cache (``distance``, ``geodesic_paths``) once it is complete.

    Returns
    -------
    RunGroup
        Its ``embedding`` array has dims (sample, component) and a ``sample`` coordinate.
    """
    inp = source if isinstance(source, InputData) else open_dataset(source, None, storage_options)
    check_output_path(out, inp)
    check_workers_can_read(inp, active_client(getattr(estimator, "client", None)))
    params = run_params(estimator)
    run = RunGroup(
        out,
        name or run_name(method, params, inp.identity),
        params={"method": method, **params},
        identity=inp.identity,
        overwrite=overwrite,
        storage_options=storage_options,
    )
    if run.complete:
        logger.info("run %s is already complete", run.path)
        return run
    with Lease(run.location.child(run.name, "lease.json")):
        run.refresh()
        if run.complete:  # finished by another run between our first look and the lease
            return run
        return _fit_into(estimator, inp, run, method, drop_cache)


def _fit_into(estimator: Any, inp: InputData, run: RunGroup, method: str,
              drop_cache: bool) -> RunGroup:
    t0 = time.perf_counter()
    try:
        if "run" in inspect.signature(estimator.fit).parameters:
            emb = estimator.fit(inp, run=run).embedding_
        else:  # any scikit-learn transformer (PCA, ...): its fit_transform is the embedding
            emb = estimator.fit_transform(inp.data)
    except ValueError:  # rejected input or parameters: leave no run group behind
        if run.created and not run.done_stages:
            run.location.child(run.name).delete()
        raise
    seconds = time.perf_counter() - t0
    emb = np.asarray(emb.compute() if hasattr(emb, "compute") else emb)
    check_embedding(emb, run.path)
    ids = inp.sample_ids if inp.sample_ids is not None else np.arange(emb.shape[0])
    run.write("sample", ids, ("sample",))
    run.write("component", np.arange(emb.shape[1]), ("component",))
    run.write("embedding", emb, ("sample", "component"), {"method": method})
    summary: dict[str, Any] = {"method": method, "fit_seconds": seconds, "shape": emb.shape}
    for attr in ("eigenvalues_", "explained_variance_ratio_", "reference_index_", "sigma2_"):
        value = getattr(estimator, attr, None)
        if value is not None:
            summary[attr.rstrip("_")] = np.asarray(value).tolist()
    run.mark_complete(**summary)
    if drop_cache:
        run.drop("distance", "geodesic_paths")
    logger.info("run %s complete in %.1f s", run.path, seconds)
    return run


def check_embedding(emb: np.ndarray, where: str) -> None:
    """Refuse to mark a run complete on an embedding no input could have produced."""
    if not np.isfinite(emb).all():
        raise InputError(f"{where}: the embedding has non-finite values; not marked complete")
    if emb.size and not np.any(emb):
        raise InputError(
            f"{where}: the embedding is all zeros (were fill values read instead of data?); "
            "not marked complete"
        )
