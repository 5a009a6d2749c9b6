"""Blockwise IKD (Li & Wu 2024, §2.4, first bullet).

Small similarities carry large inverse-kernel errors, so blockwise IKD only trusts the graph
``s_ij / sigma^2 > s0``: it finds maximal cliques of that graph (Bron–Kerbosch with pivoting,
:mod:`dr_dask.graph.cliques`), solves IKD on each clique, and glues the clique embeddings
together by rigid alignments on shared points, greedily merging the pair of cliques that
shares most points first.

How this runs:

1. ``S`` (T x T) is computed on the cluster and gathered: the blockwise solver is for the small
   T the method is meant for (the authors' code holds S too); the clique search needs all of it.
2. The clique search and leftover rules follow the authors' code (the papers leave them
   open): cliques of fewer than M + 2 points are dropped; leftover points, if at most 5% of T,
   get a kNN "clique" of ``M + max(floor(0.02 T), 2)`` most-similar points each; otherwise,
   with a user s0 or s0 > 0.26, every point gets such a kNN clique and shared points are
   averaged; otherwise s0 rises by 0.04 and the search reruns.
3. The merge order depends only on the clique sets, so it is planned first (symbolically);
   then every clique IKD the plan needs, and every bridging sub-problem, is solved in one
   parallel batch on the workers; finally the merges (Procrustes on a handful of points) run
   in order on the driver.

Merges (authors' ``combine_two_eig``): the larger clique's frame is kept; with at least
``min_overlap`` (M + 1) shared points the smaller one is aligned to it rigidly (rotation,
reflection, translation; docs/decisions.md IKD-A12); with fewer, a bridging sub-problem of the M + 2
points of each side most similar to the closest pair (no shared point) or to a shared point (the one
with the smallest alignment error) is solved and both sides are aligned to it.

``fit_blockwise(config, data, run) -> IKDResult``. A run keeps the clique search (the cliques
and the final s0): a rerun reuses them and redoes only the similarities and the merge. No
single g(D) exists, so ``eigenvalues`` are those of the centred Gram matrix ``Zc^T Zc`` of the
merged embedding (its squared singular values) and ``eigen_residuals``/``eigen_passes`` are None.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

import dask
import numpy as np

from dr_dask.graph.cliques import maximal_cliques
from dr_dask.io.checkpoint import Checkpoint
from dr_dask.io.inputs import InputData
from dr_dask.linalg.align import procrustes_fit
from dr_dask.linalg.cost import memory_of, quadratic_cost
from dr_dask.linalg.eigen import top_eigh
from dr_dask.methods._ikd_transform import local_map
from dr_dask.methods.ikd_core import (
    LANDMARK_WAY_OUT,
    IKDConfig,
    IKDResult,
    InverseKernel,
    embedding_from_eigenpairs,
    gram_dense,
    prepared_rows,
    reference_index,
)
from dr_dask.runtime.blas import single_blas_thread
from dr_dask.runtime.cluster import active_client, compute, gather, share
from dr_dask.runtime.resources import timed

logger = logging.getLogger(__name__)

#: Leftover points up to this fraction of T get kNN cliques (authors' code).
LEFTOVER_FRACTION = 0.05
#: Step and ceiling of the automatic threshold's retries (authors' code).
THRESHOLD_STEP = 0.04
THRESHOLD_CEIL = 0.26


def threshold_rule(n_features: int) -> float:
    """The authors' N-based s0: 0.3 if N <= 100, 0.1 if N >= 1000, else 0.7 - 0.2 log10 N."""
    if n_features <= 100:
        return 0.3
    if n_features >= 1000:
        return 0.1
    return float(0.7 - 0.2 * np.log10(n_features))


# --------------------------------------------------------------------------------------------
# one clique's IKD (runs on the workers)


