"""GP-Isomap stream runner: sources, a durable output store with checkpoints, refits.

See :mod:`dr_dask.stream.runner` for the semantics (exactly-once output, quarantine,
strict-sequential vs parallel mode and its staleness bound).
"""

from dr_dask.stream.runner import StreamRunner, run_stream
from dr_dask.stream.sources import (
    DirectorySource,
    IteratorSource,
    ZarrSource,
    open_source,
)
from dr_dask.stream.store import STATUS, StreamStore, read_output

__all__ = [
    "STATUS",
    "DirectorySource",
    "IteratorSource",
    "StreamRunner",
    "StreamStore",
    "ZarrSource",
    "open_source",
    "read_output",
    "run_stream",
]
