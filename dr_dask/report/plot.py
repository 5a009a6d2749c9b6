"""Plotting: the public drawing functions, and the one place that draws.

In a notebook::

    from dr_dask.report import plot
    ax = plot.embedding(Y, color=z, label="latent z1")      # an Axes; ax.figure shows it
    plot.spectrum(ikd.eigenvalues_, ax=other_ax)              # into your own figure

:func:`embedding`, :func:`spectrum`, :func:`variance` (threshold and refit marks),
:func:`drift_history` and :func:`loglog` each draw into ``ax`` (any matplotlib Axes, e.g. from
``plt.subplots``) or, without one, into a new :class:`matplotlib.figure.Figure` of a fixed
readable size (:data:`PANEL` inches at :data:`DPI`) with an Agg canvas, and return the Axes.
Nothing here imports pyplot (no display, no global backend switch, no figure registry that
keeps figures alive), and font sizes are passed explicitly instead of through ``rcParams``, so
drawing leaves no global state behind: it works on headless workers, inside other
applications and in Jupyter (an Axes' ``.figure`` displays inline).

The PNG report pages of runs, jobs and streams are built from the same functions:
:func:`report_page` renders each panel at its size and places the pixels side by side with a
table, so fonts are never shrunk to fit a page.
"""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dr_dask.io.storage import location

logger = logging.getLogger(__name__)

__all__ = ["drift_history", "embedding", "loglog", "report_page", "spectrum", "variance"]

#: Pixels per inch of every figure and page.
DPI = 100
#: Size (inches) of one panel: 640 x 480 pixels.
PANEL = (6.4, 4.8)
#: Size (inches) of a time-series panel: wide, because time runs along x.
WIDE_PANEL = (10.0, 4.8)
#: Points drawn per scatter; larger embeddings are subsampled (seeded) so the picture stays
#: readable and small.
MAX_POINTS = 20_000
#: Font sizes (points): titles, axis labels, ticks and legends, table cells.
TITLE, LABEL, TICK, CELL = 13, 11, 10, 11
#: Categorical colours (labels, manifolds) are a legend up to this many classes, else a colour bar.
MAX_LEGEND = 12


def _figure(size: tuple[float, float] = PANEL) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _axes(ax: Any, title: str, xlabel: str, ylabel: str, size: tuple = PANEL) -> Any:
    """``ax``, or the Axes of a new panel-sized Figure, titled and labelled."""
    if ax is None:
        ax = _figure(size).add_subplot()
    ax.set_title(title, fontsize=TITLE)
    ax.set_xlabel(xlabel, fontsize=LABEL)
    ax.set_ylabel(ylabel, fontsize=LABEL)
    ax.tick_params(labelsize=TICK)
    return ax


def values_of(x: Any) -> np.ndarray:
    """NumPy values of an array-like (a dask array or DataArray computed)."""
    return np.asarray(x.compute() if hasattr(x, "compute") else x)


def colour_values(color: Any, n: int) -> tuple[np.ndarray | None, list | None]:
    """Colour values of ``n`` points and, for categorical colours, the category names.

    ``color`` is labels (integers, strings: categorical) or a latent (floats; its first column
    when 2-D: continuous). Raises ValueError when its rows do not match ``n``.
    """
    if color is None:
        return None, None
    c = values_of(color)
    if c.shape[0] != n:
        raise ValueError(f"colour values have {c.shape[0]} rows but the embedding has {n}")
    if c.ndim > 1:
        c = c[:, 0]
    if np.issubdtype(c.dtype, np.floating):
        return c.astype(float), None
    names, codes = np.unique(c, return_inverse=True)
    return codes.astype(float), names.tolist()