def clique_ikd(
    S: np.ndarray, idx: np.ndarray, inverse: InverseKernel, reference: str, n_components: int
) -> tuple[np.ndarray, float]:
    """IKD (Algorithm 1, dense) of the points ``idx``.

    Parameters
    ----------
    S : ndarray of shape (T, T)
        Similarities (raw scale; ``inverse`` normalises and clips).
    idx : ndarray of shape (n,)
        Row indices, n >= M + 2.

    Returns
    -------
    embedding : ndarray of shape (n, M)
    explained_variance_ratio : float
    """
    D = inverse(S[np.ix_(idx, idx)].astype(np.float64), diagonal=True)
    r = reference_index(D.max(axis=1), D.sum(axis=1), reference)
    G = gram_dense(D, r)
    eig = top_eigh(G, n_components, method="dense")
    with warnings.catch_warnings():
        # a clique with fewer than M positive eigenvalues gets zero columns (docs/decisions.md
        # IKD-A8)
        warnings.simplefilter("ignore", RuntimeWarning)
        Z = embedding_from_eigenpairs(eig.values, eig.vectors, n_components)
    return Z, float(np.sum(eig.values**2) / np.sum(G * G))


def _solve_batch(S, jobs, inverse, reference, M) -> list:
    return [clique_ikd(S, j, inverse, reference, M) for j in jobs]


def _solve_all(S: np.ndarray, jobs: list[np.ndarray], inverse, reference, M, client) -> list:
    """Every clique/bridge IKD of the plan, in parallel (workers, else dask threads).

    Solves take milliseconds each, so they go in a few batches per worker thread (balanced by
    size), not one task each: per-task scheduling overhead would otherwise dominate.
    """
    client = active_client(client)
    if not jobs:
        return []
    slots = sum(client.nthreads().values()) if client is not None else 2
    n_batches = min(len(jobs), 4 * max(1, slots))
    order = np.argsort([-len(j) for j in jobs], kind="stable")
    batches = [order[b::n_batches] for b in range(n_batches)]  # round robin over sizes
    if client is not None:
        S_f = share(S, client)
        futures = [client.submit(_solve_batch, S_f, [jobs[i] for i in b], inverse, reference,
                                 M, pure=False) for b in batches]
        parts: Any = gather(futures, client)
    else:
        S_d = dask.delayed(S, traverse=False)
        task = dask.delayed(_solve_batch, pure=True)
        # many small LAPACK calls in parallel threads: BLAS's own threads would only
        # oversubscribe the cores (dask's workers get the same setting from their nanny)
        with single_blas_thread():
            parts = compute(*[task(S_d, [jobs[i] for i in b], inverse, reference, M)
                              for b in batches])
    out: list = [None] * len(jobs)
    for b, part in zip(batches, parts):
        for i, r in zip(b, part):
            out[i] = r
    return out


# --------------------------------------------------------------------------------------------
# clique search with the authors' leftover rules


def _knn_clique(k: np.ndarray, i: int, size: int) -> np.ndarray:
    """Point i and its most similar points (i itself has the largest similarity)."""
    row = k[i].copy()
    row[i] = np.inf
    return np.sort(np.argpartition(row, -size)[-size:])


def find_cliques(
    k: np.ndarray, s0: float, M: int, max_cliques: int, user_threshold: bool
) -> tuple[list[np.ndarray], float, bool]:
    """Cliques covering every point, by the authors' rules.

    Returns
    -------
    cliques : list of sorted index arrays
    s0 : float
        The threshold finally used.
    average : bool
        Whether shared points must be averaged (every point got a kNN clique).
    """
    T = k.shape[0]
    size = min(T, M + max(int(0.02 * T), 2))
    while True:
        A = k > s0  # strict (docs/decisions.md IKD-A10)
        np.fill_diagonal(A, False)
        cliques = maximal_cliques(A, max_cliques=max_cliques, min_size=M + 2)
        covered = np.zeros(T, bool)
        for c in cliques:
            covered[c] = True
        left = np.flatnonzero(~covered)
        if left.size == 0:
            return cliques, s0, False
        if left.size / T <= LEFTOVER_FRACTION:
            logger.info("s0=%.3f: %d cliques; kNN cliques for %d leftover points",
                        s0, len(cliques), left.size)
            return cliques + [_knn_clique(k, int(i), size) for i in left], s0, False
        if user_threshold or s0 > THRESHOLD_CEIL:
            logger.info("s0=%.3f leaves %d of %d points outside the cliques: kNN cliques for "
                        "every point, shared points averaged", s0, left.size, T)
            return [_knn_clique(k, i, size) for i in range(T)], s0, True
        logger.info("s0=%.3f leaves %d of %d points outside the cliques; raising s0",
                    s0, left.size, T)
        s0 += THRESHOLD_STEP


# --------------------------------------------------------------------------------------------
# the merge plan (depends only on the clique sets) and its execution


