"""Multi-manifold bookkeeping of GP-Isomap (S-Isomap++ batch phase, Mahapatra & Chandola 2020,
§3.3).

* :func:`tangent_clusters` -- split a batch into manifolds, their number inferred;
* :func:`support_pairs`, :func:`support_set` -- k nearest and l farthest point pairs between
  every pair of manifolds;
* :func:`global_frame` -- global coordinates of the whole batch (landmark MDS of one graph
  joining the manifolds at their nearest pairs): the default stitch's target;
* :func:`points_mds`, :func:`ridge_stitch` -- Algorithm 1's stitch: MDS of the support
  points, then an affine map of each manifold's local frame by ridge regression;
* :func:`fit_manifolds` -- the manifolds checked, their cost said, each fitted
  (:func:`fit_manifold`: Isomap, then its GP) on the workers.

The clusterer (the seed names S-Isomap++'s multi-scale-SVD tangent clustering without giving
its formula) is deliberately simple:

1. build the kNN graph of the batch (``dr_dask.graph.kneighbors``), keeping an edge i -> j
   only if ``d_ij <= edge_factor * r_j`` (r_j: j's k-th neighbour distance): a relaxed
   mutual-kNN graph, so stray points do not bridge manifolds or hang on to them;
2. estimate each point's d-dimensional tangent plane by PCA of its k nearest neighbours;
3. drop every graph edge whose two tangent planes disagree: similarity ``|det(U_i^T U_j)|``
   (the product of the cosines of the principal angles) below ``tangent_threshold``;
4. the manifolds are the connected components of what remains, each split at its density
   saddles (5.); pieces smaller than ``min_cluster_size`` (sampling gaps, footnote 5 of the
   seed) join the manifold of their nearest large-component point when they are within a
   neighbour distance of it, and are outliers (label -1, excluded from every manifold)
   otherwise;
5. density split: patches that touch on one smooth surface pass steps 1-3, yet Isomap of
   their union is not faithful to either (a non-convex domain: disparity 0.06-0.14 per patch
   measured on touching Euler-roll patches). Their density dips where they meet, so the
   graph is split at density saddles deeper than ``density_persistence`` (ToMATo, on a kNN
   log density averaged once over neighbours);
6. border refinement: points move to the manifold of least link distance
   (:func:`refine_by_link`), the rule the mapping assigns new points by.

Measured on truncated-Gaussian Euler-roll layouts, seeds 1-6: with persistence 1.2 and the
averaged density, every touching layout split into its three patches (300 and 150 points
per patch; at most 10 of 900 points on the wrong side after step 6), and no separated,
unequal or noisy layout was split beyond its patches. Without the averaging, 1.5 left two
touching patches joined in 1 of 6 (and 1.0 split single patches).

Separated manifolds fall apart in step 1, intersecting ones with different orientation in
step 3, touching ones of one surface in step 5.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components, dijkstra, minimum_spanning_tree
from sklearn.utils import check_random_state

from dr_dask.graph.knn import estimator_neighbours, kneighbors_local
from dr_dask.graph.landmarks import landmark_mds, triangulate
from dr_dask.io.validation import duplicates_reported
from dr_dask.linalg import mds
from dr_dask.linalg.align import procrustes_fit
from dr_dask.linalg.cost import memory_of, quadratic_announced, quadratic_cost
from dr_dask.methods._gp import ManifoldGP
from dr_dask.methods.isomap import Isomap
from dr_dask.runtime.blas import single_blas_thread
from dr_dask.runtime.cluster import gather
from dr_dask.runtime.resources import timed

logger = logging.getLogger(__name__)


def local_tangents(X: np.ndarray, nbr_idx: np.ndarray, dim: int) -> np.ndarray:
    """Orthonormal tangent bases (n, D, dim) by PCA of each point with its neighbours."""
    P = np.concatenate([X[:, None, :], X[nbr_idx]], axis=1)  # (n, k+1, D)
    P = P - P.mean(1, keepdims=True)
    _, _, Vt = np.linalg.svd(P, full_matrices=False)
    return np.transpose(Vt[:, :dim, :], (0, 2, 1))


def tangent_clusters(
    X: np.ndarray,
    n_neighbors: int,
    dim: int,
    *,
    tangent_threshold: float = 0.5,
    min_cluster_size: int | None = None,
    outlier_factor: float = 1.0,
    edge_factor: float = 1.5,
    density_persistence: float | None = 1.2,
    client=None,
    search: dict | None = None,
) -> np.ndarray:
    """Manifold labels for a batch; the number of manifolds is inferred.

    Parameters
    ----------
    X : ndarray of shape (n, D)
    n_neighbors : int
        k of the kNN graph and of the tangent PCA.
    dim : int
        Intrinsic dimension of the tangent planes.
    tangent_threshold : float in [0, 1]
        Minimum tangent-plane similarity for an edge to be kept (0 disables step 3).
    min_cluster_size : int, optional
        Smaller components are merged into their nearest large one (default ``max(2k, 10)``)
        when within ``outlier_factor`` times the 95th percentile of k-th-neighbour distances
        of it; farther ones are outliers.
    outlier_factor : float, default=1.0
    edge_factor : float, default=1.5
        An edge i -> j is kept only when ``d_ij <= edge_factor * r_j`` (r_j: distance of j to
        its k-th neighbour), a relaxed mutual-kNN rule.
    density_persistence : float or None, default=1.2
        Split the graph at density saddles deeper than this (log density, step 5 above) with
        :func:`density_modes`; ``None`` keeps whole connected components.
    client : distributed.Client, optional
        Passed to the kNN search.
    search : dict, optional
        An estimator's search (``knn``, ``n_probe``, ``knn_tol``, ``random_state`` of
        :func:`dr_dask.graph.knn.search_neighbours`); its recall and distance error are stored
        back under ``"recall"`` and ``"distance_error"``. Default: the exact search.

    Returns
    -------
    labels : ndarray of shape (n,)
        0..p-1, ordered by decreasing cluster size; -1 for outliers.
    """

    n = X.shape[0]
    k = min(n_neighbors, n - 1)
    min_size = min_cluster_size or max(2 * k, 10)
    dist, idx = estimator_neighbours(X, k, search, client=client)
    rows = np.repeat(np.arange(n), k)
    cols = idx.ravel()
    # near-mutual kNN: an edge i -> j survives only if i is about as close to j as j's own
    # k-th neighbour, so isolated points do not hang on to a dense manifold through long edges
    short = dist.ravel() <= edge_factor * dist[cols, -1]
    rows, cols = rows[short], cols[short]
    if tangent_threshold > 0 and dim < X.shape[1]:
        U = local_tangents(X, idx, dim)
        M = np.einsum("nDa,nDb->nab", U[rows], U[cols])
        sim = np.abs(np.linalg.det(M))
        keep = sim >= tangent_threshold
        rows, cols = rows[keep], cols[keep]
    A = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n))
    if density_persistence is None:
        _, comp = connected_components(A, directed=False)
    else:
        # kNN density estimate on a dim-dimensional manifold: rho ~ r_k^-dim, averaged once
        # with the neighbours' (halves the noise of a k = 10 estimate, whose spurious modes
        # a lower persistence would otherwise split)
        log_rho = -dim * np.log(np.maximum(dist[:, -1], 1e-300))
        log_rho = 0.5 * (log_rho + log_rho[idx].mean(1))
        comp = density_modes(A, log_rho, density_persistence)
        comp = np.unique(comp, return_inverse=True)[1]
    sizes = np.bincount(comp)
    big = np.flatnonzero(sizes >= min_size)
    if big.size <= 1:
        return np.zeros(n, dtype=np.int32)
    order = big[np.argsort(-sizes[big], kind="stable")]
    remap = np.full(sizes.size, -1)
    remap[order] = np.arange(order.size)
    labels = remap[comp]
    small = labels < 0
    if small.any():
        anchor = np.flatnonzero(~small)
        d_nn, nn = kneighbors_local(X[anchor], 1, X[small])
        # a fragment joins its nearest manifold only if it is about as close to it as
        # neighbours within a manifold are; farther ones are outliers (label -1): they would
        # stretch that manifold's geodesics and pull its GP's low variance into empty space
        reach = outlier_factor * np.quantile(dist[:, -1], 0.95)
        near = d_nn[:, 0] <= reach
        merged = np.flatnonzero(small)[near]
        labels[merged] = labels[anchor[nn[near, 0]]]
        logger.info("merged %d points of small components into their nearest manifold, "
                    "%d outliers", near.sum(), (~near).sum())
    if density_persistence is not None:
        labels = refine_by_link(X, labels, k)
    logger.info("tangent clustering: %d manifolds of sizes %s", order.size,
                np.bincount(labels[labels >= 0]).tolist())
    return labels.astype(np.int32)


def refine_by_link(X: np.ndarray, labels: np.ndarray, k: int, passes: int = 2) -> np.ndarray:
    """Move every clustered point to the cluster of least link distance, ``passes`` times.

    The link distance is the mapping's assignment rule (``ManifoldGP.link_distance``): mean
    distance to the k nearest cluster points (the point itself excluded) over the cluster's
    median of the same. A density split draws its border through the sparse region where
    patches meet, a few points on the wrong side (measured on touching Euler-roll patches:
    up to 19 of 900, 10 after two passes); the link rule puts them with the patch they lie on.
    """

    labels = labels.copy()
    sel = np.flatnonzero(labels >= 0)
    n = len(sel)
    for _ in range(passes):
        p = int(labels.max()) + 1
        link = np.full((n, p), np.inf)
        for c in range(p):
            mem = sel[labels[sel] == c]
            kk = min(k, len(mem) - 1)
            if kk < 1:
                continue
            d, i = kneighbors_local(X[mem], kk + 1, X[sel])
            own = mem[i] == sel[:, None]
            own[own.sum(1) == 0, -1] = True  # a non-member drops its (k+1)-th neighbour
            mean = d[~own].reshape(n, kk).mean(1)
            link[:, c] = mean / np.median(mean[labels[sel] == c])
        new = np.argmin(link, axis=1)
        moved = int(np.sum(new != labels[sel]))
        labels[sel] = new
        logger.debug("link refinement moved %d points", moved)
        if not moved:
            break
    return labels


def density_modes(A: sp.csr_matrix, log_density: np.ndarray, persistence: float) -> np.ndarray:
    """Clusters of a graph at the modes of a density (ToMATo, Chazal et al. 2013).

    Points join, in decreasing density, the cluster of their densest already-seen neighbour;
    two clusters meeting at a point merge unless both peaks rise more than ``persistence``
    (in log density) above it. So a density saddle between two patches splits them, while
    the sampling noise of a single patch (shallower) does not.

    Returns
    -------
    ndarray of shape (n,)
        Cluster id of each point (the index of its peak point).
    """
    n = len(log_density)
    A = (A + A.T).tocsr()
    order = np.argsort(-log_density, kind="stable")
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    parent = np.arange(n)

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in order:
        nb = A.indices[A.indptr[i]:A.indptr[i + 1]]
        nb = nb[rank[nb] < rank[i]]
        if nb.size == 0:
            continue  # a peak: its own cluster
        roots = {find(j) for j in nb}
        top = max(roots, key=lambda r: log_density[r])
        parent[i] = top
        for r in roots:
            if r != top and log_density[r] - log_density[i] < persistence:
                parent[r] = top
    return np.array([find(i) for i in range(n)])


def _sq_dists(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    d = (A**2).sum(1)[:, None] + (B**2).sum(1)[None, :] - 2 * A @ B.T
    return np.maximum(d, 0.0)


def support_pairs(
    X: np.ndarray, labels: np.ndarray, n_nearest: int = 16, n_farthest: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest and l farthest point pairs between every pair of manifolds.

    Distances are ambient Euclidean (docs/decisions.md GPI-SPLIT). Computed in row blocks so that
    the cross-distance temporaries stay small.

    Returns
    -------
    near, far : ndarray of shape (n_pairs, 2)
        Row indices into X of the nearest and of the farthest pairs.
    """
    p = int(labels.max()) + 1
    members = [np.flatnonzero(labels == i) for i in range(p)]
    near_all, far_all = [np.zeros((0, 2), np.int64)], [np.zeros((0, 2), np.int64)]
    for i in range(p):
        for j in range(i + 1, p):
            A, B = members[i], members[j]
            best_d: list = []
            best_pairs: list = []
            far_d: list = []
            far_pairs: list = []
            step = max(1, (1 << 21) // max(len(B), 1))
            for s in range(0, len(A), step):
                D = _sq_dists(X[A[s : s + step]], X[B])
                flat = D.ravel()
                kk = min(n_nearest, flat.size)
                near = np.argpartition(flat, kk - 1)[:kk] if kk else np.array([], int)
                ll = min(n_farthest, flat.size)
                far = np.argpartition(-flat, ll - 1)[:ll] if ll else np.array([], int)
                for sel, dst, prs in ((near, best_d, best_pairs), (far, far_d, far_pairs)):
                    r, c = np.unravel_index(sel, D.shape)
                    dst.append(flat[sel])
                    prs.append(np.column_stack([A[s + r], B[c]]))
            bd, bp = np.concatenate(best_d), np.vstack(best_pairs)
            fd, fp = np.concatenate(far_d), np.vstack(far_pairs)
            near_all.append(bp[np.argsort(bd, kind="stable")[:n_nearest]])
            far_all.append(fp[np.argsort(-fd, kind="stable")[:n_farthest]])
    return np.vstack(near_all), np.vstack(far_all)


def support_set(
    X: np.ndarray, labels: np.ndarray, n_nearest: int = 16, n_farthest: int = 1
) -> np.ndarray:
    """Indices of the support points ξ_s (Alg. 1, line 12): rows of :func:`support_pairs`.

    Returns
    -------
    ndarray of shape (n_support,)
        Sorted unique row indices into X.
    """
    near, far = support_pairs(X, labels, n_nearest, n_farthest)
    return np.unique(np.concatenate([near.ravel(), far.ravel()]))


def global_frame(
    X: np.ndarray,
    labels: np.ndarray,
    n_neighbors: int,
    n_components: int,
    *,
    n_nearest: int = 16,
    n_landmarks: int = 64,
    random_state=None,
) -> np.ndarray:
    """Global coordinates (n, n_components) of a multi-manifold batch, in geodesic units.

    One graph holds every manifold's kNN graph plus the ``n_nearest`` closest point pairs of
    the manifold pairs of a minimum spanning tree over their gaps (the bridges); landmark MDS of
    its shortest paths (``n_landmarks`` seeded landmarks per manifold) places every point.
    Within a manifold the paths are its Isomap geodesics, so a manifold keeps its shape here
    and only needs a rotation and a translation to land on these coordinates.
    """


    rng = check_random_state(random_state)
    n = len(X)
    rows, cols, w, marks = [], [], [], []
    for i in range(int(labels.max()) + 1):
        mem = np.flatnonzero(labels == i)
        k = min(n_neighbors, len(mem) - 1)
        dist, idx = kneighbors_local(X[mem], k + 1, X[mem])
        rows.append(np.repeat(mem, k))
        cols.append(mem[idx[:, 1:]].ravel())
        w.append(dist[:, 1:].ravel())
        marks.append(rng.choice(mem, min(n_landmarks, len(mem)), replace=False))
    near, _ = support_pairs(X, labels, n_nearest, 0)
    gap = np.sqrt(((X[near[:, 0]] - X[near[:, 1]]) ** 2).sum(1))
    # bridge only the manifold pairs of a minimum spanning tree over closest-pair gaps: on a
    # curved surface the chord between two far manifolds cuts across it, and MDS would fold
    # the frame around it (docs/decisions.md, GP-Isomap's measurements)
    li, lj = labels[near[:, 0]], labels[near[:, 1]]
    p = int(labels.max()) + 1
    closest = np.zeros((p, p))
    for a, b, g in zip(li, lj, gap):
        closest[a, b] = g if closest[a, b] == 0 else min(closest[a, b], g)
    tree = minimum_spanning_tree(sp.csr_matrix(np.maximum(closest, 1e-12) * (closest > 0)))
    keep = np.asarray(tree[li, lj]).ravel() > 0
    rows.append(near[keep, 0])
    cols.append(near[keep, 1])
    w.append(gap[keep])
    r, c, wt = np.concatenate(rows), np.concatenate(cols), np.concatenate(w)
    # zero-length edges (duplicate points) would vanish from a sparse matrix
    A = sp.csr_matrix((np.maximum(wt, 1e-12), (r, c)), shape=(n, n))
    L = np.sort(np.concatenate(marks))
    D2 = dijkstra(A, directed=False, indices=L) ** 2
    mds = landmark_mds(D2[:, L], n_components)
    return triangulate(mds.pinv, D2, mds.sq_mean)


def points_mds(X: np.ndarray, n_components: int, random_state=None) -> np.ndarray:
    """Classical MDS of points from their ambient Euclidean distances, (m, n_components)."""

    k = min(n_components, X.shape[0] - 1)
    Y = mds.classical_mds(_sq_dists(X, X), k, random_state=random_state).embedding
    if k < n_components:
        Y = np.pad(Y, ((0, 0), (0, n_components - k)))
    return Y


def ridge_stitch(
    local: np.ndarray, target: np.ndarray, ridge: float
) -> tuple[np.ndarray, np.ndarray]:
    """Affine map of local coordinates onto global ones by ridge regression (Alg. 1, l. 14-18).

    ``[R | t] = GE A^T (A A^T + lambda I)^-1`` with ``A = [local^T; 1^T]``.

    Parameters
    ----------
    local : ndarray of shape (m, d_j)
    target : ndarray of shape (m, d_g)
    ridge : float

    Returns
    -------
    R : ndarray of shape (d_g, d_j)
    t : ndarray of shape (d_g,)
    """
    A = np.vstack([local.T, np.ones(local.shape[0])])
    M = target.T @ A.T @ np.linalg.inv(A @ A.T + ridge * np.eye(A.shape[0]))
    return M[:, :-1], M[:, -1]


def cluster_labels(clusterer: Any, X: np.ndarray, n_neighbors: int, n_components: int, *,
                   tangent_threshold: float, density_persistence: float | None,
                   min_cluster_size: int | None, client: Any, search: dict) -> np.ndarray:
    """GP-Isomap's manifold of each batch row (``-1``: an outlier), from ``clusterer``:
    ``"single"`` (one manifold), ``"tangent"`` (:func:`tangent_clusters`, its search's recall
    stored in ``search``), a callable of X, or the labels themselves (relabelled 0..p-1)."""
    if isinstance(clusterer, str):
        if clusterer == "single":
            return np.zeros(len(X), dtype=np.int32)
        if clusterer == "tangent":
            return tangent_clusters(
                X, n_neighbors, n_components, tangent_threshold=tangent_threshold,
                density_persistence=density_persistence, min_cluster_size=min_cluster_size,
                client=client, search=search)
    labels = np.asarray(clusterer(X) if callable(clusterer) else clusterer)
    if labels.shape != (len(X),):
        raise ValueError(f"clusterer labels have shape {labels.shape}, expected ({len(X)},)")
    out = np.full(len(X), -1, dtype=np.int32)
    keep = labels >= 0 if np.issubdtype(labels.dtype, np.number) else np.ones(len(X), bool)
    out[keep] = np.unique(labels[keep], return_inverse=True)[1]
    return out


def stitch_frames(X: np.ndarray, labels: np.ndarray, local: list[np.ndarray], d: int, dg: int,
                  method: str, *, n_neighbors: int, n_support_nearest: int,
                  n_support_farthest: int, ridge_lambda: float, rng: Any) -> tuple:
    """The rigid (``"procrustes"``) or ridge (``"ridge"``) map of each manifold's local
    embedding ``local[j]`` (d columns) into one global frame of ``dg`` dimensions.

    Returns
    -------
    rotation : ndarray of shape (p, dg, d)
    translation : ndarray of shape (p, dg)
    support : ndarray of int
        The batch rows that tied the frames together.
    embedding : ndarray of shape (n, dg)
        The batch rows in the global frame.
    """
    p = len(local)
    R = np.zeros((p, dg, d))
    t = np.zeros((p, dg))
    if p == 1:
        R[0, : min(d, dg), : min(d, dg)] = np.eye(min(d, dg))
        support = np.array([], dtype=np.int64)
    elif method == "ridge":
        support = support_set(X, labels, n_support_nearest, n_support_farthest)
        GE = points_mds(X[support], dg, random_state=rng)
        local_index = np.empty(len(X), dtype=np.int64)
        for i in range(p):
            local_index[labels == i] = np.arange(np.sum(labels == i))
        for j in range(p):
            mine = labels[support] == j
            R[j], t[j] = ridge_stitch(local[j][local_index[support[mine]]], GE[mine],
                                      ridge_lambda)
    else:
        GF = global_frame(X, labels, n_neighbors, dg, n_nearest=n_support_nearest,
                          random_state=rng)
        for j in range(p):
            rigid = procrustes_fit(local[j], GF[labels == j], scaling=False, reflection=True)
            R[j], t[j] = rigid.rotation.T, rigid.translation
        support = np.unique(support_pairs(X, labels, n_support_nearest, 0)[0])
    embedding = np.zeros((len(X), dg))
    for j in range(p):
        embedding[labels == j] = local[j] @ R[j].T + t[j]
    return R, t, support, embedding


@single_blas_thread()  # small kernels beside dask's threads (see dr_dask.runtime.blas)
def fit_manifold(points: np.ndarray, params: dict, seed: int) -> tuple[np.ndarray, ManifoldGP]:
    """Isomap then the GP of one manifold (a worker task: module-level, picklable inputs)."""

    iso = Isomap(n_neighbors=params["n_neighbors"], n_components=params["n_components"])
    # GPIsomap.fit warned for the batch (duplicates, the T x T cost), in the caller's process
    with duplicates_reported(), quadratic_announced():
        iso.fit(points)
    coords = np.asarray(iso.embedding_, dtype=np.float64)
    G = np.asarray(iso.dist_matrix_, dtype=np.float64)
    gp = ManifoldGP.fit(
        points, iso.graph_, G, coords,
        kernel=params["kernel"],
        length_scale=params["length_scale"],
        noise_variance=params["noise_variance"],
        n_neighbors=params["stream_neighbors"],
        max_points=params["hyper_max_points"],
        rng=np.random.RandomState(seed),
    )
    return coords, gp


def fit_manifolds(X: np.ndarray, labels: np.ndarray, params: dict, *, min_size: int, rng: Any,
                  client: Any, timings: dict[str, float]) -> list[tuple[np.ndarray, ManifoldGP]]:
    """GP-Isomap's batch phase past the clustering: every manifold checked for size, the
    batch's T x T cost said, then :func:`fit_manifold` of each (on the workers with a
    client), in label order; the fits are timed as ``timings["manifolds"]``.

    Raises
    ------
    ValueError
        Every row an outlier (label -1), or a manifold with fewer than ``min_size`` rows.
    """
    outlier = labels < 0
    if outlier.all():
        raise ValueError("the clusterer labelled every batch point an outlier (-1)")
    sizes = np.bincount(labels[~outlier])
    if sizes.min() < min_size:
        bad = np.flatnonzero(sizes < min_size).tolist()
        raise ValueError(
            f"manifolds {bad} have fewer than {min_size} points (sizes {sizes.tolist()}); "
            "lower n_neighbors or raise min_cluster_size"
        )
    p = sizes.size
    # each manifold's fit holds about five n_i x n_i float64 matrices at once (squared
    # geodesics, geodesics, kernel, its Cholesky factor, the likelihood's eigenvectors)
    quadratic_cost(
        f"GP-Isomap batch ({p} manifold{'s' * (p > 1)})", int(sizes.max()),
        [(5 * 8.0 * float(np.sum(sizes.astype(np.float64) ** 2)), memory_of(client))],
        way_out="a smaller batch (a subsample of a few thousand points; transform maps "
                "the rest), or LandmarkIsomap(n_landmarks=L) for an embedding without the "
                "GP's variance", stacklevel=3)  # a frame below GPIsomap.fit: warns at its caller
    seeds = rng.randint(0, 2**31 - 1, size=p)
    parts = [X[labels == i] for i in range(p)]
    with timed(timings, "manifolds"):
        if client is not None:
            futs = [client.submit(fit_manifold, P, params, int(s), pure=False)
                    for P, s in zip(parts, seeds)]
            # the parts travel in the graph: a killed worker's fits are rerun elsewhere
            return gather(futs, client)
        return [fit_manifold(P, params, int(s)) for P, s in zip(parts, seeds)]
