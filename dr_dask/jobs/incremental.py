"""The nightly job: map the rows appended since the last run through the current GP-Isomap
model, keep a drift history, refit when the drift rule fires.

It is the stream runner (:class:`dr_dask.stream.runner.StreamRunner`) pointed at an appendable
Zarr array and stopped at its current end: the runner's checkpoint is the durable *watermark*
(rows consumed), its buffer and ``n_s`` are the drift rule, its ``models/v{k}`` are the model
versions (each refit Procrustes-aligned to the previous frame). So a rerun after success finds
no new row and does nothing, and a run killed at any moment resumes from the checkpoint: every
row of the source ends up exactly once in the output, row i of the output being row i of the
source.

The state location holds the stream store (:mod:`dr_dask.stream.store`: ``embedding``,
``variance``, ``manifold``, ``version``, ``status``, ``models/v{k}``, ``checkpoint.json`` with
the checksums of the committed rows, which each run verifies: a changed row block stops it,
exit 2, naming the array, rows and chunk) and:

``job.json``
    The source it follows (another source is refused).
``drift_history.json``
    One entry per run that mapped rows or refitted: watermarks before/after, rows, drift
    statistic, buffer, model version, refits. Written after the checkpoint; a run killed in
    between is accounted for by the next one (its entry spans both), so an entry never
    duplicates or misses rows.
``report.png``
    Variance over rows with the threshold and the refits, and the latest embedding.
``consumed.json``
    Fingerprints of the consumed source rows, one record per row block of the source's chunk
    grid (:mod:`dr_dask.jobs._consumed`): each run checks them first, and rows rewritten in
    place since they were mapped stop it (exit 2, naming the rows and chunk keys).
``lease.json``
    One run at a time (:class:`dr_dask.runs.lease.Lease`).

Every chunk the job reads is read whole: one that cannot be decoded, has the wrong size or is
missing stops the run (exit 2, naming the array and the chunk key) before any row after it is
written, the watermark staying before it (:mod:`dr_dask.stream.sources`); a state whose output
rows and consumed source rows differ in number is refused.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

from dr_dask.io.inputs import InputError
from dr_dask.io.storage import location
from dr_dask.jobs._common import JobIncomplete, job_params, now, open_stored
from dr_dask.jobs._consumed import check_consumed, record_consumed
from dr_dask.methods.gp_isomap import GPIsomap
from dr_dask.report.jobs import drift_report
from dr_dask.runs.lease import Lease, LeaseLost
from dr_dask.runtime.cluster import active_client, compute
from dr_dask.runtime.credential_delivery import credentials_delivered
from dr_dask.stream.runner import StreamRunner
from dr_dask.stream.store import STATUS, StreamStore

logger = logging.getLogger(__name__)

#: Parameters of :func:`run_incremental` and their defaults.
DEFAULTS: dict[str, Any] = {
    "n_batch": 1000,        # first run: rows the batch phase is fitted on
    "n_s": 1000,            # drift rule: buffered (uncertain) points that trigger a refit
    "chunk_size": 1000,     # rows per mapping task
    "max_in_flight": 2,     # chunks mapped at once
    "strict": False,        # Algorithm 1's point-by-point semantics (reproducible refit points)
    "n_neighbors": 10,      # first fit: graph k
    "sigma_t": None,        # first fit: novelty threshold (None: leave-one-out calibration)
    "random_state": 0,      # first fit
    "report": True,         # write report.png
}
_POSITIVE = ("n_batch", "n_s", "chunk_size", "max_in_flight", "n_neighbors")


def run_incremental(source: str, state: str, *, variable: str | None = None,
                    storage_options: dict | None = None, client: Any = None,
                    **params: Any) -> dict:
    """Map the rows of ``source`` appended since the last successful run; refit on drift.

    Parameters
    ----------
    source : str
        An appendable 2-D Zarr array, ``STORE:VAR`` or a group with one 2-D array; local path or
        URL. Rows are samples; only rows beyond the watermark are read.
    state : str
        The job's state location (stream store, models, drift history), created on the first
        run.
    variable : str, optional
        The array of a group (overrides a ``:VAR`` suffix).
    storage_options : dict, optional
        For the filesystems of URLs.
    client : distributed.Client, optional
        Resolved by :func:`dr_dask.runtime.cluster.active_client`; None maps on local threads.
    **params
        See :data:`DEFAULTS`: ``n_batch``, ``n_s``, ``chunk_size``, ``max_in_flight``,
        ``strict``, ``n_neighbors``, ``sigma_t``, ``random_state``, ``report``.

    Returns
    -------
    dict
        ``status`` ("done", "nothing to do", "waiting" for ``n_batch`` rows, "stopped" by a
        signal), ``rows_mapped``, ``watermark_before``, ``watermark_after``,
        ``model_version``, ``refit`` (bool), ``new_versions``, ``drift_statistic`` (fraction
        of this run's rows found uncertain), ``buffered``, ``n_s``, ``state``, ``report``.

    Raises
    ------
    InputError
        Bad source, parameter, or a state that follows another source.
    LeaseHeld
        Another run of this job is live.
    """
    p = job_params("incremental", DEFAULTS, params, _POSITIVE)
    if p["sigma_t"] is not None and not float(p["sigma_t"]) > 0:
        raise InputError(f"incremental: sigma_t must be > 0, got {p['sigma_t']!r}")
    inp, array = open_stored(source, variable, storage_options, "incremental")
    n_rows, n_features = inp.data.shape
    loc = location(state, storage_options)
    loc.check()
    job = loc.child("job.json").read_json()
    if job is not None and job.get("source") != array.url:
        raise InputError(f"state {loc} follows {job.get('source')}, not {array.url}; use "
                         "another --state for another source")
    client = active_client(client)
    # the credentials delivered to the workers live as long as the job (also on failure)
    with credentials_delivered(client, storage_options):
        model = None
        if not StreamStore(loc).exists():
            if n_rows < p["n_batch"]:
                logger.info("%s has %d rows; the first run fits on n_batch=%d", array.url, n_rows,
                            p["n_batch"])
                return {"state": loc.url, "source": array.url, "status": "waiting",
                        "watermark_before": 0, "watermark_after": 0, "n_s": p["n_s"],
                        **_idle({"version": None, "pending": []}, 0)}
            # before the lease: rejected rows leave nothing behind (a rare concurrent first run
            # fits twice, and the lease lets one of them write)
            model = _first_model(inp, p, client)
        with Lease(StreamStore(loc).lease_location) as lease:
            return _run(array, n_rows, n_features, loc, p, client, model, lease)


def _run(array, n_rows: int, n_features: int, loc, p: dict, client: Any, model: Any,
         lease: Lease) -> dict:
    store = StreamStore(loc)
    history_loc = loc.child("drift_history.json")
    got = history_loc.read_versioned()
    history, history_version = (json.loads(got[0]), got[1]) if got else ([], None)
    before = history[-1]["watermark_after"] if history else 0
    summary = {"state": loc.url, "source": array.url, "watermark_before": before, "n_s": p["n_s"]}
    records: dict = {"blocks": {}}
    updated = False
    if store.exists():
        ck = store.read_checkpoint()
        _check_aligned(ck, loc)
        if n_rows < ck["source"]:
            raise InputError(f"{array.url} has {n_rows} rows, fewer than the watermark "
                             f"{ck['source']} in {loc}: was the source rewritten?")
        # rows rewritten in place since they were mapped (module docstring of _consumed)
        records, updated = check_consumed(loc, array, ck["source"] + ck.get("skip", 0))
        refit_due = len(ck["pending"]) >= p["n_s"]
        if ck["source"] == n_rows and not refit_due and before == ck["n_rows"]:
            store.verify(ck)  # the runner verifies a state it resumes; this run reads it only
            record_consumed(loc, array, ck["source"] + ck.get("skip", 0), records, lease.fence,
                            updated)
            logger.info("%s: no row beyond the watermark %d; nothing to do", array.url, before)
            return {**summary, **_idle(ck, before), "status": "nothing to do"}
    else:
        lease.fence()
        loc.child("job.json").write_json({"source": array.url, "n_features": n_features})
    runner = StreamRunner(
        loc, array, model, n_s=p["n_s"], chunk_size=p["chunk_size"],
        strict_sequential=bool(p["strict"]), max_in_flight=p["max_in_flight"], client=client,
        storage_options=loc.storage_options, lease=lease,
    )
    result = runner.run()
    ck = store.read_checkpoint()
    if not result["stopped"] and ck["source"] < n_rows:
        # never "done" with rows it did not see: the source had n_rows when this run began
        raise JobIncomplete(
            f"incremental: {array.url} had {n_rows} rows when this run began but the watermark "
            f"in {loc} is {ck['source']}: rows {ck['source']}..{n_rows} were not processed; "
            "rerun to process them")
    _check_aligned(ck, loc)
    record_consumed(loc, array, ck["source"] + ck.get("skip", 0), records, lease.fence, updated)
    prev_version = history[-1]["model_version"] if history else 0
    entry = _history_entry(store, ck, before, prev_version, p["n_s"])
    if entry["rows"] or entry["refit"]:
        entry["lease"] = lease.stamp()
        # after the checkpoint it describes; a compare-and-swap on the history this run read:
        # a run paused after its fence, taken over meanwhile, writes nothing
        if history_loc.swap_bytes(json.dumps([*history, entry]).encode(),
                                  history_version) is None:
            lease.fence()  # LeaseLost naming the run that holds the lease now
            raise LeaseLost(f"{history_loc} was extended by another run meanwhile; this run "
                            "stopped writing")
    report = None
    if p["report"]:
        lease.fence()
        report = drift_report(loc, [*history, entry])
    status = "stopped" if result["stopped"] else "done"
    logger.info("incremental %s: rows %d..%d mapped, model v%d%s", status, before,
                entry["watermark_after"], ck["version"],
                f", refits {entry['new_versions']}" if entry["refit"] else "")
    return {**summary, **{k: entry[k] for k in _ENTRY_KEYS}, "status": status, "report": report}


def _check_aligned(ck: dict, loc) -> None:
    """Output row i is source row i: as many output rows as source rows consumed (a state
    where they differ has rows shifted and cannot be continued)."""
    consumed = ck["source"] + ck.get("skip", 0)
    if ck["n_rows"] != consumed:
        raise InputError(
            f"the state {loc} holds {ck['n_rows']} output rows for the {consumed} source rows "
            "it consumed: its rows are shifted (a chunk was skipped without its rows by an "
            "earlier version). Map the source again into a new state (another --state)")


_ENTRY_KEYS = ("rows_mapped", "watermark_after", "model_version", "refit", "new_versions",
               "drift_statistic", "buffered")


def _idle(ck: dict, watermark: int) -> dict:
    return {"rows_mapped": 0, "watermark_after": watermark, "model_version": ck["version"],
            "refit": False, "new_versions": [], "drift_statistic": None,
            "buffered": len(ck["pending"]), "report": None}


def _first_model(inp, p: dict, client: Any):
    """The batch phase on the first ``n_batch`` rows (model version 0)."""

    (X,) = compute(inp.data[: p["n_batch"]], client=client)  # never waits forever on workers
    X = np.asarray(X, dtype=np.float64)
    logger.info("first run: fitting GP-Isomap on rows 0..%d", p["n_batch"])
    try:
        return GPIsomap(n_neighbors=p["n_neighbors"], sigma_t=p["sigma_t"],
                        random_state=p["random_state"], client=client).fit(X)
    except ValueError as exc:  # non-finite rows, too few rows for the graph, ...
        raise InputError(f"{inp.name} rows 0..{p['n_batch']} (n_batch): {exc}") from exc


def _history_entry(store: StreamStore, ck: dict, before: int, prev_version: int,
                   n_s: int) -> dict:
    """The drift history entry of output rows ``before..n_rows`` (read back from the store)."""
    after = ck["n_rows"]
    status = np.asarray(store["status"][before:after])
    variance = np.asarray(store["first_variance"][before:after])
    mapped = status != STATUS["quarantined"]
    # remapped rows were buffered when first mapped: both were found uncertain
    flagged = np.isin(status, [STATUS["buffered"], STATUS["remapped"]])
    new = [r["version"] for r in ck["refits"] if r["version"] > prev_version]
    m = int(mapped.sum())
    return {
        "finished": now(), "watermark_before": before, "watermark_after": after,
        "rows": after - before, "rows_mapped": m, "quarantined": int((~mapped).sum()),
        "flagged": int(flagged.sum()),
        "drift_statistic": float(flagged.sum() / m) if m else None,
        "mean_variance": float(variance[mapped].mean()) if m else None,
        "sigma_t": float(ck["sigma_t"][-1]), "buffered": len(ck["pending"]), "n_s": n_s,
        "model_version": ck["version"], "refit": bool(new), "new_versions": new,
    }