@dataclass
class _Merge:
    """One effective merge: ``big`` keeps its frame, ``small`` is aligned to it."""

    big: int
    small: int
    members: np.ndarray
    shared: np.ndarray
    kind: str  # "align" | "bridge" (no shared point) | "bridge_shared"
    bridges: list = field(default_factory=list)  # [(sub_big, sub_small, union)]


def _top(k: np.ndarray, anchor: int, members: np.ndarray, n: int) -> np.ndarray:
    n = min(n, members.size)
    return np.sort(members[np.argpartition(k[anchor, members], -n)[-n:]])


def plan_merges(cliques: list[np.ndarray], k: np.ndarray, M: int, min_overlap: int):
    """Greedy maximum-overlap merge order of the authors' ``merge_cliques``.

    Returns ``(nodes, merges, root)``: ``nodes[i]`` is the member array of node i (the cliques
    first, then merge results), ``merges`` maps a merge node to its :class:`_Merge`, ``root`` is
    the node holding the final embedding.
    """
    T = k.shape[0]
    nodes = [np.asarray(c) for c in cliques]
    merges: dict[int, _Merge] = {}
    # slot s holds node slot_node[s]; a merged-away slot is masked with -1 in ``inter`` (the
    # authors delete its row and column: masking keeps the same row-major argmax order)
    slot_node = list(range(len(nodes)))
    onehot = np.zeros((T, len(nodes)), dtype=np.float32)  # point x slot membership
    for i, c in enumerate(nodes):
        onehot[c, i] = 1.0
    inter = onehot.T @ onehot
    np.fill_diagonal(inter, -1)
    alive = len(nodes)
    root = 0
    # per-row maxima make each step O(n) instead of an argmax over the n x n matrix; the first
    # row with the largest maximum and its first argmax is np.argmax's row-major choice
    rowarg = np.argmax(inter, axis=1)
    rowmax = inter[np.arange(len(nodes)), rowarg]
    while alive > 1:
        i = int(np.argmax(rowmax))
        j = int(rowarg[i])
        a, b = slot_node[i], slot_node[j]
        if nodes[b].size > nodes[a].size:
            a, b = b, a
        union = np.union1d(nodes[a], nodes[b])
        shared = np.intersect1d(nodes[a], nodes[b])
        if union.size == nodes[a].size:
            node = a  # the smaller clique lies inside the larger one: nothing to align
        else:
            node = len(nodes)
            nodes.append(union)
            m = _Merge(a, b, union, shared, "align")
            if shared.size == 0:
                sub = k[np.ix_(nodes[a], nodes[b])]
                p, q = np.unravel_index(int(np.argmax(sub)), sub.shape)
                sa = _top(k, nodes[a][p], nodes[a], M + 2)
                sb = _top(k, nodes[b][q], nodes[b], M + 2)
                m.kind, m.bridges = "bridge", [(sa, sb, np.union1d(sa, sb))]
            elif shared.size < min_overlap:
                m.kind = "bridge_shared"
                for s in shared:
                    sa, sb = _top(k, s, nodes[a], M + 2), _top(k, s, nodes[b], M + 2)
                    m.bridges.append((sa, sb, np.union1d(sa, sb)))
            merges[node] = m
        root = node
        if union.size == T:
            break
        alive -= 1
        onehot[:, j] = 0.0
        inter[j, :] = -1
        inter[:, j] = -1
        rowmax[j] = -np.inf
        # the union's overlaps = the old slot-i node's + those of the points it gained
        added = np.setdiff1d(union, nodes[slot_node[i]], assume_unique=True)
        row = inter[i] + onehot[added].sum(axis=0)
        onehot[added, i] = 1.0
        slot_node[i] = node
        live = inter[i] >= 0
        inter[i, live] = row[live]
        inter[live, i] = row[live]
        # column i only grew (a union overlaps at least as much); rows that pointed at j or are
        # row i itself are recomputed
        grew = live & ((inter[:, i] > rowmax) | ((inter[:, i] == rowmax) & (i < rowarg)))
        rowarg[grew], rowmax[grew] = i, inter[grew, i]
        for r in [*np.flatnonzero((rowarg == j) & (rowmax > -np.inf)).tolist(), i]:
            rowarg[r] = int(np.argmax(inter[r]))
            rowmax[r] = inter[r, rowarg[r]]
    return nodes, merges, root


