"""Stationary kernels of IKD Table 1 and their elementwise inverses, on the normalised scale.

Every kernel is written as ``k / sigma^2 = f(d)`` with ``d = r^2 / l^2`` the scaled squared
distance, so ``f`` maps ``[0, inf)`` onto ``(0, 1]`` with ``f(0) = 1``, and ``inverse`` maps
``(0, 1]`` back to ``[0, inf)`` with ``inverse(1) == 0`` exactly. The IKD code applies
``inverse`` to every T x T similarity tile, so it is vectorised (no Python loop over entries),
processes large arrays in cache-sized blocks and keeps float32 input float32.

==========================  ==============================  ==========================================
name (aliases)              f(d)                            inverse(k)
==========================  ==============================  ==========================================
``se`` (squared_exponential) ``exp(-d/2)``                   ``-2 ln k``
``rational_quadratic``      ``(1 + d/(2 alpha))^-alpha``    ``2 alpha (k^(-1/alpha) - 1)``
(``rq``)
``gamma_exponential``       ``exp(-d^(gamma/2))``           ``(-ln k)^(2/gamma)``
``matern``                  ``2^(1-nu)/Gamma(nu) x^nu       root of ``f(d) = k``: closed form for
                            K_nu(x)``, ``x = sqrt(2 nu d)``  nu = 1/2, Newton for nu = 3/2, 5/2,
                                                            safeguarded Newton for other nu
==========================  ==============================  ==========================================

The gamma-exponential form is the one of seed 000 (``exp(-(r/l)^gamma)``), not the reciprocal
exponents misprinted in 001/002 (spec seed-ikd.md, A5).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from scipy import special

logger = logging.getLogger(__name__)

KERNELS: tuple[str, ...] = ("se", "rational_quadratic", "gamma_exponential", "matern")
_ALIASES = {"squared_exponential": "se", "rq": "rational_quadratic"}

# Entries are processed in blocks of this many so that the temporaries of the multi-step
# formulas (Matérn Newton) stay in cache instead of streaming 25M-entry arrays through RAM.
_BLOCK = 1 << 16


def _as_float(x: Any) -> np.ndarray:
    """``x`` as a float array; float32 stays float32, everything else becomes float64."""
    x = np.asarray(x)
    if x.dtype == np.float32 or x.dtype == np.float64:
        return x
    return x.astype(np.float64)


def _check_similarities(k: np.ndarray) -> np.ndarray:
    """Validate ``k`` in (0, 1] (up to a few ulps above 1) and return it clipped to <= 1."""
    if k.size == 0:
        return k
    # two reductions instead of boolean masks: cheap on 25M-entry tiles, and NaN fails both tests
    lo, hi = k.min(), k.max()
    tol = 8 * np.finfo(k.dtype).eps
    if lo > 0 and hi <= 1 + tol:
        return np.minimum(k, 1, dtype=k.dtype) if hi > 1 else k
    bad = ~((k > 0) & (k <= 1 + tol))
    first = np.unravel_index(int(np.argmax(bad)), k.shape)
    raise ValueError(
        f"kernel inverse needs similarities in (0, 1]; {int(bad.sum())} of {k.size} entries are "
        f"outside (min={lo!r}, max={hi!r}; first bad entry at index {tuple(int(i) for i in first)} "
        f"= {k[first]!r}). Clip the normalised similarities before inverting."
    )


def _check_distances(d: np.ndarray) -> None:
    if d.size and not d.min() >= 0:  # also catches NaN
        bad = ~(d >= 0)
        raise ValueError(
            f"kernel f needs scaled squared distances d >= 0; {int(bad.sum())} entries are "
            f"negative or NaN (min={d.min()!r})"
        )


def _blockwise(func, k: np.ndarray) -> np.ndarray:
    """Apply ``func`` (1-D float64 -> 1-D float64) to ``k`` block by block, keeping k's dtype."""
    flat = k.reshape(-1)
    out = np.empty(flat.shape, dtype=k.dtype)
    for start in range(0, flat.size, _BLOCK):
        block = np.asarray(flat[start : start + _BLOCK], dtype=np.float64)
        out[start : start + _BLOCK] = func(block)
    return out.reshape(k.shape)


