"""``dr-dask report RUN_OR_STATE --html OUT.html``: one self-contained interactive page, opened
in a real headless browser (chromium over the DevTools protocol): it loads with no console
error, its scatter holds the number of points the page states, and it is not blank."""

from __future__ import annotations

import io
import json

import browser
import numpy as np
import pytest
import zarr
from click.testing import CliRunner
from matplotlib.image import imread

from dr_dask.cli import main
from dr_dask.datasets.swiss_roll import shift_scenario
from dr_dask.io.storage import Location
from dr_dask.jobs import run_incremental
from dr_dask.report.html import html_report
from dr_dask.runs.group import RunGroup

needs_chromium = pytest.mark.skipif(
    browser.find_chromium() is None,
    reason="no chromium on PATH (Debian: apt-get install -y chromium; .ci/run installs it)")

#: What the test reads from the live page: the points in Bokeh's document, as the page's
#: DocumentReady callback recorded them, and the count the page states.
POINTS = "[document.body.dataset.scatterPoints, document.body.dataset.statedPoints]"


def _cli(*args):
    return CliRunner().invoke(main, ["--scheduler", "threads", *args])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A complete IKD run of 400 rows (through the CLI, as a user makes one)."""
    root = tmp_path_factory.mktemp("runs")
    res = _cli("datasets", "make", "gp", "--out", str(root / "d.zarr"), "-T", "400", "-N", "40")
    assert res.exit_code == 0, res.output
    res = _cli("embed", "ikd", "--input", f"{root / 'd.zarr'}:X", "--out",
               str(root / "runs.zarr"), "-n", "3", "--name", "r1")
    assert res.exit_code == 0, res.output
    return root / "runs.zarr" / "r1"


def _open(path, stated: int):
    page = browser.load(path.as_uri(), POINTS)
    assert page.errors == []
    assert page.value == [str(stated), str(stated)]
    img = imread(io.BytesIO(page.screenshot), format="png")
    assert img.std() > 0.05  # drawn, not a blank page
    return page


@needs_chromium
def test_run_page_in_the_browser(run, tmp_path):
    out = tmp_path / "run.html"
    res = _cli("report", str(run), "--html", str(out))
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary == {"html": str(out), "kind": "run", "points": 400, "rows": 400,
                       "bytes": out.stat().st_size}
    page = out.read_text()
    assert "https://" not in page.split("<body", 1)[0] or "cdn.bokeh.org" not in page
    assert "<script src=" not in page  # everything inline: opens with no network
    _open(out, 400)


@needs_chromium
def test_large_scatter_draws_a_seeded_sample_and_says_so(run, tmp_path):
    out = tmp_path / "sampled.html"
    res = _cli("report", str(run), "--html", str(out), "--max-points", "150")
    assert res.exit_code == 0, res.output
    assert "150 of 400 points (a seeded sample)" in out.read_text()
    _open(out, 150)
    again = tmp_path / "again.html"
    _cli("report", str(run), "--html", str(again), "--max-points", "150")
    assert again.read_bytes().count(b"150 of 400") == 1


@needs_chromium
def test_job_state_page_in_the_browser(tmp_path):
    """An incremental job's state after two nights (the second brings an unseen patch): the
    embedding by manifold, variance over time with threshold and refits, drift history."""
    sc = shift_scenario(100, random_state=3)
    X = np.vstack([sc.batch, sc.stream])
    src, state = str(tmp_path / "land.zarr"), str(tmp_path / "state")
    g = zarr.open_group(store=Location(src).zarr_store(), mode="a")
    arr = g.create_array("X", shape=(400, 3), chunks=(50, 3), dtype="f8")
    arr[:] = X[:400]
    params = {"n_batch": 300, "n_s": 40, "chunk_size": 50}
    run_incremental(f"{src}:X", state, **params)
    arr.resize((700, 3))
    arr[400:] = X[400:700]
    second = run_incremental(f"{src}:X", state, **params)
    assert second["refit"]  # the unseen patch triggered one: the page has refit marks
    out = tmp_path / "state.html"
    res = _cli("report", state, "--html", str(out))
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["kind"] == "stream" and summary["rows"] == 700
    text = out.read_text()
    for title in ("embedding by manifold", "predictive variance over the stream",
                  "drift history", "rows per manifold"):
        assert title in text
    _open(out, summary["points"])


def test_written_to_a_url(run):
    url = html_report(str(run), "memory://reports/run.html")["html"]
    page = Location(url).read_bytes().decode()
    assert page.startswith("<!DOCTYPE html>") and "data-stated-points=\"400\"" in page


def test_missing_or_incomplete_run_is_exit_2_and_writes_nothing(run, tmp_path):
    out = tmp_path / "x.html"
    res = _cli("report", str(run.parent / "nope"), "--html", str(out))
    assert res.exit_code == 2 and "neither a run" in res.output and not out.exists()
    RunGroup(str(run.parent), "half", params={"n": 1}, identity={})  # started, never complete
    res = _cli("report", str(run.parent / "half"), "--html", str(out))
    assert res.exit_code == 2 and "incomplete run" in res.output and not out.exists()
    assert "Traceback" not in res.output


def test_refit_job_store_shows_its_latest_run_and_metrics(run, tmp_path):
    """A weekly refit job's run store: the run ``latest.json`` names, with the job's metrics
    (latest.json as :func:`dr_dask.jobs.run_refit` writes it, trimmed to what the page reads)."""
    import shutil

    store = tmp_path / "weekly.zarr"
    shutil.copytree(run.parent, store)
    Location(str(store)).child("latest.json").write_json(
        {"run": run.name, "metrics": {"trustworthiness": 0.9321, "tci_per_n": 2.5}})
    res = html_report(str(store), str(tmp_path / "job.html"))
    assert res["kind"] == "refit-job" and res["points"] == 400
    page = (tmp_path / "job.html").read_text()
    assert "metric: trustworthiness" in page and "0.9321" in page
    Location(str(store)).child("latest.json").write_json({"run": "gone", "metrics": {}})
    with pytest.raises(ValueError, match="neither a run"):
        html_report(str(store), str(tmp_path / "gone.html"))
    assert not (tmp_path / "gone.html").exists()


#: The colour keys of the live page: the names of its legend and colour bar models.
KEYS = ("[...Bokeh.documents[0].all_models].map(m => m.constructor.__name__)"
        ".filter(n => n == 'Legend' || n == 'ColorBar')")


@needs_chromium
def test_colour_by_a_variable_of_the_input_or_a_user_array(run, tmp_path):
    """--color: numbers get a colour bar, categories a legend; a wrong name is exit 2."""
    out = tmp_path / "latent.html"
    res = _cli("report", str(run), "--html", str(out), "--color", "latent[0]")
    assert res.exit_code == 0, res.output
    page = browser.load(out.as_uri(), KEYS)
    assert page.errors == [] and page.value == ["ColorBar"]
    labels = tmp_path / "labels.npy"
    np.save(labels, np.arange(400) % 3)
    out = tmp_path / "labels.html"
    res = _cli("report", str(run), "--html", str(out), "--color", str(labels))
    assert res.exit_code == 0, res.output
    # (the page in the browser: test_page_size_for_ten_thousand_points)
    assert '"name":"Legend"' in out.read_text() and '"name":"ColorBar"' not in out.read_text()
    res = _cli("report", str(run), "--html", str(tmp_path / "x.html"), "--color", "nope")
    assert res.exit_code == 2 and "no variable 'nope'" in res.output and "latent" in res.output
    res = _cli("report", str(run), "--html", str(tmp_path / "x.html"), "--color", "latent")
    assert res.exit_code == 2 and "VAR[j]" in res.output
    assert not (tmp_path / "x.html").exists()


@needs_chromium
def test_page_size_for_ten_thousand_points(tmp_path):
    """10^4 points make a page under 1 MB with BokehJS in it (compressed, unpacked by the
    browser: it opens with no network and draws every point); above 1 MB the page says what
    it is made of."""
    rng = np.random.default_rng(0)
    rg = RunGroup(str(tmp_path / "runs.zarr"), "big", params={"n": 2}, identity={})
    rg.write("embedding", rng.normal(size=(100_000, 2)), dims=("sample", "component"))
    rg.write("sample", np.arange(100_000), dims=("sample",))
    rg.mark_complete(arrays=("embedding",), method="IKD", eigenvalues=[3.0, 2.0])
    run, labels = str(tmp_path / "runs.zarr" / "big"), np.arange(100_000) % 4
    lean = html_report(run, str(tmp_path / "cdn.html"), resources="cdn", color=labels,
                       max_points=10_000)
    assert lean["points"] == 10_000 and lean["bytes"] < 300_000
    out = tmp_path / "inline.html"
    full = html_report(run, str(out), color=labels, max_points=10_000)
    assert full["bytes"] < 1_000_000
    text = out.read_text()
    assert "<script src=" not in text and f"This page is {full['bytes'] / 1e6:.2f} MB." in text
    # no console error, every point in the scatter, drawn, with a legend of the labels
    _open(out, 10_000)
    assert '"name":"Legend"' in text
    html_report(run, str(tmp_path / "all.html"), color=labels)  # 10^5 points: over 1 MB
    assert "MB of it BokehJS (compressed), included so that it opens with no network; the " \
        "rest is the 100,000 points drawn" in (tmp_path / "all.html").read_text()
