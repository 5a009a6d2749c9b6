"""``dr_dask.plot.interactive``: the report's Bokeh scatter from an embedding in memory, with
``dr_dask.plot.embedding``'s colouring rules and a seeded sample above 10^5 points."""

from __future__ import annotations

import numpy as np
import pytest
from bokeh.models import ColorBar, Legend, LinearColorMapper
from bokeh.models.sources import ColumnDataSource
from bokeh.plotting import figure

from dr_dask import plot
from dr_dask.report.html import MAX_POINTS, SCATTER_SOURCE


def _source(fig) -> ColumnDataSource:
    return fig.select_one({"name": SCATTER_SOURCE})


@pytest.fixture(scope="module")
def Y() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(500, 3))


def test_a_latent_colours_continuously(Y):
    fig = plot.interactive(Y, color=Y[:, 2], label="z", sample=np.arange(500) + 1000)
    assert isinstance(fig, figure)
    data = _source(fig).data
    np.testing.assert_array_equal(data["x"], Y[:, 0].astype(np.float32))
    np.testing.assert_array_equal(data["y"], Y[:, 1].astype(np.float32))
    np.testing.assert_array_equal(data["colour"], Y[:, 2].astype(np.float32))
    assert list(data["sample"][:2]) == [1000, 1001]  # shown on hover
    (bar,) = fig.select({"type": ColorBar})
    assert bar.title == "z" and isinstance(bar.color_mapper, LinearColorMapper)
    assert bar.color_mapper.low == pytest.approx(Y[:, 2].min(), rel=1e-6)
    assert not fig.select({"type": Legend}) or not fig.legend[0].items


def test_labels_get_a_legend_by_the_rules_of_plot_embedding(Y):
    labels = np.array(["a", "b", "c"])[np.arange(500) % 3]
    fig = plot.interactive(Y, color=labels, label="patch")
    assert sorted(set(_source(fig).data["colour"])) == ["a", "b", "c"]
    legend = fig.legend[0]
    assert legend.title == "patch"
    assert not fig.select({"type": ColorBar})
    # embedding()'s rule: more labels than MAX_LEGEND are a colour map, not a legend
    many = plot.interactive(Y, color=np.arange(500) % 30)
    assert many.select({"type": ColorBar}) and not many.legend


def test_no_colour_draws_one_colour(Y):
    fig = plot.interactive(Y[:, :1])  # a 1-D embedding, against zero
    data = _source(fig).data
    assert "colour" not in data and not np.any(data["y"])


def test_above_the_threshold_a_seeded_sample_is_drawn():
    n = MAX_POINTS + 20_000
    Y = np.random.default_rng(1).normal(size=(n, 2))
    a, b = plot.interactive(Y, color=Y[:, 0]), plot.interactive(Y, color=Y[:, 0])
    xa = _source(a).data["x"]
    assert len(xa) == MAX_POINTS and "seeded sample" in a.title.text
    np.testing.assert_array_equal(xa, _source(b).data["x"])  # same seed, same points
    rows = _source(a).data["sample"]
    np.testing.assert_array_equal(xa, Y[rows, 0].astype(np.float32))  # rows kept whole
    c = plot.interactive(Y, color=Y[:, 0], random_state=7)
    assert not np.array_equal(_source(c).data["sample"], rows)


def test_colour_of_another_length_is_refused(Y):
    with pytest.raises(ValueError, match="rows"):
        plot.interactive(Y, color=np.zeros(10))


def test_a_kernel_displays_the_figure(Y):
    from IPython.core.interactiveshell import InteractiveShell

    from dr_dask.report.interactive import _display_in_notebook

    shell = InteractiveShell.instance()
    try:
        _display_in_notebook()
        bundle, _ = shell.display_formatter.format(plot.interactive(Y, color=Y[:, 2]))
    finally:
        InteractiveShell.clear_instance()
    page = bundle["text/html"]
    assert page.startswith("<iframe srcdoc=") and SCATTER_SOURCE in page
    # BokehJS travels inside the frame (packed): it draws with no extension and no network
    assert "DecompressionStream" in page
