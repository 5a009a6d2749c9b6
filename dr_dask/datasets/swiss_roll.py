"""The Euler isometric swiss roll with Gaussian patches (Mahapatra & Chandola 2020, §7.1) and its
streams.

The roll is the clothoid map ``psi(u1, u2) = (int_0^u1 sin(s^2) ds, int_0^u1 cos(s^2) ds, u2)``.
Its first coordinate is arc length, so the roll is isometric: the ground truth ``u`` is itself a
valid Isomap embedding and Procrustes disparity against it measures embedding quality directly.

Scenarios (Mahapatra & Chandola 2020, §7.1, experiments A and B):

* **shift** -- batch from the training halves of patches 1-3; stream the shuffled test halves of
  patches 1-3, then the test half of patch 4 (the unseen mode).
* **drift** -- batch from patch 1's training half; stream uniform on the whole domain
  ``[1, 3] x [0, 1]`` in random order, so the stream gradually leaves the batch's support.

``ambient_dim > 3`` embeds the roll isometrically in R^D with a random orthonormal map (for the
D=100 benchmarks): all distances, hence all geodesics, are unchanged.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from scipy.special import fresnel
from sklearn.utils import check_random_state

from dr_dask.io.storage import location

logger = logging.getLogger(__name__)

#: Patch means (u1, u2) and per-axis standard deviations (Mahapatra & Chandola 2020, §7.1;
#: values from the authors' code).
PATCH_MEANS = np.array([[1.25, 0.65], [1.75, 0.35], [2.35, 0.72], [2.65, 0.29]])
PATCH_SDS = np.array([[0.07, 0.05], [0.09, 0.06], [0.10, 0.07], [0.12, 0.06]])
#: Ground-truth domain of the uniform drift stream.
DOMAIN = np.array([[1.0, 3.0], [0.0, 1.0]])


def euler_roll(U: np.ndarray) -> np.ndarray:
    """Map ground-truth coordinates onto the Euler isometric swiss roll.

    Parameters
    ----------
    U : ndarray of shape (n, 2)
        ``(u1, u2)``; u1 is arc length along the clothoid.

    Returns
    -------
    ndarray of shape (n, 3)
    """
    U = np.asarray(U, dtype=np.float64)
    # scipy's Fresnel integrals use sin(pi t^2 / 2); substitute s = t * sqrt(pi / 2)
    c = np.sqrt(np.pi / 2)
    S, C = fresnel(U[:, 0] / c)
    return np.column_stack([c * S, c * C, U[:, 1]])


def ambient_embedding(X: np.ndarray, ambient_dim: int, random_state=None) -> np.ndarray:
    """Isometrically embed ``(n, 3)`` points in R^ambient_dim with a random orthonormal map."""
    if ambient_dim == X.shape[1]:
        return X
    if ambient_dim < X.shape[1]:
        raise ValueError(f"ambient_dim={ambient_dim} is below the data dimension {X.shape[1]}")
    rng = check_random_state(random_state)
    Q, _ = np.linalg.qr(rng.standard_normal((ambient_dim, X.shape[1])))
    return X @ Q.T


def sample_patches(
    n_per_patch: int, patches=(0, 1, 2, 3), random_state=None
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian patches in ground-truth coordinates.

    Returns
    -------
    U : ndarray of shape (n_per_patch * len(patches), 2)
    labels : ndarray of shape (n_per_patch * len(patches),)
        Patch index 0..3 of each point.
    """
    rng = check_random_state(random_state)
    U = [PATCH_MEANS[p] + PATCH_SDS[p] * rng.standard_normal((n_per_patch, 2)) for p in patches]
    labels = np.repeat(np.asarray(patches, dtype=np.int32), n_per_patch)
    return np.vstack(U), labels


def patch_points(n_batch_per_patch: int, n_stream: int, ambient_dim: int = 3,
                 random_state=None) -> tuple[np.ndarray, np.ndarray]:
    """A batch of all four patches and ``n_stream`` further points of them in random order.

    Returns
    -------
    batch : ndarray of shape (4 * n_batch_per_patch, ambient_dim)
    stream : ndarray of shape (n_stream, ambient_dim)
    """
    rng = check_random_state(random_state)
    Ub, _ = sample_patches(n_batch_per_patch, random_state=rng)
    Us, _ = sample_patches(int(np.ceil(n_stream / 4)), random_state=rng)
    Us = Us[rng.permutation(len(Us))[:n_stream]]
    X = ambient_embedding(euler_roll(np.vstack([Ub, Us])), ambient_dim, rng)
    return X[: len(Ub)], X[len(Ub):]


