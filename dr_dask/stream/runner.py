"""The GP-Isomap stream runner: map on workers, buffer the uncertain, refit, lose no row.

Per chunk: the chunk is validated (malformed ones, of another width or with NaN rows, are
quarantined with their rows and reason: output rows = source rows; a chunk the source cannot
read whole stops the run by name once the chunks before it are committed, see
:mod:`dr_dask.stream.sources`), mapped on
a worker with the current model version (shared with the workers once per version), and its
rows are written to the output store: confident points (variance <= ``sigma_t_``) with status
``confident``, uncertain ones with status ``buffered`` and appended to a durable buffer. Then
the checkpoint (source offset, row count, buffer) is replaced atomically. Data first,
checkpoint last: a runner killed at any moment restarts from the checkpoint, discards what was
written after it, and re-reads the same source rows, so every input row ends up in the output
exactly once.

When the buffer holds ``n_s`` points, the batch phase is re-run on batch + buffer as a task on
the cluster while mapping continues. The new version is Procrustes-aligned to the previous
frame on the previous batch (which it contains), published (saved, then shared), and the
buffered points are re-mapped and rewritten with status ``remapped``.

Semantics
---------
``strict_sequential=True`` reproduces Algorithm 1 point by point: one chunk in flight; the
buffer is checked before every point; when it fills, the prefix is committed, the refit runs
synchronously and the rest of the chunk is mapped by the new version.

Parallel mode (default) maps up to ``max_in_flight`` chunks while a refit runs, and publishes
the refit at a point fixed by the stream itself, never by how fast the refit ran: before the
commit of the chunk ``dr_dask.stream.refit-lag`` chunks after the one whose commit started it
(waiting for the refit there if it is still running), or at the end of the stream. A chunk
committed after a publication but mapped before it is mapped again, whole, by the new version:
every row is mapped by the version current at its commit.

Determinism
-----------
Everything a refit and a mapping depend on is a function of the checkpoint: the refit in
flight (its buffer entries, the chunk it is published before) and the count of failed refits
are checkpointed when the refit starts, each version is read back from the store before it
maps a row (so a resumed run and an undisturbed one map with the same bytes), and the refit's
random state is the model's. So a run killed at any point (or whose lease was taken over) and
resumed writes the same rows, bit for bit, as one never interrupted. A publication torn by a
kill is redone on resume from the checkpointed refit: it rewrites every row it could have
touched with the same values.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from dr_dask.io.inputs import InputError
from dr_dask.methods.gp_isomap_io import check_model
from dr_dask.runs.lease import Lease
from dr_dask.runtime import config
from dr_dask.runtime.blas import single_blas_thread
from dr_dask.runtime.cluster import (
    ClusterLost,
    active_client,
    cluster_gone,
)
from dr_dask.runtime.credential_delivery import credentials_delivered
from dr_dask.stream.models import Executor, batch_of, refit_model, refit_params
from dr_dask.stream.sources import Chunk, DirectorySource, open_source
from dr_dask.stream.store import STATUS, StreamStore

logger = logging.getLogger(__name__)


@dataclass
class _InFlight:
    seq: int
    chunk: Chunk
    offset_before: Any
    skip: int
    data: np.ndarray | None
    reason: str | None
    future: Any
    version: int


@dataclass
class _Refit:
    future: Any
    ids: list
    batch: np.ndarray
    trigger_row: int
    started: float
    #: Published before the commit of this chunk (parallel mode).
    publish_seq: int


class StreamRunner:
    """Run a stream through GP-Isomap into a durable output store.

    Parameters
    ----------
    out : str
        Output directory (created, or resumed when it holds a checkpoint).
    source : str, source object or iterable
        See :func:`dr_dask.stream.sources.open_source`.
    model : GPIsomap, optional
        Fitted model (version 0). Required for a new store; ignored on resume.
    batch : ndarray of shape (n, D), optional
        The model's batch (default: reassembled from the model).
    n_s : int
        Buffer size that triggers a refit.
    chunk_size : int
        Rows per chunk for Zarr sources.
    strict_sequential : bool
        Algorithm 1's point-by-point semantics (see module docstring).
    max_in_flight : int
        Chunks mapped concurrently in parallel mode.
    follow : bool
        Keep polling the source for new data instead of stopping at its end.
    poll_interval : float
        Seconds between polls of an idle source.
    client : distributed.Client, optional
        Resolved by :func:`dr_dask.runtime.cluster.active_client`; None maps on local threads.
    handle_signals : bool
        Install SIGTERM/SIGINT handlers (main thread only): finish the chunks in flight,
        checkpoint, return.
    storage_options : dict, optional
        For the filesystems of ``out`` and ``source`` when they are URLs.
    lease : Lease, optional
        A lease of ``out`` the caller holds; by default :meth:`run` holds ``out/lease.json``
        (one writer at a time: a second runner of the same output raises LeaseHeld, and a
        runner that loses the lease while paused raises LeaseLost at its next write).
    """

    def __init__(
        self,
        out: str,
        source: Any,
        model: Any = None,
        batch: np.ndarray | None = None,
        *,
        n_s: int = 1000,
        chunk_size: int = 1000,
        strict_sequential: bool = False,
        max_in_flight: int = 2,
        follow: bool = False,
        poll_interval: float = 0.5,
        client: Any = None,
        handle_signals: bool = True,
        storage_options: dict | None = None,
        lease: Lease | None = None,
    ):
        for name, value in (("n_s", n_s), ("max_in_flight", max_in_flight),
                            ("chunk_size", chunk_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"StreamRunner: {name} must be an integer >= 1, got {value!r}")
        self.store = StreamStore(out, storage_options)
        self.source = open_source(source, chunk_size=chunk_size, follow=follow,
                                  storage_options=storage_options)
        if isinstance(self.source, DirectorySource) and self.source.archive is None:
            self.source.archive = self.store.location.child("source_keys")
        self.n_s = int(n_s)
        self.strict = bool(strict_sequential)
        self.max_in_flight = 1 if self.strict else int(max_in_flight)
        self.poll_interval = poll_interval
        self.client = active_client(client)
        self.storage_options = storage_options
        self.handle_signals = handle_signals
        self._init_model, self._init_batch = model, batch
        self._stop = threading.Event()
        self._refit: _Refit | None = None
        #: A chunk the source could not read whole: raised once the chunks before it are
        #: committed (nothing after it is written, the checkpoint stays before it).
        self._fatal: InputError | None = None
        self.lease = lease

    # ------------------------------------------------------------------ lifecycle
    def request_stop(self) -> None:
        """Finish the chunks in flight, checkpoint and return from :meth:`run`."""
        self._stop.set()

    def _setup(self) -> None:
        if self.store.exists():
            st = self.store.read_checkpoint()
            self.store.open()
            # the committed rows as the checkpoint vouches for them, before anything is
            # written: a changed block is refused by name (docs/decisions.md STREAM-CHECKSUMS)
            self.store.verify(st)
            self.store.truncate(st)
            self.model, self.batch = self.store.load_model(st["version"])
            # checkpoints written before refits were checkpointed
            st.setdefault("refit", None)
            st.setdefault("refit_failures", 0)
            self.state = st
            logger.info("resuming %s at row %d (model v%d, %d buffered%s)", self.store.path,
                        st["n_rows"], st["version"], len(st["pending"]),
                        ", refit in flight redone" if st["refit"] else "")
            return
        model = self._check_new()
        batch = batch_of(model) if self._init_batch is None else np.asarray(self._init_batch)
        self.store.create(model.n_features_in_, model.embedding_.shape[1])
        self.store.save_model(0, model, batch)
        # map with the stored bytes, as a resumed run does
        self.model, self.batch = self.store.load_model(0)
        self.state = dict(
            n_rows=0, source=self.source.initial_offset, skip=0, version=0, buffer_len=0,
            pending=[], n_chunks=0, n_quarantined=0, refits=[], sigma_t=[model.sigma_t_],
            refit=None, refit_failures=0,
        )
        self.store.write_checkpoint(self.state)

    def _check_new(self) -> Any:
        """The model of a new stream, refused before anything (even the lease) is written
        when the store could not give it back."""
        if self._init_model is None:
            raise InputError(f"{self.store.path} holds no stream yet: pass a fitted model")
        model = self._init_model
        if getattr(model, "sigma_t_", None) is None:
            raise InputError("the model has no sigma_t_: fit it, or call calibrate_threshold")
        check_model(model, "the model given to the stream")
        self._check_width(model)
        return model

    def _check_width(self, model: Any) -> None:
        """A stored array source of another width than the model's is refused whole (its
        every chunk would be quarantined)."""
        width = getattr(self.source, "n_features", None)
        if width is not None and width != model.n_features_in_:
            raise InputError(f"the stream source {getattr(self.source, 'path', '')} has {width} "
                             f"features; the model maps {model.n_features_in_}")

    def run(self) -> dict:
        """Process the stream until it ends (or a stop is requested); returns a summary."""
        if not self.store.exists():
            self._check_new()
        with contextlib.ExitStack() as stack:
            # the workers' credentials live as long as the run (withdrawn also on failure)
            stack.enter_context(credentials_delivered(self.client, self.storage_options))
            self.store.lease = self.lease or stack.enter_context(
                Lease(self.store.lease_location))
            return self._run()

    def _run(self) -> dict:
        self._setup()
        self._check_width(self.model)
        self.exec = Executor(self.client, self.max_in_flight + 1)
        self.exec.put_model(self.model)
        self._resume_refit()
        old = {}
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                old[sig] = signal.signal(sig, lambda *_: self._stop.set())
        try:
            # one BLAS scope for the whole run: the chunks mapped here (threaded mode, stale
            # re-evaluations, publications) would otherwise lift and set it chunk by chunk
            with single_blas_thread():
                self._loop()
        except Exception as exc:
            if isinstance(exc, ClusterLost) or not cluster_gone(exc):
                raise
            # the scheduler or the workers went away: a rerun resumes from the checkpoint
            raise ClusterLost("stream", f"the Dask cluster went away with "
                              f"{self.state['n_rows']} rows committed ({type(exc).__name__})"
                              ) from exc
        finally:
            for sig, h in old.items():
                signal.signal(sig, h)
            self.exec.close()
        st = self.state
        return dict(n_rows=st["n_rows"], n_chunks=st["n_chunks"], version=st["version"],
                    n_refits=len(st["refits"]), n_quarantined=st["n_quarantined"],
                    n_buffered=len(st["pending"]), stopped=self._stop.is_set())

    # ------------------------------------------------------------------ main loop
    def _loop(self) -> None:
        st = self.state
        offset, skip = st["source"], st["skip"]
        in_flight: deque[_InFlight] = deque()
        while True:
            if self.strict and self._due() and not self._stop.is_set():
                self._refit_sync()  # Algorithm 1 checks the buffer before each point
            offset, skip = self._read_ahead(in_flight, offset, skip)
            if not in_flight:
                if self._ended(offset):
                    break
                # idle while following: a finished refit lands now rather than at a chunk
                # that may not come for hours (its publication is checkpointed like any other);
                # not while a file being written is waited for (the stream goes on in moments:
                # the publication point stays the one fixed by the stream)
                following = bool(getattr(self.source, "follow", False))
                self._poll_refit(wait=following and self._refit is not None
                                 and self._refit.future.done())
                self._stop.wait(self.poll_interval)
                continue
            self._commit(in_flight.popleft())
            if not self.strict:
                self._poll_refit(wait=False)
        if self._stop.is_set() or not self.source_done(offset):
            if self._refit is not None:
                logger.info("stopping: abandoning the refit in flight (the buffer is kept)")
            return
        # the stream ended: let the last refit land, or run the one that is due (a restart
        # after a kill during the final refit finds a full buffer and no refit in flight)
        if self._refit is None and self._due():
            self._start_refit()
        if self._refit is not None:
            self._poll_refit(wait=True)

    def _ended(self, offset: Any) -> bool:
        """Nothing in flight: stop (the error of a chunk the source could not read, once the
        chunks before it are committed), or the end of the stream."""
        if self._fatal is not None:
            raise self._fatal
        return self._stop.is_set() or self.source.exhausted(offset)

    def _read_ahead(self, in_flight: deque[_InFlight], offset: Any, skip: int) -> tuple:
        """Read chunks from ``offset`` into ``in_flight`` up to ``max_in_flight``, each valid
        one already mapping; returns the offset and skip after them."""
        st = self.state
        while (not self._stop.is_set() and self._fatal is None
               and len(in_flight) < self.max_in_flight):
            try:
                ch = self.source.read(offset)
            except InputError as exc:  # the source's data boundary (sources module docstring)
                self._fatal = exc
                break
            if ch is None:
                break
            data, reason = self._validate(ch)
            if data is not None and skip:
                data = data[skip:]
            # a valid chunk with rows is mapped; an invalid one goes to quarantine at its
            # turn, an empty one is consumed (recorded by the checkpoint), never mapped
            fut = (self.exec.map(data) if data is not None and reason is None and len(data)
                   else None)
            in_flight.append(_InFlight(st["n_chunks"] + len(in_flight), ch, offset, skip,
                                       data, reason, fut, st["version"]))
            offset, skip = ch.offset, 0
        return offset, skip

    def source_done(self, offset: Any) -> bool:
        return self.source.exhausted(offset)

    def _validate(self, ch: Chunk) -> tuple[np.ndarray | None, str | None]:
        if ch.error:
            return None, ch.error
        data = ch.data
        assert data is not None  # a source returns a chunk without data only with its error
        D = self.model.n_features_in_
        if data.ndim != 2:
            return data, f"expected a 2-D chunk (rows, {D}), got shape {data.shape}"
        if data.shape[1] != D:
            return data, f"wrong width: {data.shape[1]} columns, expected {D}"
        if not np.issubdtype(data.dtype, np.number):
            return data, f"non-numeric dtype {data.dtype}"
        data = data.astype(np.float64, copy=False)
        bad = ~np.isfinite(data).all(axis=1)
        if bad.any():
            return data, f"NaN or infinite values in rows {np.flatnonzero(bad)[:10].tolist()}"
        return data, None

    # ------------------------------------------------------------------ commits
    def _write(self, seq: int, data, emb, var, man, version: int, sigma_t: float) -> None:
        """Append rows (and their uncertain points to the buffer); no checkpoint.

        A row the model maps to a non-finite value is never written as a result: it is
        quarantined (status ``quarantined``, NaN coordinates) with a record of its reason.
        """
        st = self.state
        start = st["n_rows"]
        bad = ~(np.isfinite(emb).all(axis=1) & np.isfinite(var))
        if bad.any():
            rows = np.flatnonzero(bad)
            reason = (f"model v{version} mapped rows {rows[:10].tolist()} of the chunk to "
                      "non-finite values")
            logger.warning("quarantined %d rows of chunk %d: %s", rows.size, seq, reason)
            self.store.quarantine(seq, dict(seq=seq, reason=reason, first_row=start,
                                            rows=(start + rows).tolist(), n_rows=int(rows.size)),
                                  data[bad], first_row=start)
            emb, var = emb.copy(), var.copy()
            emb[bad], var[bad] = np.nan, np.nan
            st["n_quarantined"] += 1
        unc = (var > sigma_t) & ~bad
        status = np.where(unc, STATUS["buffered"], STATUS["confident"]).astype(np.int8)
        status[bad] = STATUS["quarantined"]
        st["n_rows"] = self.store.append_rows(
            start, emb, var, man, np.full(len(var), version, np.int32), status)
        rows = start + np.flatnonzero(unc)
        b0 = st["buffer_len"]
        st["buffer_len"] = self.store.append_buffer(b0, data[unc], rows)
        st["pending"].extend(range(b0, st["buffer_len"]))

    def _commit(self, job: _InFlight) -> None:
        st = self.state
        if (self._refit is not None and not self.strict
                and job.seq >= self._refit.publish_seq):
            self._poll_refit(wait=True)  # its fixed publication point (module docstring)
        if job.reason:
            self._quarantine(job)
            return
        assert job.data is not None  # a chunk without a reason to quarantine it was read
        if not len(job.data):
            logger.info("chunk %s holds no rows: consumed", job.chunk.name)
            st["source"], st["skip"] = job.chunk.offset, 0
            st["n_chunks"] = job.seq + 1
            st["n_empty"] = st.get("n_empty", 0) + 1
            self.store.write_checkpoint(st)
            return
        if job.version != st["version"]:
            # mapped by a superseded version: every row is mapped by the version current at
            # its commit, whatever the timing of the mapping
            emb, var, man = self.exec.result(self.exec.map(job.data))
        else:
            emb, var, man = self.exec.result(job.future)
        version = st["version"]
        data, done = job.data, 0
        while True:
            cut = len(data)
            if self.strict:
                room = self.n_s - len(st["pending"])
                unc = np.flatnonzero(var > self.model.sigma_t_)
                if room > 0 and unc.size >= room:
                    cut = int(unc[room - 1]) + 1
            self._write(job.seq, data[:cut], emb[:cut], var[:cut], man[:cut], version,
                        self.model.sigma_t_)
            done += cut
            if cut == len(data):
                st["source"], st["skip"] = job.chunk.offset, 0
                st["n_chunks"] = job.seq + 1
                self.store.write_checkpoint(st)
                return
            # strict mode: the buffer is full mid-chunk; commit the prefix, refit, go on
            st["source"], st["skip"] = job.offset_before, job.skip + done
            self.store.write_checkpoint(st)
            self._refit_sync()
            data = rest = data[cut:]
            emb, var, man = self.exec.result(self.exec.map(rest))
            version = st["version"]

    def _quarantine(self, job: _InFlight) -> None:
        st = self.state
        data = job.data
        # every row read is kept (output rows = source rows); samples are along the first axis
        m = job.chunk.n_rows if data is None else (data.shape[0] if data.ndim else 1)
        record = dict(seq=job.seq, name=job.chunk.name, reason=job.reason,
                      first_row=st["n_rows"], n_rows=m)
        logger.warning("quarantined chunk %s: %s", job.chunk.name, job.reason)
        self.store.quarantine(job.seq, record, data)
        dg = self.model.embedding_.shape[1]
        st["n_rows"] = self.store.append_rows(
            st["n_rows"], np.full((m, dg), np.nan), np.full(m, np.nan), np.full(m, -1, np.int32),
            np.full(m, st["version"], np.int32), np.full(m, STATUS["quarantined"], np.int8))
        st["source"], st["skip"] = job.chunk.offset, 0
        st["n_chunks"] = job.seq + 1
        st["n_quarantined"] += 1
        self.store.write_checkpoint(st)

    # ------------------------------------------------------------------ refits
    def _due(self) -> bool:
        """The buffer is full (each refit that failed on its data doubles, triples… ``n_s``)."""
        st = self.state
        return len(st["pending"]) >= self.n_s * (1 + st["refit_failures"])

    def _resume_refit(self) -> None:
        """At start: redo the refit the checkpoint records in flight (or start the one that
        was due when the run stopped before recording it), as the stopped run had it."""
        st = self.state
        if st["refit"] is not None:
            self._submit_refit(st["refit"])
            if self.strict:  # Algorithm 1: nothing is mapped before it lands
                self._poll_refit(wait=True)
        elif not self.strict and self._due():
            self._start_refit()

    def _start_refit(self) -> None:
        st = self.state
        st["refit"] = dict(ids=list(st["pending"]), trigger_row=st["n_rows"],
                           trigger_seq=st["n_chunks"],
                           publish_seq=st["n_chunks"] + int(config.get("stream.refit-lag")))
        # before the refit runs: a resumed run redoes this refit, on this buffer
        self.store.write_checkpoint(st)
        self._submit_refit(st["refit"])

    def _submit_refit(self, rec: dict) -> None:
        pts, _ = self.store.buffer_entries(rec["ids"])
        batch = np.vstack([self.batch, pts])
        logger.info("refit: batch %d + buffer %d (model v%d)", len(self.batch), len(rec["ids"]),
                    self.state["version"])
        future = self.exec.submit(refit_model, refit_params(self.model), batch,
                                  self.model.embedding_)
        self._refit = _Refit(future, list(rec["ids"]), batch, rec["trigger_row"],
                             time.perf_counter(), rec["publish_seq"])

    def _poll_refit(self, wait: bool) -> None:
        """Start the refit that is due; with ``wait``, let the one in flight land."""
        st = self.state
        if self._refit is None:
            if self._due():
                self._start_refit()
            return
        if not wait:
            return
        r, self._refit = self._refit, None
        try:
            model = self.exec.result(r.future)
            check_model(model, f"the model refitted at row {r.trigger_row}")
        except Exception as exc:
            if isinstance(exc, ClusterLost) or cluster_gone(exc):
                raise  # transient: a rerun redoes this refit from the checkpoint
            st["refit_failures"] += 1
            st["refit"] = None
            self.store.write_checkpoint(st)
            logger.exception("refit failed; retrying once the buffer holds %d points",
                             self.n_s * (1 + st["refit_failures"]))
            return
        st["refit_failures"] = 0
        self._publish(model, r)

    def _refit_sync(self) -> None:
        if self._refit is None:
            self._start_refit()
        self._poll_refit(wait=True)

    def _publish(self, model: Any, r: _Refit) -> None:
        st = self.state
        # a refit that lands after the lease was lost (this run paused while it ran) is
        # discarded here: LeaseLost, nothing of it written
        self.store.fence()
        v = st["version"] + 1
        self.store.save_model(v, model, r.batch)
        # map with the stored bytes, as a run resumed after this publication does
        model, batch = self.store.load_model(v)
        pts, rows = self.store.buffer_entries(r.ids)
        emb, var, man = model.map_points(pts)
        self.store.update_rows(rows, emb, var, man, v, STATUS["remapped"])
        taken = set(r.ids)
        rest = [i for i in st["pending"] if i not in taken]
        still = []
        if rest:
            # buffered while the refit ran: the new version decides whether they are explained
            pts, rows = self.store.buffer_entries(rest)
            emb, var, man = model.map_points(pts)
            unc = var > model.sigma_t_
            status = np.where(unc, STATUS["buffered"], STATUS["remapped"]).astype(np.int8)
            self.store.update_rows(rows, emb, var, man, v, status)
            still = [i for i, u in zip(rest, unc) if u]
        seconds = time.perf_counter() - r.started
        st["refits"].append(dict(version=v, trigger_row=r.trigger_row, publish_row=st["n_rows"],
                                 n_batch=len(r.batch), n_buffer=len(r.ids), seconds=seconds))
        st["pending"] = still
        st["version"] = v
        st["refit"] = None
        st["sigma_t"].append(model.sigma_t_)
        self.store.write_checkpoint(st)
        self.model, self.batch = model, batch
        self.exec.put_model(model)
        logger.info("published model v%d (%d manifolds) after %.1f s; %d points remapped",
                    v, model.n_manifolds_, seconds, len(r.ids) + len(rest) - len(still))


def run_stream(out: str, source: Any, model: Any = None, **kwargs: Any) -> dict:
    """Convenience wrapper: ``StreamRunner(out, source, model, **kwargs).run()``."""
    return StreamRunner(out, source, model, **kwargs).run()
