"""Gaussian-process regression from geodesic distances to manifold coordinates (GP-Isomap).

One :class:`ManifoldGP` per manifold. The paper's text gives three mutually inconsistent kernels
(Mahapatra & Chandola 2020, §5.1; docs/decisions.md GPI-KERNEL); all are offered, with signal
variance fixed to 1 (paper §5.1):

``geodesic_se`` (K3, default)
    ``K_ij = exp(-g_ij^2 / 2l^2)``, ``k_*i = exp(-g_*i^2 / 2l^2)``, ``k_** = 1``: eq. 22 and the
    authors' scripts; train and test kernels agree. Not guaranteed PSD: the PD check below
    adds jitter when needed.
``geodesic_se_cailliez`` (K3c)
    The same on Cailliez-corrected distances ``g + c`` (off the diagonal): provably PSD.
``spectral`` (K2)
    Train kernel ``I + Q diag(exp(-lambda/2l^2) - 1) Q^T`` from the top-d eigenpairs of the
    Cailliez-corrected B~ (eqs. 19-20, the kernel of Theorem 6.1); cross kernel from eq. 22.
``literal_btilde`` (K1, ablation only)
    Element-wise ``exp(-b~_ij / 2l^2)`` (eq. 18). Indefinite and undefined for new points in
    the paper; here the new point's inner products come from the Law-Jain formula (eq. 3).

Geodesics from a new point to the manifold's points are computed through its k_s nearest
manifold points (``dr_dask.graph.out_of_sample.geodesics_via_neighbors``), the standard
S-Isomap rule.
"""

from __future__ import annotations

import functools
import logging
import warnings
from dataclasses import dataclass

import numba
import numpy as np
import scipy.linalg
import scipy.optimize
import scipy.sparse as sp
import scipy.sparse.linalg

from dr_dask.graph.knn import NeighbourIndex, kneighbors_local
from dr_dask.graph.out_of_sample import geodesics_via_neighbors
from dr_dask.graph.sssp import dijkstra_rows
from dr_dask.linalg.mds import classical_mds, double_centre

logger = logging.getLogger(__name__)

KERNELS = ("geodesic_se", "geodesic_se_cailliez", "spectral", "literal_btilde")
#: Hyper-parameter search box: noise variance (absolute, outputs are in geodesic units).
NOISE_BOUNDS = (1e-6, 1.0)
#: Length scale box relative to the manifold's largest geodesic distance. From the diameter
#: up: the mean must follow S-Isomap (docs/decisions.md GPI-HYPER). Shorter scales can win the
#: likelihood on small manifolds and then interpolate the batch but not map new points (an
#: 80-point Euler-roll patch: 0.009 chosen from a box starting at 0.05x, stream disparity
#: 0.23-0.36).
LENGTH_BOUNDS_REL = (1.0, 20.0)
#: Admissible negative eigenvalue of K, relative to the noise variance, in the ML search.
PSD_TOL = 0.1
#: Objective value of inadmissible length scales (finite: the bounded search does arithmetic).
INADMISSIBLE = 1e30
#: Bytes of one (block, n_i) buffer in the mapping. The geodesic min-plus step is memory
#: bound: its buffers must stay in cache.
QUERY_BLOCK_BYTES = 1 << 19


def cailliez_constant(G: np.ndarray) -> float:
    """Cailliez additive constant: largest real eigenvalue of ``[[0, 2B], [-I, -4P]]``.

    ``B = -1/2 H G^2 H`` and ``P = -1/2 H G H``. Adding it to every off-diagonal distance makes the
    distances Euclidean-embeddable (docs/decisions.md GPI-KERNEL). The 2n x 2n matrix is
    non-symmetric and only applied through products (ARPACK, ``which="LR"``).
    """
    n = G.shape[0]
    B = double_centre(G**2)
    P = double_centre(G)

    def mv(v):
        a, b = v[:n], v[n:]
        return np.concatenate([2 * B @ b, -a - 4 * P @ b])

    op = scipy.sparse.linalg.LinearOperator((2 * n, 2 * n), matvec=mv, dtype=np.float64)
    # a fixed start vector keeps ARPACK deterministic
    vals = scipy.sparse.linalg.eigs(op, k=1, which="LR", v0=np.ones(2 * n),
                                    return_eigenvectors=False)
    return float(max(vals.real.max(), 0.0))


