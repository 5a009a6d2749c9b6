"""Stream sources: an appendable Zarr array, a directory of chunk files, a Python iterator.

Every source is addressed by a JSON-serialisable *offset* that the runner checkpoints with each
write. ``read(offset)`` returns the next chunk and the offset after it with no side effect a
checkpoint can see, so re-reading from a checkpointed offset after a crash yields exactly the
rows not yet committed.

A chunk that cannot be read comes back as a :class:`Chunk` with ``error`` set (the runner
quarantines it) and an offset past it, so one bad file never blocks the stream.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

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
    """

    data: np.ndarray | None
    offset: Any
    name: str
    error: str | None = None


class ZarrSource:
    """An appendable 2-D Zarr array; new rows are picked up by polling its shape.

    Offset: number of rows consumed. ``follow=False`` ends the stream once every row present
    has been read; ``follow=True`` keeps polling for appended rows.
    """

    def __init__(self, path: Any, chunk_size: int = 1000, follow: bool = False):
        self.path = location(path)
        self.chunk_size = int(chunk_size)
        self.follow = follow
        self.initial_offset = 0

    def _array(self):

        return zarr.open_array(self.path.zarr_store(read_only=True), mode="r")

    def read(self, offset: int) -> Chunk | None:
        arr = self._array()  # re-opened on every poll so that appended rows become visible
        n = arr.shape[0]
        if offset >= n:
            return None
        end = min(n, offset + self.chunk_size)
        try:
            data = np.asarray(arr[offset:end])
        except Exception as exc:  # noqa: BLE001  (any failure but a transient one is the chunk's)
            # an unreachable or throttling store is no reason to quarantine good rows: exit 1
            raise_if_transient(exc, self.path)
            return Chunk(None, end, f"rows {offset}:{end}", f"unreadable: {exc!r}")
        return Chunk(data, end, f"rows {offset}:{end}")

    def exhausted(self, offset: int) -> bool:
        return not self.follow and offset >= self._array().shape[0]


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
        state = self._state(offset)
        pending = self._pending(state)
        if not pending:
            return None
        name = pending[0]
        if name < state["last"]:
            logger.warning("chunk file %s arrived after %s was processed (it sorts before it): "
                           "processing it now; its rows follow those already written", name,
                           state["last"])
        after = self._after(state, name)
        try:
            with self.path.child(name).open("rb") as fh:
                data = np.load(fh, allow_pickle=False)
        except Exception as exc:  # noqa: BLE001  (any failure but a transient one is the file's)
            raise_if_transient(exc, self.path)
            return Chunk(None, after, name, f"unreadable file: {exc!r}")
        return Chunk(np.asarray(data), after, name)

    def exhausted(self, offset: Any) -> bool:
        return not self.follow and not self._pending(self._state(offset))


class IteratorSource:
    """Chunks from a Python iterable.

    Offset: number of chunks consumed. To resume after a restart the iterable must replay the
    same chunks: pass a callable returning a fresh iterator (or a re-iterable such as a list);
    the runner skips the chunks already consumed. A one-shot iterator resumes correctly only
    in the same process.
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
        except Exception as exc:  # noqa: BLE001  (the producer failed on this item: skip it)
            self._pos += 1
            return Chunk(None, offset + 1, f"chunk {offset}", f"iterator raised: {exc!r}")
        self._pos += 1
        try:
            data = np.asarray(item, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            return Chunk(None, offset + 1, f"chunk {offset}", f"not numeric: {exc!r}")
        return Chunk(data, offset + 1, f"chunk {offset}")

    def exhausted(self, offset: int) -> bool:
        return self._done


def open_source(
    source: Any, chunk_size: int = 1000, follow: bool = False,
    storage_options: dict | None = None,
):
    """A source object from a location (local path or URL of a directory of ``.npy`` files or
    of a Zarr array) or an iterable."""
    if hasattr(source, "read") and hasattr(source, "exhausted"):
        return source
    if isinstance(source, (str, os.PathLike, Location)):
        loc = location(source, storage_options)
        if loc.child("zarr.json").exists() or loc.child(".zarray").exists():
            return ZarrSource(loc, chunk_size=chunk_size, follow=follow)
        if loc.exists():
            return DirectorySource(loc, follow=follow)
        raise FileNotFoundError(f"stream source {loc} does not exist")
    return IteratorSource(source)
