"""Stream sources: an appendable Zarr array, a directory of chunk files, a Python iterator.

Every source is addressed by a JSON-serialisable *offset* that the runner checkpoints with each
write. ``read(offset)`` returns the next chunk and the offset after it with no side effect a
checkpoint can see, so re-reading from a checkpointed offset after a crash yields exactly the
rows not yet committed.

The data boundary: every chunk is read whole or the stream stops by name. A stored chunk that
cannot be decoded, has the wrong size or is missing (a Zarr chunk, a ``.npy`` file that is not
one or holds other bytes than its header says) raises :class:`~dr_dask.io.inputs.InputError`
naming the array or file and the chunk key (exit 2): nothing after it is written and the
checkpointed offset stays before it, so fixing the chunk and rerunning resumes there. A chunk
that *was* read but cannot be mapped (wrong width, non-numeric, NaN or infinite rows) is
quarantined by the runner with its rows, so output rows = source rows, always. Metadata is
bounded before it is believed (:func:`dr_dask.io.inputs.check_claimed`).

Writers of a directory source: write each file under a temporary name that does not end in
``.npy`` and rename it into place (one PUT on an object store is atomic). A file still being
written (shorter than its header says, or whose header is not all there yet) is waited for,
never quarantined, and refused as truncated once its size has not changed for
``dr_dask.stream.settle``.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from dr_dask.io.boundary import NpyRows, ZarrRows
from dr_dask.io.inputs import InputError, check_claimed
from dr_dask.io.storage import Location, location, raise_if_transient
from dr_dask.runtime import config

logger = logging.getLogger(__name__)


@dataclass
class Chunk:
    """One unit read from a source.

    Attributes
    ----------
    data : ndarray or None
        The rows as read (not yet validated); None when unreadable.
    offset : Any
        Source offset *after* this chunk.
    name : str
        Where it came from (file name, row range, iterator position), for quarantine records.
    error : str or None
        Why the chunk could not be read.
    n_rows : int
        The rows of a chunk with ``error`` and no data (an item of an iterator that is not
        numeric but has a length): the runner quarantines that many rows.
    """

    data: np.ndarray | None
    offset: Any
    name: str
    error: str | None = None
    n_rows: int = 0


class _RowsSource:
    """A stored 2-D array read in row ranges; offset: rows consumed. Opened (and its metadata
    bounded) at construction, so an input the stream cannot read is refused before the runner
    writes anything; re-opened on every read so that appended rows become visible."""

    def __init__(self, path: Any, chunk_size: int = 1000, follow: bool = False):
        self.path = location(path)
        self.chunk_size = int(chunk_size)
        self.follow = follow
        self.initial_offset = 0
        self.n_features = int(self._array().shape[1])

    def _array(self) -> Any:
        raise NotImplementedError

    def _rows(self, arr: Any, start: int, stop: int) -> np.ndarray:
        raise NotImplementedError

    def read(self, offset: int) -> Chunk | None:
        arr = self._array()
        n = arr.shape[0]
        if offset >= n:
            return None
        end = min(n, offset + self.chunk_size)
        # a chunk that cannot be read whole raises InputError naming it: never skipped
        return Chunk(self._rows(arr, offset, end), end, f"rows {offset}:{end}")

    def exhausted(self, offset: int) -> bool:
        return not self.follow and offset >= self._array().shape[0]


class ZarrSource(_RowsSource):
    """An appendable 2-D Zarr array; new rows are picked up by polling its shape.

    Offset: number of rows consumed. ``follow=False`` ends the stream once every row present
    has been read; ``follow=True`` keeps polling for appended rows. Every chunk a read touches
    is looked up and decoded whole (:meth:`dr_dask.io.boundary.ZarrRows.read_rows`).
    """

    def _array(self) -> ZarrRows:
        try:
            arr = zarr.open_array(self.path.zarr_store(read_only=True), mode="r")
        except Exception as exc:  # noqa: BLE001  (zarr raises several types for "not an array")
            raise_if_transient(exc, self.path)
            raise InputError(f"stream source {self.path} is not a readable Zarr array: "
                             f"{exc}") from None
        check_claimed(str(self.path), arr.shape, arr.dtype, arr.shards or arr.chunks)
        if arr.ndim != 2:
            raise InputError(f"stream source {self.path} must be 2-D (samples x features); "
                             f"it has shape {arr.shape}")
        return ZarrRows.of(arr, str(self.path), self.path)

    def _rows(self, arr: Any, start: int, stop: int) -> np.ndarray:
        return arr.read_rows(start, stop)


class NpySource(_RowsSource):
    """One ``.npy`` file of rows (samples x features), read ``chunk_size`` rows at a time
    (byte ranges of the file); offset: rows consumed. A file shorter or longer than its header
    says is refused at open."""

    def _array(self) -> NpyRows:
        rows = NpyRows(self.path)
        if rows.ndim != 2:
            raise InputError(f"stream source {self.path} must be 2-D (samples x features); "
                             f"it has shape {rows.shape}")
        return rows

    def _rows(self, arr: Any, start: int, stop: int) -> np.ndarray:
        return arr[start:stop]


class DirectorySource:
    """Chunk files (``.npy``) in a directory, each processed once, in name order.

    Offset: the names processed, ``{"done": [...], "archives": [...], "last": name}``: the
    names since the last compaction, the archive objects holding the older ones, and the
    greatest name processed. Processed names, not a high-water mark: a file that appears
    after the checkpoint with a name sorting before ``last`` is processed (with a warning),
    never skipped. A writer must make each file appear whole: on local disk write under a
    temporary name (not ending in ``.npy``) and rename; on an object store one PUT is atomic.

    Compaction: once an offset lists ``dr_dask.stream.compact-after`` names (dask config;
    the checkpoint is rewritten after every chunk, so it must stay small), :meth:`read` writes them
    to an archive object under :attr:`archive` (named by a hash of its content, so it is
    never rewritten with other names) and the next offset refers to it instead. An archive
    nothing committed refers to (a crash right after writing it) is harmless debris.
    """

    def __init__(self, path: Any, pattern: str = ".npy", follow: bool = False,
                 archive: Location | None = None):
        self.path = location(path)
        if not self.path.exists():
            raise FileNotFoundError(f"stream directory {self.path} does not exist")
        self.suffix = pattern
        self.follow = follow
        #: Where compacted names go (the runner sets a location in its store); None: the
        #: offset lists every name.
        self.archive = archive
        self._archived: dict[str, list[str]] = {}
        #: Files seen short of their header's size: name -> (size, when first seen at it).
        self._seen: dict[str, tuple[int, float]] = {}
        self.initial_offset: dict = {"done": [], "archives": [], "last": ""}

    def _names(self) -> list[str]:
        return [f for f in self.path.listdir() if f.endswith(self.suffix)]

    def _state(self, offset: Any) -> dict:
        if isinstance(offset, str):  # a checkpoint of the high-water-mark format
            done = [f for f in self._names() if f <= offset]
            return {"done": done, "archives": [], "last": offset}
        return offset

    def _processed(self, state: dict) -> set[str]:
        seen = set(state["done"])
        for name in state["archives"]:
            if name not in self._archived:
                self._archived[name] = json.loads(self.archive_location(name).read_bytes())
            seen.update(self._archived[name])
        return seen

    def archive_location(self, name: str) -> Location:
        if self.archive is None:
            raise ValueError("this offset refers to archived names but the source has no "
                             "archive location")
        return self.archive.child(f"{name}.json")

    def _pending(self, state: dict) -> list[str]:
        seen = self._processed(state)
        return [f for f in self._names() if f not in seen]

    def _after(self, state: dict, name: str) -> dict:
        done, archives = [*state["done"], name], list(state["archives"])
        if self.archive is not None and len(done) >= int(config.get("stream.compact-after")):
            data = json.dumps(sorted(done)).encode()
            key = hashlib.sha256(data).hexdigest()[:24]
            self.archive_location(key).write_bytes(data)  # before any offset names it
            self._archived[key] = sorted(done)
            done, archives = [], [*archives, key]
        return {"done": done, "archives": archives, "last": max(state["last"], name)}

    def read(self, offset: Any) -> Chunk | None:
        """The next unprocessed file, whole; None when there is none, or when it is still
        being written (the runner polls again)."""
        state = self._state(offset)
        pending = self._pending(state)
        if not pending:
            return None
        name = pending[0]
        data = self._load(name)
        if data is None:
            return None
        if name < state["last"]:
            logger.warning("chunk file %s arrived after %s was processed (it sorts before it): "
                           "processing it now; its rows follow those already written", name,
                           state["last"])
        return Chunk(data, self._after(state, name), name)

    def _load(self, name: str) -> np.ndarray | None:
        """The array in file ``name``; None while it is being written; InputError naming it
        when it is not a .npy file, holds other bytes than its header says, or stayed short
        of them for ``dr_dask.stream.settle``."""
        where = self.path.child(name)
        try:
            size = int(where.fs.info(where.path)["size"])
            with where.open("rb") as fh:
                head = fh.read(min(size, 1 << 16))
                header = _npy_header(head, f"{self.path}/{name}")
                if header is None or size < header[1]:
                    self._settling(name, size, header[1] if header else None)
                    return None
                if size > header[1]:
                    raise InputError(
                        f"{self.path}/{name} holds {size:,} bytes but its .npy header says "
                        f"{header[1]:,} (shape {header[0]}): corrupt; write it again")
                fh.seek(0)
                data = np.load(fh, allow_pickle=False)
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001  (any failure but a transient one is the file's)
            raise_if_transient(exc, self.path)
            raise InputError(f"{self.path}/{name} cannot be read as a .npy file "
                             f"({type(exc).__name__}: {exc}); write it again or remove it"
                             ) from None
        self._seen.pop(name, None)
        return np.asarray(data)

    def _settling(self, name: str, size: int, expected: int | None) -> None:
        """A file short of its header's size: waited for while its size changes, refused as
        truncated once it has not changed for ``dr_dask.stream.settle``."""
        now = time.monotonic()
        seen = self._seen.get(name)
        if seen is None or seen[0] != size:
            self._seen[name] = (size, now)
            logger.info("waiting for %s/%s to be written whole (%d of %s bytes)", self.path,
                        name, size, expected if expected is not None else "?")
            return
        settle = config.get_seconds("stream.settle")
        if now - seen[1] >= settle:
            raise InputError(
                f"{self.path}/{name} is truncated: {size:,} bytes of the "
                f"{expected if expected is not None else 'header'} its .npy header says, "
                f"unchanged for {settle:g} s (dr_dask.stream.settle); write it again (under "
                "a temporary name, then rename it into place) or remove it")

    def exhausted(self, offset: Any) -> bool:
        return not self.follow and not self._pending(self._state(offset))


def _npy_header(head: bytes, where: str) -> tuple[tuple[int, ...], int] | None:
    """(shape, total size in bytes) from the first bytes of a .npy file; None when they stop
    before the header ends (a file still being written); InputError when they are not a
    .npy header or claim a shape beyond the ``dr_dask.input.max-*`` limits."""
    magic = np.lib.format.MAGIC_PREFIX
    if len(head) < len(magic) + 2:
        if magic.startswith(head[: len(magic)]):
            return None
        raise InputError(f"{where} is not a .npy file (no .npy magic bytes); remove it")
    if head[: len(magic)] != magic:
        raise InputError(f"{where} is not a .npy file (no .npy magic bytes); remove it")
    major = head[len(magic)]
    width = 2 if major == 1 else 4
    start = len(magic) + 2 + width
    if len(head) < start:
        return None
    hlen = int.from_bytes(head[len(magic) + 2:start], "little")
    if len(head) < start + hlen:
        return None
    try:
        fh = io.BytesIO(head)
        version = np.lib.format.read_magic(fh)
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, _, dtype = read(fh, max_header_size=1 << 16)
    except ValueError as exc:
        raise InputError(f"{where} has no readable .npy header: {exc}") from None
    check_claimed(where, shape, dtype, numeric=False)
    n = 1
    for s in shape:
        n *= int(s)
    return tuple(shape), start + hlen + n * dtype.itemsize


class IteratorSource:
    """Chunks from a Python iterable.

    Offset: number of chunks consumed. To resume after a restart the iterable must replay the
    same chunks: pass a callable returning a fresh iterator (or a re-iterable such as a list);
    the runner skips the chunks already consumed. A one-shot iterator resumes correctly only
    in the same process.

    Nothing is lost silently. An exception raised by the producer stops the stream with an
    :class:`~dr_dask.io.inputs.InputError` naming the item's position and the exception (a
    generator cannot continue after raising, and skipping the item would lose its rows
    uncounted): the checkpoint stays before it, so a rerun with a fixed producer resumes
    there. An item produced but not numeric is quarantined with its rows when it has a
    length (``len(item)`` rows), and stops the stream the same way when it has none (its
    rows cannot be counted).
    """

    def __init__(self, chunks: Iterable | Callable[[], Iterable]):
        self._factory = chunks if callable(chunks) else (lambda: chunks)
        self._it: Iterator | None = None
        self._pos = 0
        self._done = False
        self.initial_offset = 0

    def _seek(self, offset: int) -> Iterator:
        """The iterator positioned at `offset` (a fresh one, replayed, unless already there)."""
        if self._it is None or self._pos != offset:
            self._it, self._pos = iter(self._factory()), 0
            for _ in range(offset):
                next(self._it)
                self._pos += 1
        return self._it

    def read(self, offset: int) -> Chunk | None:
        try:
            item = next(self._seek(offset))
        except StopIteration:
            self._done = True
            return None
        except Exception as exc:  # whatever the producer raised stops the stream, by name
            failed, self._it = self._pos, None  # a generator that raised is finished
            raise InputError(
                f"the stream's iterator raised {exc!r} producing item {failed}; the stream "
                f"is checkpointed before it: fix the producer and rerun to resume at item "
                f"{failed}") from exc
        self._pos += 1
        try:
            data = np.asarray(item, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            try:
                n = len(item)
            except TypeError:
                raise InputError(
                    f"item {offset} of the stream's iterator ({type(item).__name__}) is not "
                    f"numeric ({exc}) and has no length, so its rows cannot be counted nor "
                    f"quarantined; the stream is checkpointed before it: produce arrays of "
                    "rows and rerun to resume there") from None
            return Chunk(None, offset + 1, f"chunk {offset}", f"not numeric: {exc!r}", n)
        return Chunk(data, offset + 1, f"chunk {offset}")

    def exhausted(self, offset: int) -> bool:
        return self._done


def open_source(
    source: Any, chunk_size: int = 1000, follow: bool = False,
    storage_options: dict | None = None,
):
    """A source object from a location (local path or URL of a directory of ``.npy`` files,
    of one ``.npy`` file or of a Zarr array) or an iterable; a stored one is opened (and its
    metadata bounded) now."""
    if hasattr(source, "read") and hasattr(source, "exhausted"):
        return source
    if isinstance(source, (str, os.PathLike, Location)):
        loc = location(source, storage_options)
        if loc.child("zarr.json").exists() or loc.child(".zarray").exists():
            return ZarrSource(loc, chunk_size=chunk_size, follow=follow)
        if loc.url.endswith(".npy") and loc.exists():
            return NpySource(loc, chunk_size=chunk_size, follow=follow)
        if loc.exists():
            if not loc.fs.isdir(loc.path):
                raise InputError(f"stream source {loc} is a file but not a .npy file; give a "
                                 "directory of .npy files, a .npy file or a Zarr array")
            return DirectorySource(loc, follow=follow)
        raise FileNotFoundError(f"stream source {loc} does not exist")
    return IteratorSource(source)