def _offset(G: np.ndarray, c: float) -> np.ndarray:
    """Distances with the constant c added off the diagonal."""
    Gc = G + c
    np.fill_diagonal(Gc, 0.0)
    return Gc


@dataclass
class KernelSpec:
    """What a kernel needs besides the length scale (fixed once per manifold)."""

    kind: str
    cailliez: float = 0.0
    # spectral: top-d eigenpairs of B~
    eigvals: np.ndarray | None = None
    eigvecs: np.ndarray | None = None
    # literal_btilde: row means of the squared corrected distances and their grand mean
    row_means: np.ndarray | None = None
    grand_mean: float = 0.0

    @classmethod
    def build(cls, kind: str, G: np.ndarray, n_components: int, random_state=None) -> KernelSpec:
        if kind not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kind!r}")
        if kind == "geodesic_se":
            return cls(kind)
        c = cailliez_constant(G)
        if kind == "geodesic_se_cailliez":
            return cls(kind, cailliez=c)
        D2 = _offset(G, c) ** 2
        if kind == "spectral":
            res = classical_mds(D2, n_components, random_state=random_state)
            return cls(kind, cailliez=c, eigvals=res.values, eigvecs=res.vectors)
        warnings.warn(
            "kernel='literal_btilde' (element-wise exp of B~, eq. 18) is indefinite and is offered "
            "for ablation only; use 'geodesic_se'",
            UserWarning,
            stacklevel=4,
        )
        rm = D2.mean(1)
        return cls(kind, cailliez=c, row_means=rm, grand_mean=float(rm.mean()))

    def train(self, G: np.ndarray, ell: float) -> np.ndarray:
        """Train kernel matrix (n, n), signal variance 1."""
        s = 2.0 * ell**2
        if self.kind == "geodesic_se":
            return np.exp(-(G**2) / s)
        if self.kind == "geodesic_se_cailliez":
            return np.exp(-(_offset(G, self.cailliez) ** 2) / s)
        if self.kind == "spectral":
            Q, lam = self.eigvecs, self.eigvals
            assert Q is not None and lam is not None  # built with them (KernelSpec.build)
            return np.eye(G.shape[0]) + (Q * np.expm1(-lam / s)) @ Q.T
        return np.exp(-double_centre(_offset(G, self.cailliez) ** 2) / s)

    def cross(
        self, g: np.ndarray, ell: float, out: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray | float]:
        """Cross kernel (m, n) from query geodesics g (m, n), and k_** per query (or scalar).

        With ``out`` the kernel is written there and g is overwritten as scratch: the mapping
        loop then allocates nothing per block (dask workers set ``MALLOC_TRIM_THRESHOLD_``,
        which makes glibc mmap, and page-fault, every temporary afresh: 3-5x slower).
        """
        s = 2.0 * ell**2
        if self.kind == "literal_btilde":
            # Law-Jain inner products of the new point with the batch points (eq. 3)
            gc2 = (g + self.cailliez) ** 2
            m = gc2.mean(1)
            # the new rows centred against the batch's means (out-of-sample MDS)
            f = double_centre(gc2, m, self.row_means, self.grand_mean)
            kss = np.exp(-(m - 0.5 * self.grand_mean) / s)
            return np.exp(-f / s, out=out), kss
        if out is None:
            g = g.copy()
        if self.kind == "geodesic_se_cailliez":
            g += self.cailliez
        np.square(g, out=g)
        g *= -1.0 / s
        return np.exp(g, out=out if out is not None else g), 1.0


