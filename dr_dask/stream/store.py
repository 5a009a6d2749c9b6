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
    It carries the lease it was written under (``lease``: fencing token and owner), and the
    content of the rows it commits (``checksums``): the SHA-256 of each output array's values
    in every block of :data:`ROW_CHUNK` rows (one stored chunk) up to ``n_rows``, computed
    from the values the writer holds when it commits. The rows still buffered at the
    checkpoint (``open_rows``) enter the block checksums by ``first_variance`` only (a
    publication torn by a kill may already have remapped their other values, and the resumed
    run rewrites them), and each carries its own (``open_digests``): the values the checkpoint
    committed in :data:`REMAPPABLE`. A reader accepts an open row that differs from it only as
    a publication in progress: the next model version is stored and the row's ``version`` is
    that version (a publication writes ``version`` first). Every reader compares
    (:meth:`StreamStore.verify`, :func:`read_output`): a block or open row that differs, or a
    chunk that cannot be decoded, is :class:`dr_dask.runs.group.ResultCorrupted` naming the
    array, rows and chunk (exit 2), and a resumed writer refuses it the same way
    (``docs/decisions.md`` STREAM-CHECKSUMS). A checkpoint written before checkpoints carried
    checksums is read unverified, with a warning; a writer resuming it records them.
``lease.json``
    One writer at a time (:class:`dr_dask.runs.lease.Lease`): every write of the store is fenced
    (:meth:`StreamStore.fence`), so a writer that paused past the lease's lifetime and lost it
    to another writes nothing more.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import numpy as np
import zarr

from dr_dask.io.errors import raise_if_transient
from dr_dask.io.storage import Location, location
from dr_dask.methods.gp_isomap_io import load_gp_isomap, save_gp_isomap
from dr_dask.runs.group import ResultCorrupted
from dr_dask.runs.lease import FencedStore, Lease, LeaseLost

logger = logging.getLogger(__name__)

#: Final row statuses.
STATUS = {"confident": 1, "buffered": 2, "remapped": 3, "quarantined": 4}
STATUS_NAMES = {v: k for k, v in STATUS.items()}
ROW_CHUNK = 4096
#: The output arrays, one row per input row.
OUTPUT_ARRAYS = ("embedding", "variance", "first_variance", "manifold", "version", "status")
#: What a publication rewrites, so not vouched for in the rows buffered at a checkpoint.
REMAPPABLE = ("embedding", "variance", "manifold", "version", "status")
#: The checkpoint's record of the committed rows' content (module docstring).
CHECKSUMS = "checksums"


def block_digest(name: str, values: np.ndarray, open_rows: np.ndarray) -> str:
    """SHA-256 of one block of output array ``name`` (its rows' values in little-endian C
    order, with its shape and dtype), the rows ``open_rows`` (block-relative) zeroed in the
    arrays a publication may still rewrite (:data:`REMAPPABLE`)."""
    v = _little_endian(values)
    if name in REMAPPABLE and open_rows.size:
        v = v.copy()
        v[open_rows] = 0
    head = f"{name}:{v.dtype.str}:{v.shape}:".encode()
    return hashlib.sha256(head + v.tobytes()).hexdigest()


def row_digest(values: dict[str, np.ndarray]) -> str:
    """The first 64 bits of the SHA-256 of one output row's values in the arrays a publication
    rewrites (``values``: array name -> that row's value), as the checkpoint records a row
    still buffered at it (a change detector, not a signature: the checkpoint is beside the
    rows it vouches for)."""
    h = hashlib.sha256()
    for a in REMAPPABLE:
        h.update(f"{a}:".encode() + _little_endian(values[a]).tobytes())
    return h.hexdigest()[:16]


def _little_endian(values: Any) -> np.ndarray:
    """``values`` as a C-ordered little-endian array: the bytes every digest here hashes."""
    v = np.asarray(values)
    return np.ascontiguousarray(v, dtype=v.dtype.newbyteorder("<"))


