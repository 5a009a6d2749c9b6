"""``dr-dask report RUN_OR_STATE --html OUT.html``: one self-contained, interactive page.

Bokeh's standalone HTML (``bokeh.embed.file_html`` with ``INLINE`` resources) draws it: the
page carries BokehJS and its CSS inline, so it opens from a file or an object store with no
network, and the plots are Bokeh's own pan / zoom / hover tools rather than JavaScript of ours.

What the page shows depends on what ``RUN_OR_STATE`` is:

- a **run** (a run group of ``dr-dask embed`` / :func:`dr_dask.runs.group.run_embedding`, e.g.
  ``runs.zarr/ikd-1a2b...``; or a refit job's run store, whose ``latest.json`` names the run):
  the embedding as a scatter (hover: the sample coordinate and the colour value, the row
  order), the eigenvalue spectrum, and the run's summary (and, for a refit job, its metrics)
  as a table;
- a **stream output store** or an **incremental job's state** (``checkpoint.json``): the
  embedding coloured by manifold, the predictive variance over stream time with its running
  mean, the threshold in force and the refit marks, the rows per manifold, the table of the
  stream's numbers and, for a job, the drift statistic of each run with its refits.

Scatters of more than ``max_points`` points draw a seeded sample of that size, and say so in
the title (10^5 points stay responsive, drawn with WebGL where the browser has it). A run that
does not exist or is not complete is refused before anything is written
(:class:`~dr_dask.io.inputs.InputError`: exit code 2).
"""

from __future__ import annotations

import html
import json
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
from bokeh.document import Document
from bokeh.embed import file_html
from bokeh.events import DocumentReady
from bokeh.layouts import column, row
from bokeh.models.annotations import ColorBar, Span
from bokeh.models.callbacks import CustomJS
from bokeh.models.ranges import FactorRange
from bokeh.models.sources import ColumnDataSource
from bokeh.models.tools import HoverTool
from bokeh.models.widgets.markups import Div
from bokeh.palettes import Category10_10, Category20_20, Viridis256
from bokeh.plotting import figure
from bokeh.resources import INLINE
from bokeh.transform import factor_cmap, linear_cmap

from dr_dask.io.inputs import InputError
from dr_dask.io.storage import Location, location
from dr_dask.report.plot import format_cell, running_mean, sample_rows
from dr_dask.report.stream import threshold_in_force
from dr_dask.runs.group import run_attr
from dr_dask.stream.store import STATUS, read_output

logger = logging.getLogger(__name__)

#: Points drawn per scatter; above it a seeded sample of this size.
MAX_POINTS = 100_000
#: Plot sizes (pixels).
WIDTH, HEIGHT, WIDE = 560, 480, 1000
#: Name of the main scatter's data source (tests read its length from the live document).
SCATTER_SOURCE = "embedding-points"

__all__ = ["MAX_POINTS", "html_report"]


# --------------------------------------------------------------------------------------------
# what the location holds


def _kind(loc: Location) -> str:
    """``"stream"`` (a stream store or a job's state), ``"refit-job"`` or ``"run"``; raises
    InputError for anything else, and for an incomplete run."""
    if loc.child("checkpoint.json").exists():
        return "stream"
    if loc.child("latest.json").exists():
        return "refit-job"
    if not loc.child("zarr.json").exists():
        raise InputError(f"{loc} is neither a run (a Zarr run group), a refit job's run store "
                         "(latest.json) nor a stream output or job state (checkpoint.json)")
    meta = loc.child("zarr.json").read_json() or {}
    attrs = meta.get("attributes", {})
    if meta.get("node_type") != "group" or "complete" not in attrs:
        raise InputError(f"{loc} is a Zarr {meta.get('node_type', 'node')} but not a run group "
                         "(no completion mark)")
    if not attrs["complete"]:
        raise InputError(f"{loc} is an incomplete run (interrupted or still running); finish "
                         "it first (rerun the same command: it resumes)")
    return "run"


