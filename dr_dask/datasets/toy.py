"""Small in-memory manifolds with their latent truth, for tests, benchmarks and examples.

Unlike the registered generators (written to Zarr chunk by chunk), these return NumPy arrays:
they are the few-thousand-point shapes that tests and benchmark baselines fit in one process.
"""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger(__name__)


def noisy_spiral(n: int, random_state: int = 0,
                 noise: float = 0.35) -> tuple[np.ndarray, np.ndarray]:
    """A noisy 2-D Archimedean spiral (LSDR's test shape).

    Returns
    -------
    X : ndarray of shape (n, 2)
    theta : ndarray of shape (n,)
        The angle, the spiral's 1-D latent.
    """
    rng = np.random.default_rng(random_state)
    theta = rng.uniform(1.5 * np.pi, 4.5 * np.pi, n)
    X = np.c_[theta * np.cos(theta), theta * np.sin(theta)] + noise * rng.normal(size=(n, 2))
    return X, theta


def noisy_swiss_roll(n: int, random_state: int = 0, noise: float = 0.3,
                     n_features: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A swiss roll in the first 3 of ``n_features`` dimensions, Gaussian noise on all.

    Returns
    -------
    X : ndarray of shape (n, n_features)
    t, h : ndarray of shape (n,)
        Angle along the roll and height: the 2-D latent.
    """
    if n_features < 3:
        raise ValueError(f"n_features must be >= 3 (the roll is 3-D), got {n_features}")
    rng = np.random.default_rng(random_state)
    t = 1.5 * np.pi * (1 + 2 * rng.uniform(size=n))
    h = 21 * rng.uniform(size=n)
    X = np.zeros((n, n_features))
    X[:, :3] = np.c_[t * np.cos(t), h, t * np.sin(t)]
    return X + noise * rng.normal(size=X.shape), t, h


def isometric_swiss_roll(n: int, random_state: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's swiss roll and its isometric ground truth (arc length, height).

    The spiral ``(t cos t, t sin t)`` has arc length ``(t sqrt(1 + t^2) + asinh t) / 2``, so
    ``(arc length, height)`` is an isometric parametrisation: an exact Isomap embedding of the
    continuous roll, against which Procrustes disparity measures quality.

    Returns
    -------
    X : ndarray of shape (n, 3)
    truth : ndarray of shape (n, 2)
    """
    from sklearn.datasets import make_swiss_roll  # lazy: not on workers (__init__)
    X, t = make_swiss_roll(n, random_state=random_state)
    arc = 0.5 * (t * np.sqrt(1 + t**2) + np.arcsinh(t))
    return X, np.column_stack([arc, X[:, 1]])


def tanh_lowrank(n: int, n_features: int, random_state: int = 0, n_latent: int = 3,
                 noise: float = 0.1, dtype: str = "float32") -> np.ndarray:
    """``tanh(Z W) + noise``: a cheap nonlinear low-rank matrix of shape (n, n_features)
    (``bench io``'s data; Z standard normal of shape (n, n_latent))."""
    rng = np.random.default_rng(random_state)
    z = rng.normal(size=(n, n_latent)).astype(dtype)
    X = np.tanh(z @ rng.normal(size=(n_latent, n_features)).astype(dtype))
    return X + noise * rng.normal(size=(n, n_features)).astype(dtype)