def _needed(root: int, merges: dict) -> list[int]:
    """Nodes whose embeddings the root depends on, children before parents."""
    order, stack, seen = [], [root], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        order.append(n)
        if n in merges:
            stack += [merges[n].big, merges[n].small]
    return sorted(order)  # merge nodes are numbered after their children


def _rows(members: np.ndarray, subset: np.ndarray) -> np.ndarray:
    return np.searchsorted(members, subset)


def _align(src_members, Z_src, tgt_members, Z_tgt, points):
    fit = procrustes_fit(Z_src[_rows(src_members, points)], Z_tgt[_rows(tgt_members, points)],
                         scaling=False, reflection=True)
    return fit


def _combine(m: _Merge, nodes, Z: dict, weight: dict, policy: str, bridge_Z: dict, log: list):
    A, B = nodes[m.big], nodes[m.small]
    ZA, ZB = Z[m.big], Z[m.small]
    entry = {"big": int(m.big), "small": int(m.small), "n_big": int(A.size),
             "n_small": int(B.size), "n_shared": int(m.shared.size), "kind": m.kind}
    if m.kind == "align":
        fit = _align(B, ZB, A, ZA, m.shared)
        ZB = fit.apply(ZB)
        entry["residual"] = fit.residual
    else:
        best: tuple | None = None
        for t, (sa, sb, u) in enumerate(m.bridges):
            Zu = bridge_Z[id(m), t]
            fa, fb = _align(A, ZA, u, Zu, sa), _align(B, ZB, u, Zu, sb)
            err = np.sqrt(fa.residual) + np.sqrt(fb.residual)
            if best is None or err < best[0]:
                best = (err, fa, fb)
        assert best is not None  # a merge without overlap has at least one bridge
        err, fa, fb = best
        ZA, ZB = fa.apply(ZA), fb.apply(ZB)
        entry["residual"] = float(err)
        if m.kind == "bridge_shared":
            policy = "average"  # the authors average shared points of bridged merges
    out = np.empty((m.members.size, ZA.shape[1]))
    out[_rows(m.members, B)] = ZB
    out[_rows(m.members, A)] = ZA
    if m.shared.size and policy != "keep_larger":
        wa, wb = (1.0, 1.0) if policy == "average" else (weight[m.big], weight[m.small])
        ra, rb = _rows(A, m.shared), _rows(B, m.shared)
        out[_rows(m.members, m.shared)] = (wa * ZA[ra] + wb * ZB[rb]) / (wa + wb)
    log.append(entry)
    return out


def merge_cliques(
    S: np.ndarray,
    cliques: list[np.ndarray],
    inverse: InverseKernel,
    reference: str,
    n_components: int,
    *,
    min_overlap: int | None = None,
    shared_points: str = "keep_larger",
    client: Any = None,
) -> dict:
    """Per-clique IKD in parallel and the greedy rigid merge into one embedding.

    Parameters
    ----------
    S : ndarray of shape (T, T)
        Similarities (raw scale).
    cliques : list of sorted index arrays
        Cliques covering every point, each of at least M + 2 points.
    inverse : InverseKernel
    reference : {"min_max", "min_mean", "center"}
        Reference of each clique's IKD.
    n_components : int
        M.
    min_overlap : int, optional
        Fewest shared points for a direct alignment (default M + 1, the paper's).
    shared_points : {"keep_larger", "average", "weighted"}
        Coordinates of points two merged cliques share: the larger clique's (authors'
        default), the mean, or the mean weighted by how many cliques each side merged.
    client : distributed.Client, optional

    Returns
    -------
    dict
        ``embedding`` (T, M), ``cliques`` (those the merge used), ``merge_log``,
        ``explained_variance_ratio`` (size-weighted mean over the used cliques), ``seconds``.
    """
    M = int(n_components)
    T = S.shape[0]
    k = S / inverse.sigma2
    seconds: dict[str, float] = {}
    with timed(seconds, "merge_plan"):
        nodes, merges, root = plan_merges(cliques, k, M, min_overlap or M + 1)
        if nodes[root].size != T:
            missing = np.setdiff1d(np.arange(T), nodes[root])
            raise ValueError(f"the cliques do not cover rows {missing[:10].tolist()} "
                             f"({missing.size} rows in all)")
        needed = _needed(root, merges)
        leaves = [n for n in needed if n not in merges]
        bridge_keys = [(id(merges[n]), t) for n in needed if n in merges
                       for t in range(len(merges[n].bridges))]
        bridge_sets = [merges[n].bridges[t][2] for n in needed if n in merges
                       for t in range(len(merges[n].bridges))]

    with timed(seconds, "clique_ikd"):
        solved = _solve_all(S, [nodes[n] for n in leaves] + bridge_sets, inverse, reference, M,
                            client)

    with timed(seconds, "merge"):
        Z = {n: solved[i][0] for i, n in enumerate(leaves)}
        weight = {n: 1.0 for n in leaves}
        bridge_Z = {key: solved[len(leaves) + i][0] for i, key in enumerate(bridge_keys)}
        log: list[dict] = []
        for n in needed:
            if n in merges:
                Z[n] = _combine(merges[n], nodes, Z, weight, shared_points, bridge_Z, log)
                weight[n] = weight[merges[n].big] + weight[merges[n].small]
    sizes = np.array([nodes[n].size for n in leaves], dtype=np.float64)
    evr = float(np.sum(sizes * [solved[i][1] for i in range(len(leaves))]) / sizes.sum())
    logger.info("blockwise merge: %d of %d cliques used, %d merges, %d bridging IKDs",
                len(leaves), len(cliques), len(log), len(bridge_sets))
    return {"embedding": Z[root], "cliques": [nodes[n] for n in leaves], "merge_log": log,
            "explained_variance_ratio": evr, "seconds": seconds}


