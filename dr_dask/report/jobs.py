"""The jobs' reports: the nightly drift history page and the weekly refit report.

Every picture is drawn by :mod:`dr_dask.report.plot`; this module chooses what goes on the page.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from dr_dask.io.jsonio import write_json
from dr_dask.io.storage import Location
from dr_dask.report import plot
from dr_dask.report.stream import threshold_in_force
from dr_dask.stream.store import STATUS, StreamStore

logger = logging.getLogger(__name__)


def drift_report(state: Location, history: list[dict]) -> str:
    """``STATE/report.png``: variance over rows (threshold in force, refits), the embedding by
    model version, and the latest run's figures; returns its URL.

    At most :data:`dr_dask.report.plot.MAX_POINTS` of the most recent rows are drawn.
    """

    store = StreamStore(state)
    ck = store.read_checkpoint()
    n = ck["n_rows"]
    lo = max(0, n - plot.MAX_POINTS)
    rows = np.arange(lo, n)
    get = {name: np.asarray(store[name][lo:n])
           for name in ("first_variance", "status", "manifold", "version", "embedding")}
    threshold = threshold_in_force(ck["refits"], ck["sigma_t"], rows)
    flagged = np.isin(get["status"], [STATUS["buffered"], STATUS["remapped"]])
    ok = get["status"] != STATUS["quarantined"]
    panels = [
        plot.variance(rows, np.where(ok, get["first_variance"], np.nan), threshold,
                        [r for r in ck["refits"] if r["publish_row"] >= lo], flagged=flagged,
                        groups=get["manifold"],
                        title=f"predictive variance, rows {lo}..{n} (when first mapped)"),
        plot.embedding(get["embedding"][ok], get["version"][ok], label="model version",
                         title=f"embedding, rows {lo}..{n}"),
    ]
    last = history[-1] if history else {}
    table = {
        "runs": len(history),
        "rows (watermark)": n,
        "last run: rows": last.get("rows"),
        "last run: drift statistic": last.get("drift_statistic"),
        "last run: refit": "yes" if last.get("refit") else "no",
        "model version": ck["version"],
        "refits in all": len(ck["refits"]),
        "buffered / n_s": f"{len(ck['pending'])} / {last.get('n_s', '-')}",
        "threshold sigma_t": float(ck["sigma_t"][-1]),
    }
    return plot.report_page(state.child("report.png"), panels, table, title="nightly GP-Isomap")


def refit_report(where: Location, result: dict, embedding: np.ndarray,
                 eigenvalues: Any) -> str:
    """``WHERE/report.json`` (the job's summary) and ``WHERE/report.png`` (the embedding by
    row, the spectrum, the metrics, time and memory); returns the JSON's URL."""

    write_json(result, where.child("report.json"))
    panels = [plot.embedding(embedding, np.arange(len(embedding), dtype=float),
                               label="row (landing order)",
                               title=f"{result['method']}: {result['run']}")]
    if eigenvalues is not None and len(eigenvalues):
        panels.append(plot.spectrum(eigenvalues, n_kept=result["n_components"]))
    m = result["metrics"]
    table = {
        "rows": result["n_samples"],
        "trustworthiness": m.get("trustworthiness"),
        "continuity": m.get("continuity"),
        f"TI / n ({m.get('tci_rows')} rows)": m.get("ti_per_n"),
        f"TCI / n (sampled, {m.get('tci_candidates')})": m.get("tci_per_n"),
        "disparity vs previous": m.get("procrustes_disparity_vs_previous"),
        "fit time (s)": result["fit_seconds"],
        "evaluation time (s)": result["evaluate_seconds"],
        "peak RSS (GB)": result["peak_rss_gb"],
    }
    plot.report_page(where.child("report.png"), panels, table, title="weekly refit")
    return where.child("report.json").url
