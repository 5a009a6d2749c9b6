"""The kNN backends: each search :func:`dr_dask.graph.knn.kneighbors` can take and each mode an
estimator's ``knn`` parameter (and the CLI's ``--knn``) offers, in one table.

Everything that names a search reads it from here: ``kneighbors`` validates its ``algorithm``
and dispatches on it (:func:`backend`, :meth:`Backend.load`), refusing a query or a
non-Euclidean metric a search does not take by name; the estimators' parameter constraints
(``knn.KNN_CONSTRAINTS``) and the CLI's ``--knn`` choices and help list :data:`MODES`. A new
search is one :class:`Backend` entry here, its function living where it is named (``search``,
imported when first used, so this table loads nothing: ``dr-dask --help`` reads it).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

#: The options :func:`~dr_dask.graph.knn.kneighbors` can hand a search, beyond the rows, k,
#: whether a row is excluded from its own neighbours and the client. ``in_memory``: the rows
#: as the NumPy array in this process that X (staged for the workers) was made from.
OPTIONS = frozenset({"query", "block_size", "metric", "n_lists", "n_probe", "scratch",
                     "random_state", "knn_tol", "in_memory"})


@dataclass(frozen=True)
class Backend:
    """One neighbour search.

    Attributes
    ----------
    name : str
        Its ``algorithm`` in :func:`~dr_dask.graph.knn.kneighbors`.
    search : str
        ``"module:function"``, called as ``function(X, k, exclude_self, client=client,
        **options)`` with the ``options`` below.
    options : frozenset of str
        What the search takes from :data:`OPTIONS`: ``"query"`` (it searches new points, not
        only X among itself), ``"metric"`` (it searches any metric, not only Euclidean), ...
    approximate : bool
        It may miss true neighbours: an estimator estimates its recall and distance error.
    mode : str or None
        The estimators' ``knn`` mode that takes this search (None: only through ``"auto"`` or
        ``algorithm=``), with ``help`` saying what it does in ``--knn``.
    mode_algorithm : str
        The ``algorithm`` that mode hands ``kneighbors`` (``"auto"``: whichever exact search
        fits).
    """

    name: str
    search: str
    options: frozenset = frozenset()
    approximate: bool = False
    mode: str | None = None
    mode_algorithm: str = ""
    help: str = ""

    def __post_init__(self) -> None:
        unknown = set(self.options) - OPTIONS
        if unknown:
            raise ValueError(f"kNN backend {self.name!r}: unknown options {sorted(unknown)}")

    @property
    def takes_query(self) -> bool:
        return "query" in self.options

    @property
    def takes_metric(self) -> bool:
        return "metric" in self.options

    def load(self) -> Callable[..., Any]:
        """The search function (its module imported now)."""
        module, _, function = self.search.partition(":")
        return getattr(importlib.import_module(module), function)


#: Every search, by its ``algorithm`` name.
BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("exact", "dr_dask.graph.knn:exact_kneighbors",
            frozenset({"query", "block_size", "metric"}), mode="exact", mode_algorithm="auto",
            help="exact"),
    Backend("cells", "dr_dask.graph._knn_cells:cell_kneighbors", frozenset({"in_memory"})),
    Backend("ivf", "dr_dask.graph._knn_ivf:ivf_kneighbors",
            frozenset({"n_lists", "n_probe", "scratch", "random_state", "knn_tol"}),
            approximate=True, mode="ivf", mode_algorithm="ivf",
            help="ivf (partitioned, approximate; its estimated recall and distance error are "
                 "in the summary)"),
)}

#: ``kneighbors``' ``algorithm``: ``"auto"`` (the cell search or the exact one, never an
#: approximate search) or a backend.
ALGORITHMS: tuple[str, ...] = ("auto", *BACKENDS)

#: The estimators' ``knn`` parameter and the CLI's ``--knn``: ``"auto"`` (the IVF search with
#: its adaptive probe from ``dr_dask.knn.ivf-min-rows`` rows above
#: ``dr_dask.knn.kd-tree-max-dim`` features, else the exact search; one search either way) or
#: a backend's mode.
MODES: tuple[str, ...] = ("auto", *(b.mode for b in BACKENDS.values() if b.mode))

#: The estimators' ``knn_tol`` and the CLI's ``--knn-tol``: the distance error the IVF search's
#: adaptive probe aims at (:mod:`dr_dask.graph.knn_tol`, where the measurement behind it is).
DEFAULT_KNN_TOL = 0.003

#: ``"auto"`` in the help of ``--knn``.
AUTO_HELP = "auto (ivf from 100,000 rows; one search)"


def backend(algorithm: str) -> Backend:
    """The backend named ``algorithm``; a ValueError naming the choices otherwise."""
    try:
        return BACKENDS[algorithm]
    except (KeyError, TypeError):
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}") from None


def mode_backend(knn: str) -> Backend | None:
    """The backend of the estimators' mode ``knn`` (None for ``"auto"``); a ValueError naming
    the modes otherwise."""
    if knn == "auto":
        return None
    for b in BACKENDS.values():
        if b.mode == knn:
            return b
    raise ValueError(f"knn must be one of {MODES}, got {knn!r}")


def modes_help() -> str:
    """What each ``--knn`` mode does, for the CLI's help."""
    modes = [b.help for b in BACKENDS.values() if b.mode]
    return f"Neighbour search: {', '.join(modes)}, or {AUTO_HELP}."