def embedding(
    Y: Any, color: Any = None, *, ax: Any = None, label: str | None = None,
    title: str = "embedding", random_state: int = 0, max_points: int = MAX_POINTS,
) -> Any:
    """Scatter of an embedding's first two coordinates, coloured by a latent or by labels.

    Parameters
    ----------
    Y : array-like of shape (T, d)
        The embedding (a 1-D embedding is drawn against zero).
    color : array-like of shape (T,) or (T, M), optional
        Floats (a latent: its first column, colour bar) or labels/manifold indices
        (categorical: a legend up to :data:`MAX_LEGEND` classes).
    label : str, optional
        What the colour shows (the colour bar's or legend's title), e.g. ``"latent z1"``.
    ax : matplotlib.axes.Axes, optional
        Where to draw; default a new panel-sized Figure.
    title : str
    random_state : int
        Seeds the subsample drawn above ``max_points`` points.
    max_points : int
        Points drawn at most (a seeded subsample above it keeps the picture readable).

    Returns
    -------
    matplotlib.axes.Axes
    """
    Y = np.asarray(values_of(Y), dtype=float)
    Y = Y[:, None] if Y.ndim == 1 else Y
    c, categories = colour_values(color, Y.shape[0])
    idx = np.arange(Y.shape[0])
    if Y.shape[0] > max_points:
        idx = sample_rows(Y.shape[0], max_points, random_state)
    x = Y[idx, 0]
    y = Y[idx, 1] if Y.shape[1] > 1 else np.zeros_like(x)
    ax = _axes(ax, title, "component 1", "component 2" if Y.shape[1] > 1 else "")
    size = 12 if len(idx) <= 2000 else 4
    if c is None:
        ax.scatter(x, y, s=size, linewidths=0, color="tab:blue")
    elif categories is not None and len(categories) <= MAX_LEGEND:
        cmap = _cmap("tab10" if len(categories) <= 10 else "tab20")
        for j, name in enumerate(categories):
            sel = c[idx] == j
            ax.scatter(x[sel], y[sel], s=size, linewidths=0, color=cmap(j), label=str(name))
        ax.legend(title=label, fontsize=TICK, title_fontsize=LABEL, markerscale=2.5 if
                  size < 12 else 1.5, loc="best", framealpha=0.8)
    else:
        sc = ax.scatter(x, y, c=c[idx], s=size, linewidths=0, cmap="viridis")
        bar = ax.figure.colorbar(sc, ax=ax)
        bar.set_label(label or "colour", fontsize=LABEL)
        bar.ax.tick_params(labelsize=TICK)
    if Y.shape[1] > 1:
        ax.set_aspect("equal", adjustable="datalim")
    return ax


def sample_rows(n: int, size: int, random_state: int = 0) -> np.ndarray:
    """Sorted indices of a seeded sample of ``size`` of ``n`` rows (all of them when fewer):
    what a scatter draws of a large embedding."""
    if n <= size:
        return np.arange(n)
    return np.sort(np.random.default_rng(random_state).choice(n, size, replace=False))


def _cmap(name: str) -> Any:
    from matplotlib import colormaps

    return colormaps[name]


def running_mean(x: Any, window: int) -> np.ndarray:
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


