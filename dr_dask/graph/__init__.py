"""Neighbour graphs, connectivity repair, distributed shortest paths and landmarks.

One machinery shared by Isomap, Landmark Isomap, GP-Isomap and geodesic/blockwise IKD:

* :func:`kneighbors` — the package's one kNN (exact blockwise or cells, or partitioned IVF);
* :func:`kneighbors_graph` / :func:`graph_from_neighbors` — symmetric sparse graphs with any
  edge weights;
* :func:`connect_components` — explicit repair (or refusal) of disconnected graphs;
* :func:`shortest_paths` / :class:`GeodesicRows` — Dijkstra over blocks of sources on the workers;
* :func:`select_landmarks`, :func:`landmark_mds`, :func:`triangulate` — the landmark extension.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dr_dask.graph.components import connect_components
    from dr_dask.graph.diagnostics import (
        DisconnectedGraphWarning,
        DuplicatePointsWarning,
        LowRecallWarning,
    )
    from dr_dask.graph.knn import kneighbors
    from dr_dask.graph.landmarks import landmark_mds, select_landmarks, triangulate
    from dr_dask.graph.neighbour_graph import graph_from_neighbors, kneighbors_graph
    from dr_dask.graph.out_of_sample import geodesics_via_neighbors
    from dr_dask.graph.paths import GeodesicRows, shortest_paths

# Imported when first asked for, as the package's public names are (dr_dask/__init__.py): the
# CLI reads the kNN backends' table (graph.knn_backends) without loading the searches.
_PUBLIC = {
    "connect_components": "dr_dask.graph.components",
    "DisconnectedGraphWarning": "dr_dask.graph.diagnostics",
    "DuplicatePointsWarning": "dr_dask.graph.diagnostics",
    "LowRecallWarning": "dr_dask.graph.diagnostics",
    "kneighbors": "dr_dask.graph.knn",
    "landmark_mds": "dr_dask.graph.landmarks",
    "select_landmarks": "dr_dask.graph.landmarks",
    "triangulate": "dr_dask.graph.landmarks",
    "graph_from_neighbors": "dr_dask.graph.neighbour_graph",
    "kneighbors_graph": "dr_dask.graph.neighbour_graph",
    "geodesics_via_neighbors": "dr_dask.graph.out_of_sample",
    "GeodesicRows": "dr_dask.graph.paths",
    "shortest_paths": "dr_dask.graph.paths",
}


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'dr_dask.graph' has no attribute {name!r}")

__all__ = [
    "DisconnectedGraphWarning",
    "DuplicatePointsWarning",
    "GeodesicRows",
    "LowRecallWarning",
    "connect_components",
    "geodesics_via_neighbors",
    "graph_from_neighbors",
    "kneighbors",
    "kneighbors_graph",
    "landmark_mds",
    "select_landmarks",
    "shortest_paths",
    "triangulate",
]
