"""Quality metrics of an embedding: the papers' scores and the standard neighbourhood measures.

Small (T x M, T x d) inputs are gathered to NumPy; anything that would be T x T is computed in
row blocks (block x T at a time) as tasks on the active Dask client, so memory stays at
``O(block * T + T * (N + d))`` per worker.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import dask
import dask.array as da
import numpy as np
from scipy.stats import pearsonr, spearmanr

from dr_dask.graph.knn import kneighbors
from dr_dask.io.validation import check_array_like
from dr_dask.linalg.align import (
    procrustes_disparity,
    procrustes_fit,
)
from dr_dask.runtime import config
from dr_dask.runtime.cluster import active_client, compute, gather, run_stage, share

logger = logging.getLogger(__name__)

__all__ = [
    "consistency_index",
    "continuity",
    "evaluate_embedding",
    "kernel_reconstruction",
    "knn_accuracy",
    "knn_preservation",
    "latent_correlation",
    "neighbourhood_scores",
    "procrustes_disparity",
    "procrustes_residual",
    "r2_affine",
    "silhouette",
    "stress",
    "trustability_index",
    "trustworthiness",
]


def _numpy(a: Any, name: str) -> np.ndarray:
    """Materialise a (small) NumPy/dask array as checked float64; 1-D inputs become one
    column."""
    arr = check_array_like(a, name, ensure_2d=False)
    return arr[:, None] if arr.ndim == 1 else arr


def _check_rows(name_a: str, a: np.ndarray, name_b: str, b: np.ndarray) -> None:
    if a.shape[0] != b.shape[0]:
        raise ValueError(
            f"{name_a} has {a.shape[0]} rows but {name_b} has {b.shape[0]}; they must describe "
            "the same points in the same order"
        )


def r2_affine(latent: Any, embedding: Any) -> float:
    """R^2 of the true latent after the best affine map of the embedding (the IKD papers' metric).

    ``lstsq([1, embedding], latent)`` is fitted in-sample, then ``sklearn.metrics.r2_score`` is
    taken per latent dimension and averaged uniformly (Li & Wu 2022, §3.1).

    Parameters
    ----------
    latent : array-like of shape (T, M) or (T,)
        True latent variables.
    embedding : array-like of shape (T, d) or (T,)
        Estimated embedding. NumPy or dask.

    Returns
    -------
    float
        Mean R^2 over the M latent dimensions, in [0, 1]: 1 is perfect, 0 an embedding
        that explains none of the latent (an in-sample least-squares fit with an intercept
        is never worse than the latent's mean, so R^2 is never negative).
    """
    from sklearn.metrics import r2_score  # lazy: not on workers (__init__)
    Z = _numpy(latent, "latent")
    E = _numpy(embedding, "embedding")
    _check_rows("latent", Z, "embedding", E)
    design = np.hstack([np.ones((E.shape[0], 1)), E])
    coef, *_ = np.linalg.lstsq(design, Z, rcond=None)
    return float(r2_score(Z, design @ coef, multioutput="uniform_average"))


def knn_accuracy(embedding: Any, labels: Any, n_neighbors: int = 5, cv: int = 5) -> float:
    """Cross-validated accuracy of a k-nearest-neighbour classifier on the embedding.

    Parameters
    ----------
    embedding : array-like of shape (T, d)
    labels : array-like of shape (T,)
        Class labels.
    n_neighbors : int
        k of ``KNeighborsClassifier``.
    cv : int
        Folds of ``cross_val_score`` (stratified, unshuffled, so the score is deterministic).

    Returns
    -------
    float
        Mean accuracy over the folds.
    """
    from sklearn.model_selection import cross_val_score  # lazy: not on workers (__init__)
    from sklearn.neighbors import KNeighborsClassifier  # lazy: not on workers (__init__)
    E = _numpy(embedding, "embedding")
    y = np.asarray(labels.compute() if hasattr(labels, "compute") else labels).ravel()
    if y.shape[0] != E.shape[0]:
        raise ValueError(f"labels has {y.shape[0]} entries but the embedding has {E.shape[0]} rows")
    scores = cross_val_score(KNeighborsClassifier(n_neighbors=n_neighbors), E, y, cv=cv)
    return float(np.mean(scores))


def latent_correlation(latent: Any, embedding: Any, method: str = "spearman") -> float:
    """Mean over latent dimensions of the best absolute correlation with any embedding coordinate.

    Parameters
    ----------
    latent : array-like of shape (T, M) or (T,)
    embedding : array-like of shape (T, d) or (T,)
    method : {"spearman", "pearson"}

    Returns
    -------
    float
        In [0, 1]; 1 means every latent is a monotone (spearman) or linear (pearson) function
        of some embedding coordinate.
    """

    Z = _numpy(latent, "latent")
    E = _numpy(embedding, "embedding")
    _check_rows("latent", Z, "embedding", E)
    if method not in ("spearman", "pearson"):
        raise ValueError(f"method must be 'spearman' or 'pearson', got {method!r}")
    corr = spearmanr if method == "spearman" else pearsonr
    best = [max(abs(float(corr(Z[:, m], E[:, j])[0])) for j in range(E.shape[1]))
            for m in range(Z.shape[1])]
    return float(np.mean(np.nan_to_num(best)))


def silhouette(
    embedding: Any, labels: Any, *, max_samples: int = 10_000, random_state: Any = None
) -> float:
    """Silhouette score of the labels in the embedding (sklearn), sampled above ``max_samples``.

    The score is O(T^2); above ``max_samples`` points a seeded random subset of that size is
    scored (``random_state``), which estimates the full score.
    """
    from sklearn.metrics import silhouette_score  # lazy: not on workers (__init__)
    E = _numpy(embedding, "embedding")
    y = _labels(labels, E.shape[0])
    sample = max_samples if E.shape[0] > max_samples else None
    return float(silhouette_score(E, y, sample_size=sample, random_state=random_state))


def _labels(labels: Any, n: int) -> np.ndarray:
    y = np.asarray(labels.compute() if hasattr(labels, "compute") else labels).ravel()
    if y.shape[0] != n:
        raise ValueError(f"labels has {y.shape[0]} entries but the embedding has {n} rows")
    return y


# ---------------------------------------------------------------------------------------------
# Neighbourhood metrics: trustworthiness, continuity, kNN preservation, stress (row blocks)
# ---------------------------------------------------------------------------------------------

def _knn_indices(A: np.ndarray, k: int, client: Any) -> np.ndarray:
    """Indices (T, k) of each point's k nearest other points: the package's one kNN."""

    return np.asarray(kneighbors(A, k, client=client)[1], dtype=np.int64)


def _sqdist(A: np.ndarray, B: np.ndarray, b_sq: np.ndarray) -> np.ndarray:
    D = (A * A).sum(1)[:, None] + b_sq[None, :] - 2.0 * (A @ B.T)
    np.maximum(D, 0.0, out=D)
    return D


def _ranks_of(D: np.ndarray, nbrs: np.ndarray) -> np.ndarray:
    """1-based rank of each ``nbrs[r, c]`` among row r of D (strictly closer points + 1)."""
    rows = np.arange(D.shape[0])
    out = np.empty(nbrs.shape, dtype=np.int64)
    for c in range(nbrs.shape[1]):  # a loop over k keeps the temporary at block x T booleans
        out[:, c] = (D[rows, nbrs[:, c]][:, None] > D).sum(1) + 1
    return out


def _block_neighbourhood(
    X: np.ndarray, Y: np.ndarray, start: int, nbr_x: np.ndarray, nbr_y: np.ndarray
) -> np.ndarray:
    """Additive sums over rows ``start:start+b``.

    Returns ``[trust, cont, overlap, sxx, sxy, syy]``: the rank excesses of trustworthiness and
    continuity, the kNN-set overlap, and the distance cross-products for stress.
    """
    b, k = nbr_x.shape
    rows = np.arange(b)
    DX = _sqdist(X[start:start + b], X, (X * X).sum(1))
    DY = _sqdist(Y[start:start + b], Y, (Y * Y).sum(1))
    DX[rows, start + rows] = 0.0
    DY[rows, start + rows] = 0.0
    dx, dy = np.sqrt(DX), np.sqrt(DY)
    sums = [0.0, 0.0, 0.0, float((dx * dx).sum()), float((dx * dy).sum()), float((dy * dy).sum())]
    del dx, dy
    if k:
        DX[rows, start + rows] = np.inf  # a point is not its own neighbour
        DY[rows, start + rows] = np.inf
        sums[0] = float(np.clip(_ranks_of(DX, nbr_y) - k, 0, None).sum())
        sums[1] = float(np.clip(_ranks_of(DY, nbr_x) - k, 0, None).sum())
        sums[2] = float((nbr_x[:, :, None] == nbr_y[:, None, :]).any(2).sum())
    return np.asarray(sums)


def neighbourhood_scores(
    X: Any,
    Y: Any,
    n_neighbors: int = 5,
    *,
    block_rows: int | None = None,
    client: Any = None,
) -> dict[str, float]:
    """Trustworthiness, continuity, kNN preservation and stress in one blockwise pass.

    No T x T matrix is formed: each task takes a block of query rows, computes their distances
    to all points in input and output space (block x T), and returns additive sums. The k
    nearest neighbours come from :func:`dr_dask.graph.knn.kneighbors`.

    Parameters
    ----------
    X : array-like of shape (T, N)
        Input data (NumPy or dask; gathered to NumPy, O(T N) memory).
    Y : array-like of shape (T, d)
        Embedding.
    n_neighbors : int
        k, with ``k < T / 2`` (Venna-Kaski normalisation). ``0`` computes stress only.
    block_rows : int, optional
        Query rows per task (default: a block x T float64 matrix of about 64 MiB).
    client : distributed.Client, optional
        Resolved with :func:`dr_dask.runtime.cluster.active_client`; None runs on dask's threads.

    Returns
    -------
    dict
        ``trustworthiness``, ``continuity``, ``knn_preservation`` (mean fraction of shared
        k-neighbours; the thesis's "TSI"), ``stress`` (Kruskal stress-1 after the optimal
        scaling of the embedding distances, in [0, 1]) and ``raw_stress``
        (``sqrt(sum_{i<j} (|x_i-x_j| - |y_i-y_j|)^2)``, the thesis's unscaled form).
    """


    Xn = _numpy(X, "X")
    Yn = _numpy(Y, "Y")
    _check_rows("X", Xn, "Y (embedding)", Yn)
    T, k = Xn.shape[0], int(n_neighbors)
    if not 0 <= k < T / 2:
        raise ValueError(f"n_neighbors must satisfy 0 <= k < T/2 = {T / 2}, got {k}")
    client = active_client(client)
    if k:
        nbr_x, nbr_y = _knn_indices(Xn, k, client), _knn_indices(Yn, k, client)
    else:
        nbr_x = nbr_y = np.zeros((T, 0), dtype=np.int64)
    block_bytes = config.get_bytes("metrics.block-bytes")
    b = int(block_rows or np.clip(block_bytes // (8 * T), 16, 4096))
    starts = list(range(0, T, b))
    blocks = [(s, nbr_x[s:s + b], nbr_y[s:s + b]) for s in starts]
    if client is not None:
        def scores() -> list:
            Xf, Yf = share(Xn, client), share(Yn, client)
            return gather([client.submit(_block_neighbourhood, Xf, Yf, s, nx, ny, pure=False)
                           for s, nx, ny in blocks], client)

        parts: Sequence[Any] = run_stage("neighbourhood_scores", scores)
    else:
        Xd, Yd = dask.delayed(Xn), dask.delayed(Yn)
        parts = compute(*[dask.delayed(_block_neighbourhood)(Xd, Yd, s, nx, ny)
                          for s, nx, ny in blocks])
    trust, cont, overlap, sxx, sxy, syy = np.sum(parts, axis=0)
    out: dict[str, float] = {}
    if k:
        norm = 2.0 / (T * k * (2.0 * T - 3.0 * k - 1.0))
        out.update(trustworthiness=1.0 - norm * trust, continuity=1.0 - norm * cont,
                   knn_preservation=overlap / (T * k))
    resid = sxx - (sxy * sxy / syy if syy > 0 else 0.0)
    out["stress"] = float(np.sqrt(max(resid, 0.0) / sxx)) if sxx > 0 else 0.0
    # sums run over ordered pairs (each unordered pair twice)
    out["raw_stress"] = float(np.sqrt(max(sxx - 2 * sxy + syy, 0.0) / 2))
    return {key: float(v) for key, v in out.items()}


def trustworthiness(X: Any, Y: Any, n_neighbors: int = 5, *, block_rows: int | None = None,
                    client: Any = None) -> float:
    """Venna-Kaski trustworthiness (equal to ``sklearn.manifold.trustworthiness``), blockwise.

    Tied input distances rank as the closer position (sklearn orders ties arbitrarily), so on
    data with ties (e.g. integer pixels) the two can differ in the 4th decimal.

    See :func:`neighbourhood_scores` for parameters; X (T, N), Y (T, d).
    """
    return neighbourhood_scores(X, Y, n_neighbors, block_rows=block_rows,
                                client=client)["trustworthiness"]


def continuity(X: Any, Y: Any, n_neighbors: int = 5, *, block_rows: int | None = None,
               client: Any = None) -> float:
    """Venna-Kaski continuity (trustworthiness with the roles of X and Y swapped), blockwise."""
    return neighbourhood_scores(X, Y, n_neighbors, block_rows=block_rows,
                                client=client)["continuity"]


def knn_preservation(X: Any, Y: Any, n_neighbors: int = 5, *, block_rows: int | None = None,
                     client: Any = None) -> float:
    """Mean fraction of each point's k input-space neighbours kept among its k embedding ones."""
    return neighbourhood_scores(X, Y, n_neighbors, block_rows=block_rows,
                                client=client)["knn_preservation"]


def stress(X: Any, Y: Any, *, block_rows: int | None = None, client: Any = None) -> float:
    """Kruskal stress-1 of the embedding distances after optimal scaling, blockwise (in [0, 1])."""
    return neighbourhood_scores(X, Y, 0, block_rows=block_rows, client=client)["stress"]


# ---------------------------------------------------------------------------------------------
# Trustability (TI) and tractable consistency (TCI) indices (Roy 2021, §2.5, Definitions 3-5)
# ---------------------------------------------------------------------------------------------


def _as_rows(a: Any, name: str, chunks: Any = None) -> Any:

    arr = a if isinstance(a, da.Array) else da.from_array(
        check_array_like(a, name, ensure_2d=False), chunks=(chunks or 10_000, -1))
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {arr.shape}")
    return arr.astype(np.float64).rechunk({1: -1} if chunks is None else (chunks, -1))


def trustability_index(X: Any, Y_full: Any, *, client: Any = None) -> dict[str, float]:
    """Trustability index TI of an embedding computed at output dimension d = p (Roy 2021, Def. 3).

    ``TI = tr(Yc^T Yc) - ||Xc^T Yc||_*^2 / tr(Xc^T Xc)``: the residual of the best similarity
    map (translation, uniform scale, rotation/reflection) of X onto the embedding, i.e. how far
    the method is from returning the data itself when asked for all p dimensions. Lower is
    better; 0 for PCA. The means, the traces and the p x p cross-product are row-chunk
    reductions of dask arrays (two passes: means, then centred products), so the data never
    has to fit in memory; only one p x p SVD runs locally.

    Not scale invariant: ``TI(X, c Y) = c^2 TI(X, Y)`` because the embedding is the unscaled
    target (as in the thesis). ``gower`` is the scale-free variant ``1 - ||Xc^T Yc||_*^2 /
    (||Xc||^2 ||Yc||^2)`` in [0, 1] (not in the thesis).

    Parameters
    ----------
    X : array-like of shape (T, p)
        Input data (NumPy or dask).
    Y_full : array-like of shape (T, p)
        The method's embedding at ``n_components = p``.
    client : distributed.Client, optional

    Returns
    -------
    dict
        ``ti``, ``ti_per_n`` (what the thesis tables report) and ``gower``.
    """

    Xd = _as_rows(X, "X")
    Yd = _as_rows(Y_full, "Y_full", Xd.chunks[0])
    n, p = Xd.shape
    if Yd.shape[0] != n:
        raise ValueError(f"X has {n} rows but Y_full has {Yd.shape[0]}")
    if Yd.shape[1] != p:
        raise ValueError(
            f"TI is defined at output dimension d = p: X has p = {p} columns but the embedding "
            f"has {Yd.shape[1]}; refit the method with n_components={p}"
        )
    mx, my = compute(Xd.mean(0), Yd.mean(0), client=client)
    Xc, Yc = Xd - mx, Yd - my
    sxx, syy, C = compute((Xc * Xc).sum(), (Yc * Yc).sum(), Xc.T @ Yc, client=client)
    if sxx <= 0:
        raise ValueError("TI is undefined for X whose rows are all identical")
    nuc = float(np.linalg.svd(np.asarray(C), compute_uv=False).sum())
    ti = float(syy) - nuc**2 / float(sxx)
    gower = 1.0 - nuc**2 / (float(sxx) * float(syy)) if syy > 0 else 1.0
    return {"ti": ti, "ti_per_n": ti / n, "gower": gower}


def procrustes_residual(target: np.ndarray, source: np.ndarray) -> float:
    """``R(target | source) = min ||target - 1 mu^T - lambda source P||_F^2`` (p x p SVD form).

    The source is scaled and rotated; the target is not (so R is asymmetric). Computed with the
    package's one Procrustes, :func:`dr_dask.linalg.align.procrustes_fit`.
    """

    return procrustes_fit(source, target, scaling=True, reflection=True).residual


def _rbf(A: np.ndarray, B: np.ndarray, gamma: float) -> np.ndarray:
    return np.exp(-gamma * _sqdist(A, B, (B * B).sum(1)))


def _median_gamma(A: np.ndarray) -> float:
    """1 / median squared pairwise distance (median heuristic; not specified by the thesis)."""
    D = _sqdist(A, A, (A * A).sum(1))
    med = np.median(D[np.triu_indices(A.shape[0], 1)])
    return 1.0 / med if med > 0 else 1.0


def kernel_reconstruction(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Theorem 3 reconstruction ``f(Y)`` of the training data, "cov_exact" variant
    (docs/decisions.md LSDR-F2).

    ``f_l(y) = xbar_l + sum_i beta_il (k_y(y, y_i) - mean_j k_y(y_j, y_i))`` with
    ``beta = A (A^T A)^+ C``, ``A = K_y H Y / n`` and ``C`` the d x p sample cross-covariance of
    Y and X, which makes the residuals exactly uncorrelated with the embedding. RBF ``k_y`` with
    the median heuristic.

    Parameters
    ----------
    X : ndarray of shape (n, p)
    Y : ndarray of shape (n, d)

    Returns
    -------
    ndarray of shape (n, p)
    """
    n = X.shape[0]
    Ky = _rbf(Y, Y, _median_gamma(Y))
    Yc = Y - Y.mean(0)
    A = Ky @ Yc / n
    C = Yc.T @ (X - X.mean(0)) / n
    beta = A @ np.linalg.pinv(A.T @ A) @ C
    return X.mean(0) + (Ky - Ky.mean(0)) @ beta


def _tci_candidate(estimator: Any, X: np.ndarray, Xr: np.ndarray, Y0: np.ndarray, i: int,
                   j: int, gamma: float, deformation: str, epsilon: float) -> float:
    from sklearn.base import clone  # lazy: not on workers (__init__)
    bump = _rbf(Xr, X[i:i + 1], gamma)[:, 0]
    if deformation == "thesis":  # T(x) = k(x, x_i) e_j applied to f(Y), residuals kept
        Xt = X - Xr
        Xt[:, j] += bump
    else:  # x -> x + eps k(x, x_i) e_j: invertible for small eps (non-thesis)
        Xt = X.copy()
        Xt[:, j] += epsilon * bump
    Yt = np.asarray(clone(estimator).fit_transform(Xt), dtype=np.float64)
    return procrustes_residual(Yt, Y0)


def consistency_index(
    estimator: Any,
    X: Any,
    *,
    method: str = "auto",
    n_candidates: int = 64,
    max_exhaustive: int = 256,
    deformation: str = "thesis",
    epsilon: float = 0.1,
    random_state: Any = None,
    client: Any = None,
) -> dict[str, Any]:
    """Tractable consistency index TCI (Roy 2021, Def. 5): worst Procrustes change under warps.

    The embedding ``Y0 = estimator.fit_transform(X)`` is compared, by ``R(Y_T | Y0)``, with the
    embedding of each deformed data set ``T(f(Y0)) + (X - f(Y0))``, where ``f`` is the Theorem 3
    reconstruction (:func:`kernel_reconstruction`) and ``T(x) = k(x, x_i) e_j`` runs over the
    n p extreme points of the thesis's tractable family (RBF k, median heuristic). Lower is
    better. Each candidate is one re-fit, run as tasks on the cluster.

    Caveats (docs/decisions.md LSDR-F4): the thesis's separable kernel makes every ``T`` rank-one
    (not invertible). ``deformation="bump"`` uses ``x + epsilon k(x, x_i) e_j`` instead, which is
    invertible for small epsilon (not in the thesis).

    Parameters
    ----------
    estimator : sklearn-style estimator with ``fit_transform``
        Configured with its output dimension d; cloned for every fit.
    X : array-like of shape (n, p)
    method : {"auto", "exhaustive", "sampled"}
        ``auto`` is exhaustive when ``n p <= max_exhaustive``. ``sampled`` scores
        ``n_candidates`` seeded random (i, j): a **lower bound** on the TCI.
    n_candidates, max_exhaustive : int
    deformation : {"thesis", "bump"}
    epsilon : float
        Bump height for ``deformation="bump"``.
    random_state : int, RandomState or None
        Seeds the candidate sample.
    client : distributed.Client, optional

    Returns
    -------
    dict
        ``tci``, ``tci_per_n``, ``argmax`` ([i, j]), ``n_candidates``, ``lower_bound`` (True when
        sampled), ``method``, ``deformation``.
    """
    from sklearn.base import clone  # lazy: not on workers (__init__)
    from sklearn.utils import check_random_state  # lazy: not on workers (__init__)
    if deformation not in ("thesis", "bump"):
        raise ValueError(f"deformation must be 'thesis' or 'bump', got {deformation!r}")
    if method not in ("auto", "exhaustive", "sampled"):
        raise ValueError(f"method must be 'auto', 'exhaustive' or 'sampled', got {method!r}")
    Xn = _numpy(X, "X")
    n, p = Xn.shape
    if method == "auto":
        method = "exhaustive" if n * p <= max_exhaustive else "sampled"
    Y0 = _numpy(clone(estimator).fit_transform(Xn), "embedding")
    Xr = kernel_reconstruction(Xn, Y0)
    gamma = _median_gamma(Xr)
    if method == "exhaustive":
        flat = np.arange(n * p)
    else:
        m = min(int(n_candidates), n * p)
        flat = np.sort(check_random_state(random_state).choice(n * p, size=m, replace=False))
    pairs = [(int(f // p), int(f % p)) for f in flat]
    client = active_client(client)
    if client is not None:
        est, Xf, Xrf, Yf = (share(v, client) for v in (estimator, Xn, Xr, Y0))
        futures = [client.submit(_tci_candidate, est, Xf, Xrf, Yf, i, j, gamma, deformation,
                                 epsilon, pure=False) for i, j in pairs]
        scores: Sequence[Any] = gather(futures, client)
    else:
        task = dask.delayed(_tci_candidate)
        Xd, Xrd, Yd = dask.delayed(Xn), dask.delayed(Xr), dask.delayed(Y0)
        scores = compute(*[task(estimator, Xd, Xrd, Yd, i, j, gamma, deformation, epsilon)
                           for i, j in pairs])
    best = int(np.argmax(scores))
    return {
        "tci": float(scores[best]), "tci_per_n": float(scores[best]) / n,
        "argmax": list(pairs[best]), "n_candidates": len(pairs),
        "lower_bound": method == "sampled", "method": method, "deformation": deformation,
    }


def evaluate_embedding(
    embedding: Any,
    *,
    X: Any = None,
    labels: Any = None,
    latent: Any = None,
    n_neighbors: int = 10,
    random_state: Any = 0,
    client: Any = None,
) -> dict[str, float]:
    """Every metric that the given inputs allow, in one dict (what the reports show).

    Parameters
    ----------
    embedding : array-like of shape (T, d)
    X : array-like of shape (T, N), optional
        Input data: trustworthiness, continuity, kNN preservation, stress (blockwise).
    labels : array-like of shape (T,), optional
        Class labels: kNN accuracy (5-fold) and silhouette.
    latent : array-like of shape (T, M), optional
        True latent: R^2 after affine alignment, best absolute Spearman rho, Procrustes disparity.
    n_neighbors : int
        k of the neighbourhood metrics (reduced to below T/2 for tiny inputs).
    random_state : int, RandomState or None
        Seeds the silhouette subsample.
    client : distributed.Client, optional

    Returns
    -------
    dict
    """
    E = _numpy(embedding, "embedding")
    out: dict[str, float] = {}
    if X is not None:
        k = min(int(n_neighbors), (E.shape[0] - 1) // 2)
        out.update(neighbourhood_scores(X, E, k, client=client))
    if labels is not None:
        y = _labels(labels, E.shape[0])
        out["knn_accuracy"] = knn_accuracy(E, y)
        out["silhouette"] = silhouette(E, y, random_state=random_state)
    if latent is not None:
        Z = _numpy(latent, "latent")
        _check_rows("latent", Z, "embedding", E)
        out["r2_affine"] = r2_affine(Z, E)
        out["latent_spearman"] = latent_correlation(Z, E)
        out["procrustes_disparity"] = procrustes_disparity(Z, E)
    return out
