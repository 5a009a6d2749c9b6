"""dr_dask.report.plot: readable panels laid out beside a short table, written to any location;
the quickstart's report (figures and JSON carry the same numbers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from matplotlib.image import imread

from dr_dask.cli import main
from dr_dask.io.storage import Location
from dr_dask.report import plot

PANEL_PX = (int(plot.PANEL[1] * plot.DPI), int(plot.PANEL[0] * plot.DPI))  # (h, w)


def _png_shape(loc: Location) -> tuple[int, int]:
    import io

    return imread(io.BytesIO(loc.read_bytes()), format="png").shape[:2]


def test_report_page_lays_panels_beside_the_table_at_a_url():
    rng = np.random.default_rng(0)
    Y, z = rng.normal(size=(300, 2)), rng.normal(size=(300, 3))
    table = {"T": 300, "R²": 0.98765}
    panels = [plot.embedding(Y, z, label="latent z1", title="emb"),
              plot.spectrum([3.0, 2.0, 0.5], n_kept=2)]
    url = plot.report_page("memory://figs/page.png", panels, table, title="numbers")
    tab_h, tab_w = plot.render(plot.table_figure(table, "numbers")).shape[:2]
    # panels at their own readable size, the one-column table beside them: nothing shrunk
    assert _png_shape(Location(url)) == (max(PANEL_PX[0], tab_h), 2 * PANEL_PX[1] + tab_w)
    # a table of several columns goes below a full row of panels
    wide = {"ikd": {"r2": 0.9}, "pca": {"r2": 0.5}}
    url = plot.report_page("memory://figs/wide.png", panels[:1], wide, ncol=1)
    tab_h, tab_w = plot.render(plot.table_figure(wide)).shape[:2]
    assert _png_shape(Location(url)) == (PANEL_PX[0] + tab_h, max(PANEL_PX[1], tab_w))
    with pytest.raises(ValueError, match="empty report page"):
        plot.report_page("memory://figs/empty.png", [], None)


def test_embedding_colours_legend_and_colour_bar():
    rng = np.random.default_rng(1)
    Y = rng.normal(size=(200, 3))
    labels = np.repeat(["a", "b", "c", "d"], 50)
    ax = plot.embedding(Y, labels, label="class")
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["a", "b", "c", "d"]
    assert legend.get_title().get_text() == "class"
    assert ax.get_xlabel() == "component 1" and ax.get_ylabel() == "component 2"
    fig = plot.embedding(Y, Y[:, 2], label="latent z1").figure
    assert fig.axes[1].get_ylabel() == "latent z1"  # the colour bar says what colour means
    with pytest.raises(ValueError, match="colour values have 199 rows but the embedding has 200"):
        plot.embedding(Y, labels[:199])


def test_variance_threshold_and_refit_marks():
    t = np.arange(100)
    v = np.linspace(0.01, 1.0, 100)
    thr = np.where(t < 60, 0.5, 0.8)
    refits = [{"trigger_row": 50, "publish_row": 60}]
    ax = plot.variance(t, v, thr, refits, window=10)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"threshold", "refit triggered", "refit published", "running mean (w=10)"} <= set(
        labels)
    marks = sorted(line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() in
                   (":", "-") and len(set(line.get_xdata())) == 1)
    assert marks == [50, 60]
    assert ax.get_yscale() == "log"
    np.testing.assert_allclose(plot.running_mean(v, 10)[9], v[:10].mean())
    with pytest.raises(ValueError, match="variance has shape"):
        plot.variance(t, v[:-1], thr, refits)


def test_spectrum_bars_are_the_eigenvalues():
    w = [5.0, 3.0, 1.0, -0.5]
    ax = plot.spectrum(w, n_kept=2)
    np.testing.assert_allclose([b.get_height() for b in ax.patches], w)
    with pytest.raises(ValueError, match="no eigenvalues"):
        plot.spectrum([])


def test_drift_history_marks_refits():
    history = [{"watermark_after": 100 * (i + 1), "drift_statistic": s, "refit": i == 2}
               for i, s in enumerate([0.01, 0.02, 0.4, 0.03])]
    history.append({"watermark_after": 500, "drift_statistic": None, "refit": False})  # idle
    ax = plot.drift_history(history)
    x, y = ax.get_lines()[0].get_data()
    np.testing.assert_allclose(x, [100, 200, 300, 400, 500])
    np.testing.assert_allclose(y[:4], [0.01, 0.02, 0.4, 0.03])
    assert np.isnan(y[4])
    marks = [line.get_xdata()[0] for line in ax.get_lines()[1:]]
    assert marks == [300]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["drift statistic", "refit"]


def test_draws_into_the_callers_axes():
    """Every function draws into a given Axes (a notebook's subplots) and returns it."""
    from matplotlib.figure import Figure

    fig = Figure()
    axes = fig.subplots(2, 2).ravel()
    rng = np.random.default_rng(0)
    drawn = [
        plot.embedding(rng.normal(size=(50, 2)), rng.normal(size=50), ax=axes[0]),
        plot.spectrum([3.0, 1.0], ax=axes[1]),
        plot.variance(np.arange(10), np.ones(10), 0.5, ax=axes[2]),
        plot.drift_history([{"watermark_after": 10, "drift_statistic": 0.1}], ax=axes[3]),
    ]
    assert all(a is b for a, b in zip(drawn, axes))
    assert len(fig.axes) == 5  # the four and the embedding's colour bar: no other figure
    assert plot.embedding(rng.normal(size=(30_000, 2)), max_points=1000).collections[0] \
        .get_offsets().shape == (1000, 2)  # a seeded sample of a large embedding


def test_drawing_leaves_pyplot_alone():
    """No pyplot import, no global backend switch, no rcParams change: safe inside other apps."""
    code = (
        "import matplotlib, numpy as np, sys\n"
        "backend, rc = matplotlib.get_backend(), dict(matplotlib.rcParams)\n"
        "from dr_dask import plot\n"
        "plot.report_page('memory://x.png', [plot.embedding(np.eye(5), "
        "np.arange(5.0))], {'a': 1})\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
        "assert matplotlib.get_backend() == backend and dict(matplotlib.rcParams) == rc\n"
    )
    env = {**os.environ, "MPLBACKEND": "svg"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_quickstart_report_numbers(tmp_path):
    """The quickstart's JSON carries what its picture shows (R², the IKD eigenvalues), the
    picture has its two panels beside the table."""
    from dr_dask.runs.group import open_run

    out = tmp_path / "qs"
    res = CliRunner().invoke(main, ["--scheduler", "threads", "quickstart", "--out", str(out),
                                    "-T", "150", "-N", "40"])
    assert res.exit_code == 0, res.output
    metrics = json.loads((out / "metrics.json").read_text())
    run_path = metrics["ikd"]["run"]
    store, name = os.path.split(run_path)
    summary = open_run(store, name).attrs["summary"]
    assert metrics["ikd"]["eigenvalues"] == summary["eigenvalues"]
    assert len(metrics["ikd"]["eigenvalues"]) == metrics["dataset"]["latent_dim"] == 3
    assert 0.5 < metrics["ikd"]["r2"] <= 1 and 0 <= metrics["pca"]["r2"] <= 1
    h, w = imread(str(out / "embedding.png")).shape[:2]
    assert h == PANEL_PX[0] and w > 2 * PANEL_PX[1]
