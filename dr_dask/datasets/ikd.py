"""The synthetic datasets of the IKD paper (Li & Wu 2022, §3.1).

All three share the latent prior: each of the M latent dimensions is an independent
zero-mean Gaussian sequence over the sample index with covariance ``6 exp(-|i - j| / 5)``.
That is exactly a stationary AR(1) (discretely sampled Ornstein-Uhlenbeck) process,

    z_0 ~ N(0, 6),   z_t = a z_{t-1} + sqrt(6 (1 - a^2)) e_t,   a = exp(-1/5),

generated in O(T) with the state carried from block to block. The authors' code clips the
latents to [-6, 6] (``clip=6.0``, the default here; ``clip=None`` keeps the paper's prior).

===============  ===  =============================================================  =====
name             M    X given Z                                                      noise
===============  ===  =============================================================  =====
``gp``           3    X[:, n] ~ N(0, K(Z)), SE kernel, sigma^2 = 1, length scale 3    0.05
``sinusoidal``   1    x_t = sin(Omega z_t + phi), omega ~ U(-1, 1), phi ~ U(-pi, pi)  0.1
``bump``         2    x_tn = 20 exp(-||z_t - c_n||_2^2), c_n from a 100 x 100 grid    0.05
                      on [-6, 6]^2 (``bump="l1"``: the code's 20 exp(-||z_t - c_n||_1))
===============  ===  =============================================================  =====

Noise is i.i.d. Gaussian with the given standard deviation, added to every entry of X.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from scipy import linalg, signal
from scipy.spatial.distance import cdist

from dr_dask.datasets._zarr import (
    RNG_BLOCK,
    Generator,
    check_int,
    normal_rows,
    register,
    stream_rng,
)

logger = logging.getLogger(__name__)

LATENT_VARIANCE = 6.0
LATENT_LENGTH = 5.0
#: largest T for which ``method="exact"`` (Cholesky of the T x T kernel matrix) is allowed
EXACT_MAX_SAMPLES = 5000

# random streams of one seed: latent innovations, mapping parameters, observation noise
_LATENT, _MAPPING, _NOISE = 0, 1, 2
# rows of latent innovations generated per step of the AR(1) recursion
_LATENT_STEP = 64 * RNG_BLOCK


def latent_prior(
    n_samples: int, n_components: int, *, random_state: int = 0, clip: float | None = 6.0
) -> np.ndarray:
    """Latents with i.i.d. columns ``~ N(0, 6 exp(-|i - j| / 5))`` over the sample index.

    Exact sampling of that covariance through its AR(1) form, O(T M) time. The innovations
    come from :func:`~dr_dask.datasets._zarr.normal_rows`, so the result depends only on
    ``random_state`` (and is a prefix-consistent sequence: the first T' rows of a longer
    sample equal a sample of length T').

    Parameters
    ----------
    n_samples, n_components : int
        T and M.
    random_state : int
        Seed (non-negative int).
    clip : float or None
        Clip the latents to ``[-clip, clip]`` after sampling, as the authors' code does
        (``bound=6``); ``None`` keeps the exact Gaussian prior.

    Returns
    -------
    ndarray, shape (n_samples, n_components), float64
    """
    a = np.exp(-1.0 / LATENT_LENGTH)
    scale = np.sqrt(LATENT_VARIANCE * (1.0 - a * a))
    z = np.empty((n_samples, n_components))
    # lfilter computes y_t = scale * e_t + a * y_{t-1}; zi carries a * y_{t-1} across steps
    b_coef, a_coef = [scale], [1.0, -a]
    zi = None
    for start in range(0, n_samples, _LATENT_STEP):
        stop = min(start + _LATENT_STEP, n_samples)
        e = normal_rows(random_state, _LATENT, start, stop, n_components)
        if zi is None:  # stationary start: z_0 ~ N(0, 6)
            z[0] = np.sqrt(LATENT_VARIANCE) * e[0]
            zi = (a * z[0])[None, :]
            e, start = e[1:], 1
        z[start:stop], zi = signal.lfilter(b_coef, a_coef, e, axis=0, zi=zi)
    if clip is not None:
        np.clip(z, -clip, clip, out=z)
    return z


class _IKDGenerator(Generator):
    """Shared parts: the latent prior, the noise, validation of the common options."""

    default_components: int = 1
    default_noise: float = 0.0

    def __init__(
        self,
        n_samples: int,
        n_features: int,
        random_state: int,
        n_components: int | None = None,
        noise: float | None = None,
        clip: float | None = 6.0,
    ):
        self.n_samples, self.n_features, self.entropy = n_samples, n_features, random_state
        self.n_components = check_int(
            "n_components", self.default_components if n_components is None else n_components, 1)
        self.noise = _nonnegative("noise", self.default_noise if noise is None else noise)
        self.clip = None if clip is None else _positive("clip", clip)

    def params(self) -> dict[str, Any]:
        return {"n_components": self.n_components, "noise": self.noise, "clip": self.clip}

    def latents(self) -> np.ndarray:
        return latent_prior(
            self.n_samples, self.n_components, random_state=self.entropy, clip=self.clip
        )

    def _rng(self) -> np.random.Generator:
        return stream_rng(self.entropy, _MAPPING)

    def _add_noise(self, x: np.ndarray, start: int) -> np.ndarray:
        if self.noise > 0:
            x += self.noise * normal_rows(self.entropy, _NOISE, start, start + len(x), x.shape[1])
        return x


@register
class GPMapping(_IKDGenerator):
    """GP mapping: ``X[:, n] ~ N(0, K(Z))`` i.i.d. over features, SE kernel, sigma^2 = 1.

    Options: ``n_components`` (3), ``noise`` (0.05), ``length_scale`` (3.0), ``method``,
    ``n_features_rff`` (2000), ``clip`` (6.0).

    ``method="exact"`` samples through the Cholesky factor of the T x T kernel matrix
    (T <= 5000; a diagonal jitter, recorded as ``params["jitter"]``, is added only if the
    factorisation needs it, which is the same as a tiny extra noise variance).
    ``method="rff"`` uses R random Fourier features of the same kernel,
    ``phi(z) = sqrt(2/R) cos(W z / l + b)``, ``W ~ N(0, I)``, ``b ~ U(0, 2 pi)``, and
    ``X = phi(Z) A`` with ``A ~ N(0, 1)`` of shape (R, N) shared by all chunks. Then X is
    exactly Gaussian with covariance ``phi(Z) phi(Z)^T``, an unbiased rank-R estimate of K whose
    entries have standard deviation ``sqrt((1 + k(2 delta)/2 - k(delta)^2) / R)`` <= sqrt(1.5/R)
    (0.027 at R = 2000) and whose diagonal has sd ``sqrt(1/(2R))`` (0.016). ``"auto"`` is exact
    for T <= 5000 and RFF above; the two methods give different samples for the same seed.
    """

    name = "gp"
    default_components = 3
    default_noise = 0.05

    def __init__(
        self,
        n_samples: int,
        n_features: int,
        random_state: int,
        n_components: int | None = None,
        noise: float | None = None,
        clip: float | None = 6.0,
        length_scale: float = 3.0,
        method: str = "auto",
        n_features_rff: int = 2000,
    ):
        super().__init__(n_samples, n_features, random_state, n_components, noise, clip)
        self.length_scale = _positive("length_scale", length_scale)
        if method not in ("auto", "exact", "rff"):
            raise ValueError(f"method must be 'auto', 'exact' or 'rff', got {method!r}")
        if method == "auto":
            method = "exact" if n_samples <= EXACT_MAX_SAMPLES else "rff"
        if method == "exact" and n_samples > EXACT_MAX_SAMPLES:
            raise ValueError(
                f"method='exact' holds the T x T kernel matrix and is limited to "
                f"n_samples <= {EXACT_MAX_SAMPLES}; got {n_samples}. Use method='rff'."
            )
        self.method = method
        self.n_features_rff = check_int("n_features_rff", n_features_rff, 1)
        self.jitter = 0.0

    def params(self) -> dict[str, Any]:
        out = {**super().params(), "length_scale": self.length_scale, "method": self.method}
        if self.method == "rff":
            out["n_features_rff"] = self.n_features_rff
        else:
            out["jitter"] = self.jitter
        return out

    def mapping(self, latent: np.ndarray) -> dict[str, np.ndarray]:
        rng = self._rng()
        if self.method == "rff":
            R, M = self.n_features_rff, self.n_components
            return {
                "W": rng.standard_normal((R, M)) / self.length_scale,
                "b": rng.uniform(0.0, 2.0 * np.pi, R),
                "A": rng.standard_normal((R, self.n_features)),
            }
        K = cdist(latent, latent, "sqeuclidean")
        K *= -0.5 / self.length_scale**2
        np.exp(K, out=K)
        L = self._cholesky(K)
        return {"L": L, "A": rng.standard_normal((self.n_samples, self.n_features))}

    def _cholesky(self, K: np.ndarray) -> np.ndarray:
        # nearby latents make K numerically singular; escalate a diagonal jitter until the
        # factorisation succeeds (1e-4 is still far below the default noise variance 2.5e-3)
        for jitter in (0.0, 1e-10, 1e-8, 1e-6, 1e-4):
            try:
                L = linalg.cholesky(K + jitter * np.eye(len(K)), lower=True, check_finite=False)
            except linalg.LinAlgError:
                continue
            if jitter:
                logger.info("GP exact sampling: added jitter %g to the kernel diagonal", jitter)
            self.jitter = jitter
            return L
        raise linalg.LinAlgError("kernel matrix is not positive definite even with jitter 1e-4")

    def block(self, mapping: dict[str, np.ndarray], latent: np.ndarray, start: int) -> np.ndarray:
        if self.method == "rff":
            W, b, A = mapping["W"], mapping["b"], mapping["A"]
            phi = latent @ W.T
            phi += b
            np.cos(phi, out=phi)
            phi *= np.sqrt(2.0 / len(b))
            x = phi @ A
        else:
            stop = start + len(latent)
            # L is lower triangular: rows start..stop only use columns < stop
            x = mapping["L"][start:stop, :stop] @ mapping["A"][:stop]
        return self._add_noise(x, start)


@register
class Sinusoidal(_IKDGenerator):
    """Sinusoidal mapping ``x_t = sin(Omega z_t + phi) + eps``.

    ``Omega`` (N x M) ~ U(-1, 1), ``phi`` (N) ~ U(-pi, pi). Options: ``n_components`` (1),
    ``noise`` (0.1), ``clip`` (6.0).
    """

    name = "sinusoidal"
    default_components = 1
    default_noise = 0.1

    def mapping(self, latent: np.ndarray) -> dict[str, np.ndarray]:
        rng = self._rng()
        return {
            "omega": rng.uniform(-1.0, 1.0, (self.n_features, self.n_components)),
            "phi": rng.uniform(-np.pi, np.pi, self.n_features),
        }

    def block(self, mapping: dict[str, np.ndarray], latent: np.ndarray, start: int) -> np.ndarray:
        x = latent @ mapping["omega"].T
        x += mapping["phi"]
        np.sin(x, out=x)
        return self._add_noise(x, start)


@register
class GaussianBump(_IKDGenerator):
    """Gaussian bump mapping ``x_tn = 20 exp(-||z_t - c_n||^2) + eps`` (paper Eq. 13).

    Centres ``c_n`` are grid points of a ``grid_size``-per-axis grid on ``[-6, 6]^M``
    (100 x 100 = 10,000 points for M = 2). ``bump="l2"`` (default, the paper): squared
    Euclidean distance, centres drawn uniformly with replacement (the paper says "picked at
    random"). ``bump="l1"`` (the authors' code): ``20 exp(-||z_t - c_n||_1)``, centres drawn
    without replacement, so N may not exceed the number of grid points.
    Options: ``n_components`` (2), ``noise`` (0.05), ``bump``, ``grid_size`` (100), ``clip``.
    """

    name = "bump"
    default_components = 2
    default_noise = 0.05
    amplitude = 20.0
    extent = 6.0

    def __init__(
        self,
        n_samples: int,
        n_features: int,
        random_state: int,
        n_components: int | None = None,
        noise: float | None = None,
        clip: float | None = 6.0,
        bump: str = "l2",
        grid_size: int = 100,
    ):
        super().__init__(n_samples, n_features, random_state, n_components, noise, clip)
        if bump not in ("l2", "l1"):
            raise ValueError(f"bump must be 'l2' (paper) or 'l1' (authors' code), got {bump!r}")
        grid_size = check_int("grid_size", grid_size, 2)
        n_grid = grid_size**self.n_components
        if bump == "l1" and n_features > n_grid:
            raise ValueError(
                f"bump='l1' draws centres without replacement from {n_grid} grid points; "
                f"n_features={n_features} is larger"
            )
        self.bump, self.grid_size = bump, grid_size

    def params(self) -> dict[str, Any]:
        return {**super().params(), "bump": self.bump, "grid_size": self.grid_size}

    def mapping(self, latent: np.ndarray) -> dict[str, np.ndarray]:
        rng = self._rng()
        axis = np.linspace(-self.extent, self.extent, self.grid_size)
        shape = (self.grid_size,) * self.n_components
        if self.bump == "l2":
            idx = rng.integers(0, self.grid_size, (self.n_features, self.n_components))
        else:
            flat = rng.choice(self.grid_size**self.n_components, self.n_features, replace=False)
            idx = np.stack(np.unravel_index(flat, shape), axis=1)
        return {"centres": axis[idx]}

    def block(self, mapping: dict[str, np.ndarray], latent: np.ndarray, start: int) -> np.ndarray:
        centres = mapping["centres"]
        # accumulate per latent dimension: memory rows x N, no cancellation in the distance
        dist = np.zeros((len(latent), len(centres)))
        for m in range(self.n_components):
            diff = latent[:, m, None] - centres[None, :, m]
            dist += diff * diff if self.bump == "l2" else np.abs(diff)
        np.negative(dist, out=dist)
        np.exp(dist, out=dist)
        dist *= self.amplitude
        return self._add_noise(dist, start)


def _positive(name: str, value: Any) -> float:
    value = float(value)
    if not (value > 0 and np.isfinite(value)):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return value


def _nonnegative(name: str, value: Any) -> float:
    value = float(value)
    if not (value >= 0 and np.isfinite(value)):
        raise ValueError(f"{name} must be a non-negative finite number, got {value!r}")
    return value