def variance(
    times: Any, variance: Any, threshold: Any, refits: Sequence[Any] = (), *, ax: Any = None,
    window: int = 50, flagged: Any = None, groups: Any = None, title: str = "predictive variance",
) -> Any:
    """Per-point predictive variance over stream time, its running mean, the threshold in force
    and a mark at every refit.

    Parameters
    ----------
    times : array-like of shape (n,)
        Stream position of each point.
    variance : array-like of shape (n,)
        Its predictive variance (NaN: not drawn).
    threshold : float or array-like of shape (n,)
        The threshold in force at each point (a step line).
    refits : sequence of float or of dict
        Refit times; a dict gives ``trigger_row`` (dotted mark) and ``publish_row`` (solid).
    window : int
        Points of the trailing running mean.
    flagged : array-like of bool, shape (n,), optional
        Points drawn as x (flagged as off the model) instead of dots.
    groups : array-like of int, shape (n,), optional
        Colour of each point (e.g. its manifold).
    ax : matplotlib.axes.Axes, optional
        Where to draw; default a new wide Figure.
    title : str

    Returns
    -------
    matplotlib.axes.Axes
    """
    t = np.asarray(times, dtype=float)
    v = np.asarray(variance, dtype=float)
    if v.shape != t.shape:
        raise ValueError(f"variance has shape {v.shape} but times has {t.shape}")
    thr = np.broadcast_to(np.asarray(threshold, dtype=float), t.shape)
    flag = np.zeros(t.shape, bool) if flagged is None else np.asarray(flagged, bool)
    g = np.zeros(t.shape, int) if groups is None else np.asarray(groups).astype(int)
    cmap = _cmap("tab10")
    ax = _axes(ax, title, "stream position", "predictive variance (log)", WIDE_PANEL)
    colour_note = "" if groups is None else " (colour: manifold)"
    for sel, marker, what in ((~flag, "o", "point"), (flag, "x", "flagged point")):
        sel = sel & np.isfinite(v)
        if sel.any():
            ax.scatter(t[sel], v[sel], s=6, c=cmap(np.mod(np.maximum(g[sel], 0), 10)),
                       marker=marker, alpha=0.6, linewidths=0.6 if marker == "x" else 0)
            # the legend's marker in neutral grey: the colours are the groups'
            ax.scatter([], [], s=12, color="dimgray", marker=marker, label=what + colour_note)
    ax.plot(t, running_mean(v, window), color="black", lw=1.5, label=f"running mean (w={window})")
    ax.step(t, thr, where="post", color="red", ls="--", lw=1.5, label="threshold")
    for i, r in enumerate(refits):
        trigger, publish = ((r.get("trigger_row"), r.get("publish_row")) if isinstance(r, Mapping)
                            else (None, r))
        if trigger is not None:
            ax.axvline(trigger, color="gray", ls=":", lw=1.2,
                       label="refit triggered" if i == 0 else None)
        if publish is not None:
            ax.axvline(publish, color="gray", ls="-", lw=1.2,
                       label="refit published" if i == 0 else None)
    if np.any(np.isfinite(v) & (v > 0)):
        ax.set_yscale("log")
    ax.legend(fontsize=TICK, loc="upper left", framealpha=0.8)
    return ax


def spectrum(
    eigenvalues: Any, *, n_kept: int | None = None, ax: Any = None,
    title: str = "eigenvalue spectrum",
) -> Any:
    """Bars of eigenvalues by index, the kept ones highlighted, each labelled with its value.

    Parameters
    ----------
    eigenvalues : array-like of shape (k,)
        In decreasing order (an indefinite operator's negative ones are drawn below zero).
    n_kept : int, optional
        How many leading ones the embedding uses (default: all).
    ax : matplotlib.axes.Axes, optional
        Where to draw; default a new panel-sized Figure.
    title : str

    Returns
    -------
    matplotlib.axes.Axes
    """
    w = np.asarray(eigenvalues, dtype=float).ravel()
    if w.size == 0:
        raise ValueError("no eigenvalues to draw")
    kept = w.size if n_kept is None else int(n_kept)
    index = np.arange(1, w.size + 1)
    ax = _axes(ax, title, "index", "eigenvalue")
    colours = ["tab:blue" if i <= kept else "lightgray" for i in index]
    bars = ax.bar(index, w, color=colours)
    if w.size <= 20:
        ax.bar_label(bars, labels=[f"{x:.3g}" for x in w], fontsize=TICK)
        ax.set_xticks(index)
    ax.axhline(0, color="black", lw=0.8)
    if kept < w.size:
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color="tab:blue", label="kept"),
                           Patch(color="lightgray", label="not kept")], fontsize=TICK)
    ax.margins(y=0.15)
    return ax


