"""The weekly job: refit IKD or Isomap on the whole store, evaluate it against the previous
run, then move the ``latest`` pointer.

Runs live side by side in one run store (:func:`dr_dask.runs.group.run_embedding`: a resumable group
per run, named from method, parameters and input content, so a rerun after a kill resumes the
same group). After the fit, an evaluation report is written to ``RUNS/NAME.report/``
(``report.json``, ``report.png``): trustworthiness and its neighbourhood companions on all rows
(blockwise), TI and TCI on a seeded subsample of ``eval_rows`` rows (each TCI candidate is a
refit, run as a task), the Procrustes disparity between this run and the previous one on the
rows they share, the fit time and peak memory. Last, ``RUNS/latest.json`` (one small object:
one PUT) is replaced to name the new run: a reader of ``latest`` never sees a run that is not
complete and evaluated. A rerun when ``latest`` already names the run of the current input
and parameters does nothing.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from sklearn.base import clone

from dr_dask.io.inputs import InputError
from dr_dask.io.jsonio import plain_json
from dr_dask.io.storage import StorageError, location, read_array
from dr_dask.jobs._common import job_params, now, open_stored
from dr_dask.linalg.align import procrustes_disparity
from dr_dask.methods.factory import make_method
from dr_dask.metrics import consistency_index, evaluate_embedding, trustability_index
from dr_dask.report.jobs import refit_report
from dr_dask.runs.group import (
    ResultCorrupted,
    open_run,
    run_embedding,
    run_name,
    run_params,
)
from dr_dask.runtime.cluster import active_client, compute
from dr_dask.runtime.credential_delivery import credentials_delivered
from dr_dask.runtime.resources import PeakRSS, timed

logger = logging.getLogger(__name__)

METHODS = ("ikd", "isomap")
#: Parameters of :func:`run_refit` and their defaults.
DEFAULTS: dict[str, Any] = {
    "n_neighbors": 10,      # graph k of the method, and k of trustworthiness
    "random_state": 0,      # the fit and the evaluation subsample
    "eval_rows": 500,       # rows of the TI/TCI subsample
    "tci_candidates": 16,   # sampled TCI warps (each one refit of eval_rows rows)
    "max_ti_dim": 50,       # TI needs a fit at d = p: skipped for more input features
}
_POSITIVE = ("n_neighbors", "eval_rows", "tci_candidates", "max_ti_dim")


def run_refit(source: str, runs: str, *, method: str = "ikd", n_components: int = 2,
              variable: str | None = None, storage_options: dict | None = None,
              client: Any = None, **params: Any) -> dict:
    """Fit ``method`` on every row of ``source`` into ``runs``; report; move ``latest``.

    Parameters
    ----------
    source : str
        A 2-D Zarr array, ``STORE:VAR`` or a group with one 2-D array; local path or URL.
    runs : str
        The run store (Zarr), created if absent; holds every run, its report and
        ``latest.json``.
    method : {"ikd", "isomap"}
    n_components : int
        Output dimension d.
    variable : str, optional
        The array of a group (overrides a ``:VAR`` suffix).
    storage_options : dict, optional
    client : distributed.Client, optional
    **params
        See :data:`DEFAULTS`: ``n_neighbors``, ``random_state``, ``eval_rows``,
        ``tci_candidates``, ``max_ti_dim``.

    Returns
    -------
    dict
        ``status`` ("done" or "nothing to do"), ``run``, ``previous``, ``n_samples``,
        ``metrics`` (trustworthiness, continuity, knn_preservation, stress, ti, ti_per_n,
        tci, tci_per_n, procrustes_disparity_vs_previous), ``fit_seconds``, ``peak_rss_gb``,
        ``report``, ``latest``.

    Raises
    ------
    InputError
        Bad source, method or parameter.
    """
    client = active_client(client)
    # the credentials delivered to the workers live as long as the job (also on failure)
    with credentials_delivered(client, storage_options):
        return _run_refit(source, runs, method=method, n_components=n_components,
                          variable=variable, storage_options=storage_options, client=client,
                          **params)


def _run_refit(source: str, runs: str, *, method: str, n_components: int,
               variable: str | None, storage_options: dict | None, client: Any,
               **params: Any) -> dict:
    if method not in METHODS:
        raise InputError(f"refit: method must be one of {METHODS}, got {method!r}")
    if isinstance(n_components, bool) or not isinstance(n_components, int) or n_components < 1:
        raise InputError(f"refit: n_components must be an integer >= 1, got {n_components!r}")
    p = job_params("refit", DEFAULTS, params, _POSITIVE)
    inp, _ = open_stored(source, variable, storage_options, "refit")
    out = location(runs, storage_options)
    out.check()
    est = make_method(method, n_components, n_neighbors=p["n_neighbors"],
                      seed=p["random_state"], client=client)
    name = run_name(method, run_params(est), inp.identify(client))  # what run_embedding names
    latest_loc = out.child("latest.json")
    previous = latest_loc.read_json()
    if previous and previous.get("run") == name:
        try:  # the run latest names still holds what its completion mark vouched for
            open_run(out, name)
        except ResultCorrupted as exc:
            logger.warning("latest names %s, but %s: refitting it", name, exc)
        else:
            logger.info("latest already names %s (same input and parameters): nothing to do",
                        name)
            return {**previous, "status": "nothing to do"}

    took: dict[str, float] = {}
    with PeakRSS() as mem, timed(took, "fit"):
        try:
            run = run_embedding(est, inp, out, method=method, name=name,
                                storage_options=storage_options)
        except ValueError as exc:  # rejected data or parameters (no run group is left)
            if isinstance(exc, InputError | StorageError):
                raise
            raise InputError(f"refit: {method} on {inp.name}: {exc}") from exc
    emb = run.read("embedding")
    with timed(took, "evaluate"):
        metrics = _evaluate(est, inp, emb, p, client)
    seconds, evaluate_seconds = took["fit"], took["evaluate"]
    metrics["procrustes_disparity_vs_previous"], note = _vs_previous(out, previous, inp, emb)
    summary = dict(run.summary)
    report_dir = out.child(f"{name}.report")
    result = {
        "status": "done", "run": name, "runs": out.url, "method": method,
        "input": inp.name, "n_samples": int(emb.shape[0]), "n_components": int(emb.shape[1]),
        "previous": previous.get("run") if previous else None, "previous_note": note,
        "metrics": metrics, "fit_seconds": seconds, "evaluate_seconds": evaluate_seconds,
        "peak_rss_gb": mem.peak_gb, "finished": now(),
        "report": report_dir.child("report.json").url, "latest": latest_loc.url,
    }

    result = plain_json(result)
    refit_report(report_dir, result, emb, summary.get("eigenvalues"))
    latest_loc.write_json(result)  # last: moved only once the run and its report are written
    logger.info("refit %s: %s on %d rows; latest -> %s", method, name, emb.shape[0], name)
    return result


def _evaluate(est: Any, inp, emb: np.ndarray, p: dict, client: Any) -> dict:
    """Neighbourhood scores on all rows (blockwise); TI and TCI on a seeded subsample."""


    metrics = evaluate_embedding(emb, X=inp.data, n_neighbors=p["n_neighbors"], client=client)
    T, D = inp.data.shape
    rng = np.random.RandomState(p["random_state"])
    rows = np.sort(rng.choice(T, size=min(p["eval_rows"], T), replace=False))
    (Xs,) = compute(inp.data[rows], client=client)
    Xs = np.asarray(Xs, dtype=np.float64)
    small = clone(est).set_params(client=None)  # subsample fits run in-process or as tasks
    if p["max_ti_dim"] >= D and len(rows) > D:
        # TI is defined at d = p; IKD centres each sample across features, so it gives at most
        # p - 1 components: its full embedding is zero-padded (a zero axis adds no residual)
        d_full = D - 1 if type(est).__name__ == "IKD" else D
        Yfull = np.asarray(clone(small).set_params(n_components=d_full).fit_transform(Xs))
        Yfull = np.pad(Yfull, ((0, 0), (0, D - d_full)))
        metrics.update(trustability_index(Xs, Yfull, client=client), ti_dim=d_full)
    else:
        logger.warning("TI skipped: it needs a fit at d = p = %d (max_ti_dim %d)", D,
                       p["max_ti_dim"])
    tci = consistency_index(small, Xs, method="sampled", n_candidates=p["tci_candidates"],
                            random_state=p["random_state"], client=client)
    metrics.update(tci=tci["tci"], tci_per_n=tci["tci_per_n"], tci_rows=len(rows),
                   tci_candidates=tci["n_candidates"])
    return metrics


def _vs_previous(out, previous: dict | None, inp, emb: np.ndarray) -> tuple[float | None, str]:
    """Procrustes disparity between the previous run's embedding and this one on the rows
    both embedded (an append-only store: the previous run's rows are this run's first rows)."""

    if not previous:
        return None, "first run: no previous run"
    if previous.get("input") != inp.name:
        return None, f"the previous run embedded another input ({previous.get('input')})"
    try:
        prev = read_array(open_run(out, previous["run"]), "embedding")
    except ResultCorrupted as exc:
        return None, f"the previous run cannot be compared: {exc}"
    if prev.shape[0] > emb.shape[0]:
        return None, f"the previous run has more rows ({prev.shape[0]}) than the input now"
    return float(procrustes_disparity(prev, emb[: prev.shape[0]])), (
        f"on the first {prev.shape[0]} rows, shared with {previous['run']}")
