"""Stationary kernels of IKD Table 1 and their elementwise inverses, on the normalised scale.

Every kernel is written as ``k / sigma^2 = f(d)`` with ``d = r^2 / l^2`` the scaled squared
distance, so ``f`` maps ``[0, inf)`` onto ``(0, 1]`` with ``f(0) = 1``, and ``inverse`` maps
``(0, 1]`` back to ``[0, inf)`` with ``inverse(1) == 0`` exactly. The IKD code applies
``inverse`` to every T x T similarity tile, so it is vectorised (no Python loop over entries),
processes large arrays in cache-sized blocks and keeps float32 input float32.

==========================  ==============================  ========================================
name (aliases)              f(d)                            inverse(k)
==========================  ==============================  ========================================
``se`` (squared_exponential) ``exp(-d/2)``                   ``-2 ln k``
``rational_quadratic``      ``(1 + d/(2 alpha))^-alpha``    ``2 alpha (k^(-1/alpha) - 1)``
(``rq``)
``gamma_exponential``       ``exp(-d^(gamma/2))``           ``(-ln k)^(2/gamma)``
``matern``                  ``2^(1-nu)/Gamma(nu) x^nu       root of ``f(d) = k``: closed form for
                            K_nu(x)``, ``x = sqrt(2 nu d)``  nu = 1/2, Newton for nu = 3/2, 5/2,
                                                            safeguarded Newton for other nu
==========================  ==============================  ========================================

The gamma-exponential form is the arXiv HTML version's (``exp(-(r/l)^gamma)``), not the reciprocal
exponents of the PDF and TMLR versions (docs/decisions.md IKD-A5).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from scipy import special

logger = logging.getLogger(__name__)

KERNELS: tuple[str, ...] = ("se", "rational_quadratic", "gamma_exponential", "matern")
ALIASES = {"squared_exponential": "se", "rq": "rational_quadratic"}

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

    def inverse_inplace(self, k: np.ndarray) -> np.ndarray:
        """:meth:`inverse` written over ``k``, which is returned (same domain check).

        For callers that own a large block (IKD's similarity tiles, row chunk by row chunk) and
        need no copy of it. This general form computes in float64 and copies back; kernels whose
        inverse is a short ufunc chain (SE) override it to work in ``k``'s own dtype with no
        temporary.

        Parameters
        ----------
        k : ndarray of float32 or float64, any shape, writable
            Normalised similarities in (0, 1].

        Returns
        -------
        ndarray
            ``k``, now holding the scaled squared distances.
        """
        k[...] = self.inverse(k)
        return k

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

    def inverse_inplace(self, k: np.ndarray) -> np.ndarray:
        # the ufunc chain of _inverse, in place and in k's dtype: a float32 log is accurate to
        # float32 precision, so float32 tiles need no float64 copy (half the inverse's time);
        # for float64 this is bit-for-bit _inverse
        checked = _check_similarities(k)
        if checked is not k:  # a few ulps above 1, clipped to 1
            k[...] = checked
        np.log(k, out=k)
        np.abs(k, out=k)  # -ln k as +0.0 at k == 1, as _neg_log
        np.multiply(k, 2.0, out=k)
        return k


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

    This is the arXiv HTML version's form, i.e. ``exp(-(r/l)^gamma)``; the PDF and TMLR print the
    reciprocal exponents, which for gamma = 1 would give ``exp(-d^2)`` (docs/decisions.md IKD-A5).
    """

    name = "gamma_exponential"

    def __init__(self, gamma: float = 1.0):
        gamma = float(gamma)
        if not 0 < gamma <= 2:
            raise ValueError(
                f"gamma must be in (0, 2] for the gamma-exponential kernel, got {gamma!r}")
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
    - other nu: cubic Hermite interpolation of ``ln x`` against ``ln(-ln k)`` in a table of
      4097 exact roots (Newton in ln x inside a bisection bracket, ``f`` being strictly
      decreasing) built once per kernel: |f(d) - k| <= ~1e-11 for k in [1e-300, 1], monotone,
      and linear in the number of entries.
    """

    name = "matern"
    _NEWTON_STEPS = 5  # 4 reach full precision over k in [1e-300, 1] (a test checks); one spare

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
        x = self._newton_half_integer(L) if nu in (1.5, 2.5) else self._interpolate(L)
        return x * x / (2.0 * nu)

    # -- general nu: a table of the exact inverse, interpolated --------------------------------
    # kve costs ~1 us per call and a root solve needs ~30 calls per entry, far too slow for
    # T x T tiles. Instead the exact solver is run once per kernel on a uniform grid of
    # u = ln(-ln k), and y = ln x is interpolated with cubic Hermite using the exact slopes.
    # y(u) is smooth and linear at both ends (L ~ c x^(2 min(nu, 1)) for small x, L ~ x for
    # large x), so 4097 nodes give ~1e-12 relative error. ln f has an absolute error ~1e-14,
    # so the table starts at L = 1e-10; below it y continues with the small-x power law,
    # slope 1 / (2 min(nu, 1)), which keeps |f(d) - k| <= 1e-10 there. The table (100 kB)
    # is built on first use and travels with the pickle.
    _TABLE_U = (np.log(1e-10), np.log(750.0))  # k in [~5e-324, 1 - 1e-10]
    _TABLE_SIZE = 4097

    def _table(self):
        table = self.__dict__.get("_table_cache")
        if table is None:
            u = np.linspace(*self._TABLE_U, self._TABLE_SIZE)
            L = np.exp(u)
            x = self._safeguarded_newton(L)
            # dy/du = L / (x dL/dx), dL/dx = K_{nu-1}(x) / K_nu(x)
            slope = L / (x * special.kve(self.nu - 1.0, x) / special.kve(self.nu, x))
            slope[0] = 0.5 / min(self.nu, 1.0)  # the asymptotic power law, continued below
            table = self._table_cache = (u, np.log(x), slope)
        return table

    def _interpolate(self, L):
        u_nodes, y_nodes, s_nodes = self._table()
        h = u_nodes[1] - u_nodes[0]
        with np.errstate(divide="ignore"):
            u = np.log(L)
        pos = (u - u_nodes[0]) / h
        i = np.clip(np.floor(pos), 0, len(u_nodes) - 2).astype(np.intp)
        t = np.clip(pos - i, 0.0, 1.0)
        y0, y1, s0, s1 = y_nodes[i], y_nodes[i + 1], s_nodes[i] * h, s_nodes[i + 1] * h
        t2 = t * t
        t3 = t2 * t
        y = ((2 * t3 - 3 * t2 + 1) * y0 + (t3 - 2 * t2 + t) * s0
             + (3 * t2 - 2 * t3) * y1 + (t3 - t2) * s1)
        # outside the table: continue along the end slope (the asymptotic power laws)
        lo, hi = pos < 0, pos > len(u_nodes) - 1
        y = np.where(lo, y_nodes[0] + s_nodes[0] * (u - u_nodes[0]), y)
        y = np.where(hi, y_nodes[-1] + s_nodes[-1] * (u - u_nodes[-1]), y)
        return np.where(L > 0, np.exp(y), 0.0)

    def _newton_half_integer(self, L):
        """Solve ``x - ln p(x) = L`` for x >= 0 (p as in the class docstring)."""
        c = 2.0 if self.nu == 1.5 else 6.0  # phi(x) <= x^2/2, else x^2/6 near 0
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

    def _safeguarded_newton(self, L, max_iter: int = 200):
        """Root of ``ln f(x) + L = 0``, L > 0: Newton in ``y = ln x`` inside a bisection bracket.

        Working in ln x reaches the tiny roots of small nu (x ~ 1e-50 at L = 1e-10, nu = 0.1).
        """
        nu = self.nu
        target = -L
        lo = np.full_like(L, np.log(1e-300))  # f(1e-300) > 1 - 1e-10 for nu >= 0.02
        hi = np.zeros_like(L)
        # grow the bracket: double x_hi until f(x_hi) <= k (about 10 doublings for k >= 1e-300)
        active = self._log_f(np.exp(hi)) > target
        for _ in range(64):
            if not active.any():
                break
            lo[active] = hi[active]
            hi[active] += np.log(2.0)
            active[active] = self._log_f(np.exp(hi[active])) > target[active]
        y = 0.5 * (lo + hi)
        idx = np.arange(L.size)
        for _ in range(max_iter):
            if idx.size == 0:
                break
            yi, lo_i, hi_i = y[idx], lo[idx], hi[idx]
            xi = np.exp(yi)
            g = self._log_f(xi) - target[idx]  # decreasing in y
            lo_i = np.where(g > 0, yi, lo_i)
            hi_i = np.where(g > 0, hi_i, yi)
            # d ln f / d ln x = -x K_{nu-1}(x) / K_nu(x)  (from d/dx [x^nu K_nu] = -x^nu K_{nu-1})
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                dg = -xi * special.kve(nu - 1.0, xi) / special.kve(nu, xi)
                new = yi - g / dg
            bad = ~np.isfinite(new) | (new <= lo_i) | (new >= hi_i)
            new = np.where(bad, 0.5 * (lo_i + hi_i), new)
            done = ((np.abs(new - yi) <= 1e-15 * np.maximum(np.abs(new), 1.0))
                    | (hi_i - lo_i <= 1e-15))
            y[idx], lo[idx], hi[idx] = new, lo_i, hi_i
            idx = idx[~done]
        if idx.size:
            logger.warning("Matérn(nu=%g) inverse table: %d roots did not converge", nu, idx.size)
        return np.exp(y)


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
    key = ALIASES.get(key, key)
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
        f"(aliases: {', '.join(f'{a}={b}' for a, b in ALIASES.items())})"
    )


__all__ = [
    "KERNELS",
    "GammaExponential",
    "Kernel",
    "Matern",
    "RationalQuadratic",
    "SquaredExponential",
    "get_kernel",
]