class Kernel:
    """A stationary kernel on the normalised scale: ``f(d) = k / sigma^2`` with ``d = r^2/l^2``.

    Subclasses implement ``_f`` and ``_inverse`` on float64 1-D blocks; the public methods
    validate inputs, handle shapes and dtypes, and work in blocks. Instances are plain
    picklable objects (they are shipped to dask workers).
    """

    name: str = ""

    def params(self) -> dict[str, float]:
        """Hyper-parameters of this kernel (empty for SE)."""
        return {}

    def f(self, d: np.ndarray) -> np.ndarray:
        """Normalised kernel value ``k / sigma^2`` as a function of ``d >= 0``.

        Parameters
        ----------
        d : array_like of any shape
            Scaled squared distances ``r^2 / l^2``; must be >= 0 and not NaN.

        Returns
        -------
        ndarray, same shape as ``d``
            Values in (0, 1] (0 only by underflow), float32 for float32 input else float64.
        """
        d = _as_float(d)
        _check_distances(d)
        return _blockwise(self._f, d)

    def inverse(self, k: np.ndarray) -> np.ndarray:
        """Scaled squared distance ``d >= 0`` with ``f(d) = k``, elementwise.

        The domain is (0, 1]: values ``<= 0``, NaN or above 1 by more than a few ulps raise
        ``ValueError`` (naming how many and where). Callers (the IKD code) clip the normalised
        similarities into (0, 1] first; being strict here catches clipping bugs.
        ``inverse(1) == 0`` exactly.

        Parameters
        ----------
        k : array_like of any shape
            Normalised similarities ``s / sigma^2``.

        Returns
        -------
        ndarray, same shape as ``k``
            float32 for float32 input, else float64.
        """
        k = _check_similarities(_as_float(k))
        return _blockwise(self._inverse, k)

    def _f(self, d: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _inverse(self, k: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{key}={value!r}" for key, value in self.params().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.params() == self.params()

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(self.params().items()))))


def _neg_log(k: np.ndarray) -> np.ndarray:
    """``-ln k`` for k in (0, 1], as +0.0 (not -0.0) at k == 1."""
    return np.abs(np.log(k))


class SquaredExponential(Kernel):
    """``f(d) = exp(-d/2)``, ``f^-1(k) = -2 ln k`` (IKD's default kernel)."""

    name = "se"

    def _f(self, d):
        return np.exp(-0.5 * d)

    def _inverse(self, k):
        return 2.0 * _neg_log(k)


class RationalQuadratic(Kernel):
    """``f(d) = (1 + d/(2 alpha))^-alpha``, ``f^-1(k) = 2 alpha (k^(-1/alpha) - 1)``."""

    name = "rational_quadratic"

    def __init__(self, alpha: float = 1.0):
        self.alpha = _positive("alpha", alpha)

    def params(self):
        return {"alpha": self.alpha}

    def _f(self, d):
        return np.exp(-self.alpha * np.log1p(d / (2.0 * self.alpha)))

    def _inverse(self, k):
        # expm1 keeps full relative precision for k close to 1 (small d); d overflows to inf
        # for k below ~1e-308^alpha, which is the correct limit
        with np.errstate(over="ignore"):
            return 2.0 * self.alpha * np.expm1(_neg_log(k) / self.alpha)


class GammaExponential(Kernel):
    """``f(d) = exp(-d^(gamma/2))``, ``f^-1(k) = (-ln k)^(2/gamma)``, gamma in (0, 2].

    This is seed 000's form, i.e. ``exp(-(r/l)^gamma)``; 001/002 print the reciprocal
    exponents, which for gamma = 1 would give ``exp(-d^2)`` (spec A5).
    """

    name = "gamma_exponential"

    def __init__(self, gamma: float = 1.0):
        gamma = float(gamma)
        if not 0 < gamma <= 2:
            raise ValueError(f"gamma must be in (0, 2] for the gamma-exponential kernel, got {gamma!r}")
        self.gamma = gamma

    def params(self):
        return {"gamma": self.gamma}

    def _f(self, d):
        return np.exp(-(d ** (0.5 * self.gamma)))

    def _inverse(self, k):
        return _neg_log(k) ** (2.0 / self.gamma)


