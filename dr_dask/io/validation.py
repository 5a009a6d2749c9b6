"""Input and parameter validation for every estimator and metric: one module.

Inputs. :func:`check_input` is what an estimator's ``fit``/``transform`` calls. In-memory
array-likes (NumPy, lists, DataFrames) go through scikit-learn's public
:func:`sklearn.utils.validation.validate_data`, so they are checked, worded and recorded
exactly as scikit-learn's own estimators do it (``n_features_in_``, ``feature_names_in_``;
complex, sparse, object, NaN/inf, empty input refused with scikit-learn's messages). Stores,
paths, URLs, zarr, xarray and dask arrays are opened by
:func:`dr_dask.io.inputs.open_dataset` and still set or check ``n_features_in_``. Either way the
estimator gets one type, :class:`~dr_dask.io.inputs.InputData`. :func:`check_array_like` is the
same for functions (metrics, kNN) that take user arrays but are not estimators.

Parameters. An estimator declares ``_parameter_constraints`` (a dict naming every ``__init__``
parameter, as scikit-learn's own estimators do) and calls :func:`check_params` first in
``fit``. The constraint vocabulary (:class:`Interval`, :class:`Options`, ``None``, a type,
``"random_state"``, ``"array-like"``, ``callable``, ``"no_validation"``) and the message
("The 'alpha' parameter of LSDR must be a float in the range (0, 1). Got 2 instead.") follow
scikit-learn's; the implementation is ours because scikit-learn's is private API
(``sklearn.utils._param_validation``), which its developer guide asks third-party estimators
not to rely on. Checks that relate two parameters or a parameter to the data stay in the
estimator, after :func:`check_params`.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from numbers import Integral, Real
from typing import Any

import dask
import numba
import numpy as np

from dr_dask.io import anndata
from dr_dask.io.inputs import InputData, InputError, memory_input, open_dataset
from dr_dask.io.storage import Location
from dr_dask.runtime import config
from dr_dask.runtime.cluster import active_client, compute
from dr_dask.runtime.credential_delivery import deliver_credentials

logger = logging.getLogger(__name__)

#: dtypes kept as they are; anything else numeric is converted to the first.
FLOAT_DTYPES = (np.float64, np.float32)

__all__ = [
    "FLOAT_DTYPES",
    "DuplicatePointsWarning",
    "Interval",
    "Options",
    "ParameterError",
    "check_array_like",
    "check_input",
    "check_params",
    "checked_rows",
    "clamp_to_samples",
    "duplicates_reported",
    "first_equal_rows",
    "is_stored",
    "non_negative",
    "positive",
    "warn_duplicates",
]


# ---------------------------------------------------------------------------------------------
# inputs


def is_stored(X: Any) -> bool:
    """True for inputs that go through the store boundary rather than scikit-learn's checks:
    paths, URLs, :class:`~dr_dask.io.storage.Location`, dask / zarr / xarray objects, a
    backed AnnData object (its file holds the data)."""
    if isinstance(X, (str, os.PathLike, Location, InputData)):
        return True
    if anndata.is_anndata(X):
        return bool(getattr(X, "isbacked", False))
    module = type(X).__module__.split(".")[0]
    return module in ("dask", "zarr", "xarray")


def check_input(
    estimator: Any,
    X: Any,
    *,
    reset: bool,
    in_memory: bool = False,
    dtype: Any = FLOAT_DTYPES,
    min_samples: int = 1,
    min_features: int = 1,
    variable: str | None = None,
    storage_options: dict | None = None,
    stage: bool = False,
) -> InputData:
    """Validate the samples x features input of an estimator's ``fit`` or ``transform``.

    On a cluster the workers read and write the stores themselves: the credentials of the
    input's store and of any store given as the estimator's parameter are delivered to them
    here, once (:func:`~dr_dask.runtime.credential_delivery.deliver_credentials`).

    Parameters
    ----------
    estimator : estimator instance
        Its ``n_features_in_`` (and ``feature_names_in_``) is set when ``reset``, else checked.
    X : array-like, dask / zarr / xarray array, AnnData, path, URL, Location or InputData
        Of shape (T, N). Paths take the ``"STORE[:VAR]"`` form of
        :func:`dr_dask.io.inputs.open_dataset`; an AnnData object (in memory or backed),
        ``.h5ad`` file or AnnData-Zarr store gives its ``X`` or the element ``variable``
        names (:mod:`dr_dask.io.anndata`). Never modified.
    reset : bool
        True in ``fit`` (record the number of features), False in ``transform`` (check it).
    in_memory : bool, default=False
        The estimator works on a NumPy array: a stored input is read whole and then checked
        like an in-memory one (values included), and ``InputData.values`` holds the array.
        False: a stored input stays lazy and only its structure is checked here (the values
        are the caller's, e.g. :func:`check_values` in a run stage).
    dtype : dtype or tuple of dtypes, default=(float64, float32)
        Accepted dtypes of in-memory data; anything else numeric is converted to the first.
    min_samples : int, default=1
        Fewest rows accepted (scikit-learn's ``ensure_min_samples``).
    min_features : int, default=1
        Fewest columns accepted (scikit-learn's ``ensure_min_features``).
    variable : str, optional
        Variable of a group, Dataset or NetCDF file; element of an AnnData (``X``,
        ``layers/NAME``, ``obsm/NAME``).
    storage_options : dict, optional
        For the filesystem of a URL.
    stage : bool, default=False
        For a caller that hands ``data`` to a cluster's workers: an in-memory array is
        written where they read it (:func:`dr_dask.io.inputs.rows_for_workers`) when the
        estimator has a client. Callers that use only ``values`` leave it (their neighbour
        searches stage what they send): writing the rows was a third of a second of an
        Isomap fit of 80 MB on a LocalCluster, for nothing.

    Returns
    -------
    InputData
        ``data`` of shape (T, N) is a row-chunked dask array; ``values`` is the checked
        NumPy array for in-memory inputs and when ``in_memory``, else None.

    Raises
    ------
    ValueError
        scikit-learn's messages for in-memory data (complex, NaN/inf, empty, wrong number of
        features, 1-D); :class:`~dr_dask.io.inputs.InputError` (a ValueError) for stores; a
        dr_dask knob of dask's configuration that is not a valid value, named.
    TypeError
        Sparse input (dense data is required).
    """
    config.check()  # the knobs are read mid-fit: a bad one fails here, before any work
    if anndata.is_anndata(X):  # its element, checked as that kind of input; rows named by cell
        rows, obs_names = anndata.element(X, variable)
        inp = check_input(estimator, rows, reset=reset, in_memory=in_memory, dtype=dtype,
                          min_samples=min_samples, min_features=min_features, stage=stage)
        inp.sample_ids = obs_names
        return inp
    if is_stored(X):
        inp = X if isinstance(X, InputData) else open_dataset(X, variable, storage_options)
        _deliver_store_credentials(estimator, inp.location)
        if not in_memory:
            from sklearn.utils.validation import validate_data  # lazy: not on workers (__init__)

            # structure checked by open_dataset; the feature count as scikit-learn does it
            validate_data(estimator, inp.data, reset=reset, skip_check_array=True)
            shape = tuple(inp.data.shape)
            for axis, what, least in ((0, "sample", min_samples), (1, "feature", min_features)):
                if shape[axis] < least:
                    raise ValueError(
                        f"Found array with {shape[axis]} {what}(s) (shape={shape}) while a "
                        f"minimum of {least} is required by {type(estimator).__name__}.")
            return inp
        # read on the estimator's client like all its dask work (threads without one): a
        # dask input may hold futures of that cluster
        (values,) = compute(inp.data, client=getattr(estimator, "client", None))
        values = _validate(estimator, values, inp.sample_ids, reset=reset,
                           dtype=dtype, ensure_min_samples=min_samples,
                           ensure_min_features=min_features)
        return replace(inp, values=values)
    values = _validate(estimator, X, None, reset=reset, dtype=dtype,
                       ensure_min_samples=min_samples, ensure_min_features=min_features)
    _deliver_store_credentials(estimator, None)
    return memory_input(values, active_client(getattr(estimator, "client", None))
                        if stage else None)


def _deliver_store_credentials(estimator: Any, input_location: Location | None) -> None:
    """The workers read and write the stores themselves: the credentials (storage options) of
    the input's store and of every store given as a parameter (``scratch``,
    ``geodesic_store``) reach the estimator's workers once, never in a task graph."""
    client = active_client(getattr(estimator, "client", None))
    if client is None:
        return
    for store in (input_location, *estimator.get_params(deep=False).values()):
        if isinstance(store, Location):
            deliver_credentials(client, store.storage_options)


def _validate(estimator: Any, X: Any, sample_ids: np.ndarray | None, **params: Any) -> np.ndarray:
    """scikit-learn's ``validate_data``; its non-finite message names the offending rows."""
    from sklearn.utils.validation import validate_data  # lazy: not on workers (__init__)

    try:
        return validate_data(estimator, X, **params)
    except ValueError as exc:
        if not str(exc).startswith("Input X contains"):
            raise
        values = np.asarray(X, dtype=np.float64)  # lists and object arrays too
        bad = np.flatnonzero(~np.isfinite(values.reshape(len(values), -1)).all(axis=1))
        # the first line is scikit-learn's; the rest of its message is about supervised models
        first = str(exc).splitlines()[0]
        rows = describe_rows(bad, sample_ids)
        raise ValueError(f"{first} Non-finite values in {rows}.") from None


def output_dtype(X: Any) -> np.dtype:
    """The dtype of an estimator's outputs for input ``X`` (an array, or anything with a
    ``dtype``): float32 stays float32 (as scikit-learn's transformers keep it), anything else
    is float64. The work itself is float64."""
    return np.dtype(np.float32) if getattr(X, "dtype", None) == np.float32 else np.dtype(
        np.float64)


def checked_rows(estimator: Any, X: Any, *, reset: bool, min_samples: int = 1) -> np.ndarray:
    """An estimator's rows in memory, checked (:func:`check_input`) and as float64; on a fit
    (``reset``) the estimator's outputs keep the input's float32 (``_out_dtype``)."""
    values = check_input(estimator, X, reset=reset, in_memory=True, dtype=FLOAT_DTYPES,
                         min_samples=min_samples).values
    assert values is not None  # in_memory=True always holds the checked values
    if reset:
        estimator._out_dtype = output_dtype(values)
    return values.astype(np.float64, copy=False)


def check_array_like(a: Any, name: str, *, ensure_2d: bool = True, dtype: Any = np.float64,
                     **check_params: Any) -> np.ndarray:
    """A function's user array (not an estimator's input) as a checked NumPy array.

    Parameters
    ----------
    a : array-like or dask array
        A dask array is computed (the caller's data are small enough by contract).
    name : str
        The argument's name, used in messages ("Input latent contains NaN.").
    ensure_2d : bool, default=True
        Refuse 1-D input (scikit-learn's "Reshape your data" message); False keeps 1-D.
    dtype : dtype or tuple of dtypes, default=float64
    **check_params
        Further :func:`sklearn.utils.check_array` options (``ensure_all_finite=False`` where
        the caller names the non-finite rows itself, block by block).

    Returns
    -------
    ndarray
    """
    from sklearn.utils.validation import check_array  # lazy: not on workers (__init__)

    if hasattr(a, "compute"):
        a = a.compute()
    return check_array(a, dtype=dtype, ensure_2d=ensure_2d, input_name=name, **check_params)


# ---------------------------------------------------------------------------------------------
# parameters


class ParameterError(ValueError, TypeError):
    """A parameter has an invalid type or value (a ValueError and a TypeError, like
    scikit-learn's ``InvalidParameterError``)."""


def parameter_errors() -> tuple[type[Exception], ...]:
    """What a parameter out of its range or type raises: :class:`ParameterError` (the
    package's checks) and scikit-learn's ``InvalidParameterError`` (its estimators' checks,
    e.g. a baseline's): the one place that names scikit-learn's private class."""
    from sklearn.utils._param_validation import (  # lazy: not on workers (__init__)
        InvalidParameterError,
    )

    return (ParameterError, InvalidParameterError)


@dataclass(frozen=True)
class Interval:
    """Numbers of ``type`` (``Integral`` or ``Real``) between ``left`` and ``right`` (None:
    unbounded); ``closed`` is "both", "left", "right" or "neither". Booleans never match."""

    type: type
    left: float | None
    right: float | None
    closed: str = "both"

    def __contains__(self, value: Any) -> bool:
        right_type = isinstance(value, self.type) and not isinstance(value, bool)
        if not right_type:
            return False
        if np.isnan(value):
            return False
        low_open = self.closed in ("right", "neither")
        high_open = self.closed in ("left", "neither")
        return not (
            (self.left is not None and (value < self.left or (low_open and value == self.left)))
            or (self.right is not None
                and (value > self.right or (high_open and value == self.right))))

    def __str__(self) -> str:
        kind = "an int" if self.type is Integral else "a float"
        lo = "-inf" if self.left is None else self.left
        hi = "inf" if self.right is None else self.right
        left = "[" if self.closed in ("both", "left") and self.left is not None else "("
        right = "]" if self.closed in ("both", "right") and self.right is not None else ")"
        return f"{kind} in the range {left}{lo}, {hi}{right}"


@dataclass(frozen=True)
class Options:
    """One of a fixed set of values (strings, typically)."""

    values: frozenset

    def __init__(self, values: Iterable):
        object.__setattr__(self, "values", frozenset(values))

    def __contains__(self, value: Any) -> bool:
        try:
            return value in self.values
        except TypeError:  # unhashable values are no option
            return False

    def __str__(self) -> str:
        return f"a str among {{{', '.join(repr(v) for v in sorted(self.values, key=str))}}}"


def _satisfies(value: Any, constraint: Any) -> bool:
    if constraint is None:
        return value is None
    if isinstance(constraint, (Interval, Options)):
        return value in constraint
    if constraint == "random_state":
        return value is None or isinstance(value, np.random.RandomState) or (
            isinstance(value, Integral) and not isinstance(value, bool)
            and 0 <= int(value) <= 2**32 - 1)
    if constraint == "array-like":
        return isinstance(value, (np.ndarray, list, tuple))
    if constraint is callable:
        return callable(value)
    if constraint == "boolean":
        return isinstance(value, (bool, np.bool_))
    if isinstance(constraint, type):
        return isinstance(value, constraint) and not (
            isinstance(value, bool) and constraint in (int, float, Integral, Real))
    raise TypeError(f"unknown parameter constraint {constraint!r}")


def _describe(constraint: Any) -> str:
    if constraint is None:
        return "None"
    if constraint is callable:
        return "a callable"
    if isinstance(constraint, type):
        return f"an instance of {constraint.__name__!r}"
    words = {"random_state": "an int in the range [0, 4294967295], an instance of "
                             "'numpy.random.RandomState' or None",
             "array-like": "an array-like", "boolean": "a bool"}
    return words.get(constraint, str(constraint))


def check_params(estimator: Any, constraints: dict[str, list | str] | None = None) -> None:
    """Check every parameter of ``estimator`` against its declared constraints.

    Parameters
    ----------
    estimator : estimator instance
    constraints : dict, optional
        ``{parameter: [constraint, ...] or "no_validation"}``; default the estimator's
        ``_parameter_constraints``. A value is valid when it satisfies any constraint of its
        list.

    Raises
    ------
    ParameterError
        "The 'alpha' parameter of LSDR must be a float in the range (0, 1). Got 2 instead."
    """
    constraints = estimator._parameter_constraints if constraints is None else constraints
    params = estimator.get_params(deep=False)
    for name, allowed in constraints.items():
        if allowed == "no_validation":
            continue
        value = params[name]
        if any(_satisfies(value, c) for c in allowed):
            continue
        described = [_describe(c) for c in allowed]
        listed = (f"{', '.join(described[:-1])} or {described[-1]}" if len(described) > 1
                  else described[0])
        raise ParameterError(f"The {name!r} parameter of {type(estimator).__name__} must be "
                             f"{listed}. Got {value!r} instead.")


def clamp_to_samples(estimator: Any, name: str, n_samples: int, *, stacklevel: int = 3) -> int:
    """The parameter ``name`` of ``estimator``, or ``n_samples`` with a warning if it is larger.

    For counts of training points to pick (landmarks): a default sized for large data sets then
    works on small ones, as scikit-learn's ``Nystroem`` clamps its ``n_components``.
    ``stacklevel`` is the warning's (the default points at the caller's caller: who called
    ``fit``, when ``fit`` calls this).
    """
    value = int(getattr(estimator, name))
    if value <= n_samples:
        return value
    warnings.warn(
        f"{name}={value} is more than the {n_samples} samples of X: {type(estimator).__name__} "
        f"uses {name}={n_samples} (every sample)", UserWarning, stacklevel=stacklevel)
    return int(n_samples)


def non_negative(kind: type = Real) -> Interval:
    """Numbers >= 0 (shorthand for the most common constraint, with :func:`positive`)."""
    return Interval(kind, 0, None, closed="left")


def positive(kind: type = Real) -> Interval:
    """Numbers > 0 (``Integral``: >= 1)."""
    return Interval(kind, 1, None, closed="left") if kind is Integral else Interval(
        kind, 0, None, closed="neither")


# ---------------------------------------------------------------------------------------------
# duplicate points: one policy for every estimator


class DuplicatePointsWarning(UserWarning):
    """Some points coincide exactly. They are kept (a neighbour graph joins them by zero-length
    edges) and embedded together; no estimator drops or refuses them."""


#: Set by :func:`duplicates_reported`: the points at hand were warned about already.
_DUPLICATES_REPORTED: ContextVar[bool] = ContextVar("duplicates_reported", default=False)


@contextmanager
def duplicates_reported() -> Iterator[None]:
    """Inside, :func:`warn_duplicates` is quiet: the caller has warned about these points (an
    estimator fitting another on part of its data). A context variable, so other threads keep
    warning (``warnings.catch_warnings`` swaps the process's filters and is not thread-safe)."""
    token = _DUPLICATES_REPORTED.set(True)
    try:
        yield
    finally:
        _DUPLICATES_REPORTED.reset(token)


def warn_duplicates(first: np.ndarray, *, stacklevel: int = 2) -> None:
    """Warn with :class:`DuplicatePointsWarning` when some rows repeat an earlier one.

    ``first[i]`` is the index of the first row equal to row i (i itself when none is earlier),
    as :func:`first_equal_rows` returns it. The message counts the points that have a twin
    and names one pair.
    """
    first = np.asarray(first)
    later = np.flatnonzero(first != np.arange(len(first)))
    _warn_duplicate_rows(later, first[later], stacklevel=stacklevel + 1)


def _warn_duplicate_rows(later: np.ndarray, first: np.ndarray, *, stacklevel: int) -> None:
    """:func:`warn_duplicates` of the rows ``later`` that repeat an earlier row, ``first`` of
    each the first row equal to it (the other rows need not be listed)."""
    if later.size == 0 or _DUPLICATES_REPORTED.get():
        return
    n_points = len(later) + len(np.unique(first))  # every member of a repeated group
    e = int(np.argmin(later))
    i, j = int(first[e]), int(later[e])
    msg = (f"{n_points} points have exact duplicates (e.g. rows {i} and {j}); they are kept, "
           "joined by zero-length edges where a graph is built, and get identical embeddings")
    logger.warning(msg)
    warnings.warn(msg, DuplicatePointsWarning, stacklevel=stacklevel + 1)


def first_equal_rows(X: np.ndarray) -> np.ndarray:
    """For each row of X (or each entry of a 1-D array of row fingerprints), the index of the
    first row equal to it."""
    X = np.asarray(X)
    _, first, inverse = np.unique(X, axis=0, return_index=True, return_inverse=True)
    return first[inverse.ravel()]


def _row_fingerprints(block: np.ndarray) -> np.ndarray:
    """A 64-bit fingerprint of each row's float64 values, so duplicates are found without
    holding the rows: splitmix64 of each value's bits salted by its column, summed (equal rows
    give equal sums; the mixing makes unequal rows collide only by chance, ~T^2 / 2^65)."""
    # + 0.0 turns -0.0 into 0.0: equal values, different bits
    return _fingerprints((np.asarray(block, dtype=np.float64) + 0.0).view(np.uint64))


@numba.njit(cache=True, nogil=True)
def _fingerprints(bits: np.ndarray) -> np.ndarray:
    # compiled: one pass without temporaries, 6x NumPy's chain of whole-array operations
    n, m = bits.shape
    out = np.zeros(n, np.uint64)
    for i in range(n):
        h = np.uint64(0)
        for j in range(m):
            z = bits[i, j] + np.uint64(j + 1) * np.uint64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            h += z ^ (z >> np.uint64(31))
        out[i] = h
    return out


#: Rows per bucket of the duplicate search: the fingerprints are split into about T / this
#: many buckets by value, each searched by one task, so that no process holds all T of them
#: and their sort.
DUPLICATE_BUCKET_ROWS = 1 << 22


def _scan_block(block: np.ndarray, start: int, check_constant: bool, n_buckets: int) -> tuple:
    """One block's non-finite and (``check_constant``) constant rows, as row indices, and its
    rows' fingerprints with their indices split into ``n_buckets`` buckets by value."""
    block = np.asarray(block)
    finite = np.isfinite(block)
    bad = ~finite.all(axis=1)
    const = np.zeros(len(block), bool)
    if check_constant and block.shape[1]:
        const = np.ptp(np.where(finite, block, 0), axis=1) == 0
    prints = _row_fingerprints(block)
    bucket = (prints % np.uint64(n_buckets)).astype(np.intp)
    order = np.argsort(bucket, kind="stable")
    cuts = np.cumsum(np.bincount(bucket, minlength=n_buckets))[:-1]
    rows = start + order
    return ((start + np.flatnonzero(bad), start + np.flatnonzero(const)),
            list(zip(np.split(prints[order], cuts), np.split(rows, cuts))))


def _bucket_duplicates(*parts: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The rows of one bucket's fingerprints that repeat an earlier row, and that row."""
    prints = np.concatenate([p[0] for p in parts])
    rows = np.concatenate([p[1] for p in parts])
    order = np.lexsort((rows, prints))  # by fingerprint, then row: a group's first row first
    prints, rows = prints[order], rows[order]
    starts = np.r_[True, prints[1:] != prints[:-1]]
    first = rows[np.flatnonzero(starts)][np.cumsum(starts) - 1]
    later = ~starts
    return rows[later], first[later]


def describe_rows(rows: np.ndarray, ids: np.ndarray | None, limit: int = 10) -> str:
    shown = rows[:limit] if ids is None else ids[rows[:limit]]
    more = f" and {len(rows) - limit} more" if len(rows) > limit else ""
    return f"{len(rows)} row(s): {', '.join(str(x) for x in shown)}{more}"


def check_values(
    inp: InputData,
    *,
    min_samples: int = 2,
    constant_rows: bool = False,
    client: Any = None,
) -> None:
    """Check the values of an input; one pass over the data.

    Parameters
    ----------
    inp : InputData
    min_samples : int
        Fewest rows accepted (IKD needs n_components + 2).
    constant_rows : bool
        Reject rows with a single repeated value (their correlation is undefined).
    client : distributed.Client, optional

    Raises
    ------
    InputError
        Naming the offending rows (by sample id when the input has them).

    Warns
    -----
    DuplicatePointsWarning
        When rows repeat (found by row fingerprints, see :func:`warn_duplicates`).
    """
    T, N = inp.data.shape
    if min_samples > T:
        raise InputError(f"{inp.name} has {T} samples; at least {min_samples} are needed")
    if N < 2 and constant_rows:
        raise InputError(f"{inp.name} has {N} feature(s); a correlation needs at least 2")
    X = inp.data.rechunk({1: -1})
    starts = np.cumsum((0, *X.chunks[0][:-1]))
    n_buckets = -(-T // DUPLICATE_BUCKET_ROWS)
    scan = dask.delayed(_scan_block, pure=True, nout=2)
    scans = [scan(b, int(a), constant_rows, n_buckets)
             for b, a in zip(X.to_delayed().ravel(), starts)]
    duplicates = dask.delayed(_bucket_duplicates, pure=True)
    graph = ([flagged for flagged, _ in scans],
             [duplicates(*[buckets[b] for _, buckets in scans]) for b in range(n_buckets)])
    # an array already in this process (``values``) is checked here: on a cluster the whole
    # array would travel in the graph to the workers for a check that reads it once
    if inp.values is not None:
        flagged, pairs = dask.compute(*graph, scheduler="threads")
    else:
        flagged, pairs = compute(*graph, client=client)
    bad = np.concatenate([f[0] for f in flagged])
    if bad.size:
        raise InputError(
            f"{inp.name} has NaN or infinite values in {describe_rows(bad, inp.sample_ids)}"
        )
    const = np.concatenate([f[1] for f in flagged])
    if const.size:
        raise InputError(
            f"{inp.name} has constant rows (zero variance, undefined correlation) in "
            f"{describe_rows(const, inp.sample_ids)}; use similarity='covariance' or drop them"
        )
    _warn_duplicate_rows(np.concatenate([p[0] for p in pairs]),
                         np.concatenate([p[1] for p in pairs]), stacklevel=3)