def drift_history(history: Sequence[Mapping[str, Any]], *, ax: Any = None,
                  title: str = "drift history") -> Any:
    """The drift statistic of each scheduled run against the rows seen, refits marked.

    Parameters
    ----------
    history : sequence of dict
        The entries of a job's ``drift_history.json`` (``watermark_after``,
        ``drift_statistic``: the fraction of the run's rows flagged, ``refit``,
        ``new_versions``).
    ax : matplotlib.axes.Axes, optional
        Where to draw; default a new wide Figure.
    title : str

    Returns
    -------
    matplotlib.axes.Axes
    """
    rows = np.array([h.get("watermark_after", i) for i, h in enumerate(history)], dtype=float)
    stat = np.array([np.nan if h.get("drift_statistic") is None else h["drift_statistic"]
                     for h in history], dtype=float)
    ax = _axes(ax, title, "rows seen (watermark)", "drift statistic (fraction flagged)",
               WIDE_PANEL)
    ax.plot(rows, stat, "o-", color="tab:blue", label="drift statistic")
    for i, r in enumerate(rows[[bool(h.get("refit")) for h in history]]):
        ax.axvline(r, color="tab:red", ls="--", lw=1.2, label="refit" if i == 0 else None)
    if len(history):
        ax.legend(fontsize=TICK, loc="upper left", framealpha=0.8)
    ax.set_ylim(bottom=0)
    return ax


def loglog(
    series: Mapping[str, tuple[Any, Any]], *, xlabel: str, ylabel: str, title: str,
    ax: Any = None,
) -> Any:
    """Lines with markers on log-log axes, one per named series (a power law is a straight line).

    Parameters
    ----------
    series : dict of str -> (x, y)
        Each series' x and y values, array-like of shape (n,); the name goes in the legend.
    xlabel, ylabel, title : str
    ax : matplotlib.axes.Axes, optional

    Returns
    -------
    matplotlib.axes.Axes
    """
    ax = _axes(ax, title, xlabel, ylabel)
    for name, (x, y) in series.items():
        ax.loglog(np.asarray(x, dtype=float), np.asarray(y, dtype=float), "o-", label=name)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=TICK)
    return ax


def format_cell(v: Any) -> str:
    """A report table's cell as text: numbers to 4 significant digits, a missing or non-finite
    value as ``-``, a list as its items joined by commas (the PNG and the HTML reports alike)."""
    if isinstance(v, (list, tuple)):
        return ", ".join(format_cell(x) for x in v)
    if v is None:
        return "-"
    if isinstance(v, (float, np.floating)):
        return "-" if not math.isfinite(v) else f"{v:.4g}"
    return str(v)


def table_rows(table: Mapping[str, Any]) -> tuple[list[str], list[str], list[list[str]]]:
    """Column names, row names and cell strings of a report table.

    ``table`` is either ``{row: value}`` (one column) or ``{column: {row: value}}`` (e.g. one
    column per method); numbers are shown to 4 significant digits.
    """
    if table and all(isinstance(v, Mapping) for v in table.values()):
        cols = list(table)
        rows = list(dict.fromkeys(r for c in cols for r in table[c]))
        return cols, rows, [[format_cell(table[c].get(r)) for c in cols] for r in rows]
    return ["value"], list(table), [[format_cell(v)] for v in table.values()]