class Matern(Kernel):
    """Matérn: ``f(d) = 2^(1-nu)/Gamma(nu) x^nu K_nu(x)``, ``x = sqrt(2 nu d)``, ``f(0) = 1``.

    The inverse is solved for ``x`` and returned as ``d = x^2 / (2 nu)``:

    - nu = 1/2: ``f = exp(-x)``, so ``d = (ln k)^2`` in closed form;
    - nu = 3/2, 5/2: ``f = p(x) e^-x`` with ``p = 1 + x`` or ``1 + x + x^2/3``; Newton on
      ``phi(x) = x - ln p(x) = -ln k`` (convex, increasing) from a lower bound, a fixed number
      of iterations that reaches full double precision for k in [1e-300, 1];
    - other nu: Newton on ``ln f(x) = ln k`` safeguarded by a bisection bracket (``f`` is
      strictly decreasing), iterated only on entries that have not converged. ``ln f`` is
      evaluated through ``kve`` with absolute error ~1e-14, so within ~1e-14 of k = 1 the
      returned d is accurate in absolute terms only (and monotone only up to that error).
    """

    name = "matern"
    _NEWTON_STEPS = 5  # measured: 4 reach full precision over k in [1e-300, 1]; one spare

    def __init__(self, nu: float = 1.5):
        self.nu = _positive("nu", nu)
        self._log_norm = (1.0 - self.nu) * np.log(2.0) - special.gammaln(self.nu)

    def params(self):
        return {"nu": self.nu}

    # -- f ----------------------------------------------------------------------------------
    def _f(self, d):
        nu = self.nu
        x = np.sqrt(2.0 * nu * d)
        if nu == 0.5:
            return np.exp(-x)
        if nu == 1.5:
            return (1.0 + x) * np.exp(-x)
        if nu == 2.5:
            return (1.0 + x + x * x / 3.0) * np.exp(-x)
        return np.exp(self._log_f(x))

    def _log_f(self, x):
        """``ln f`` via the exponentially scaled Bessel function (no overflow/underflow)."""
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out = self._log_norm + self.nu * np.log(x) + np.log(special.kve(self.nu, x)) - x
        # x -> 0 gives 0 * inf or inf - inf; there f = 1 to machine precision
        return np.where(np.isfinite(out), np.minimum(out, 0.0), 0.0)

    # -- inverse ----------------------------------------------------------------------------
    def _inverse(self, k):
        nu = self.nu
        L = _neg_log(k)
        if nu == 0.5:
            return L * L
        if nu in (1.5, 2.5):
            x = self._newton_half_integer(L)
        else:
            x = self._safeguarded_newton(L)
        return x * x / (2.0 * nu)

    def _newton_half_integer(self, L):
        """Solve ``x - ln p(x) = L`` for x >= 0 (p as in the class docstring)."""
        if self.nu == 1.5:
            c = 2.0  # phi(x) <= x^2/2
        else:
            c = 6.0  # phi(x) <= x^2/6 near 0
        # Both sqrt(c L) (phi <= x^2/c) and L + ln(1 + L) (x* = L + ln p(x*) >= L + ln(1+L))
        # are lower bounds of the root; Newton on the convex increasing phi from below jumps
        # just past the root once and then converges monotonically and quadratically.
        x = np.maximum(np.sqrt(c * L), L + np.log1p(L))
        for _ in range(self._NEWTON_STEPS):
            # p - 1 and log1p keep precision for the small x of k close to 1
            if self.nu == 1.5:
                pm1 = x
                dphi = x / (1.0 + x)
            else:
                pm1 = x * (1.0 + x / 3.0)
                dphi = x * (1.0 + x) / (3.0 * (1.0 + pm1))
            phi = x - np.log1p(pm1)
            with np.errstate(divide="ignore", invalid="ignore"):
                step = (phi - L) / dphi
            # dphi == 0 only at x == 0, which is the exact root for L == 0
            x = np.where(dphi > 0, x - step, x)
            x = np.maximum(x, 0.0)
        return x

    def _safeguarded_newton(self, L, max_iter: int = 100):
        """Root of ``ln f(x) + L = 0`` with Newton steps kept inside a bisection bracket."""
        nu = self.nu
        target = -L
        lo = np.zeros_like(L)
        hi = np.ones_like(L)
        # grow the bracket: double hi until f(hi) <= k (at most ~10 doublings for k >= 1e-300)
        active = self._log_f(hi) > target
        for _ in range(64):
            if not active.any():
                break
            lo[active] = hi[active]
            hi[active] *= 2.0
            active[active] = self._log_f(hi[active]) > target[active]
        x = 0.5 * (lo + hi)
        idx = np.flatnonzero(L > 0)
        x[L == 0] = 0.0
        for _ in range(max_iter):
            if idx.size == 0:
                break
            xi, lo_i, hi_i, t = x[idx], lo[idx], hi[idx], target[idx]
            g = self._log_f(xi) - t  # decreasing in x
            lo_i = np.where(g > 0, xi, lo_i)
            hi_i = np.where(g > 0, hi_i, xi)
            # d/dx ln f = -K_{nu-1}(x) / K_nu(x)  (from d/dx [x^nu K_nu] = -x^nu K_{nu-1})
            with np.errstate(divide="ignore", invalid="ignore"):
                dg = -special.kve(nu - 1.0, xi) / special.kve(nu, xi)
                new = xi - g / dg
            bad = ~np.isfinite(new) | (new <= lo_i) | (new >= hi_i)
            new = np.where(bad, 0.5 * (lo_i + hi_i), new)
            done = np.abs(new - xi) <= 4 * np.finfo(np.float64).eps * np.maximum(new, 1e-300)
            x[idx], lo[idx], hi[idx] = new, lo_i, hi_i
            idx = idx[~done]
        if idx.size:
            logger.warning("Matérn(nu=%g) inverse: %d entries did not converge", nu, idx.size)
        return x


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not value > 0 or not np.isfinite(value):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return value


