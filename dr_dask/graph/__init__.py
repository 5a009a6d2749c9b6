"""Neighbour graphs, connectivity repair, distributed shortest paths and landmarks.

One machinery shared by Isomap, Landmark Isomap, GP-Isomap and geodesic/blockwise IKD:

* :func:`kneighbors` — the package's one kNN (exact blockwise or cells, or partitioned IVF);
* :func:`kneighbors_graph` / :func:`graph_from_neighbors` — symmetric sparse graphs with any
  edge weights;
* :func:`connect_components` — explicit repair (or refusal) of disconnected graphs;
* :func:`shortest_paths` / :class:`GeodesicRows` — Dijkstra over blocks of sources on the workers;
* :func:`select_landmarks`, :func:`landmark_mds`, :func:`triangulate` — the landmark extension.
"""

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
