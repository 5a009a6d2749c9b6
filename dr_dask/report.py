"""JSON and PNG reports of one embedding or of several embeddings of the same data.

Figures are drawn on matplotlib's Agg canvas directly (no pyplot, no display, no global backend
switch), so reports work on headless workers and inside other applications.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import numpy as np

from dr_dask.storage import location

logger = logging.getLogger(__name__)

#: Points drawn per scatter; larger embeddings are subsampled (seeded) for a readable figure.
MAX_POINTS = 20_000


def write_json(results: dict, path: Any) -> str:
    """Write ``results`` as indented JSON (NumPy values converted) to ``path`` (a local path,
    URL or :class:`~dr_dask.storage.Location`) and return where it went."""
    loc = location(path)
    loc.write_bytes((json.dumps(plain_json(results), indent=2) + "\n").encode())
    return loc.url


def plain_json(obj: Any) -> Any:
    """``obj`` with NumPy scalars and arrays as Python values, non-finite floats as None and
    dict keys as strings: what ``json`` can write and read back unchanged."""
    if isinstance(obj, dict):
        return {str(k): plain_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain_json(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None  # JSON has no NaN/inf
    return obj


def _color_values(color: Any, n: int) -> tuple[np.ndarray | None, bool]:
    """Colour values (first latent column, or labels) and whether they are categorical."""
    if color is None:
        return None, False
    c = np.asarray(color.compute() if hasattr(color, "compute") else color)
    if c.shape[0] != n:
        raise ValueError(f"colour values have {c.shape[0]} rows but the embedding has {n}")
    if c.ndim > 1:
        c = c[:, 0]
    categorical = not np.issubdtype(c.dtype, np.floating) and np.unique(c).size <= 50
    if categorical or not np.issubdtype(c.dtype, np.number):
        c = np.unique(c, return_inverse=True)[1]
    return c.astype(float), categorical


def _scatter(ax: Any, Y: np.ndarray, c: np.ndarray | None, categorical: bool, title: str,
             rng: np.random.Generator) -> Any:
    idx = np.arange(Y.shape[0])
    if Y.shape[0] > MAX_POINTS:
        idx = np.sort(rng.choice(Y.shape[0], MAX_POINTS, replace=False))
    x = Y[idx, 0]
    y = Y[idx, 1] if Y.shape[1] > 1 else np.zeros_like(x)
    sc = ax.scatter(x, y, c=None if c is None else c[idx], s=4, linewidths=0,
                    cmap="tab10" if categorical else "viridis")
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
    return sc


def _table(ax: Any, rows: list[str], cols: list[str], cells: list[list[str]]) -> None:
    ax.axis("off")
    if not rows or not cols:
        ax.text(0.5, 0.5, "no metrics", ha="center", va="center")
        return
    t = ax.table(cellText=cells, rowLabels=rows, colLabels=cols, loc="center", cellLoc="center")
    t.auto_set_font_size(False)
    t.set_fontsize(7)
    t.scale(1.0, 1.2)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, (float, np.floating)):
        return f"{v:.4g}"
    return str(v)


def plot_embedding(
    embedding: Any, path: Any, *, color: Any = None, title: str = "embedding",
    metrics: dict | None = None, random_state: int = 0,
) -> str:
    """Scatter of one embedding (first two coordinates) next to its metric table, as PNG.

    Parameters
    ----------
    embedding : array-like of shape (T, d)
    path : str
        Output PNG path.
    color : array-like of shape (T,) or (T, M), optional
        Labels (categorical colours) or a latent (its first column, continuous colours).
    title : str
    metrics : dict, optional
        Name -> value rows of the table.
    random_state : int
        Seeds the subsample drawn above ``MAX_POINTS`` points.

    Returns
    -------
    str
        ``path``.
    """
    return plot_comparison({title: embedding}, path, color=color,
                           metrics={title: metrics or {}}, random_state=random_state)


def plot_comparison(
    embeddings: dict[str, Any], path: Any, *, color: Any = None,
    metrics: dict[str, dict] | None = None, random_state: int = 0,
) -> str:
    """Several embeddings of the same points side by side, above one metrics table, as PNG.

    Parameters
    ----------
    embeddings : dict of str -> array-like of shape (T, d)
    path : str
    color : array-like of shape (T,) or (T, M), optional
    metrics : dict of str -> dict, optional
        Per method, its metrics (table columns = methods, rows = metric names).
    random_state : int

    Returns
    -------
    str
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not embeddings:
        raise ValueError("nothing to plot: no embeddings were given")
    names = list(embeddings)
    mats = {k: np.asarray(v.compute() if hasattr(v, "compute") else v, dtype=float)
            for k, v in embeddings.items()}
    mats = {k: (v[:, None] if v.ndim == 1 else v) for k, v in mats.items()}
    n = next(iter(mats.values())).shape[0]
    c, categorical = _color_values(color, n)
    metrics = metrics or {}
    rows = sorted({m for name in names for m in metrics.get(name, {})})
    cells = [[_fmt(metrics.get(name, {}).get(r)) for name in names] for r in rows]

    ncol = min(len(names), 4)
    nrow = math.ceil(len(names) / ncol)
    table_h = 0.25 * (len(rows) + 2)
    fig = Figure(figsize=(3.2 * ncol + 1.5, 3.2 * nrow + table_h), dpi=100)
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(nrow + 1, ncol, height_ratios=[3.2] * nrow + [max(table_h, 0.5)])
    rng = np.random.default_rng(random_state)
    for i, name in enumerate(names):
        ax = fig.add_subplot(grid[i // ncol, i % ncol])
        if mats[name].shape[0] != n:
            raise ValueError(f"embedding {name!r} has {mats[name].shape[0]} rows, expected {n}")
        sc = _scatter(ax, mats[name], c, categorical, name, rng)
    if c is not None and not categorical:
        fig.colorbar(sc, ax=fig.axes, shrink=0.6)
    _table(fig.add_subplot(grid[nrow, :]), rows, names, cells)
    loc = location(path)
    with loc.open("wb") as fh:
        fig.savefig(fh, format="png")
    logger.info("wrote %s", loc)
    return loc.url