def get_kernel(
    name: str | Kernel, *, alpha: float = 1.0, gamma: float = 1.0, nu: float = 1.5
) -> Kernel:
    """The kernel called ``name`` with its hyper-parameter.

    Parameters
    ----------
    name : str or Kernel
        One of ``KERNELS`` (``"se"``, ``"rational_quadratic"``, ``"gamma_exponential"``,
        ``"matern"``) or an alias (``"squared_exponential"``, ``"rq"``); case-insensitive.
        A ``Kernel`` instance is returned unchanged.
    alpha : float
        Rational-quadratic shape, > 0 (only used by that kernel).
    gamma : float
        Gamma-exponential exponent, in (0, 2] (only used by that kernel).
    nu : float
        Matérn smoothness, > 0 (only used by that kernel).

    Returns
    -------
    Kernel
    """
    if isinstance(name, Kernel):
        return name
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key == "se":
        return SquaredExponential()
    if key == "rational_quadratic":
        return RationalQuadratic(alpha)
    if key == "gamma_exponential":
        return GammaExponential(gamma)
    if key == "matern":
        return Matern(nu)
    raise ValueError(
        f"unknown kernel {name!r}; valid names: {', '.join(KERNELS)} "
        f"(aliases: {', '.join(f'{a}={b}' for a, b in _ALIASES.items())})"
    )


__all__ = [
    "KERNELS",
    "Kernel",
    "SquaredExponential",
    "RationalQuadratic",
    "GammaExponential",
    "Matern",
    "get_kernel",
]
