"""``dr-dask bench knn``: our neighbour search against the libraries users reach for.

On the same rows at each size (``DATASETS``: the sinusoid, N = 100, at noise 0.1 and 0.01, and
augmented digits, N = 64; float32): our partitioned search with its adaptive probe at the
default ``knn_tol`` (and the fixed ``n_probe=6`` beside it), and the peers, each optional (a
peer that is not installed is reported as skipped): faiss's ``IndexIVFFlat`` and
``IndexHNSWFlat`` (Johnson, Douze & Jégou 2019; Malkov & Yashunin 2018), hnswlib (the same
graph, its reference implementation) and pynndescent's NN-descent built as umap-learn builds it
(McInnes et al. 2018; Dong, Charikar & Li 2011).

Every search is judged as the fits judge theirs, on ``QUERIES`` seeded rows against their exact
neighbours (:func:`dr_dask.graph.knn.sampled_quality`): the recall and the distance error (the
mean relative excess of the k-th found neighbour's distance, :mod:`dr_dask.graph.knn_tol`;
infinite, null in the JSON, when a search leaves a row fewer than k neighbours, as faiss's IVF
does at one probe).
A peer's own knob (faiss IVF's ``nprobe``, HNSW's ``efSearch``/``ef``, pynndescent's graph width)
is raised through ``KNOBS`` until it reaches our adaptive search's recall and until it reaches
its distance error: its seconds there are the comparison *at equal recall* and *at equal
distance error* (``summary``). An index is built once per peer (its build's seconds added to
each search's) except pynndescent's, whose width is its build. Wall seconds on a loaded machine
say little; the machine's load average is recorded beside them.
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
from dr_dask.graph.knn import recall_rows, sampled_quality

logger = logging.getLogger(__name__)

SIZES = (100_000, 1_000_000)
N_FEATURES = 100
N_NEIGHBORS = 10
#: Rows whose neighbours are checked against the exact search (a row's neighbours are found or
#: missed together, so a sample's recall spreads more than its k draws each suggest).
QUERIES = 5000
DATASETS = ("sinusoid-0.1", "sinusoid-0.01", "digits")
PEERS = ("faiss-ivf", "faiss-hnsw", "hnswlib", "pynndescent")
#: Each peer's knob, in the order it is raised until the peer reaches our search (HNSW's beam
#: is at least k + 1, the smallest it searches with).
KNOBS: dict[str, tuple[int, ...]] = {
    "faiss-ivf": (1, 2, 4, 8, 16, 32, 64, 128),
    "faiss-hnsw": (10, 16, 32, 64, 128, 256, 512),
    "hnswlib": (10, 16, 32, 64, 128, 256, 512),
    "pynndescent": (1, 2, 3, 4, 5, 6),
}
KNOB_NAMES = {"faiss-ivf": "nprobe", "faiss-hnsw": "efSearch", "hnswlib": "ef",
              "pynndescent": "width"}
#: Rows of an untimed call before each timed one: compilation is not the search's cost.
WARM_ROWS = 2000
#: HNSW's links per node and its build's beam (faiss's and hnswlib's).
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 100


def _ours(n_probe: int | None, client: Any) -> Callable:
    def search(X: np.ndarray, k: int) -> np.ndarray:
        from dr_dask.graph.knn import kneighbors

        return kneighbors(X, k, algorithm="ivf", n_probe=n_probe, client=client)[1]
    return search


def _pynndescent(width: int) -> Callable:
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


def _faiss() -> Any:
    """faiss, searching on every core as the other peers do. A LocalCluster's nannies set
    ``OMP_NUM_THREADS=1`` in this process's environment (distributed's
    ``nanny.pre-spawn-environ``, meant for the workers they start), so a faiss loaded after
    the cluster started would build and search on one thread."""
    import faiss

    faiss.omp_set_num_threads(os.cpu_count() or 1)
    return faiss


def _index(peer: str, X: np.ndarray) -> Callable[[int, int], np.ndarray]:
    """A peer's index of X, built here; returns ``search(knob, k)``: the self-join's (T, k)
    neighbours at that knob."""
    T, N = X.shape
    if peer == "faiss-ivf":
        faiss = _faiss()
        n_lists = max(1, round(math.sqrt(T)))
        ivf = faiss.IndexIVFFlat(faiss.IndexFlatL2(N), N, n_lists)
        ivf.train(X[np.random.RandomState(0).choice(T, min(T, 64 * n_lists), replace=False)])
        ivf.add(X)

        def search_ivf(knob: int, k: int) -> np.ndarray:
            ivf.nprobe = knob
            return _drop_self(ivf.search(X, k + 1)[1])
        return search_ivf
    if peer == "faiss-hnsw":
        faiss = _faiss()
        hnsw = faiss.IndexHNSWFlat(N, HNSW_M)
        hnsw.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        hnsw.add(X)

        def search_hnsw(knob: int, k: int) -> np.ndarray:
            hnsw.hnsw.efSearch = max(knob, k + 1)
            return _drop_self(hnsw.search(X, k + 1)[1])
        return search_hnsw
    if peer == "hnswlib":
        import hnswlib

        index = hnswlib.Index(space="l2", dim=N)
        index.init_index(max_elements=T, ef_construction=HNSW_EF_CONSTRUCTION, M=HNSW_M,
                         random_seed=0)
        index.set_num_threads(os.cpu_count() or 1)
        index.add_items(X, np.arange(T))

        def search_hnswlib(knob: int, k: int) -> np.ndarray:
            index.set_ef(max(knob, k + 1))
            return _drop_self(np.asarray(index.knn_query(X, k=k + 1)[0], dtype=np.int64))
        return search_hnswlib
    raise ValueError(f"no index for peer {peer!r}")


def _judged(idx: np.ndarray, X: np.ndarray, sample: np.ndarray) -> dict:
    """The recall and distance error on the sampled rows, as each fit estimates its own."""
    recall, error, _ = sampled_quality(X, sample, idx[sample])
    return {"recall": recall, "distance_error": error}


def _timed(search: Callable, X: np.ndarray, k: int, sample: np.ndarray) -> dict:
    """Seconds, recall and distance error of one search of all rows, after an untimed
    warm-up call."""
    search(X[:WARM_ROWS], k)  # compiles (numba) and loads what a later call reuses
    load = os.getloadavg()
    start = time.perf_counter()
    idx = search(X, k)
    seconds = time.perf_counter() - start
    row = {"seconds": seconds, **_judged(idx, X, sample),
           "load_average": [load, os.getloadavg()]}
    logger.info("bench knn T=%d: %.1f s, recall %.3f, distance error %.2e", X.shape[0],
                seconds, row["recall"], row["distance_error"])
    return row


def _index_timed(peer: str, X: np.ndarray) -> tuple[Callable[[int, int], np.ndarray], float]:
    """:func:`_index` and the seconds its build took."""
    start = time.perf_counter()
    search = _index(peer, X)
    return search, time.perf_counter() - start


def _sweep(peer: str, X: np.ndarray, k: int, sample: np.ndarray, recall: float,
           error: float) -> list[dict]:
    """The peer at each knob in turn until it reaches both ``recall`` and ``error``; each row
    says which of the two it reaches (``reaches``)."""
    rows: list[dict] = []
    index = None if peer == "pynndescent" else _index_timed(peer, X)
    for knob in KNOBS[peer]:
        if index is None:  # its graph's width is its build
            row = _timed(_pynndescent(knob), X, k, sample)
        else:
            search, build = index
            start = time.perf_counter()
            idx = search(knob, k)
            row = {"seconds": build + time.perf_counter() - start, "build_seconds": build,
                   **_judged(idx, X, sample)}
        row = {"search": peer, KNOB_NAMES[peer]: knob, **row,
               "reaches": [name for name, ok in (("recall", row["recall"] >= recall),
                                                 ("distance_error",
                                                  row["distance_error"] <= error)) if ok]}
        rows.append(row)
        if index is not None:  # pynndescent's search is logged by _timed
            logger.info("bench knn T=%d: %s at %s %d: %.1f s, recall %.3f, distance error %s",
                        X.shape[0], peer, KNOB_NAMES[peer], knob, row["seconds"],
                        row["recall"], row["distance_error"])
        if len(row["reaches"]) == 2:
            break
    return rows


def _equal(rows: list[dict], ours: dict) -> dict:
    """Per peer, its seconds at our recall and at our distance error (its first knob to reach
    each; None: none did), and their ratio to ours."""
    out: dict[str, dict] = {}
    for row in rows:
        peer = out.setdefault(row["search"], {"at_equal_recall": None,
                                              "at_equal_distance_error": None})
        for target in row["reaches"]:
            key = f"at_equal_{target}"
            if peer[key] is None:
                peer[key] = {"seconds": row["seconds"],
                             "knob": row[KNOB_NAMES[row["search"]]],
                             "ratio_to_ours": row["seconds"] / ours["seconds"]}
    return out


def _drop_self(idx: np.ndarray) -> np.ndarray:
    """(T, k) neighbours from a (T, k + 1) self-join that lists the row itself (or, among
    duplicates, another row first): the row's own index removed, else the last."""
    T, kk = idx.shape
    own = idx == np.arange(T)[:, None]
    own[~own.any(axis=1), kk - 1] = True
    return idx[~own].reshape(T, kk - 1)