@dataclass
class Scenario:
    """A batch and an ordered stream with ground truth.

    Attributes
    ----------
    batch, batch_truth : ndarray of shape (n_b, D), (n_b, 2)
    stream, stream_truth : ndarray of shape (n_s, D), (n_s, 2)
    stream_labels : ndarray of shape (n_s,)
        Patch of each stream point; -1 for uniform (drift) points.
    first_unseen : int
        Stream position of the first point from a mode absent from the batch (-1 if none).
    name : str
    """

    batch: np.ndarray
    batch_truth: np.ndarray
    stream: np.ndarray
    stream_truth: np.ndarray
    stream_labels: np.ndarray
    first_unseen: int
    name: str


def shift_scenario(n_per_patch: int = 1000, ambient_dim: int = 3, random_state=0) -> Scenario:
    """Experiment A: train on patches 1-3, stream their test points then the unseen patch 4.

    Each patch has ``2 * n_per_patch`` points split equally and at random into train and test,
    as in the paper (n_per_patch = 1000 is the paper's scale).
    """
    rng = check_random_state(random_state)
    U, lab = sample_patches(2 * n_per_patch, random_state=rng)
    train = np.zeros(len(U), bool)
    for p in range(4):
        members = np.flatnonzero(lab == p)
        train[rng.choice(members, n_per_patch, replace=False)] = True
    known = ~train & (lab < 3)
    known_order = rng.permutation(np.flatnonzero(known))
    unseen = np.flatnonzero(~train & (lab == 3))
    order = np.concatenate([known_order, rng.permutation(unseen)])
    bt = np.flatnonzero(train & (lab < 3))
    X = ambient_embedding(euler_roll(U), ambient_dim, rng)
    return Scenario(X[bt], U[bt], X[order], U[order], lab[order], len(known_order), "shift")


def drift_scenario(
    n_batch: int = 1000, n_stream: int = 3000, ambient_dim: int = 3, random_state=0
) -> Scenario:
    """Experiment B: train on patch 1, stream points uniform on the whole domain."""
    rng = check_random_state(random_state)
    Ub, _ = sample_patches(n_batch, patches=(0,), random_state=rng)
    Us = DOMAIN[:, 0] + (DOMAIN[:, 1] - DOMAIN[:, 0]) * rng.random_sample((n_stream, 2))
    Xb = euler_roll(Ub)
    Xs = euler_roll(Us)
    if ambient_dim != 3:
        both = ambient_embedding(np.vstack([Xb, Xs]), ambient_dim, rng)
        Xb, Xs = both[:n_batch], both[n_batch:]
    return Scenario(Xb, Ub, Xs, Us, np.full(n_stream, -1, np.int32), -1, "drift")


def write_scenario(
    scenario: Scenario, path: Any, *, kind: str = "npy-dir", chunk_size: int = 250,
    storage_options: dict | None = None,
) -> dict:
    """Write a scenario as a stream source plus its batch and ground truth.

    Layout of ``path`` (a directory or prefix): ``batch.npy``, ``batch_truth.npy``,
    ``stream_truth.npy``, ``stream_labels.npy``, ``meta.json`` and the stream itself as
    ``stream/`` -- either chunk files ``000000.npy, 000001.npy, ...`` (``kind="npy-dir"``) or
    an appendable Zarr array ``stream.zarr`` (``kind="zarr"``) with ``chunk_size`` rows per
    Zarr chunk. ``meta.json`` is written last: it marks the scenario complete.

    Parameters
    ----------
    scenario : Scenario
    path : str or Location
        Local path or URL (``s3://…``, ``memory://…``).
    kind : {"npy-dir", "zarr"}
    chunk_size : int
        Stream rows per file or Zarr chunk.
    storage_options : dict, optional
        For the filesystem of a URL.

    Returns
    -------
    dict
        The metadata written to ``meta.json`` (``source`` is the stream source URL or path).
    """


    if kind not in ("npy-dir", "zarr"):
        raise ValueError(f"kind must be 'npy-dir' or 'zarr', got {kind!r}")
    loc = location(path, storage_options)
    for name in ("batch", "batch_truth", "stream_truth", "stream_labels"):
        loc.child(f"{name}.npy").write_npy(getattr(scenario, name))
    if kind == "npy-dir":
        src = loc.child("stream")
        for i, s in enumerate(range(0, len(scenario.stream), chunk_size)):
            src.child(f"{i:06d}.npy").write_npy(scenario.stream[s : s + chunk_size])
    else:
        src = loc.child("stream.zarr")
        arr = zarr.create_array(
            src.zarr_store(), shape=scenario.stream.shape,
            chunks=(chunk_size, scenario.stream.shape[1]), dtype="f8", overwrite=True,
        )
        arr[:] = scenario.stream
    meta = {
        "name": scenario.name,
        "source": src.url,
        "kind": kind,
        "n_batch": len(scenario.batch),
        "n_stream": len(scenario.stream),
        "ambient_dim": int(scenario.batch.shape[1]),
        "first_unseen": int(scenario.first_unseen),
    }
    loc.child("meta.json").write_bytes(json.dumps(meta, indent=2).encode())
    logger.info("wrote %s scenario to %s (%d stream rows)", scenario.name, path, meta["n_stream"])
    return meta
