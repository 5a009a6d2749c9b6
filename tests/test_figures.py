"""dr_dask.figures: readable panels laid out beside a short table, written to any location;
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

from dr_dask import figures
from dr_dask.cli import main
from dr_dask.storage import Location

PANEL_PX = (int(figures.PANEL[1] * figures.DPI), int(figures.PANEL[0] * figures.DPI))  # (h, w)


def _png_shape(loc: Location) -> tuple[int, int]:
    import io

    return imread(io.BytesIO(loc.read_bytes()), format="png").shape[:2]


def test_report_page_lays_panels_beside_the_table_at_a_url():
    rng = np.random.default_rng(0)
    Y, z = rng.normal(size=(300, 2)), rng.normal(size=(300, 3))
    table = {"T": 300, "R²": 0.98765}
    panels = [figures.embedding_figure(Y, z, label="latent z1", title="emb"),
              figures.spectrum_figure([3.0, 2.0, 0.5], n_kept=2)]
    url = figures.report_page("memory://figs/page.png", panels, table, title="numbers")
    tab_h, tab_w = figures.render(figures.table_figure(table, "numbers")).shape[:2]
    # panels at their own readable size, the one-column table beside them: nothing shrunk
    assert _png_shape(Location(url)) == (max(PANEL_PX[0], tab_h), 2 * PANEL_PX[1] + tab_w)
    # a table of several columns goes below a full row of panels
    wide = {"ikd": {"r2": 0.9}, "pca": {"r2": 0.5}}
    url = figures.report_page("memory://figs/wide.png", panels[:1], wide, ncol=1)
    tab_h, tab_w = figures.render(figures.table_figure(wide)).shape[:2]
    assert _png_shape(Location(url)) == (PANEL_PX[0] + tab_h, max(PANEL_PX[1], tab_w))
    with pytest.raises(ValueError, match="empty report page"):
        figures.report_page("memory://figs/empty.png", [], None)


def test_embedding_colours_legend_and_colour_bar():
    rng = np.random.default_rng(1)
    Y = rng.normal(size=(200, 3))
    labels = np.repeat(["a", "b", "c", "d"], 50)
    ax = figures.embedding_figure(Y, labels, label="class").axes[0]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["a", "b", "c", "d"]
    assert legend.get_title().get_text() == "class"
    assert ax.get_xlabel() == "component 1" and ax.get_ylabel() == "component 2"
    fig = figures.embedding_figure(Y, Y[:, 2], label="latent z1")
    assert fig.axes[1].get_ylabel() == "latent z1"  # the colour bar says what colour means
    with pytest.raises(ValueError, match="colour values have 199 rows but the embedding has 200"):
        figures.embedding_figure(Y, labels[:199])


def test_variance_threshold_and_refit_marks():
    t = np.arange(100)
    v = np.linspace(0.01, 1.0, 100)
    thr = np.where(t < 60, 0.5, 0.8)
    refits = [{"trigger_row": 50, "publish_row": 60}]
    ax = figures.variance_figure(t, v, thr, refits, window=10).axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"threshold", "refit triggered", "refit published", "running mean (w=10)"} <= set(
        labels)
    marks = sorted(line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() in
                   (":", "-") and len(set(line.get_xdata())) == 1)
    assert marks == [50, 60]
    assert ax.get_yscale() == "log"
    np.testing.assert_allclose(figures.running_mean(v, 10)[9], v[:10].mean())
    with pytest.raises(ValueError, match="variance has shape"):
        figures.variance_figure(t, v[:-1], thr, refits)


def test_spectrum_bars_are_the_eigenvalues():
    w = [5.0, 3.0, 1.0, -0.5]
    ax = figures.spectrum_figure(w, n_kept=2).axes[0]
    np.testing.assert_allclose([b.get_height() for b in ax.patches], w)
    with pytest.raises(ValueError, match="no eigenvalues"):
        figures.spectrum_figure([])


def test_drawing_leaves_pyplot_alone():
    """No pyplot import, no global backend switch, no rcParams change: safe inside other apps."""
    code = (
        "import matplotlib, numpy as np, sys\n"
        "backend, rc = matplotlib.get_backend(), dict(matplotlib.rcParams)\n"
        "from dr_dask import figures\n"
        "figures.report_page('memory://x.png', [figures.embedding_figure(np.eye(5), "
        "np.arange(5.0))], {'a': 1})\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
        "assert matplotlib.get_backend() == backend and dict(matplotlib.rcParams) == rc\n"
    )
    env = {**os.environ, "MPLBACKEND": "svg"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_quickstart_report_numbers(tmp_path):
    """The quickstart's JSON carries what its picture shows (R², the IKD eigenvalues), the
    picture has its two panels beside the table."""
    from dr_dask.runs import open_run

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
