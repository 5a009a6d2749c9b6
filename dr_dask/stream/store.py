"""The stream's durable state: output rows, the drift buffer, model versions, the checkpoint.

Layout of the output location, a local path or URL (a Zarr v3 group plus plain objects):

``embedding (N, d_g)``, ``variance (N,)``, ``first_variance (N,)``, ``manifold (N,)``,
``version (N,)``, ``status (N,)``
    One row per input row, row i = the i-th row of the stream (quarantined rows included).
    ``first_variance`` is the variance under the version that first mapped the row.
``buffer_points (M, D)``, ``buffer_rows (M,)``
    Append-only log of every point that was ever buffered, with its output row.
``models/v{k}/``
    Each published model version with the batch it was fitted on (Zarr group, no pickle:
    :mod:`dr_dask.methods.gp_isomap_io`).
``quarantine/{seq}.json`` (+ ``.npy``)
    Malformed chunks with the reason; ``quarantine/{seq}-{first_row}.json`` (+ ``.npy``): rows
    of chunk ``seq`` the model mapped to non-finite values.
``source_keys/``
    Names of processed chunk files moved out of the checkpoint
    (:class:`dr_dask.stream.sources.DirectorySource`).
``checkpoint.json``
    The committed state: one object written last (a single PUT on object stores; see
    :mod:`dr_dask.io.storage`):
    anything beyond it (rows past ``n_rows``, buffer entries past ``buffer_len``, models newer
    than ``version``, quarantine records from chunk ``n_chunks`` or row ``n_rows`` on) is
    discarded on restart.
    It carries the lease it was written under (``lease``: fencing token and owner).
``lease.json``
    One writer at a time (:class:`dr_dask.runs.lease.Lease`): every write of the store is fenced
    (:meth:`StreamStore.fence`), so a writer that paused past the lease's lifetime and lost it
    to another writes nothing more.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import zarr

from dr_dask.io.storage import Location, location
from dr_dask.methods.gp_isomap_io import load_gp_isomap, save_gp_isomap
from dr_dask.runs.lease import FencedStore, Lease, LeaseLost

logger = logging.getLogger(__name__)

#: Final row statuses.
STATUS = {"confident": 1, "buffered": 2, "remapped": 3, "quarantined": 4}
STATUS_NAMES = {v: k for k, v in STATUS.items()}
ROW_CHUNK = 4096


class StreamStore:
    """Reader/writer of a stream output location (one writer: the runner).

    Parameters
    ----------
    path : str or Location
        Local path or URL.
    storage_options : dict, optional
        For the filesystem of a URL.
    """

    def __init__(self, path: Any, storage_options: dict | None = None):
        self.location = location(path, storage_options)
        self.path = self.location.url
        self.group: zarr.Group | None = None
        #: The lease every write is fenced by (None: a store read, or written without one).
        self.lease: Lease | None = None
        #: The checkpoint's version as this writer last read or wrote it (None: absent).
        self._checkpoint_version: str | None = None

    def fence(self) -> int | None:
        """Before a write: the lease's token if this writer still holds it, else LeaseLost."""
        return self.lease.fence() if self.lease is not None else None

    def _check(self) -> None:
        """Immediately before one object write: :meth:`Lease.check` (a fence unless one has
        just succeeded)."""
        if self.lease is not None:
            self.lease.check()

    def _zarr_store(self, where: Location | None = None) -> Any:
        """The Zarr store of ``where`` (default: the output), every write of it fenced by the
        lease (:class:`dr_dask.runs.lease.FencedStore`) when there is one: a writer that loses
        the lease in the middle of an array, or while a refit is in flight, writes no further
        chunk or metadata object."""
        store = (where or self.location).zarr_store()
        return store if self.lease is None else FencedStore(store, self.lease)

    # ------------------------------------------------------------------ layout
    @property
    def checkpoint_path(self) -> Location:
        return self.location.child("checkpoint.json")

    @property
    def lease_location(self) -> Location:
        return self.location.child("lease.json")

    def exists(self) -> bool:
        return self.checkpoint_path.exists()

    def create(self, n_features: int, global_dim: int) -> None:
        self.location.check()
        self.fence()
        g = zarr.open_group(store=self._zarr_store(), mode="a")
        spec = {
            "embedding": ((0, global_dim), "f8", (ROW_CHUNK, global_dim), np.nan),
            "variance": ((0,), "f8", (ROW_CHUNK,), np.nan),
            "first_variance": ((0,), "f8", (ROW_CHUNK,), np.nan),
            "manifold": ((0,), "i4", (ROW_CHUNK,), -1),
            "version": ((0,), "i4", (ROW_CHUNK,), -1),
            "status": ((0,), "i1", (ROW_CHUNK,), 0),
            "buffer_points": ((0, n_features), "f8", (1024, n_features), np.nan),
            "buffer_rows": ((0,), "i8", (1024,), -1),
        }
        for name, (shape, dtype, chunks, fill) in spec.items():
            g.create_array(name, shape=shape, dtype=dtype, chunks=chunks, fill_value=fill,
                           overwrite=True)
        g.attrs["status_codes"] = STATUS
        self.group = g

    def open(self) -> zarr.Group:
        self.group = zarr.open_group(store=self._zarr_store(), mode="a",
                                     use_consolidated=False)
        return self.group

    def __getitem__(self, name: str) -> zarr.Array:
        arr = (self.group if self.group is not None else self.open())[name]
        assert isinstance(arr, zarr.Array), f"{name} is a group"  # create() made arrays only
        return arr

    # ------------------------------------------------------------------ checkpoint
    def read_checkpoint(self) -> dict:
        got = self.checkpoint_path.read_versioned()
        if got is None:
            raise FileNotFoundError(self.checkpoint_path.url)
        self._checkpoint_version = got[1]
        return json.loads(got[0])

    def write_checkpoint(self, state: dict) -> None:
        """The commit mark of everything written before it, with the lease's stamp.

        Under a lease it is a compare-and-swap on the checkpoint this writer last read or
        wrote: a writer paused *after* its fence (the window a lease alone leaves open) finds
        the checkpoint of the run that took over, writes nothing and raises LeaseLost."""
        if self.lease is None:
            state["lease"] = None
            self.checkpoint_path.write_json(state)
            return
        state["lease"] = self.lease.stamp()
        version = self.checkpoint_path.swap_bytes(json.dumps(state).encode(),
                                                  self._checkpoint_version)
        if version is None:
            self.lease.fence()  # taken over: LeaseLost naming the run that holds it now
            raise LeaseLost(
                f"{self.checkpoint_path} was committed by another run since this one last "
                f"wrote it (this run, {self.lease.owner}, paused past its lease's lifetime): "
                "it stopped writing and the other run's output stands")
        self._checkpoint_version = version

    def truncate(self, state: dict) -> None:
        """Drop everything written after the checkpoint ``state`` (restart after a crash)."""
        n, b = state["n_rows"], state["buffer_len"]
        self.fence()
        for name in ("embedding", "variance", "first_variance", "manifold", "version", "status"):
            arr = self[name]
            if arr.shape[0] != n:
                arr.resize((n, *arr.shape[1:]))
        for name in ("buffer_points", "buffer_rows"):
            arr = self[name]
            if arr.shape[0] != b:
                arr.resize((b, *arr.shape[1:]))
        # listings here only find debris to delete; the checkpoint says what is committed
        mdir = self.location.child("models")
        for f in mdir.listdir():  # model groups models/v{k} newer than the checkpoint
            if f.startswith("v") and f[1:].isdigit() and int(f[1:]) > state["version"]:
                self._check()
                mdir.child(f).delete()
        qdir = self.location.child("quarantine")
        for f in qdir.listdir():
            seq, _, first_row = f.split(".")[0].partition("-")
            if not (seq.isdigit() and (first_row or "0").isdigit()):
                continue
            # a chunk's record is committed with the chunk; a record of rows with its rows
            if (int(first_row) >= state["n_rows"] if first_row
                    else int(seq) >= state["n_chunks"]):
                self._check()
                qdir.child(f).delete()

    # ------------------------------------------------------------------ rows
    def append_rows(self, start: int, emb, var, manifold, version, status) -> int:
        """Write rows ``start..start+m`` (growing the arrays); returns the new row count."""
        m = len(status)
        end = start + m
        self.fence()
        # first_variance keeps the variance under the model that first saw the row (detection
        # plots); variance is overwritten when a refit re-maps the row
        for name, val in (("embedding", emb), ("variance", var), ("first_variance", var),
                          ("manifold", manifold), ("version", version), ("status", status)):
            arr = self[name]
            if arr.shape[0] < end:
                arr.resize((end, *arr.shape[1:]))
            if m:
                arr[start:end] = val
        return end

    def update_rows(self, rows: np.ndarray, emb, var, manifold, version, status) -> None:
        """Overwrite existing rows (buffered points re-mapped after a refit)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return
        self.fence()
        order = np.argsort(rows)
        vals = {"embedding": np.asarray(emb)[order]}
        for name, val in (("variance", var), ("manifold", manifold), ("version", version),
                          ("status", status)):
            vals[name] = np.broadcast_to(np.asarray(val), rows.shape)[order]
        rows = rows[order]
        for name, val in vals.items():
            arr = self[name]
            arr.set_orthogonal_selection((rows,) if arr.ndim == 1 else (rows, slice(None)), val)

    def append_buffer(self, start: int, points: np.ndarray, rows: np.ndarray) -> int:
        end = start + len(rows)
        self.fence()
        for name, val in (("buffer_points", points), ("buffer_rows", rows)):
            arr = self[name]
            if arr.shape[0] < end:
                arr.resize((end, *arr.shape[1:]))
            if len(rows):
                arr[start:end] = val
        return end

    def buffer_entries(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Points (m, D) and output rows (m,) of buffer entries ``ids``."""
        if not ids:
            return np.zeros((0, self["buffer_points"].shape[1])), np.zeros(0, dtype=np.int64)
        idx = np.asarray(ids, dtype=np.int64)
        pts = self["buffer_points"].get_orthogonal_selection((idx, slice(None)))
        rows = self["buffer_rows"].get_orthogonal_selection((idx,))
        return np.asarray(pts), np.asarray(rows)

    # ------------------------------------------------------------------ models, quarantine
    def save_model(self, version: int, model: Any, batch: np.ndarray) -> None:
        self.fence()
        where = self.location.child("models", f"v{version}")
        save_gp_isomap(model, zarr.open_group(store=self._zarr_store(where), mode="a"), batch)

    def load_model(self, version: int) -> tuple[Any, np.ndarray]:

        model, batch = load_gp_isomap(self.location.child("models", f"v{version}"))
        assert batch is not None  # save_model always stores the batch
        return model, batch

    def quarantine(self, seq: int, record: dict, data: np.ndarray | None,
                   first_row: int | None = None) -> None:
        """Record quarantined chunk ``seq`` (or its rows from output row ``first_row`` on)."""
        qdir = self.location.child("quarantine")
        self.fence()
        stem = f"{seq:09d}" if first_row is None else f"{seq:09d}-{first_row:012d}"
        if data is not None:
            try:
                qdir.child(f"{stem}.npy").write_npy(data)
            except Exception:  # noqa: BLE001  (an object array or similar: the record must do)
                logger.debug("could not save quarantined chunk %d data", seq)
        self._check()
        qdir.child(f"{stem}.json").write_json(record)  # the entry's mark, after its data

    def quarantine_records(self) -> list[dict]:
        qdir = self.location.child("quarantine")
        return [json.loads(qdir.child(f).read_bytes()) for f in qdir.listdir()
                if f.endswith(".json")]


def read_output(path: Any, storage_options: dict | None = None) -> dict:
    """The committed output of a stream store as NumPy arrays (rows up to the checkpoint).

    Returns
    -------
    dict with ``embedding (N, d_g)``, ``variance``, ``first_variance``, ``manifold``,
    ``version``, ``status``
    (all (N,)), ``checkpoint`` (dict) and ``quarantine`` (list of records).
    """
    store = StreamStore(path, storage_options)
    state = store.read_checkpoint()
    n = state["n_rows"]
    out: dict[str, Any] = {name: np.asarray(store[name][:n])
           for name in ("embedding", "variance", "first_variance", "manifold", "version",
                        "status")}
    out["checkpoint"] = state
    out["quarantine"] = store.quarantine_records()
    return out
