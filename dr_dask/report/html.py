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

The main scatter is coloured by ``color``: a run's row order by default, a stream's manifold;
or any variable of the run's input store (``"t"``, a column ``"latent[0]"``), of another store
(``"STORE:VAR"``), a ``.npy`` file, or (from Python) an array with one value per row.
Categorical values (strings, booleans, integers with at most ``MAX_CATEGORIES`` distinct
values: manifolds, patches, labels) get a palette and a legend; anything else a continuous
colour map and a colour bar.

Size: BokehJS itself is 1.27 MB minified. ``resources="inline"`` (the default) puts it in the
page gzip-compressed (0.45 MB as base64; the browser unpacks it with its own
``DecompressionStream`` and then runs the page's scripts), so the page opens with no network;
the other parts are kept small (plain HTML for headings and tables instead of Bokeh's widget
bundle, WebGL's bundle only from ``WEBGL_MIN`` points, numbers as binary float32, not text):
10^4 points make a page of about 0.6 MB (2.15 MB before). ``resources="cdn"`` leaves BokehJS
out (the browser fetches it when the page opens). The page states its size, and above
``TARGET_BYTES`` (1 MB) what it is made of.

Scatters of more than ``max_points`` points draw a seeded sample of that size, and say so in
the title (10^5 points stay responsive, drawn with WebGL where the browser has it). A run that
does not exist or is not complete is refused before anything is written
(:class:`~dr_dask.io.inputs.InputError`: exit code 2).
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import logging
import re
from collections.abc import Mapping
from typing import Any, Literal

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
from bokeh.palettes import Category10_10, Category20_20, Viridis256
from bokeh.plotting import figure
from bokeh.resources import CDN, INLINE
from bokeh.transform import factor_cmap, linear_cmap

from dr_dask.io.boundary import read_values
from dr_dask.io.inputs import InputError
from dr_dask.io.storage import Location, location
from dr_dask.report.plot import format_cell, running_mean, sample_rows
from dr_dask.report.stream import threshold_in_force
from dr_dask.runs.group import run_attr, verify_result
from dr_dask.stream.store import STATUS, read_output

logger = logging.getLogger(__name__)

#: Points drawn per scatter; above it a seeded sample of this size.
MAX_POINTS = 100_000
#: Plot sizes (pixels).
WIDTH, HEIGHT, WIDE = 560, 480, 1000
#: Name of the main scatter's data source (tests read its length from the live document).
SCATTER_SOURCE = "embedding-points"
#: Integer colour values with at most this many distinct values are categories (a legend).
MAX_CATEGORIES = 20
#: Points drawn from which the scatters use WebGL (below, the canvas is fast enough and the
#: page does without BokehJS's WebGL bundle, 0.19 MB).
WEBGL_MIN = 20_000
#: Page size the report aims under.
TARGET_BYTES = 1_000_000
#: Where BokehJS comes from: in the page, or fetched when it opens.
RESOURCES = {"inline": INLINE, "cdn": CDN}

__all__ = ["MAX_POINTS", "colour_values", "html_report"]


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
    verify_result(loc, attrs)  # what it holds is still what its completion mark vouched for
    return "run"


def _run_data(loc: Location) -> dict:
    import zarr

    group = zarr.open_group(store=loc.zarr_store(read_only=True), mode="r")
    arrays = {n: a[...] for n, a in group.arrays() if n in ("embedding", "sample")}
    emb = np.asarray(arrays["embedding"])
    sample = np.asarray(arrays.get("sample", np.arange(len(emb))))
    summary = dict(run_attr(group, "summary"))
    return {"embedding": emb, "sample": sample, "summary": summary,
            "input": dict(run_attr(group, "input")),
            "title": f"{summary.get('method', 'run')}: {loc.url.rstrip('/').rsplit('/', 1)[-1]}"}


# --------------------------------------------------------------------------------------------
# the plots (Bokeh models)


def _sampled(n: int, max_points: int, random_state: int) -> tuple[np.ndarray, str]:
    idx = sample_rows(n, max_points, random_state)
    note = (f"{len(idx):,} of {n:,} points (a seeded sample)" if len(idx) < n
            else f"{n:,} points")
    return idx, note


def _backend(n_points: int) -> Literal["canvas", "webgl"]:
    return "webgl" if n_points >= WEBGL_MIN else "canvas"


def _categorical(values: np.ndarray) -> bool:
    """Strings, booleans and integers of few distinct values are categories."""
    if values.dtype.kind in "OUSb":
        return True
    return values.dtype.kind in "iu" and len(np.unique(values)) <= MAX_CATEGORIES


def colour_values(color: Any, n_rows: int, input_record: Mapping[str, Any] | None = None,
                  storage_options: dict | None = None) -> tuple[np.ndarray, str]:
    """The values to colour a report's scatter by, and their name.

    Parameters
    ----------
    color : str or array-like
        An array of one value per row; or a string: ``"VAR"`` (a variable of the run's
        input store, from ``input_record``), ``"STORE:VAR"`` (of another Zarr store),
        ``"VAR[j]"`` (column j of a 2-D variable), or a ``.npy`` file.
    n_rows : int
        Rows of the embedding.
    input_record : dict, optional
        The run's input provenance (``path`` of its store).
    storage_options : dict, optional
        For URLs.

    Returns
    -------
    values : ndarray of shape (n_rows,)
    name : str
        What the legend or colour bar is titled.

    Raises
    ------
    InputError
        An unknown variable or file, or values that are not one per row.
    """

    if not isinstance(color, str):
        values, name = np.asarray(color), "colour"
    elif color.endswith(".npy"):
        loc = location(color, storage_options)
        if not loc.exists():
            raise InputError(f"--color {color}: no such file")
        values, name = read_values(loc), color
    else:
        values, name = _stored_colour(color, input_record, storage_options), color
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.shape != (n_rows,):
        raise InputError(f"--color {name}: {values.shape} values, not one per row of the "
                         f"embedding ({n_rows},); a 2-D variable takes a column: VAR[j]")
    return values, name


def _stored_colour(color: str, input_record: Mapping[str, Any] | None,
                   storage_options: dict | None) -> np.ndarray:
    """The values of ``VAR``, ``STORE:VAR`` or ``VAR[j]`` (see :func:`colour_values`)."""
    import zarr

    spec = re.fullmatch(r"(?:(?P<store>.+):)?(?P<var>[^:\[]+)(?:\[(?P<col>\d+)\])?", color)
    store = spec and (spec["store"] or (input_record or {}).get("path"))
    if not spec or not store:
        raise InputError(f"--color {color!r}: give VAR (of the run's input), STORE:VAR, "
                         "VAR[j] or a .npy file")
    group = zarr.open_group(store=location(store, storage_options).zarr_store(
        read_only=True), mode="r")
    if spec["var"] not in group:
        raise InputError(f"--color {color!r}: {store} has no variable {spec['var']!r} "
                         f"(it has {sorted(group.array_keys())})")
    node = group[spec["var"]]
    if not isinstance(node, zarr.Array):
        raise InputError(f"--color {color!r}: {spec['var']} in {store} is a group, not an "
                         "array")
    values = read_values(location(store, storage_options), spec["var"])
    if spec["col"] is not None:
        if values.ndim != 2 or int(spec["col"]) >= values.shape[1]:
            raise InputError(f"--color {color!r}: {spec['var']} of shape {values.shape} "
                             f"has no column {spec['col']}")
        values = values[:, int(spec["col"])]
    return values


def embedding_scatter(Y: np.ndarray, sample: np.ndarray, colour: np.ndarray | None,
                      colour_name: str, title: str, max_points: int, random_state: int,
                      categorical: bool = False) -> tuple[Any, int]:
    """The embedding's scatter (a Bokeh figure) and the points it draws: the report page's
    and :func:`dr_dask.report.interactive.interactive`'s. ``colour`` None draws one colour."""
    idx, note = _sampled(len(Y), max_points, random_state)
    # float32 and integer columns travel as binary in the page (text costs 3x the bytes)
    y = Y[idx, 1] if Y.shape[1] > 1 else np.zeros(len(idx))
    s = sample[idx]
    data = {"x": Y[idx, 0].astype(np.float32), "y": y.astype(np.float32),
            "sample": s.astype(np.int64) if s.dtype.kind in "iu" else [str(v) for v in s]}
    c = colour[idx] if colour is not None else None
    if c is not None:
        data["colour"] = [str(v) for v in c] if categorical else c.astype(np.float32)
    source = ColumnDataSource(data, name=SCATTER_SOURCE)
    p = figure(title=f"{title} — {note}", width=WIDTH, height=HEIGHT,
               tools="pan,wheel_zoom,box_zoom,reset,save", active_scroll="wheel_zoom",
               output_backend=_backend(len(idx)), match_aspect=True,
               x_axis_label="component 1",
               y_axis_label="component 2" if Y.shape[1] > 1 else "")
    if c is None:
        p.scatter("x", "y", source=source, size=4, fill_color="#1f77b4", line_color=None)
        p.add_tools(HoverTool(tooltips=[("sample", "@sample")]))
        return p, len(idx)
    if categorical:
        factors = sorted(set(data["colour"]), key=lambda v: (len(v), v))
        palette = Category10_10 if len(factors) <= 10 else Category20_20
        fill = factor_cmap("colour", palette=list(palette) * (len(factors) // 20 + 1),
                           factors=factors)
        p.scatter("x", "y", source=source, size=4, fill_color=fill, line_color=None,
                  legend_field="colour")
        p.legend.title = colour_name
        p.add_layout(p.legend[0], "right")  # beside the points, not over them
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


#: The type that keeps a script from running until the packed BokehJS has (see packed_page).
_AFTER_BOKEHJS = "text/x-dr-dask-after-bokehjs"
#: Unpacks BokehJS (gzip, base64) with the browser's own DecompressionStream, runs it, then
#: the scripts that needed it, in order.
_UNPACK_JS = """(async () => {
  const packed = "%s";
  const bytes = Uint8Array.from(atob(packed), c => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  const run = text => {
    const s = document.createElement("script");
    s.text = text;
    document.head.appendChild(s);
  };
  run(await new Response(stream).text());
  const after = () => document.querySelectorAll('script[type="%s"]')
    .forEach(el => run(el.text));
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", after);
  else after();
})();"""


def packed_page(page: str) -> str:
    """The inline page with BokehJS gzip-compressed: 1.27 MB of JavaScript becomes 0.45 MB
    (base64 of 0.34 MB), which the browser unpacks with its own ``DecompressionStream``
    (every current browser has it) before it runs the page's Bokeh scripts. The page still
    opens with no network."""
    head, sep, tail = page.rpartition("<body")
    scripts = re.findall(r"<script>(.*?)</script>", head, flags=re.S)
    if not scripts:  # nothing inline to pack (a Bokeh whose page differs): keep it as it is
        return page
    code = "\n;\n".join(scripts).encode()
    packed = base64.b64encode(gzip.compress(code, 9, mtime=0)).decode()
    head = re.sub(r"<script>.*?</script>", "", head, flags=re.S)
    head = head.replace("</head>", f"<script>{_UNPACK_JS % (packed, _AFTER_BOKEHJS)}</script>"
                        "\n</head>", 1)
    # the page's own scripts (not its JSON) wait for BokehJS
    tail = tail.replace("<script>", f'<script type="{_AFTER_BOKEHJS}">')
    tail = re.sub(r'<script type="text/javascript">', f'<script type="{_AFTER_BOKEHJS}">', tail)
    return head + sep + tail


def _table(table: Mapping[str, Any], title: str) -> str:
    """A table as plain HTML (Bokeh's Div would pull its 0.38 MB widget bundle into the page)."""
    rows = "".join(f"<tr><th style='text-align:left;padding:2px 12px'>{html.escape(str(k))}"
                   f"</th><td style='text-align:right;padding:2px 12px'>"
                   f"{html.escape(format_cell(v))}</td></tr>" for k, v in table.items())
    return f"<h3>{html.escape(title)}</h3><table>{rows}</table>"


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
               tools="pan,wheel_zoom,box_zoom,reset,save", output_backend=_backend(len(idx)),
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


def _stream_page(src: Location, color: Any, storage_options: dict | None, max_points: int,
                 window: int, random_state: int) -> tuple[list, str, str, int, int]:
    """A stream store's (or a job state's) plots, table, title, points drawn and rows."""
    o = read_output(src)
    history = src.child("drift_history.json").read_json() if src.child(
        "drift_history.json").exists() else None
    emb, man, status = o["embedding"], o["manifold"], o["status"]
    ok = (status != STATUS["quarantined"]) & np.isfinite(emb).all(axis=1)
    rows = np.flatnonzero(ok)
    if color is None:
        values, name = man, "manifold"
    else:
        values, name = colour_values(color, len(status), None, storage_options)
    scatter, points = embedding_scatter(emb[ok], rows, values[ok], name,
                               f"embedding by {name}", max_points, random_state,
                               categorical=_categorical(values))
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
    parts = [row(scatter, _manifolds(man[ok])) if ok.any() else scatter,
             _variance(o, window, max_points, random_state)]
    if history:
        parts.append(_drift(history))
    tables = _table(table, "job state" if history else "stream")
    title = f"dr-dask report: {'job state' if history else 'stream'} {src.url}"
    n_rows = len(status)
    return parts, tables, title, points, n_rows


def _run_page(src: Location, kind: str, color: Any, storage_options: dict | None,
              max_points: int, random_state: int) -> tuple[list, str, str, int, int]:
    """A run's (or a refit job's latest run's) plots, table, title, points drawn and rows."""
    job = None
    run_loc = src
    if kind == "refit-job":
        job = src.child("latest.json").read_json()
        run_loc = src.child(job["run"])
        _kind(run_loc)  # the run it names must be complete
    d = _run_data(run_loc)
    emb = d["embedding"]
    if color is None:
        values, name = np.arange(len(emb), dtype=float), "row"
    else:
        values, name = colour_values(color, len(emb), d["input"], storage_options)
    scatter, points = embedding_scatter(emb, d["sample"], values, name, d["title"], max_points,
                               random_state, categorical=_categorical(values))
    summary = d["summary"]
    table = {k: v for k, v in summary.items() if k != "eigenvalues"}
    if job:
        table.update({f"metric: {k}": v for k, v in (job.get("metrics") or {}).items()})
    plots: list = [scatter]
    if summary.get("eigenvalues"):
        plots.append(_spectrum(summary["eigenvalues"], emb.shape[1]))
    parts = [row(*plots)]
    tables = _table(table, "run")
    title = f"dr-dask report: {d['title']}"
    n_rows = len(emb)
    return parts, tables, title, points, n_rows


def html_report(source: Any, out: Any, *, storage_options: dict | None = None,
                max_points: int = MAX_POINTS, window: int = 50,
                random_state: int = 0, color: Any = None,
                resources: str = "inline") -> dict:
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
    color : str or array-like, optional
        What the main scatter is coloured by (see :func:`colour_values`); default a run's row
        order, a stream's manifold.
    resources : {"inline", "cdn"}
        BokehJS in the page (compressed, 0.45 MB: opens with no network) or fetched by the
        browser when the page opens.

    Returns
    -------
    dict
        ``html`` (its URL), ``kind``, ``points`` (drawn in the main scatter), ``rows`` and
        ``bytes`` (the page's size).

    Raises
    ------
    InputError
        ``source`` holds no run or state, an incomplete run, or a ``color`` that is not one
        value per row; nothing is written.
    """
    if resources not in RESOURCES:
        raise InputError(f"resources must be one of {sorted(RESOURCES)}, got {resources!r}")

    src = location(source, storage_options)
    kind = _kind(src)
    if kind == "stream":
        parts, tables, title, points, n_rows = _stream_page(
            src, color, storage_options, max_points, window, random_state)
    else:
        parts, tables, title, points, n_rows = _run_page(
            src, kind, color, storage_options, max_points, random_state)
    doc = Document()
    doc.add_root(column(*parts))
    # the page says, once Bokeh has built it in the browser, how many points the scatter holds
    doc.js_on_event(DocumentReady, CustomJS(code=(
        f"const s = Bokeh.documents[0].get_model_by_name({json.dumps(SCATTER_SOURCE)});"
        "document.body.dataset.scatterPoints = s.data.x.length;")))
    page = file_html(doc, RESOURCES[resources], title)
    if resources == "inline":
        page = packed_page(page)
    head, _, tail = page.rpartition("<body>")  # the page's tag (BokehJS's code mentions one)
    heading = f"<h2>{html.escape(title)}</h2>"
    size = len(page.encode()) + len(tables.encode()) + len(heading.encode()) + 300
    note = f"This page is {size / 1e6:.2f} MB"
    if resources == "inline" and size > TARGET_BYTES:
        lean = size - len(page.encode()) + len(file_html(doc, CDN, title).encode())
        note += (f", {(size - lean) / 1e6:.2f} MB of it BokehJS (compressed), included so "
                 f"that it opens with no network; the rest is the {points:,} points drawn "
                 f"(--max-points draws fewer)")
    page = (f'{head}<body data-stated-points="{points}">{heading}{tail}'
            .replace("</body>", f"{tables}<p style='color:gray'>{html.escape(note)}.</p></body>"))

    dest = location(out, storage_options)
    data = page.encode()
    dest.write_bytes(data)
    logger.info("wrote %s (%s, %d of %d points drawn, %.2f MB)", dest.url, kind, points,
                n_rows, len(data) / 1e6)
    return {"html": dest.url, "kind": kind, "points": points, "rows": n_rows,
            "bytes": len(data)}
