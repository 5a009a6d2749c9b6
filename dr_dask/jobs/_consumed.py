"""Fingerprints of the source rows a job has consumed: rows rewritten in place are found.

The nightly job maps each source row once; a row rewritten afterwards (a correction, a
re-ingest into the same array) would keep its old embedding for ever. So the job state keeps,
in ``consumed.json``, one record per row block of the source array (a row of its chunk grid)
that the watermark has reached:

``rows``
    The consumed rows of the block, ``[start, stop)``.
``tags``
    Each chunk key of the block and the content tag its store's listing gives (S3's checksum
    or ETag, GCS's md5, any ETag), else ``stat:`` size, modification time and inode.
``sha1``
    A hash of the consumed rows' decoded values (dtype, shape, bytes).

Each run lists the array once and hashes again only the blocks whose tags changed: a block
whose consumed rows hash the same was appended to (the last, partial block of an array that
grows), and its tags are brought up to date; one whose rows hash differently was rewritten.
That is refused (exit 2, naming the rows and the chunk keys): the job cannot tell which of its
outputs, buffer entries and refits the old values reached, so the user chooses: restore the
rows, or map every row again into a new state. A rewrite that keeps a local file's size,
modification time and inode (``cp -p`` onto an open file) is not seen.
"""

from __future__ import annotations

import logging
from typing import Any

import zarr

from dr_dask.io.boundary import ZarrRows
from dr_dask.io.inputs import InputError, content_tag, hash_block
from dr_dask.io.storage import Location

logger = logging.getLogger(__name__)

#: The object of the job state holding the records.
CONSUMED = "consumed.json"


def _tag(info: dict | None) -> str | None:
    if info is None:
        return None
    return content_tag(info) or (f"stat:{info.get('size')}:{info.get('mtime')}:"
                                  f"{info.get('ino')}")


def _blocks(rows: ZarrRows, watermark: int) -> dict[int, tuple[int, int, list[str]]]:
    """Row block -> (start, stop) of its consumed rows and its chunk keys."""
    arr = rows.arr
    grid = arr.shards or arr.chunks
    n_cols = -(-rows.shape[1] // grid[1])
    return {i: (i * grid[0], min((i + 1) * grid[0], watermark),
                [arr.metadata.encode_chunk_key((i, j)) for j in range(n_cols)])
            for i in range(-(-watermark // grid[0]))}


def _sha1(rows: ZarrRows, start: int, stop: int) -> str:
    return hash_block(rows.read_rows(start, stop))


def check_consumed(state: Location, array: Location, watermark: int) -> tuple[dict, bool]:
    """The records of ``state`` checked against ``array`` now: an InputError naming the first
    rewritten block's rows and chunk keys; else the records and whether tags were brought up
    to date (blocks only appended to). Blocks beyond ``watermark`` are not checked."""
    records = state.child(CONSUMED).read_json(default=None) or {"blocks": {}}
    blocks = records["blocks"]
    updated = False
    if not blocks:
        return records, updated
    rows = ZarrRows.of(zarr.open_array(array.zarr_store(read_only=True), mode="r"),
                        array.url, array)
    listing = array.find()
    for name in sorted(blocks, key=int):
        rec = blocks[name]
        start, stop = rec["rows"]
        if stop > watermark:
            continue
        now = {key: _tag(listing.get(key)) for key in rec["tags"]}
        if now == rec["tags"]:
            continue
        if _sha1(rows, start, stop) != rec["sha1"]:
            changed = sorted(k for k in now if now[k] != rec["tags"][k])
            raise InputError(
                f"{array.url}: rows {start}:{stop} (chunk {', '.join(changed)}) were rewritten "
                f"after the job in {state.url} mapped them, and its embeddings of them are of "
                "the old values. Restore those rows, or map every row again into a new state "
                "(another --state; the old one can be removed once the new one has caught up)")
        logger.info("%s rows %d:%d: chunk rewritten with the same consumed rows (appended "
                    "to)", array.url, start, stop)
        rec["tags"], updated = now, True
    return records, updated


def record_consumed(state: Location, array: Location, watermark: int, records: dict,
                    fence: Any = None, updated: bool = False) -> int:
    """Record the blocks the watermark reached since ``records`` (new blocks, and the rows
    now consumed of a partial one); ``fence()`` before the write (made when a block was
    hashed, or when ``updated``). Returns the blocks hashed."""
    blocks = records.setdefault("blocks", {})
    todo: dict[int, tuple[int, int, list[str]]] = {}
    if watermark:
        rows = ZarrRows.of(zarr.open_array(array.zarr_store(read_only=True), mode="r"),
                            array.url, array)
        todo = {i: b for i, b in _blocks(rows, watermark).items()
                if str(i) not in blocks or blocks[str(i)]["rows"][1] < b[1]}
    if not todo and not updated:
        return 0
    listing = array.find()  # before the values: a tag never postdates the rows it vouches for
    for i, (start, stop, keys) in todo.items():
        blocks[str(i)] = {"rows": [start, stop],
                          "tags": {key: _tag(listing.get(key)) for key in keys},
                          "sha1": _sha1(rows, start, stop)}
    if fence is not None:
        fence()
    state.child(CONSUMED).write_json(records)
    return len(todo)
