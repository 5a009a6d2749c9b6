"""Plots of a stream run: variance over stream time and the embedding by model version."""

from __future__ import annotations

from typing import Any

import logging

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


def stream_report(store: Any, out_png: Any, window: int = 50) -> dict:
    """Write a two-panel PNG of a stream store and return summary figures.

    Left: per-point predictive variance (under the version that first mapped the point)
    against stream position, its running mean (window ``window``, the authors' w = 50), the
    initial threshold and a marker at every refit (trigger and publication). Right: the
    embedding coloured by model version, quarantined rows omitted.

    Returns
    -------
    dict
        Row counts per status, number of refits, the PNG path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    o = read_output(store)
    var, status, version, emb = o["first_variance"], o["status"], o["version"], o["embedding"]
    refits = o["checkpoint"]["refits"]
    t = np.arange(len(var))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    ok = status != STATUS["quarantined"]
    # remapped rows were buffered when first seen: both count as flagged
    flagged = np.isin(status, [STATUS["buffered"], STATUS["remapped"]])
    ax1.scatter(t[ok], var[ok], s=3, c=np.where(flagged[ok], "tab:orange", "tab:blue"),
                alpha=0.5, label="variance when first mapped (orange: flagged)")
    ax1.plot(t, running_mean(np.where(ok, var, np.nan), window), color="red", lw=1.5,
             label=f"running mean (w={window})")
    ax1.axhline(o["checkpoint"]["sigma_t"][0], color="gray", ls="--", lw=1, label="sigma_t (v0)")
    for r in refits:
        ax1.axvline(r["trigger_row"], color="k", ls=":", lw=1)
        ax1.axvline(r["publish_row"], color="k", ls="-", lw=1)
    if refits:
        ax1.plot([], [], "k:", label="refit triggered")
        ax1.plot([], [], "k-", label="refit published")
    ax1.set_yscale("log")
    ax1.set_xlabel("stream position (row)")
    ax1.set_ylabel("predictive variance")
    ax1.legend(fontsize=8)
    sel = ok & np.isfinite(emb).all(axis=1)
    sc = ax2.scatter(emb[sel, 0], emb[sel, 1] if emb.shape[1] > 1 else np.zeros(sel.sum()),
                     c=version[sel], s=3, cmap="viridis")
    fig.colorbar(sc, ax=ax2, label="model version")
    ax2.set_title("embedding by model version")
    ax2.set_aspect("equal", adjustable="datalim")
    fig.tight_layout()
    out = location(out_png)
    with out.open("wb") as fh:
        fig.savefig(fh, format="png", dpi=110)
    out_png = out.url
    plt.close(fig)
    counts = {name: int(np.sum(status == code)) for name, code in STATUS.items()}
    return dict(png=out_png, rows=int(len(var)), status=counts, refits=len(refits))
