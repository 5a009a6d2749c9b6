"""The picture of a stream run: variance over stream time with the threshold and refit marks,
and the embedding by manifold, beside a short table of the same numbers."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from dr_dask.io.storage import location
from dr_dask.report import plot
from dr_dask.stream.store import STATUS, read_output

logger = logging.getLogger(__name__)


def threshold_in_force(refits: list, sigma_t: list, rows: np.ndarray) -> np.ndarray:
    """The threshold in force at each stream row of ``rows``: ``sigma_t[i]`` from the i-th
    published refit's row on (``sigma_t[0]`` before any refit)."""
    published = np.searchsorted([r["publish_row"] for r in refits], rows, side="right")
    return np.asarray(sigma_t, dtype=float)[np.minimum(published, len(sigma_t) - 1)]


def stream_report(store: Any, out_png: Any, window: int = 50) -> dict:
    """Write the PNG report of a stream store and return the figures it shows.

    Left: per-point predictive variance (under the version that first mapped the point)
    against stream position, coloured by the manifold the point was assigned to (flagged
    points marked x), its running mean (window ``window``, the authors' w = 50), the
    threshold in force (it changes at every published refit) and a mark at every refit
    (trigger and publication). Middle: the embedding coloured by manifold, quarantined rows
    omitted. Right: a table of the numbers below.

    Returns
    -------
    dict
        ``png`` (its URL), ``rows``, rows per ``status``, ``manifold_rows``, ``refits``, the
        ``refit_rows`` (trigger, publish) marked, the ``thresholds`` in force in turn and the
        ``final_running_mean`` of the variance.
    """

    o = read_output(store)
    var, status, man, emb = o["first_variance"], o["status"], o["manifold"], o["embedding"]
    ck = o["checkpoint"]
    refits = ck["refits"]
    n = len(var)
    ok = status != STATUS["quarantined"]
    # remapped rows were buffered when first seen: both count as flagged
    flagged = np.isin(status, [STATUS["buffered"], STATUS["remapped"]])
    shown = np.where(ok, var, np.nan)
    threshold = threshold_in_force(refits, ck["sigma_t"], np.arange(n))
    mean = plot.running_mean(shown, window)
    counts = {name: int(np.sum(status == code)) for name, code in STATUS.items()}
    per_manifold = {int(j): int(c) for j, c in zip(*np.unique(man[ok], return_counts=True))}
    thresholds = [float(s) for s in ck["sigma_t"][: len(refits) + 1]]
    summary = {
        "rows": n, "status": counts, "manifold_rows": per_manifold, "refits": len(refits),
        "refit_rows": [[r["trigger_row"], r["publish_row"]] for r in refits],
        "thresholds": thresholds,
        "final_running_mean": float(mean[-1]) if n and np.isfinite(mean[-1]) else None,
    }
    sel = ok & np.isfinite(emb).all(axis=1)
    panels = [
        plot.variance(np.arange(n), shown, threshold, refits, window=window, flagged=flagged,
                        groups=man, title="predictive variance over the stream"),
        plot.embedding(emb[sel], man[sel], label="manifold", title="embedding by manifold"),
    ]
    table = {"rows": n, **{f"rows {k}": v for k, v in counts.items() if v},
             "refits": len(refits), "threshold now": thresholds[-1],
             f"running mean (w={window})": summary["final_running_mean"]}
    png = plot.report_page(location(out_png), panels, table, title="stream", ncol=2)
    return {"png": png, **summary}