def _run_data(loc: Location) -> dict:
    import zarr

    group = zarr.open_group(store=loc.zarr_store(read_only=True), mode="r")
    arrays = {n: a[...] for n, a in group.arrays() if n in ("embedding", "sample")}
    emb = np.asarray(arrays["embedding"])
    sample = np.asarray(arrays.get("sample", np.arange(len(emb))))
    summary = dict(run_attr(group, "summary"))
    return {"embedding": emb, "sample": sample, "summary": summary,
            "title": f"{summary.get('method', 'run')}: {loc.url.rstrip('/').rsplit('/', 1)[-1]}"}


# --------------------------------------------------------------------------------------------
# the plots (Bokeh models)


def _sampled(n: int, max_points: int, random_state: int) -> tuple[np.ndarray, str]:
    idx = sample_rows(n, max_points, random_state)
    note = (f"{len(idx):,} of {n:,} points (a seeded sample)" if len(idx) < n
            else f"{n:,} points")
    return idx, note


def _scatter(Y: np.ndarray, sample: np.ndarray, colour: np.ndarray, colour_name: str,
             title: str, max_points: int, random_state: int,
             categorical: bool = False) -> tuple[Any, int]:

    idx, note = _sampled(len(Y), max_points, random_state)
    y = Y[idx, 1] if Y.shape[1] > 1 else np.zeros(len(idx))
    c = colour[idx]
    data = {"x": Y[idx, 0], "y": y, "sample": [str(s) for s in sample[idx]],
            "colour": [str(v) for v in c] if categorical else c.astype(float)}
    source = ColumnDataSource(data, name=SCATTER_SOURCE)
    p = figure(title=f"{title} — {note}", width=WIDTH, height=HEIGHT,
               tools="pan,wheel_zoom,box_zoom,reset,save", active_scroll="wheel_zoom",
               output_backend="webgl", match_aspect=True,
               x_axis_label="component 1",
               y_axis_label="component 2" if Y.shape[1] > 1 else "")
    if categorical:
        factors = sorted(set(data["colour"]), key=lambda v: (len(v), v))
        palette = Category10_10 if len(factors) <= 10 else Category20_20
        fill = factor_cmap("colour", palette=list(palette) * (len(factors) // 20 + 1),
                           factors=factors)
        p.scatter("x", "y", source=source, size=4, fill_color=fill, line_color=None,
                  legend_field="colour")
        p.legend.title = colour_name
    else:
        fill = linear_cmap("colour", Viridis256, float(np.nanmin(c)) if len(c) else 0.0,
                           float(np.nanmax(c)) if len(c) else 1.0)
        p.scatter("x", "y", source=source, size=4, fill_color=fill, line_color=None)
        p.add_layout(ColorBar(color_mapper=fill["transform"], title=colour_name), "right")
    p.add_tools(HoverTool(tooltips=[("sample", "@sample"), (colour_name, "@colour")]))
    return p, len(idx)


def _spectrum(eigenvalues: Any, n_kept: int | None) -> Any:

    w = np.asarray(eigenvalues, dtype=float).ravel()
    kept = len(w) if n_kept is None else int(n_kept)
    idx = np.arange(1, len(w) + 1)
    source = ColumnDataSource({"index": idx, "value": w,
                               "colour": ["#1f77b4" if i <= kept else "#c8c8c8" for i in idx]})
    p = figure(title="eigenvalue spectrum", width=WIDTH, height=HEIGHT,
               tools="pan,wheel_zoom,reset,save", x_axis_label="index",
               y_axis_label="eigenvalue")
    p.vbar(x="index", top="value", width=0.8, color="colour", source=source)
    p.add_tools(HoverTool(tooltips=[("index", "@index"), ("eigenvalue", "@value")]))
    return p


def _table(table: Mapping[str, Any], title: str) -> Any:

    rows = "".join(f"<tr><th style='text-align:left;padding:2px 12px'>{html.escape(str(k))}"
                   f"</th><td style='text-align:right;padding:2px 12px'>"
                   f"{html.escape(format_cell(v))}</td></tr>" for k, v in table.items())
    return Div(text=f"<h3>{html.escape(title)}</h3><table>{rows}</table>", width=WIDTH)


def _variance(out: dict, window: int, max_points: int, random_state: int) -> Any:


    var, status, man = out["first_variance"], out["status"], out["manifold"]
    ck = out["checkpoint"]
    n = len(var)
    rows = np.arange(n)
    shown = np.where(status != STATUS["quarantined"], var, np.nan)
    idx, note = _sampled(n, max_points, random_state)
    ok = np.isfinite(shown[idx]) & (shown[idx] > 0)
    pts = ColumnDataSource({"row": idx[ok], "variance": shown[idx][ok],
                            "manifold": man[idx][ok].astype(str)})
    positive = np.isfinite(shown) & (shown > 0)
    p = figure(title=f"predictive variance over the stream — {note}", width=WIDE,
               height=HEIGHT, y_axis_type="log" if positive.any() else "linear",
               tools="pan,wheel_zoom,box_zoom,reset,save", output_backend="webgl",
               x_axis_label="stream position", y_axis_label="predictive variance")
    p.scatter("row", "variance", source=pts, size=3, alpha=0.5, color="#1f77b4",
              legend_label="point (first mapping)")
    mean = running_mean(shown, window)
    p.line(rows.astype(float), mean, color="black", line_width=2,
           legend_label=f"running mean (w={window})")
    thr = threshold_in_force(ck["refits"], ck["sigma_t"], rows)
    p.step(rows.astype(float), thr, mode="after", color="red", line_dash="dashed", line_width=2,
           legend_label="threshold")
    for r in ck["refits"]:
        p.add_layout(Span(location=r["trigger_row"], dimension="height", line_color="gray",
                          line_dash="dotted"))
        p.add_layout(Span(location=r["publish_row"], dimension="height", line_color="gray"))
    p.add_tools(HoverTool(tooltips=[("row", "@row"), ("variance", "@variance"),
                                    ("manifold", "@manifold")]))
    p.legend.location = "top_left"
    return p


def _manifolds(man: np.ndarray) -> Any:

    names, counts = np.unique(man, return_counts=True)
    factors = [str(v) for v in names]
    source = ColumnDataSource({"manifold": factors, "rows": counts})
    p = figure(title="rows per manifold", x_range=FactorRange(factors=factors), width=WIDTH,
               height=HEIGHT, tools="save", x_axis_label="manifold", y_axis_label="rows")
    p.vbar(x="manifold", top="rows", width=0.8, source=source)
    p.add_tools(HoverTool(tooltips=[("manifold", "@manifold"), ("rows", "@rows")]))
    return p


def _drift(history: list) -> Any:

    rows = [h.get("watermark_after", i) for i, h in enumerate(history)]
    stat = [np.nan if h.get("drift_statistic") is None else h["drift_statistic"]
            for h in history]
    source = ColumnDataSource({"rows": rows, "statistic": stat,
                               "refit": ["yes" if h.get("refit") else "no" for h in history],
                               "finished": [str(h.get("finished", "")) for h in history]})
    p = figure(title="drift history (each scheduled run)", width=WIDE, height=HEIGHT,
               tools="pan,wheel_zoom,reset,save", x_axis_label="rows seen (watermark)",
               y_axis_label="drift statistic (fraction flagged)")
    p.line("rows", "statistic", source=source, line_width=2)
    p.scatter("rows", "statistic", source=source, size=7)
    for r, h in zip(rows, history):
        if h.get("refit"):
            p.add_layout(Span(location=r, dimension="height", line_color="red",
                              line_dash="dashed"))
    p.add_tools(HoverTool(tooltips=[("rows", "@rows"), ("drift statistic", "@statistic"),
                                    ("refit", "@refit"), ("finished", "@finished")]))
    return p


# --------------------------------------------------------------------------------------------
# the page


def html_report(source: Any, out: Any, *, storage_options: dict | None = None,
                max_points: int = MAX_POINTS, window: int = 50,
                random_state: int = 0) -> dict:
    """Write the interactive page of a run, stream store or job state to ``out``.

    Parameters
    ----------
    source : str or Location
        A run group, a refit job's run store, a stream output store or an incremental job's
        state (see the module docstring).
    out : str or Location
        Where the HTML goes (local path or URL); written once, after everything was read.
    storage_options : dict, optional
        For URLs.
    max_points : int
        Points drawn per scatter (a seeded sample above it).
    window : int
        Running-mean window of the stream variance.
    random_state : int
        Seeds the samples.

    Returns
    -------
    dict
        ``html`` (its URL), ``kind``, ``points`` (drawn in the main scatter) and ``rows``.

    Raises
    ------
    InputError
        ``source`` holds no run or state, or an incomplete run; nothing is written.
    """

    src = location(source, storage_options)
    kind = _kind(src)
    history = None
    if kind == "stream":

        o = read_output(src)
        history = src.child("drift_history.json").read_json() if src.child(
            "drift_history.json").exists() else None
        emb, man, status = o["embedding"], o["manifold"], o["status"]
        ok = (status != STATUS["quarantined"]) & np.isfinite(emb).all(axis=1)
        rows = np.flatnonzero(ok)
        scatter, points = _scatter(emb[ok], rows, man[ok], "manifold",
                                   "embedding by manifold", max_points, random_state,
                                   categorical=True)
        ck = o["checkpoint"]
        counts = {name: int(np.sum(status == code)) for name, code in STATUS.items()}
        table: dict[str, Any] = {
            "rows": len(status), **{f"rows {k}": v for k, v in counts.items() if v},
            "model version": ck.get("version"), "refits": len(ck["refits"]),
            "threshold now": float(ck["sigma_t"][-1]),
        }
        if history:
            last = history[-1]
            table.update({"scheduled runs": len(history),
                          "last run: drift statistic": last.get("drift_statistic"),
                          "last run: refit": "yes" if last.get("refit") else "no"})
        parts = [row(scatter, _manifolds(man[ok]) if ok.any() else Div()),
                 _variance(o, window, max_points, random_state)]
        if history:
            parts.append(_drift(history))
        parts.append(_table(table, "job state" if history else "stream"))
        title = f"dr-dask report: {'job state' if history else 'stream'} {src.url}"
        n_rows = len(status)
    else:
        job = None
        run_loc = src
        if kind == "refit-job":
            job = src.child("latest.json").read_json()
            run_loc = src.child(job["run"])
            _kind(run_loc)  # the run it names must be complete
        d = _run_data(run_loc)
        emb = d["embedding"]
        scatter, points = _scatter(emb, d["sample"], np.arange(len(emb), dtype=float),
                                   "row", d["title"], max_points, random_state)
        summary = d["summary"]
        table = {k: v for k, v in summary.items() if k != "eigenvalues"}
        if job:
            table.update({f"metric: {k}": v for k, v in (job.get("metrics") or {}).items()})
        plots: list = [scatter]
        if summary.get("eigenvalues"):
            plots.append(_spectrum(summary["eigenvalues"], emb.shape[1]))
        parts = [row(*plots), _table(table, "run")]
        title = f"dr-dask report: {d['title']}"
        n_rows = len(emb)
    heading = Div(text=f"<h2>{html.escape(title)}</h2>", width=WIDE)
    doc = Document()
    doc.add_root(column(heading, *parts))
    # the page says, once Bokeh has built it in the browser, how many points the scatter holds
    doc.js_on_event(DocumentReady, CustomJS(code=(
        f"const s = Bokeh.documents[0].get_model_by_name({json.dumps(SCATTER_SOURCE)});"
        "document.body.dataset.scatterPoints = s.data.x.length;")))
    page = file_html(doc, INLINE, title)
    head, body, tail = page.rpartition("<body>")  # the page's tag (BokehJS's code mentions one)
    page = f'{head}<body data-stated-points="{points}">{tail}'

    dest = location(out, storage_options)
    dest.write_bytes(page.encode())
    logger.info("wrote %s (%s, %d of %d points drawn)", dest.url, kind, points, n_rows)
    return {"html": dest.url, "kind": kind, "points": points, "rows": n_rows}
