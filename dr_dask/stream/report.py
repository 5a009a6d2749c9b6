"""Plots of a stream run: variance and threshold over stream time, manifold assignment, and
the embedding by manifold."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from dr_dask.storage import location
from dr_dask.stream.store import STATUS, read_output

logger = logging.getLogger(__name__)


def running_mean(x: np.ndarray, window: int) -> np.ndarray:
    """Trailing running mean over ``window`` values (NaNs ignored), same length as x."""
    x = np.asarray(x, dtype=np.float64)
    ok = np.isfinite(x)
    c = np.concatenate([[0.0], np.cumsum(np.where(ok, x, 0.0))])
    n = np.concatenate([[0], np.cumsum(ok)])
    idx = np.arange(1, len(x) + 1)
    lo = np.maximum(idx - window, 0)
    cnt = n[idx] - n[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, (c[idx] - c[lo]) / cnt, np.nan)


def _thresholds(refits: list, sigma_t: list, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Step function of the threshold in force over stream rows: (x, y) for ``ax.step``."""
    x = [0] + [r["publish_row"] for r in refits] + [n]
    y = list(sigma_t[: len(x) - 1])
    return np.asarray(x), np.asarray(y + y[-1:])


def stream_report(store: Any, out_png: Any, window: int = 50) -> dict:
    """Write a three-panel PNG of a stream store and return summary figures.

    Top: per-point predictive variance (under the version that first mapped the point)
    against stream position, coloured by the manifold the point was assigned to (flagged
    points marked x), its running mean (window ``window``, the authors' w = 50), the
    threshold in force (it changes at every published refit) and a marker at every refit
    (trigger and publication). Bottom left: the manifold assignment over stream position.
    Bottom right: the embedding coloured by manifold, quarantined rows omitted.

    Returns
    -------
    dict
        Row counts per status, rows per manifold, number of refits, the PNG path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    o = read_output(store)
    var, status, man, emb = o["first_variance"], o["status"], o["manifold"], o["embedding"]
    ck = o["checkpoint"]
    refits = ck["refits"]
    t = np.arange(len(var))
    ok = status != STATUS["quarantined"]
    # remapped rows were buffered when first seen: both count as flagged
    flagged = np.isin(status, [STATUS["buffered"], STATUS["remapped"]])
    cmap = plt.get_cmap("tab10")
    colours = cmap(np.mod(np.maximum(man, 0), 10))
    fig = plt.figure(figsize=(13, 9))
    ax1 = fig.add_subplot(2, 1, 1)
    ax2 = fig.add_subplot(2, 2, 3)
    ax3 = fig.add_subplot(2, 2, 4)
    for sel, marker, label in ((ok & ~flagged, "o", "confident"), (ok & flagged, "x", "flagged")):
        ax1.scatter(t[sel], var[sel], s=4, c=colours[sel], marker=marker, alpha=0.6,
                    label=f"variance when first mapped ({label}; colour: manifold)")
    ax1.plot(t, running_mean(np.where(ok, var, np.nan), window), color="k", lw=1.2,
             label=f"running mean (w={window})")
    x, y = _thresholds(refits, ck["sigma_t"], len(var))
    ax1.step(x, y, where="post", color="red", ls="--", lw=1.2, label="threshold sigma_t")
    for ax in (ax1, ax2):
        for r in refits:
            ax.axvline(r["trigger_row"], color="gray", ls=":", lw=1)
            ax.axvline(r["publish_row"], color="gray", ls="-", lw=1)
    if refits:
        ax1.plot([], [], color="gray", ls=":", label="refit triggered")
        ax1.plot([], [], color="gray", ls="-", label="refit published")
    ax1.set_yscale("log")
    ax1.set_xlabel("stream position (row)")
    ax1.set_ylabel("predictive variance")
    ax1.legend(fontsize=7, loc="upper left")
    ax2.scatter(t[ok], man[ok], s=3, c=colours[ok])
    ax2.set_xlabel("stream position (row)")
    ax2.set_ylabel("manifold")
    ax2.set_title("manifold assignment")
    sel = ok & np.isfinite(emb).all(axis=1)
    ax3.scatter(emb[sel, 0], emb[sel, 1] if emb.shape[1] > 1 else np.zeros(sel.sum()),
                c=colours[sel], s=3)
    for j in np.unique(man[sel]):
        ax3.scatter([], [], color=cmap(j % 10), s=10, label=f"manifold {j}")
    ax3.legend(fontsize=7, markerscale=2)
    ax3.set_title("embedding by manifold")
    ax3.set_aspect("equal", adjustable="datalim")
    fig.tight_layout()
    out = location(out_png)
    with out.open("wb") as fh:
        fig.savefig(fh, format="png", dpi=110)
    out_png = out.url
    plt.close(fig)
    counts = {name: int(np.sum(status == code)) for name, code in STATUS.items()}
    per_manifold = {int(j): int(c) for j, c in zip(*np.unique(man[ok], return_counts=True))}
    return {"png": out_png, "rows": len(var), "status": counts, "manifold_rows": per_manifold,
            "refits": len(refits)}
