"""The drift-detection figures for a GP-Isomap model on a layout with ground truth.

Shared by the tests and ``dr-dask bench stream``, so both report the same quantities:
per-patch disparity of mapped stream points, the share landing beside their own patch, flag
rates, the variance's dynamic range, and what a refit on the flagged points does.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from dr_dask.graph.knn import kneighbors_local
from dr_dask.linalg.align import procrustes_disparity
from dr_dask.runtime.resources import timed
from dr_dask.stream.models import refit_model, refit_params

logger = logging.getLogger(__name__)


def layout_figures(model: Any, layout: Any, refit: bool = True) -> dict:
    """Measure a fitted GPIsomap on a layout's stream (its last patch unseen by the batch).

    Parameters
    ----------
    model : GPIsomap
        Fitted on ``layout.batch``.
    layout : dr_dask.datasets.roll_layouts.Layout
    refit : bool
        Also refit on batch + flagged stream points, as the stream runner does.

    Returns
    -------
    dict
        ``n_manifolds``; ``patch_disparity`` (list, one per known patch: Procrustes disparity
        of its mapped stream points against their truth); ``beside_own_patch`` (share of
        known stream points whose nearest batch point in the global frame is of their own
        patch); ``flagged_unseen``, ``flagged_known``; ``variance_ratio`` (median variance of
        unseen over known points); ``global_disparity`` (the batch's global frame against
        truth); with ``refit``: ``refit_n_manifolds``, ``new_patch_disparity``,
        ``old_points_move`` (disparity between known points' coordinates before and after),
        ``refit_seconds``.
    """

    emb, var, _ = model.map_points(layout.stream)
    known = layout.stream_labels < layout.stream_labels.max()
    patches = np.unique(layout.stream_labels[known])
    _, nn = kneighbors_local(model.embedding_, 1, emb[known])
    flagged = var > model.sigma_t_
    out = {
        "n_manifolds": int(model.n_manifolds_),
        "patch_disparity": [
            procrustes_disparity(layout.stream_truth[layout.stream_labels == p],
                                 emb[layout.stream_labels == p]) for p in patches],
        "beside_own_patch": float(np.mean(
            layout.batch_labels[nn[:, 0]] == layout.stream_labels[known])),
        "flagged_unseen": float(flagged[~known].mean()),
        "flagged_known": float(flagged[known].mean()),
        "variance_ratio": float(np.median(var[~known]) / np.median(var[known])),
        "global_disparity": procrustes_disparity(layout.batch_truth, model.embedding_),
    }
    if refit:

        with timed(out, "refit_seconds"):
            new = refit_model(refit_params(model),
                              np.vstack([layout.batch, layout.stream[flagged]]), model.embedding_)
        emb2 = new.map_points(layout.stream)[0]
        out["refit_n_manifolds"] = int(new.n_manifolds_)
        out["new_patch_disparity"] = procrustes_disparity(layout.stream_truth[~known],
                                                          emb2[~known])
        out["old_points_move"] = procrustes_disparity(emb[known], emb2[known])
    return out