def _profile_nll(w: np.ndarray, Yt2: np.ndarray, d: int, noise_lo: float) -> tuple[float, float]:
    """min over noise of the negative log marginal likelihood given eig(K) = w, (V^T Y)^2 = Yt2.

    Summed over the d output dimensions (hyper-parameters shared, docs/decisions.md GPI-HYPER);
    returns ``(nll, noise)``.
    """
    # the noise must make K + noise I positive definite (K3 can be mildly indefinite)
    lo = max(noise_lo, -w.min() * 1.01 + 1e-12)
    hi = max(NOISE_BOUNDS[1], lo * 10)
    ysq = Yt2.sum(1)

    def nll(log_noise):
        ev = w + np.exp(log_noise)
        return 0.5 * np.sum(ysq / ev) + 0.5 * d * np.sum(np.log(ev))

    r = scipy.optimize.minimize_scalar(
        nll, bounds=(np.log(lo), np.log(hi)), method="bounded", options={"xatol": 1e-3}
    )
    return float(r.fun), float(np.exp(r.x))


def fit_hyperparameters(
    G: np.ndarray,
    Y: np.ndarray,
    spec: KernelSpec,
    *,
    length_scale: float | None,
    noise_variance: float | None,
    max_points: int,
    rng: np.random.RandomState,
) -> tuple[float, float]:
    """Maximum marginal likelihood length scale and noise variance (either may be fixed).

    Profile likelihood: for each length scale one eigendecomposition of K makes the likelihood
    a cheap function of the noise, maximised exactly by a bounded scalar search; the length
    scale is chosen on a log grid and refined by a bounded search around the best grid point.
    Manifolds larger than ``max_points`` are subsampled (seeded) for this step only.
    """
    if length_scale is not None and noise_variance is not None:
        return float(length_scale), float(noise_variance)
    n = G.shape[0]
    if n > max_points and spec.kind in ("geodesic_se", "geodesic_se_cailliez"):
        sub = np.sort(rng.choice(n, max_points, replace=False))
        G, Y = G[np.ix_(sub, sub)], Y[sub]
    Y = Y - 0.0  # zero-mean prior (paper §3.4): Isomap coordinates are already centred
    d = Y.shape[1]

    noise_floor = noise_variance if noise_variance is not None else NOISE_BOUNDS[0]

    def profile(log_ell):
        K = spec.train(G, float(np.exp(log_ell)))
        w, V = scipy.linalg.eigh(K)
        if w.min() < -PSD_TOL * noise_floor:
            # K3 turns indefinite at short length scales (docs/decisions.md GPI-KERNEL); held-out
            # variances are then meaningless (they even undercut the noise), so such scales are not
            # admitted
            return INADMISSIBLE, noise_floor
        Yt2 = (V.T @ Y) ** 2
        if noise_variance is not None:
            ev = w + noise_variance
            if ev.min() <= 0:
                return INADMISSIBLE, noise_variance
            return 0.5 * np.sum(Yt2.sum(1) / ev) + 0.5 * d * np.sum(np.log(ev)), noise_variance
        return _profile_nll(w, Yt2, d, NOISE_BOUNDS[0])

    if length_scale is not None:
        _, noise = profile(np.log(length_scale))
        return float(length_scale), float(noise)
    gmax = float(G.max())
    lo, hi = np.log(LENGTH_BOUNDS_REL[0] * gmax), np.log(LENGTH_BOUNDS_REL[1] * gmax)
    grid = np.linspace(lo, hi, 9)
    vals = [profile(x)[0] for x in grid]
    if min(vals) >= INADMISSIBLE:
        logger.warning("kernel indefinite at every length scale up to %.3g; using it", np.exp(hi))
        noise = profile(hi)[1] if noise_variance is None else noise_variance
        return float(np.exp(hi)), float(noise)
    b = int(np.argmin(vals))
    r = scipy.optimize.minimize_scalar(
        lambda x: profile(x)[0],
        bounds=(grid[max(b - 1, 0)], grid[min(b + 1, len(grid) - 1)]),
        method="bounded",
        options={"xatol": 0.02},
    )
    best = r.x if r.fun <= vals[b] else grid[b]
    ell = float(np.exp(best))
    _, noise = profile(best)
    logger.debug("ML hyper-parameters: length_scale=%.4g noise_variance=%.3g", ell, noise)
    return ell, float(noise)