def table_figure(table: Mapping[str, Any], title: str | None = None) -> Any:
    """A readable table (:func:`table_rows`) as its own figure, sized to its rows and columns."""
    cols, rows, cells = table_rows(table)
    # the row names are the first column: every cell then lies inside the figure
    grid = [[r, *c] for r, c in zip(rows, cells)]
    chars = [max(len(h), *(len(g[j]) for g in grid)) + 2 if grid else len(h) + 2
             for j, h in enumerate(["", *cols])]
    fig = _figure((max(0.105 * sum(chars) + 0.3, 0.11 * len(title or ""), 2.5),
                   0.34 * (len(rows) + 1) + (0.6 if title else 0.3)))
    ax = fig.add_subplot()
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=TITLE)
    if not rows:
        ax.text(0.5, 0.5, "no figures", ha="center", va="center", fontsize=CELL)
        return fig
    t = ax.table(cellText=grid, colLabels=["", *cols], bbox=[0, 0, 1, 1],
                 colWidths=[c / sum(chars) for c in chars], cellLoc="right")
    t.auto_set_font_size(False)
    t.set_fontsize(CELL)
    for (i, j), cell in t.get_celld().items():
        if j == 0 or i == 0:  # row names left-aligned, header bold
            cell.set_text_props(ha="left" if j == 0 else "center",
                                weight="bold" if i == 0 else "normal")
    return fig


def render(fig: Any) -> np.ndarray:
    """The RGB pixels of a Figure (or of an Axes' Figure), shape (height, width, 3), at its
    own size and DPI."""
    fig = fig if hasattr(fig, "savefig") else fig.figure
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def _pad(img: np.ndarray, height: int, width: int) -> np.ndarray:
    out = np.full((height, width, 3), 255, np.uint8)
    out[: img.shape[0], : img.shape[1]] = img
    return out


def _grid(images: list[np.ndarray], ncol: int) -> np.ndarray:
    rows = []
    for i in range(0, len(images), ncol):
        row = images[i: i + ncol]
        h = max(im.shape[0] for im in row)
        rows.append(np.concatenate([_pad(im, h, im.shape[1]) for im in row], axis=1))
    w = max(r.shape[1] for r in rows)
    return np.concatenate([_pad(r, r.shape[0], w) for r in rows], axis=0)


def write_png(pixels: Any, path: Any, storage_options: dict | None = None) -> str:
    """Write a Figure or an RGB pixel array as one PNG object at ``path`` (local path, URL or
    :class:`~dr_dask.io.storage.Location`); return its URL."""
    from matplotlib.image import imsave

    buf = io.BytesIO()
    if hasattr(pixels, "savefig"):
        pixels.savefig(buf, format="png", dpi=DPI)
    else:
        imsave(buf, np.asarray(pixels), format="png")
    loc = location(path, storage_options)
    loc.write_bytes(buf.getvalue())
    logger.info("wrote %s", loc.url)
    return loc.url


def report_page(
    path: Any, panels: Sequence[Any], table: Mapping[str, Any] | None = None, *,
    title: str | None = None, ncol: int = 3, storage_options: dict | None = None,
) -> str:
    """One PNG: the panels (figures of this module) in rows of ``ncol``, the table beside them
    (below them when it has several columns or the panels fill more than one row).

    Parameters
    ----------
    path : str or Location
        Where the PNG goes (local path or URL).
    panels : sequence of matplotlib Axes (or Figures) drawn by this module
    table : dict, optional
        ``{row: value}`` or ``{column: {row: value}}`` (see :func:`table_rows`).
    title : str, optional
        The table's title.
    ncol : int
        Panels per row.
    storage_options : dict, optional

    Returns
    -------
    str
        The PNG's URL.
    """
    if not panels and not table:
        raise ValueError("an empty report page: no panels and no table")
    images = [render(p) for p in panels]
    if table is None:
        return write_png(_grid(images, ncol), path, storage_options)
    tab = render(table_figure(table, title))
    # the table takes the last row's free slot, or widens a single full row when it is one
    # column of values; otherwise it goes below the panels
    cols = ncol
    beside = bool(images) and len(images) % ncol != 0
    if len(images) == ncol and len(table_rows(table)[0]) == 1:
        beside, cols = True, ncol + 1
    if beside:
        images.append(tab)
    page = _grid(images, cols) if images else tab
    if not beside and images:
        w = max(page.shape[1], tab.shape[1])
        page = np.concatenate([_pad(page, page.shape[0], w), _pad(tab, tab.shape[0], w)], axis=0)
    return write_png(page, path, storage_options)