def _chunk_key(arr: zarr.Array, name: str, lo: int) -> str:
    """The stored chunk holding row ``lo`` of ``arr`` (default Zarr v3 key encoding)."""
    return "/".join([name, "c", str(lo // arr.chunks[0]), *(["0"] * (arr.ndim - 1))])


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
        #: The output's arrays as this writer opened them: under the lease no other process
        #: changes them, and a resize here updates the object's own metadata, so each is
        #: opened once, not once per chunk (on an object store each opening is two requests:
        #: a stream of 25 chunks reread each array's metadata 30 times, 480 of its 2,400)
        self._arrays: dict[str, zarr.Array] = {}
        #: The lease every write is fenced by (None: a store read, or written without one).
        self.lease: Lease | None = None
        #: The checkpoint's version as this writer last read or wrote it (None: absent).
        self._checkpoint_version: str | None = None
        #: Per output array, the checksum of each committed block as of the last checkpoint
        #: read or written (None: none recorded, every block is hashed at the next commit).
        self._sums: dict[str, list[str]] | None = None
        #: Blocks written since the last checkpoint, and the values of those this writer holds
        #: (block -> array -> values of its rows up to the row count written).
        self._dirty: set[int] = set()
        self._blocks: dict[int, dict[str, np.ndarray]] = {}
        self._n = 0
        #: The rows buffered at the last checkpoint, each with the digest of its values there
        #: ("": not known yet, computed at the next commit).
        self._open: dict[int, str] = {}
        #: The output row of each buffer entry, as written (None: read from the store when
        #: first needed).
        self._buffer_rows: np.ndarray | None = None

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
        self._arrays = {
            name: g.create_array(name, shape=shape, dtype=dtype, chunks=chunks,
                                 fill_value=fill, overwrite=True)
            for name, (shape, dtype, chunks, fill) in spec.items()}
        g.attrs["status_codes"] = STATUS
        self.group = g
        self._sums, self._blocks, self._dirty, self._n, self._open = (
            {a: [] for a in OUTPUT_ARRAYS}, {}, set(), 0, {})
        self._buffer_rows = np.zeros(0, dtype=np.int64)

    def open(self) -> zarr.Group:
        self.group = zarr.open_group(store=self._zarr_store(), mode="a",
                                     use_consolidated=False)
        self._arrays = {}
        return self.group

    def __getitem__(self, name: str) -> zarr.Array:
        if name not in self._arrays:
            arr = (self.group if self.group is not None else self.open())[name]
            assert isinstance(arr, zarr.Array), f"{name} is a group"  # create() made arrays
            self._arrays[name] = arr
        return self._arrays[name]

    # ------------------------------------------------------------------ checkpoint
    def read_checkpoint(self) -> dict:
        got = self.checkpoint_path.read_versioned()
        if got is None:
            raise FileNotFoundError(self.checkpoint_path.url)
        self._checkpoint_version = got[1]
        state = json.loads(got[0])
        sums = state.get(CHECKSUMS)
        # recorded in other blocks (or none): every block is hashed at this writer's commit
        self._sums = ({a: list(v) for a, v in sums["arrays"].items()}
                      if isinstance(sums, dict) and sums.get("block") == ROW_CHUNK else None)
        self._open = {}
        if isinstance(sums, dict):
            digests = sums.get("open_digests") or [""] * len(sums["open_rows"])
            self._open = dict(zip((int(r) for r in sums["open_rows"]), digests))
        self._n, self._blocks, self._dirty = state["n_rows"], {}, set()
        self._buffer_rows = None
        return state

    def write_checkpoint(self, state: dict) -> None:
        """The commit mark of everything written before it, with the lease's stamp.

        Under a lease it is a compare-and-swap on the checkpoint this writer last read or
        wrote: a writer paused *after* its fence (the window a lease alone leaves open) finds
        the checkpoint of the run that took over, writes nothing and raises LeaseLost.

        It records the checksums of the committed rows (:data:`CHECKSUMS`), rehashing only
        the blocks written since the last checkpoint, from the values this writer holds."""
        state[CHECKSUMS] = self._checksums(state)
        if self.lease is None:
            state["lease"] = None
            self.checkpoint_path.write_json(state)
            self._committed()
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
        self._committed()

    # ------------------------------------------------------------------ checksums
    def _block(self, b: int) -> dict[str, np.ndarray]:
        """The values of block ``b`` up to the rows written, read once from the store (rows
        committed before this writer held them) and then kept up to date by its writes."""
        if b not in self._blocks:
            lo, hi = b * ROW_CHUNK, min(self._n, (b + 1) * ROW_CHUNK)
            self._blocks[b] = {a: np.asarray(self[a][lo:max(lo, hi)]) for a in OUTPUT_ARRAYS}
        return self._blocks[b]

    def _hold(self, rows: np.ndarray, values: dict[str, Any]) -> None:
        """Keep the values written to ``rows`` (sorted) in the blocks held."""
        for b in np.unique(rows // ROW_CHUNK).tolist():
            sel = (rows >= b * ROW_CHUNK) & (rows < (b + 1) * ROW_CHUNK)
            local = rows[sel] - b * ROW_CHUNK
            block = self._block(b)
            for a, val in values.items():
                arr = block[a]
                if arr.shape[0] <= local[-1]:
                    grown = np.empty((int(local[-1]) + 1, *arr.shape[1:]), arr.dtype)
                    grown[:arr.shape[0]] = arr
                    block[a] = arr = grown
                arr[local] = np.broadcast_to(np.asarray(val), (rows.size, *arr.shape[1:]))[sel]
            self._dirty.add(b)

    def _checksums(self, state: dict) -> dict:
        """The checksums of the rows ``state`` commits (see the module docstring)."""
        n = state["n_rows"]
        pending = list(state.get("pending") or [])
        if pending and (self._buffer_rows is None
                        or len(self._buffer_rows) < state["buffer_len"]):
            self._buffer_rows = np.asarray(self["buffer_rows"][:state["buffer_len"]])
        open_rows = (sorted(int(r) for r in self._buffer_rows[pending])
                     if pending and self._buffer_rows is not None else [])
        n_blocks = -(-n // ROW_CHUNK)
        sums = self._sums if self._sums is not None else {a: [] for a in OUTPUT_ARRAYS}
        redo = set(self._dirty) if self._sums is not None else set(range(n_blocks))
        # a row that left or joined the buffered ones changes what its block vouches for
        redo |= {r // ROW_CHUNK for r in set(open_rows) ^ set(self._open)}
        redo |= {b for b in range(n_blocks) if b >= len(sums["status"])}
        rows = np.asarray(open_rows, dtype=np.int64)
        digests = {}
        for r in open_rows:
            held = self._open.get(r, "")
            if not held or r // ROW_CHUNK in self._dirty:  # rows written since: their values
                block = self._block(r // ROW_CHUNK)
                held = row_digest({a: block[a][r % ROW_CHUNK] for a in REMAPPABLE})
            digests[r] = held
        for b in sorted(x for x in redo if x < n_blocks):
            lo, hi = b * ROW_CHUNK, min(n, (b + 1) * ROW_CHUNK)
            block = self._block(b)
            local = rows[(rows >= lo) & (rows < hi)] - lo
            for a in OUTPUT_ARRAYS:
                digest = block_digest(a, block[a][:hi - lo], local)
                col = sums.setdefault(a, [])
                col.extend([""] * (b + 1 - len(col)))
                col[b] = digest
        self._sums = {a: col[:n_blocks] for a, col in sums.items()}
        self._open = digests
        return {"block": ROW_CHUNK, "open_rows": open_rows,
                "open_digests": [digests[r] for r in open_rows], "arrays": self._sums}

    def _committed(self) -> None:
        """After a checkpoint: only the block rows are still appended to stays held."""
        self._dirty.clear()
        tail = (self._n - 1) // ROW_CHUNK if self._n else 0
        self._blocks = {b: v for b, v in self._blocks.items() if b == tail}

    def verify(self, state: dict, keep: bool = False) -> dict[str, np.ndarray] | None:
        """Compare the committed rows of ``state`` (the checkpoint just read) with its
        checksums, a block (one stored chunk) at a time; raise :class:`ResultCorrupted` naming
        every array, rows and chunk that differs or cannot be read. A checkpoint without
        checksums is read unverified, with a warning. With ``keep``, returns the rows read."""
        n = state["n_rows"]
        sums = state.get(CHECKSUMS)
        if not isinstance(sums, dict):
            logger.warning("%s was checkpointed before stream checkpoints carried checksums: "
                           "its rows are read unverified (the next commit of a run that "
                           "resumes it records them)", self.path)
            sums = {"block": ROW_CHUNK, "open_rows": [], "arrays": None}
        problems: list[str] = []
        parts = {a: self._verified(a, n, sums, problems, keep) for a in OUTPUT_ARRAYS}
        if not problems:  # a chunk that cannot be read is named once, by its block
            self._verify_open(state, sums, problems)
        if problems:
            raise ResultCorrupted(
                f"stream output {self.path} is checkpointed at row {n} but its committed rows "
                f"were changed since: {'; '.join(problems)}. The rows cannot be recomputed "
                "from this store: map the source again into a new output")
        if not keep:
            return None
        return {a: np.concatenate(v) for a, v in parts.items()}

    def _verified(self, a: str, n: int, sums: dict, problems: list[str],
                  keep: bool) -> list[np.ndarray]:
        """The committed rows of array ``a`` a block at a time, each compared with its
        checksum in ``sums`` (none: unverified); what differs is appended to ``problems``.
        Only with ``keep`` are the rows kept (a resuming writer verifies block by block)."""
        try:
            arr = self[a]
        except KeyError:
            problems.append(f"array {a} is gone")
            return []
        block = int(sums["block"])
        recorded = None if sums["arrays"] is None else sums["arrays"].get(a, [])
        open_rows = np.asarray(sums["open_rows"], dtype=np.int64)
        parts = [np.asarray(arr[:0])]
        for b, lo in enumerate(range(0, n, block)):
            hi = min(n, lo + block)
            where = f"{a} rows {lo}..{hi} (chunk {_chunk_key(arr, a, lo)})"
            try:
                values = np.asarray(arr[lo:hi])
            except Exception as exc:  # noqa: BLE001  (a codec raises many types)
                raise_if_transient(exc, self.location)
                problems.append(f"{where} cannot be read ({type(exc).__name__}: {exc})")
                continue
            local = open_rows[(open_rows >= lo) & (open_rows < hi)] - lo
            if recorded is not None and (b >= len(recorded)
                                         or block_digest(a, values, local) != recorded[b]):
                problems.append(f"{where} does not match its checksum (overwritten or "
                                "truncated since it was committed)")
            if keep:
                parts.append(values)
        return parts

    def _verify_open(self, state: dict, sums: dict, problems: list[str]) -> None:
        """Compare each row buffered at the checkpoint ``state`` with its digest; a row that
        differs is appended to ``problems`` unless a publication in progress rewrote it: the
        next model version is stored and the row already carries it (module docstring)."""
        digests = sums.get("open_digests")
        if not digests:  # recorded before open rows carried digests: their blocks did
            return
        rows = np.asarray(sums["open_rows"], dtype=np.int64)
        values = {}
        for a in REMAPPABLE:
            arr = self[a]
            values[a] = np.asarray(arr.get_orthogonal_selection(
                (rows,) if arr.ndim == 1 else (rows, slice(None))))
        nxt = int(state["version"]) + 1
        publishing: bool | None = None
        bad: list[int] = []
        for i, r in enumerate(rows.tolist()):
            if row_digest({a: values[a][i] for a in REMAPPABLE}) == digests[i]:
                continue
            if publishing is None:
                publishing = self.location.child("models", f"v{nxt}", "zarr.json").exists()
            if not (publishing and int(values["version"][i]) == nxt):
                bad.append(r)
        if bad:
            shown = ", ".join(map(str, bad[:10])) + (f" and {len(bad) - 10} more"
                                                     if len(bad) > 10 else "")
            chunks = ", ".join(_chunk_key(self[a], a, b * ROW_CHUNK) for b in
                               sorted({r // ROW_CHUNK for r in bad}) for a in REMAPPABLE)
            problems.append(f"row{'s' if len(bad) > 1 else ''} {shown}, buffered at the "
                            f"checkpoint (chunks {chunks}), do{'' if len(bad) > 1 else 'es'} "
                            "not match the checkpoint's checksums (changed since committed, "
                            "and not by a publication of the next model version)")

    def truncate(self, state: dict) -> None:
        """Drop everything written after the checkpoint ``state`` (restart after a crash)."""
        n, b = state["n_rows"], state["buffer_len"]
        self.fence()
        self._n, self._blocks, self._dirty, self._buffer_rows = n, {}, set(), None
        # a torn publication may have rewritten the buffered rows since their digests: the
        # next commit takes them as they are now (the resumed run rewrites them anyway)
        self._open = dict.fromkeys(self._open, "")
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
        if m:
            self._hold(np.arange(start, end), {
                "embedding": emb, "variance": var, "first_variance": var,
                "manifold": manifold, "version": version, "status": status})
        self._n = max(self._n, end)
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
        # version first: a row a torn publication changed already says so, which is how a
        # reader tells it from a corrupted one (module docstring)
        vals = {"version": np.broadcast_to(np.asarray(version), rows.shape)[order],
                "embedding": np.asarray(emb)[order]}
        for name, val in (("variance", var), ("manifold", manifold), ("status", status)):
            vals[name] = np.broadcast_to(np.asarray(val), rows.shape)[order]
        rows = rows[order]
        self._hold(rows, vals)
        for name, val in vals.items():
            arr = self[name]
            arr.set_orthogonal_selection((rows,) if arr.ndim == 1 else (rows, slice(None)), val)

    def append_buffer(self, start: int, points: np.ndarray, rows: np.ndarray) -> int:
        end = start + len(rows)
        self.fence()
        if self._buffer_rows is not None:
            self._buffer_rows = np.concatenate(
                [self._buffer_rows[:start], np.asarray(rows, dtype=np.int64)])
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
    """The committed output of a stream store as NumPy arrays (rows up to the checkpoint),
    verified against the checkpoint's checksums (:meth:`StreamStore.verify`).

    Returns
    -------
    dict with ``embedding (N, d_g)``, ``variance``, ``first_variance``, ``manifold``,
    ``version``, ``status``
    (all (N,)), ``checkpoint`` (dict) and ``quarantine`` (list of records).

    Raises
    ------
    ResultCorrupted
        A committed row block no longer matches its checksum or cannot be decoded (named).
    """
    store = StreamStore(path, storage_options)
    state = store.read_checkpoint()
    out: dict[str, Any] = dict(store.verify(state, keep=True) or {})
    out["checkpoint"] = state
    out["quarantine"] = store.quarantine_records()
    return out
