"""The embedding's interactive scatter from memory, in a notebook (``dr_dask.plot.interactive``).

:func:`interactive` draws an in-memory embedding with the same Bokeh scatter as the report page
(:mod:`dr_dask.report.html`); in a Jupyter kernel the figure displays as the cell's output, a
self-contained frame (:func:`notebook_html`) with BokehJS packed inline as in the page, so no
Bokeh extension is needed.
"""

from __future__ import annotations

import html
import logging
from typing import Any

import numpy as np
from bokeh.embed import file_html
from bokeh.models.layouts import LayoutDOM
from bokeh.resources import INLINE

from dr_dask.report.html import HEIGHT, MAX_POINTS, WIDTH, embedding_scatter, packed_page
from dr_dask.report.plot import MAX_LEGEND, values_of
from dr_dask.report.plot import colour_values as embedding_colours
from dr_dask.runtime.progress import in_notebook

logger = logging.getLogger(__name__)

__all__ = ["interactive", "notebook_html"]


def interactive(Y: Any, color: Any = None, *, label: str | None = None,
                title: str = "embedding", sample: Any = None, max_points: int = MAX_POINTS,
                random_state: int = 0) -> Any:
    """The report's interactive scatter of an embedding in memory: pan, zoom, hover.

    The same Bokeh scatter as ``dr-dask report --html`` draws for a stored run, coloured by
    the rules of :func:`dr_dask.plot.embedding`: labels (integers, strings) are categories
    with a legend up to ``dr_dask.MAX_LEGEND`` of them, floats (a latent, its first
    column when 2-D) a continuous colour map with a colour bar. Above ``max_points`` points it
    draws a seeded sample and says so in the title. In a Jupyter kernel the returned figure
    displays as the cell's output (a self-contained frame: no Bokeh extension needed); outside
    one, ``bokeh.plotting.show`` or ``bokeh.io.save`` it.

    Parameters
    ----------
    Y : array-like of shape (T, d)
        The embedding (NumPy, dask, a DataArray; a 1-D embedding is drawn against zero).
    color : array-like of shape (T,) or (T, M), optional
        Labels or a latent, one value per row; ``None``: one colour.
    label : str, optional
        What the colour shows (legend or colour bar title); default ``"colour"``.
    title : str, default="embedding"
    sample : array-like of shape (T,), optional
        Each row's sample id, shown on hover; default the row number.
    max_points : int, default=100_000
        Points drawn at most (a seeded sample above it keeps the browser responsive).
    random_state : int, default=0
        Seeds that sample.

    Returns
    -------
    bokeh.plotting.figure
        Its data source is named ``"embedding-points"`` (columns ``x``, ``y``, ``sample`` and
        ``colour``).

    Raises
    ------
    ValueError
        ``color`` or ``sample`` not one value per row.

    See Also
    --------
    dr_dask.plot.embedding : the same picture as a matplotlib Axes.
    dr_dask.report.html.html_report : a stored run's page.

    Examples
    --------
    >>> import numpy as np
    >>> from dr_dask.plot import interactive
    >>> Y = np.random.default_rng(0).normal(size=(500, 2))
    >>> fig = interactive(Y, color=Y[:, 0], label="first axis")
    >>> fig.select_one({"name": "embedding-points"}).data["x"].shape
    (500,)
    """
    Y = np.asarray(values_of(Y), dtype=float)
    Y = Y[:, None] if Y.ndim == 1 else Y
    codes, categories = embedding_colours(color, Y.shape[0])
    ids = np.arange(len(Y)) if sample is None else np.asarray(values_of(sample))
    if ids.shape != (len(Y),):
        raise ValueError(f"sample has shape {ids.shape}, not one id per row ({len(Y)},)")
    colour: np.ndarray | None = codes
    categorical = categories is not None and len(categories) <= MAX_LEGEND
    if categorical:
        assert codes is not None and categories is not None  # colour_values gives both
        colour = np.asarray(categories, dtype=object)[codes.astype(np.int64)]
    fig, _ = embedding_scatter(Y, ids, colour, label or "colour", title, max_points,
                               random_state, categorical=categorical)
    if in_notebook():
        _display_in_notebook()
    return fig


def notebook_html(obj: Any) -> str:
    """A Bokeh object as a notebook cell's HTML: its standalone page in a frame (BokehJS
    inline and compressed, as in the report), so it draws with no Bokeh extension."""
    page = packed_page(file_html(obj, INLINE, "dr_dask"))
    width = (getattr(obj, "width", None) or WIDTH) + 160  # the legend or colour bar
    height = (getattr(obj, "height", None) or HEIGHT) + 40
    return (f'<iframe srcdoc="{html.escape(page, quote=True)}" width="{width}" '
            f'height="{height}" style="border:none"></iframe>')


def _display_in_notebook() -> None:
    """Have this kernel draw Bokeh figures and layouts returned by a cell (once)."""
    from IPython import get_ipython  # a kernel has IPython loaded already

    formatter = get_ipython().display_formatter.formatters["text/html"]
    formatter.for_type(LayoutDOM, notebook_html)
