"""Multi-patch layouts on the Euler roll for GP-Isomap: separated, touching, unequal, noisy.

Each layout places three batch patches and a fourth, unseen one on the Euler isometric swiss
roll (:func:`dr_dask.datasets.swiss_roll.euler_roll`). A patch is a Gaussian in ground-truth
coordinates truncated to its 2-sigma ellipse, so "separated" and "touching" are exact: two
patches touch when their ellipses meet, and no point of one lies inside another. The stream
holds held-out points of the three batch patches in random order, then the unseen patch, as
in the paper's experiment A (Mahapatra & Chandola 2020, §7.1).

Layouts (``kind``):

* ``separated`` -- equal patches with gaps of at least one patch radius between them;
* ``touching`` -- consecutive ellipses meet along u1 (the unseen patch touches the third);
* ``unequal`` -- patch sizes 1 : 2 : 4 and densities differing 4x (radii and counts differ);
* ``noise`` -- ``separated`` plus isotropic ambient Gaussian noise (``noise`` sd, default 0.003,
  4% of a patch's sd: at 0.01 the noise alone costs a disparity of ~0.02 against the truth).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from sklearn.utils import check_random_state

from dr_dask.datasets.swiss_roll import Scenario, ambient_embedding, euler_roll

logger = logging.getLogger(__name__)

#: Per layout: patch centres (u1, u2), 2-sigma radii (u1, u2) and relative point counts;
#: the last patch is the unseen one.
LAYOUTS: dict[str, dict[str, list] | None] = {
    "separated": {
        "centres": [(1.20, 0.30), (1.70, 0.70), (2.20, 0.30), (2.65, 0.72)],
        "radii": [(0.14, 0.18)] * 4, "weights": [1, 1, 1, 1]},
    "touching": {
        "centres": [(1.20, 0.50), (1.52, 0.50), (1.84, 0.50), (2.16, 0.50)],
        "radii": [(0.16, 0.20)] * 4, "weights": [1, 1, 1, 1]},
    "unequal": {
        "centres": [(1.15, 0.30), (1.65, 0.62), (2.25, 0.35), (2.65, 0.75)],
        "radii": [(0.08, 0.10), (0.13, 0.16), (0.18, 0.22), (0.12, 0.15)],
        "weights": [1, 2, 4, 2]},
    "noise": None,  # separated + ambient noise
}
KINDS = tuple(LAYOUTS)


@dataclass
class Layout(Scenario):
    """A :class:`~dr_dask.datasets.swiss_roll.Scenario` that also knows the batch's patches.

    Attributes
    ----------
    batch_labels : ndarray of shape (n_b,)
        Patch 0..2 of each batch point.
    """

    batch_labels: np.ndarray


def truncated_patch(n: int, centre, radii, rng) -> np.ndarray:
    """``n`` ground-truth points of a Gaussian (sd = radii / 2) truncated to its 2-sd ellipse."""
    out = np.empty((0, 2))
    while len(out) < n:
        z = rng.standard_normal((2 * (n - len(out)) + 8, 2))
        z = z[np.einsum("ij,ij->i", z, z) <= 4.0]  # inside the 2-sigma ellipse
        out = np.vstack([out, z[: n - len(out)]])
    return np.asarray(centre) + out * np.asarray(radii) / 2.0


def patch_layout(
    kind: str = "separated",
    n_batch: int = 300,
    n_stream: int = 200,
    *,
    noise: float | None = None,
    ambient_dim: int = 3,
    random_state=None,
) -> Layout:
    """A batch of three patches and a stream that ends with an unseen fourth.

    Parameters
    ----------
    kind : {"separated", "touching", "unequal", "noise"}
    n_batch : int
        Batch points per unit patch weight (``unequal`` patches get 1, 2 or 4 times this).
    n_stream : int
        Held-out stream points per unit patch weight, the unseen patch included.
    noise : float, optional
        Ambient noise sd (default 0.003 for ``noise``, else 0).
    ambient_dim : int
        Embed the roll isometrically in R^ambient_dim (before the noise is added).
    random_state : int, RandomState or None

    Returns
    -------
    Layout
        ``batch_truth``/``stream_truth`` are the ground-truth (u1, u2); ``stream_labels`` is
        the patch 0..3 of each stream point (3 = unseen), ``batch_labels`` 0..2.
    """
    if kind not in LAYOUTS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    for name, v in (("n_batch", n_batch), ("n_stream", n_stream)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if noise is None:
        noise = 0.003 if kind == "noise" else 0.0
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    spec = LAYOUTS["separated" if kind == "noise" else kind]
    assert spec is not None
    rng = check_random_state(random_state)
    parts: dict[str, list[np.ndarray]] = {"Ub": [], "lb": [], "Us": [], "ls": []}
    for p, (c, r, w) in enumerate(zip(spec["centres"], spec["radii"], spec["weights"])):
        if p < 3:
            parts["Ub"].append(truncated_patch(int(n_batch * w), c, r, rng))
            parts["lb"].append(np.full(int(n_batch * w), p, np.int32))
        parts["Us"].append(truncated_patch(int(n_stream * w), c, r, rng))
        parts["ls"].append(np.full(int(n_stream * w), p, np.int32))
    Ub, Us = np.vstack(parts["Ub"]), np.vstack(parts["Us"])
    lb, ls = np.concatenate(parts["lb"]), np.concatenate(parts["ls"])
    order = np.concatenate([rng.permutation(np.flatnonzero(ls < 3)), np.flatnonzero(ls == 3)])
    Us, ls = Us[order], ls[order]
    X = ambient_embedding(euler_roll(np.vstack([Ub, Us])), ambient_dim, rng)
    if noise:
        X = X + noise * rng.standard_normal(X.shape)
    return Layout(X[: len(Ub)], Ub, X[len(Ub):], Us, ls, int(np.sum(ls < 3)), f"layout-{kind}",
                  lb)
