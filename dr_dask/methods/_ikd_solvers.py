"""Dispatch of :class:`~dr_dask.methods.ikd.IKD` fits other than the full tiled solver.

``IKD.fit`` calls :func:`fit` when ``solver`` is ``"geodesic"`` or ``"blockwise"`` or when
``n_landmarks`` is set. This module validates the options those solvers read (the estimator
stores them unchecked) and hands over to :mod:`._ikd_geodesic` (geodesic and landmark IKD) or
:mod:`._ikd_blockwise`.
"""

from __future__ import annotations

import logging
import numbers
from typing import Any

from dr_dask.store import InputData, RunGroup

logger = logging.getLogger(__name__)

GEODESIC_RULES = ("knn", "threshold")
DISCONNECTED = ("bridge", "raise")
SHARED_POINTS = ("keep_larger", "average", "weighted")
LANDMARK_METHODS = ("maxmin", "random")


def _int(name: str, value: Any, low: int, high: int | None = None, why: str = "") -> int:
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not ok or value < low or (high is not None and value > high):
        span = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an integer {span}{why}, got {value!r}")
    return int(value)


def _open_unit(name: str, value: Any) -> float | None:
    """s0-type thresholds live on the normalised scale s / sigma^2 and must be in (0, 1)."""
    if value is None:
        return None
    if not isinstance(value, numbers.Real) or not 0 < float(value) < 1:
        raise ValueError(
            f"{name} must be in (0, 1) (a threshold on the normalised similarity s / sigma^2), "
            f"got {value!r}"
        )
    return float(value)


def check_solver_params(est: Any, n_samples: int) -> None:
    """Validate the geodesic, blockwise and landmark options against the data size T."""
    M = int(est.n_components)
    if est.solver == "geodesic" or est.n_landmarks is not None:
        if est.geodesic_rule not in GEODESIC_RULES:
            raise ValueError(
                f"geodesic_rule must be one of {GEODESIC_RULES}, got {est.geodesic_rule!r}"
            )
        if est.on_disconnected not in DISCONNECTED:
            raise ValueError(
                f"on_disconnected must be one of {DISCONNECTED} for IKD (infinite geodesics "
                f"have no similarity), got {est.on_disconnected!r}"
            )
        _open_unit("threshold", est.threshold)
        if est.geodesic_rule == "knn":
            _int("n_neighbors", est.n_neighbors, 1, n_samples - 1,
                 why=" (a point is not its own neighbour)")
        elif est.threshold is None:
            raise ValueError("geodesic_rule='threshold' needs threshold (s0 in (0, 1))")
    if est.solver == "blockwise":
        _open_unit("clique_threshold", est.clique_threshold)
        _int("max_cliques", est.max_cliques, 1)
        if est.min_overlap is not None:
            _int("min_overlap", est.min_overlap, M + 1,
                 why=" (M + 1 shared points make the rigid alignment unique)")
        if est.shared_points not in SHARED_POINTS:
            raise ValueError(
                f"shared_points must be one of {SHARED_POINTS}, got {est.shared_points!r}"
            )
    if est.n_landmarks is not None:
        if est.solver == "blockwise":
            raise ValueError(
                "n_landmarks is a geodesic/full-solver extension; blockwise IKD has no landmark "
                "variant (use solver='geodesic' or 'full' with n_landmarks)"
            )
        _int("n_landmarks", est.n_landmarks, M + 1, n_samples,
             why=" (more than n_components, at most the number of samples)")
        if est.landmark_method not in LANDMARK_METHODS:
            raise ValueError(
                f"landmark_method must be one of {LANDMARK_METHODS}, got {est.landmark_method!r}"
            )
        if est.solver == "geodesic" and est.geodesic_rule == "threshold":
            raise ValueError(
                "landmark IKD supports geodesic_rule='knn' only (the threshold rule needs "
                "every similarity next to the L x T geodesics)"
            )


def fit(est: Any, inp: InputData, run: RunGroup | None) -> dict:
    """Fit ``est`` on ``inp`` with its solver; returns the fitted attributes.

    Parameters
    ----------
    est : IKD
        Parameters already checked by ``IKD._check_params`` (``est._reference`` and
        ``est._kernel`` are set).
    inp : InputData
    run : RunGroup, optional
        Run group for the geodesic solver's Zarr arrays and resumable eigen stage.

    Returns
    -------
    dict
        ``embedding_``, ``eigenvalues_``, ``explained_variance_ratio_``, ``reference_index_``,
        ``sigma2_``, ``stage_seconds_`` and solver-specific attributes.
    """
    from dr_dask.cluster import run_stage

    check_solver_params(est, int(inp.data.shape[0]))
    if est.n_landmarks is not None:
        from dr_dask.methods._ikd_geodesic import fit_landmarks

        return run_stage("landmark", lambda: fit_landmarks(est, inp, run))
    if est.solver == "geodesic":
        from dr_dask.methods._ikd_geodesic import fit_geodesic

        return run_stage("geodesic", lambda: fit_geodesic(est, inp, run))
    if est.solver == "blockwise":
        from dr_dask.methods._ikd_blockwise import fit_blockwise

        return run_stage("blockwise", lambda: fit_blockwise(est, inp))
    raise ValueError(f"no solver {est.solver!r} besides 'full' in this dispatcher")