def _installed(peer: str) -> str | None:
    """None when the peer can run, else why not."""
    module = {"pynndescent": "pynndescent", "hnswlib": "hnswlib"}.get(peer, "faiss")
    try:
        __import__(module)
    except ImportError as exc:
        return f"not installed ({exc}): pip install 'dr-dask[bench]'"
    return None


def _rows_of(dataset: str, workdir: str, T: int) -> np.ndarray:
    """The dataset's T rows, float32."""
    if dataset == "digits":
        from dr_dask.datasets import augmented_digits

        return augmented_digits(T, random_state=0)[0]
    noise = float(dataset.split("-", 1)[1])
    X, _ = dataset_arrays(workdir, "sinusoidal", T, N_FEATURES, noise=noise)
    return np.ascontiguousarray(X, dtype=np.float32)


def run_knn(client: Any, *, sizes: tuple[int, ...] = SIZES, k: int = N_NEIGHBORS,
            peers: tuple[str, ...] = PEERS, datasets: tuple[str, ...] = DATASETS,
            workdir: str | None = None) -> dict:
    """Recall, distance error and time of every search at every size (see the module).

    Returns
    -------
    dict
        ``rows``: one per search (a peer's, one per knob it ran at; a missing peer's,
        ``skipped`` with the reason), with its dataset and T; ``summary``: per dataset and T,
        our adaptive search's recall, distance error and seconds, and each peer's seconds at
        equal recall and at equal distance error.
    """
    with bench_workdir(workdir, "knn") as workdir:
        rows_out, summary = [], []
        for dataset in datasets:
            for T in sizes:
                X = _rows_of(dataset, workdir, T)
                sample = recall_rows(T, QUERIES)  # drawn as the fits draw theirs
                where = {"dataset": dataset, "T": T, "k": k}
                ours = {**where, "search": "dr_dask (adaptive probe)",
                        **_timed(_ours(None, client), X, k, sample)}
                rows = [ours, {**where, "search": "dr_dask (n_probe=6)",
                               **_timed(_ours(6, client), X, k, sample)}]
                peer_rows = []
                for peer in peers:
                    skipped = _installed(peer)
                    if skipped:
                        logger.warning("bench knn: %s skipped: %s", peer, skipped)
                        rows.append({**where, "search": peer, "skipped": skipped})
                        continue
                    peer_rows += [{**where, **r} for r in _sweep(
                        peer, X, k, sample, ours["recall"], ours["distance_error"])]
                rows_out += rows + peer_rows
                summary.append({**where, "ours": {key: ours[key] for key in (
                    "seconds", "recall", "distance_error")}, "peers": _equal(peer_rows, ours)})
        return {"N": {"sinusoid": N_FEATURES, "digits": 64}, "k": k, "queries": QUERIES,
                "workers": n_workers(client), "rows": rows_out, "summary": summary}