#: Novelty length scale in units of the manifold's median k-th-neighbour distance.
NOVELTY_SCALE = 2.0


def axis_scale(predicted: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Per-axis least-squares factor ``s_k`` of ``target[:, k] ~ s_k predicted[:, k]``, (d,)
    (1 where an axis is predicted as all zeros)."""
    num = np.einsum("ij,ij->j", predicted, target)
    den = np.einsum("ij,ij->j", predicted, predicted)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)


@dataclass
class ManifoldGP:
    """A fitted GP for one manifold: everything needed to map new points, all NumPy.

    The mean and the variance come from two length scales of one GP prior (decision in
    :class:`dr_dask.methods.gp_isomap.GPIsomap`): the mean from ``length_scale`` (maximum
    likelihood, long: faithful to S-Isomap), the variance from ``novelty_length_scale``
    (``NOVELTY_SCALE`` times the median k-th-neighbour distance: the manifold's sampling
    scale), on ambient distances, which at that scale are the geodesics and keep the kernel
    positive definite (no jitter shifts the noise floor). As the kernel is local, the
    variance conditions on the point's k_s nearest manifold points only
    (a nearest-neighbour GP, Datta et al. 2016): one small solve per point instead of an
    O(n^2) quadratic form, and never below the full GP's variance (conditioning on fewer
    points cannot lower it). The leave-one-out variances that calibrate the threshold are
    computed the same way.

    The model keeps the manifold's neighbour graph (O(n k)), not its n x n geodesics: a new
    point's geodesics go through rows of that matrix, which :attr:`geodesics` recomputes from
    the graph on the first mapping (one all-pairs Dijkstra, as the batch's Isomap ran) and
    holds while this object lives. Pickles and saved models leave it out, so a model ships and
    stores in O(n k + n d); the same kernel recomputes the same lengths bit for bit.

    Attributes
    ----------
    points : ndarray of shape (n, D)
        The manifold's batch points (neighbour search for new points).
    graph : scipy.sparse.csr_matrix of shape (n, n)
        The manifold's Isomap neighbour graph (edge lengths), connected.
    spec : KernelSpec
    length_scale, noise_variance : float
        ``noise_variance`` includes any jitter the PD check of the mean's kernel had to add.
    jitter : float
    beta : ndarray of shape (n, d)
        ``(K + noise I)^-1 Y`` (eq. 10).
    novelty_length_scale, novelty_noise : float
        Length scale and noise variance of the variance's kernel.
    link_scale : float
        Median over the manifold's points of their mean distance to their k_s nearest
        manifold neighbours: the unit of :meth:`predict`'s link distance.
    n_neighbors : int
        k_s, neighbours linking a new point into the geodesic graph.
    """

    points: np.ndarray
    graph: sp.csr_matrix
    spec: KernelSpec
    length_scale: float
    noise_variance: float
    jitter: float
    beta: np.ndarray
    novelty_length_scale: float
    novelty_noise: float
    link_scale: float
    n_neighbors: int

    @classmethod
    def fit(
        cls,
        points: np.ndarray,
        graph: sp.csr_matrix,
        geodesics: np.ndarray,
        coords: np.ndarray,
        *,
        kernel: str,
        length_scale: float | None,
        noise_variance: float | None,
        n_neighbors: int,
        max_points: int,
        rng: np.random.RandomState,
        novelty_length_scale: float | None = None,
    ) -> ManifoldGP:

        spec = KernelSpec.build(kernel, geodesics, coords.shape[1], random_state=rng)
        ell, noise = fit_hyperparameters(
            geodesics, coords, spec, length_scale=length_scale, noise_variance=noise_variance,
            max_points=max_points, rng=rng,
        )
        K = spec.train(geodesics, ell)
        L, jitter = _chol_with_jitter(K, noise)
        beta = scipy.linalg.cho_solve((L, True), coords)
        n = len(points)
        ks = int(min(n_neighbors, n - 1))
        dist, _ = kneighbors_local(points, ks + 1, points)  # first column: the point itself
        link_scale = float(np.median(dist[:, 1:].mean(1)))
        ell_v = float(novelty_length_scale or NOVELTY_SCALE * np.median(dist[:, -1]))
        gp = cls(
            np.ascontiguousarray(points, dtype=np.float64), sp.csr_matrix(graph), spec, ell,
            noise + jitter, jitter, beta, ell_v, float(noise), link_scale, ks,
        )
        gp.__dict__["geodesics"] = geodesics  # the fit's own, while the batch phase maps
        # The predictive mean shrinks each axis toward the prior's 0 by its own factor
        # (Mahapatra & Chandola 2020, Theorem 6.1: a per-dimension scale alpha/(1 + alpha c_k)
        # that the theorem's Procrustes removes; docs/decisions.md GPI-SCALE): each axis of
        # beta is rescaled so that the batch points' means reproduce their Isomap coordinates
        # (least squares through the origin, where both the prior mean and the centred
        # coordinates are), and new points are mapped in the embedding's scale.
        raw, _ = gp.predict(gp.points)
        gp.beta = beta * axis_scale(raw, coords)
        return gp

    @property
    def n_points(self) -> int:
        return self.points.shape[0]

    @functools.cached_property
    def geodesics(self) -> np.ndarray:
        """Geodesic distances among the manifold's points, (n, n), from :attr:`graph`."""
        return dijkstra_rows(self.graph, np.arange(self.n_points))

    def release(self) -> None:
        """Drop what :attr:`geodesics` and :attr:`index` hold (rebuilt when next needed)."""
        self.__dict__.pop("geodesics", None)
        self.__dict__.pop("index", None)

    def __getstate__(self) -> dict:
        # the n x n geodesics and the search index are rebuilt from the graph and the points
        state = dict(self.__dict__)
        state.pop("geodesics", None)
        state.pop("index", None)
        return state

    @functools.cached_property
    def index(self) -> NeighbourIndex:
        """The batch points prepared once for the neighbour searches of every mapping."""
        return NeighbourIndex(self.points)

    def neighbours(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Distances and indices (m, k_s) of each point's k_s nearest manifold points.

        X: finite float64 rows (validated by the caller).
        """
        return self.index.kneighbors(X, self.n_neighbors)

    def link_distance(self, dist: np.ndarray) -> np.ndarray:
        """Mean distance to the k_s nearest manifold points in units of ``link_scale``, (m,).

        About 1 for a point sampled from the manifold, whatever its density.
        """
        return dist.mean(1) / self.link_scale

    def predict(
        self, X: np.ndarray, neighbours: tuple[np.ndarray, np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Predictive mean (m, d) and variance (m,) of new points.

        The variance is eq. 8 (noise included) under the novelty kernel. ``neighbours``:
        the result of :meth:`neighbours` for X, if already computed.

        Geodesics come through each point's k_s nearest manifold points. The rest runs in
        cache-sized query blocks through reused buffers, so nothing of size (m, n) is
        allocated: geodesics, cross kernels, then mean and variance by two GEMMs per block.
        """

        n = self.n_points
        dist, idx = self.neighbours(X) if neighbours is None else neighbours
        m = X.shape[0]
        mean = np.empty((m, self.beta.shape[1]))
        block = max(16, QUERY_BLOCK_BYTES // (8 * n))
        g, Ks = np.empty((min(block, m), n)), np.empty((min(block, m), n))
        for s in range(0, m, block):
            e = min(s + block, m)
            b = e - s
            geodesics_via_neighbors(dist[s:e], idx[s:e], self.geodesics, out=g[:b])
            self.spec.cross(g[:b], self.length_scale, out=Ks[:b])
            np.matmul(Ks[:b], self.beta, out=mean[s:e])
        return mean, self._local_variance(dist, idx)

    def _local_variance(self, dist: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """Eq. 8 under the novelty kernel, conditioned on the given neighbours, (m,)."""
        M = idx.shape[1]
        s = -0.5 / self.novelty_length_scale**2
        var = np.empty(len(idx))
        step = max(1, (1 << 22) // (8 * M * M))  # 4 MB of kernel matrices per step
        for a in range(0, len(idx), step):
            K = np.exp(_neighbour_sq_distances(self.points, idx[a : a + step]) * s)
            K[:, np.arange(M), np.arange(M)] += self.novelty_noise
            k = np.exp(dist[a : a + step] ** 2 * s)
            q = np.einsum("bi,bi->b", k, np.linalg.solve(K, k[:, :, None])[:, :, 0])
            var[a : a + step] = np.maximum(1.0 - q, 0.0) + self.novelty_noise
        return var

    def loo_variance(self) -> np.ndarray:
        """Leave-one-out predictive variance of each batch point, (n,).

        Each point's variance given its nearest *other* manifold points, exactly as a new
        point's: the held-out analogue of eq. 8 on the batch itself, used to calibrate the
        novelty threshold when no hold-out set exists.
        """
        M = min(self.n_neighbors, self.n_points - 1)
        dist, idx = self.index.kneighbors(self.points, M + 1)
        # drop each point itself (duplicates may sort it after a twin: drop by index)
        own = idx == np.arange(self.n_points)[:, None]
        own[own.sum(1) == 0, -1] = True
        keep = ~own
        return self._local_variance(dist[keep].reshape(-1, M), idx[keep].reshape(-1, M))


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _neighbour_sq_distances(points: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """(b, M, M) squared distances among each row's M neighbours ``points[idx[i]]``.

    Direct differences, fused: no (b, M, D) gather, no cancellation of the GEMM expansion.
    """
    b, M = idx.shape
    out = np.empty((b, M, M))
    for i in range(b):
        for p in range(M):
            out[i, p, p] = 0.0
            x = points[idx[i, p]]
            for q in range(p + 1, M):
                y = points[idx[i, q]]
                acc = 0.0
                for t in range(x.shape[0]):
                    diff = x[t] - y[t]
                    acc += diff * diff
                out[i, p, q] = acc
                out[i, q, p] = acc
    return out


def _chol_with_jitter(K: np.ndarray, noise: float) -> tuple[np.ndarray, float]:
    """Cholesky of ``K + noise I``, adding jitter when it is not positive definite.

    K3 (geodesic SE) is not guaranteed PSD (docs/decisions.md GPI-KERNEL). On failure the smallest
    eigenvalue of K sets the jitter (10% margin), which is logged and folded into the noise variance
    so that the predictive variance stays consistent with the factor.
    """
    A = K.copy()
    A[np.diag_indices_from(A)] += noise
    try:
        return np.linalg.cholesky(A), 0.0
    except np.linalg.LinAlgError:
        pass
    w_min = float(scipy.linalg.eigvalsh(K, subset_by_index=[0, 0])[0])
    jitter = max(-1.1 * w_min - noise, 0.0) + 1e-10 * max(float(np.mean(np.diag(K))), 1.0)
    A[np.diag_indices_from(A)] += jitter
    L = np.linalg.cholesky(A)
    logger.warning(
        "kernel matrix not positive definite (smallest eigenvalue %.3g) with noise %.3g: "
        "added jitter %.3g", w_min, noise, jitter,
    )
    return L, jitter
