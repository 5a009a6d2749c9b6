"""``dr-dask bench knn``: our neighbour search against the libraries users reach for.

On the same rows (the sinusoid, N=100, float32) at each size: our partitioned search (the
adaptive probe, and the former fixed ``n_probe=6`` beside it), pynndescent's NN-descent built
as umap-learn builds it (McInnes et al. 2018; Dong, Charikar & Li 2011), and faiss's
``IndexIVFFlat`` and ``IndexHNSWFlat`` (Johnson, Douze & Jégou 2019; Malkov & Yashunin 2018),
each optional: a peer that is not installed is reported as skipped. Per search: wall seconds
(the index's build and the self-join together) and the recall on ``QUERIES`` seeded rows
against their exact neighbours (:func:`dr_dask.graph.knn.sampled_recall`, as each fit
estimates its own). The machine's load average is recorded beside them.

NN-descent's recall at a given k is its own (on noisy data it is well below ours), so
pynndescent also runs at a wider graph (``PYNNDESCENT_WIDTHS`` times k, the first k kept) until
its recall reaches our adaptive search's: the time it then takes is the comparison at equal
recall.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dr_dask.bench._common import bench_workdir, dataset_arrays, n_workers
from dr_dask.graph.knn import recall_rows, sampled_recall

logger = logging.getLogger(__name__)

SIZES = (100_000, 1_000_000)
N_FEATURES = 100
N_NEIGHBORS = 10
#: Rows whose neighbours are checked against the exact search (a row's neighbours are found or
#: missed together, so a sample's recall spreads more than its k draws each suggest).
QUERIES = 5000
PEERS = ("pynndescent", "faiss-ivf", "faiss-hnsw")
#: Rows of an untimed call before each timed one: compilation is not the search's cost.
WARM_ROWS = 2000
#: faiss HNSW: links per node and the search beam (efSearch) over the build's default 40.
HNSW_M = 32
HNSW_EF_SEARCH = 64
#: pynndescent's graph widths (multiples of k) tried in turn to reach our recall.
PYNNDESCENT_WIDTHS = (2, 3, 4, 5, 6)


def _ours(n_probe: int | None, client: Any) -> Callable:
    def search(X: np.ndarray, k: int) -> np.ndarray:
        from dr_dask.graph.knn import kneighbors

        return kneighbors(X, k, algorithm="ivf", n_probe=n_probe, client=client)[1]
    return search


def _pynndescent(width: int = 1) -> Callable:
    def search(X: np.ndarray, k: int) -> np.ndarray:
        from pynndescent import NNDescent

        # umap-learn's call (umap_.nearest_neighbors): k + 1 with the row itself, its trees
        # and iterations; a wider graph keeps its k nearest
        T = X.shape[0]
        index = NNDescent(X, n_neighbors=width * k + 1, metric="euclidean", random_state=0,
                          n_trees=min(64, 5 + round(T ** 0.5 / 20.0)),
                          n_iters=max(5, round(float(np.log2(T)))), max_candidates=60,
                          low_memory=True, n_jobs=-1, compressed=False)
        return _drop_self(index.neighbor_graph[0])[:, :k]
    return search


def _faiss_ivf(X: np.ndarray, k: int) -> np.ndarray:
    import faiss

    T, N = X.shape
    n_lists = max(1, round(math.sqrt(T)))
    index = faiss.IndexIVFFlat(faiss.IndexFlatL2(N), N, n_lists)
    index.train(X[np.random.RandomState(0).choice(T, min(T, 64 * n_lists), replace=False)])
    index.add(X)
    index.nprobe = 16
    return _drop_self(index.search(X, k + 1)[1])


def _faiss_hnsw(X: np.ndarray, k: int) -> np.ndarray:
    import faiss

    index = faiss.IndexHNSWFlat(X.shape[1], HNSW_M)
    index.add(X)
    index.hnsw.efSearch = HNSW_EF_SEARCH
    return _drop_self(index.search(X, k + 1)[1])


def _timed(search: Callable, X: np.ndarray, k: int, sample: np.ndarray) -> dict:
    """Seconds and recall of one search of all rows, after an untimed warm-up call."""
    search(X[:WARM_ROWS], k)  # compiles (numba) and loads what a later call reuses
    load = os.getloadavg()
    start = time.perf_counter()
    idx = search(X, k)
    seconds = time.perf_counter() - start
    # measured as the fits estimate their own recall, so that the two compare
    recall = sampled_recall(X, sample, idx[sample])
    logger.info("bench knn T=%d: %.1f s, recall %.3f", X.shape[0], seconds, recall)
    return {"seconds": seconds, "recall": recall, "load_average": [load, os.getloadavg()]}


def _pynndescent_to(recall: float, X: np.ndarray, k: int, sample: np.ndarray) -> list[dict]:
    """pynndescent at each wider graph in turn until its recall reaches ``recall``."""
    rows = []
    for width in PYNNDESCENT_WIDTHS:
        row = {"T": X.shape[0], "search": f"pynndescent ({width}k wide)", "k": k,
               **_timed(_pynndescent(width), X, k, sample)}
        rows.append(row)
        if row["recall"] >= recall:
            break
    return rows


def _drop_self(idx: np.ndarray) -> np.ndarray:
    """(T, k) neighbours from a (T, k + 1) self-join that lists the row itself (or, among
    duplicates, another row first): the row's own index removed, else the last."""
    T, kk = idx.shape
    own = idx == np.arange(T)[:, None]
    own[~own.any(axis=1), kk - 1] = True
    return idx[~own].reshape(T, kk - 1)


def _installed(peer: str) -> str | None:
    """None when the peer can run, else why not."""
    module = "pynndescent" if peer == "pynndescent" else "faiss"
    try:
        __import__(module)
    except ImportError as exc:
        return f"not installed ({exc}): pip install 'dr-dask[bench]'"
    return None


def run_knn(client: Any, *, sizes: tuple[int, ...] = SIZES, k: int = N_NEIGHBORS,
            peers: tuple[str, ...] = PEERS, workdir: str | None = None) -> dict:
    """Recall and time of every search at every size (see the module)."""
    with bench_workdir(workdir, "knn") as workdir:
        rows_out = []
        for T in sizes:
            X, _ = dataset_arrays(workdir, "sinusoidal", T, N_FEATURES)
            X = np.ascontiguousarray(X, dtype=np.float32)
            sample = recall_rows(T, QUERIES)  # drawn as the fits draw theirs
            searches: list[tuple[str, Callable | None, str | None]] = [
                ("dr_dask (adaptive probe)", _ours(None, client), None),
                ("dr_dask (n_probe=6)", _ours(6, client), None),
            ]
            impl = {"pynndescent": _pynndescent(), "faiss-ivf": _faiss_ivf,
                    "faiss-hnsw": _faiss_hnsw}
            searches += [(p, impl[p], _installed(p)) for p in peers]
            rows = []
            for name, search, skipped in searches:
                row: dict = {"T": T, "search": name, "k": k}
                if skipped or search is None:
                    row["skipped"] = skipped
                else:
                    row.update(_timed(search, X, k, sample))
                rows.append(row)
            if "pynndescent" in peers and not _installed("pynndescent"):
                rows += _pynndescent_to(rows[0]["recall"], X, k, sample)
            rows_out += rows
        return {"dataset": "sinusoidal", "N": N_FEATURES, "k": k, "queries": QUERIES,
                "workers": n_workers(client), "rows": rows_out}