def _clique_stage(k: np.ndarray, cfg: IKDConfig, n_features: int,
                  run: Checkpoint | None) -> tuple[list[np.ndarray], float, bool]:
    """:func:`find_cliques` with the configured threshold (resumed from a run's group)."""
    if run is not None and run.is_done("cliques"):
        info = run.stage_info("cliques")
        members, offsets = run.read("clique_members"), run.read("clique_offsets")
        return np.split(members, offsets[1:-1]), float(info["s0"]), bool(info["average"])
    user = cfg.clique_threshold is not None
    s0 = float(cfg.clique_threshold) if cfg.clique_threshold is not None else threshold_rule(
        n_features)
    cliques, s0, average = find_cliques(k, s0, cfg.n_components, cfg.max_cliques, user)
    if run is not None:
        run.write("clique_members", np.concatenate(cliques), ("member",))
        run.write("clique_offsets", np.cumsum([0] + [len(c) for c in cliques]), ("clique_",))
        run.mark_done("cliques", s0=s0, average=average)
    return cliques, s0, average


def fit_blockwise(cfg: IKDConfig, inp: InputData, run: Checkpoint | None = None) -> IKDResult:
    """Blockwise IKD of ``inp``: similarities, cliques, per-clique IKD, merges."""
    client = active_client(cfg.client)
    M = cfg.n_components
    seconds: dict[str, float] = {}
    with timed(seconds, "similarity"):
        Xn, sigma2 = prepared_rows(cfg, inp)
        T, N = Xn.shape
        # S is formed whole in this process (the cliques are searched over it)
        quadratic_cost("blockwise IKD similarities", T, [(8.0 * T * T, memory_of(None))],
                       way_out=LANDMARK_WAY_OUT)
        (S,) = compute(Xn @ Xn.T, client=client)
        S = np.asarray(S, dtype=np.float64)

    with timed(seconds, "cliques"):
        cliques, s0, average = _clique_stage(S / sigma2, cfg, N, run)
    logger.info("blockwise IKD: s0=%.3f, %d cliques", s0, len(cliques))
    res = merge_cliques(
        S, cliques, cfg.inverse_kernel(sigma2), cfg.reference, M,
        min_overlap=cfg.min_overlap, shared_points="average" if average else cfg.shared_points,
        client=client,
    )
    seconds.update(res["seconds"])
    embedding = res["embedding"]
    centred = embedding - embedding.mean(axis=0)
    return IKDResult(
        embedding=embedding,
        eigenvalues=np.sort(np.linalg.eigvalsh(centred.T @ centred))[::-1],
        eigen_residuals=None,
        eigen_passes=None,
        explained_variance_ratio=res["explained_variance_ratio"],
        reference_index=None,
        sigma2=sigma2,
        timings=seconds,
        clique_threshold=s0,
        cliques=res["cliques"],
        merge_log=res["merge_log"],
        out_of_sample=local_map(cfg, inp, sigma2, embedding),
    )
