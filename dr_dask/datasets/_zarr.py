"""The generator protocol and the writer that puts a generated dataset into a Zarr v3 group.

A generator (subclass of :class:`Generator`, registered with :func:`register`) produces

1. the latents ``Z`` (T x M, small: held whole),
2. a ``mapping``: the parameters shared by all rows (random weights, centres, ...), and
3. rows of ``X`` block by block from ``(mapping, Z[a:b], a)``, a pure function,

so :func:`make_dataset` can write ``X`` chunk by chunk, in this process or as one task per
chunk on a dask cluster, without ever holding T x N. Random numbers that depend on the row
(noise, latent innovations) come from :func:`normal_rows`, whose streams are keyed by a fixed
row block, so the data do not depend on ``chunk_size`` or on how work is split.

Store layout (``xarray.open_zarr(path)`` opens it as a Dataset)::

    X       (sample, feature)     float32/float64, chunks (chunk_size, n_features)
    latent  (sample, latent_dim)  float64, the true latents
    sample  (sample,)             int64 ids 0..T-1 (the index coordinate)
    attrs   generator, params, dr_dask_version, complete

The location is a local path or a URL (``s3://``, ``gs://``, ``memory://``...). Object stores
have no rename, so a store is written in place and marked ``complete`` in its root attributes
by the last write (after every chunk); :func:`dr_dask.io.inputs.open_dataset` refuses a store
marked incomplete, and the next ``make`` replaces such debris without ``overwrite``. With a
cluster the workers write their chunks directly, so they must be able to reach the location.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import warnings
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import xarray as xr
import zarr

from dr_dask import __version__
from dr_dask.io.jsonio import plain_json
from dr_dask.io.storage import Location, location
from dr_dask.runtime.cluster import active_client, gather, share

if TYPE_CHECKING:  # xarray is only needed for in-memory results; workers never import it
    import xarray as xr

logger = logging.getLogger(__name__)

#: rows per random-number stream block: noise and latent innovations for rows
#: [b * RNG_BLOCK, (b + 1) * RNG_BLOCK) always come from stream block b
RNG_BLOCK = 256

GENERATORS: dict[str, type[Generator]] = {}

_DTYPES = ("float32", "float64")


def seed_entropy(random_state: int | np.random.Generator | None) -> int:
    """A non-negative int seed from ``random_state`` (fresh OS entropy for ``None``).

    The int is stored in the dataset's attributes, so even a ``None`` seed is reproducible.
    """
    if random_state is None:
        return int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> 1)
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(0, 2**63 - 1))
    if (isinstance(random_state, (bool, np.bool_))
            or not isinstance(random_state, (int, np.integer))):
        raise ValueError(
            f"random_state must be an int, a numpy Generator or None, got {random_state!r}")
    if random_state < 0:
        raise ValueError(f"random_state must be >= 0, got {random_state}")
    return int(random_state)


def stream_rng(entropy: int, *key: int) -> np.random.Generator:
    """An independent generator for the stream ``key`` of seed ``entropy``."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy, spawn_key=key)))


def normal_rows(entropy: int, stream: int, start: int, stop: int, n_cols: int) -> np.ndarray:
    """Rows ``[start, stop)`` of an endless standard-normal matrix with ``n_cols`` columns.

    The same row always gets the same numbers however the rows are requested, because each
    block of :data:`RNG_BLOCK` rows has its own seeded stream ``(stream, block index)``.

    Returns
    -------
    ndarray, shape (stop - start, n_cols), float64
    """
    out = np.empty((stop - start, n_cols))
    for block in range(start // RNG_BLOCK, (stop - 1) // RNG_BLOCK + 1 if stop > start else 0):
        b0 = block * RNG_BLOCK
        draws = stream_rng(entropy, stream, block).standard_normal((RNG_BLOCK, n_cols))
        lo, hi = max(start, b0), min(stop, b0 + RNG_BLOCK)
        out[lo - start : hi - start] = draws[lo - b0 : hi - b0]
    return out


class Generator:
    """Base class of the dataset generators (see the module docstring for the protocol).

    Subclasses set ``name``, take ``n_samples``, ``n_features`` and ``random_state`` plus their
    own keyword options in ``__init__`` (validated there), and implement :meth:`latents`,
    :meth:`mapping` and :meth:`block`. Instances are pickled to dask workers, so keep them
    small: large parameters belong in the mapping, which is broadcast once.
    """

    name: ClassVar[str] = ""
    n_samples: int
    n_features: int
    entropy: int

    def params(self) -> dict[str, Any]:
        """JSON-able parameters recorded in the store's ``params`` attribute."""
        raise NotImplementedError

    def latents(self) -> np.ndarray:
        """The true latents, shape (n_samples, latent_dim), float64."""
        raise NotImplementedError

    def mapping(self, latent: np.ndarray) -> dict[str, np.ndarray]:
        """Parameters shared by every block of rows (may depend on all latents)."""
        raise NotImplementedError

    def block(self, mapping: dict[str, np.ndarray], latent: np.ndarray, start: int) -> np.ndarray:
        """The rows ``X[start:start + len(latent)]``, shape (len(latent), n_features), float64."""
        raise NotImplementedError


def register(cls: type[Generator]) -> type[Generator]:
    """Class decorator adding a generator to :data:`GENERATORS` under ``cls.name``."""
    if not cls.name or cls.name in GENERATORS:
        raise ValueError(f"generator name {cls.name!r} is empty or already registered")
    GENERATORS[cls.name] = cls
    return cls


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int, or a ValueError naming ``name`` (bools are not integers here)."""
    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))
            or value < minimum):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def make_dataset(
    name: str,
    path: str | os.PathLike | Location | None = None,
    *,
    n_samples: int,
    n_features: int,
    chunk_size: int = 5000,
    dtype: str = "float64",
    random_state: int | np.random.Generator | None = 0,
    overwrite: bool = False,
    client=None,
    **options: Any,
) -> xr.Dataset | str:
    """Generate dataset ``name`` and write it to a Zarr v3 group at ``path`` chunk by chunk.

    Parameters
    ----------
    name : str
        A registered generator: ``"gp"``, ``"sinusoidal"``, ``"bump"`` (IKD paper, see
        :mod:`dr_dask.datasets.ikd`) and any others listed in :data:`GENERATORS`.
    path : str or path-like, optional
        Where to write the store. ``None`` returns an in-memory ``xarray.Dataset`` instead
        (for small data and tests).
    n_samples, n_features : int
        T rows and N columns of ``X``.
    chunk_size : int
        Rows per Zarr chunk of ``X`` and per generation task; peak memory is about one chunk
        (plus the generator's mapping).
    dtype : {"float32", "float64"}
        Storage type of ``X`` (latents are always float64).
    random_state : int, numpy Generator or None
        Seeds every random draw; the resulting int seed is recorded in ``params``.
    overwrite : bool
        Replace an existing store at ``path``. Without it an existing path is an error.
    client : distributed.Client, optional
        Cluster to generate on (one task per chunk, workers write their chunks). Resolved with
        :func:`dr_dask.runtime.cluster.active_client`; ``None`` with no active client generates in
        this process.
    **options
        Generator options, e.g. ``n_components``, ``noise``, ``length_scale``, ``method``,
        ``bump`` (see each generator's docstring). An option the generator does not take is
        an error.

    Returns
    -------
    str or xarray.Dataset
        The store path, or the Dataset with ``X`` (sample, feature), ``latent``
        (sample, latent_dim) and the ``sample`` coordinate.
    """
    if name not in GENERATORS:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(sorted(GENERATORS))}")
    cls: Any = GENERATORS[name]  # a subclass: its __init__ takes the sizes and options
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ValueError(
            f"dataset {name!r} does not take option(s) {', '.join(unknown)}; "
            f"it takes: {', '.join(sorted(accepted - {'n_samples', 'n_features', 'random_state'}))}"
        )
    chunk_size = check_int("chunk_size", chunk_size, 1)
    with contextlib.suppress(TypeError):  # not a dtype: refused below by name
        dtype = np.dtype(dtype).name
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    gen = cls(
        n_samples=check_int("n_samples", n_samples, 2),
        n_features=check_int("n_features", n_features, 1),
        random_state=seed_entropy(random_state),
        **options,
    )
    if path is None:
        return _to_memory(gen, chunk_size, dtype)
    return _to_zarr(gen, location(path), chunk_size, dtype, overwrite, active_client(client))


def _attrs(gen: Generator, chunk_size: int, dtype: str) -> dict[str, Any]:

    params = {"n_samples": gen.n_samples, "n_features": gen.n_features, **gen.params()}
    params.update(random_state=gen.entropy, chunk_size=chunk_size, dtype=dtype)
    return {"generator": gen.name, "params": plain_json(params), "dr_dask_version": __version__}


def _starts(n_samples: int, chunk_size: int) -> list[int]:
    return list(range(0, n_samples, chunk_size))


def _to_memory(gen: Generator, chunk_size: int, dtype: str) -> xr.Dataset:

    latent = gen.latents()
    mapping = gen.mapping(latent)
    X = np.empty((gen.n_samples, gen.n_features), dtype=dtype)
    for a in _starts(gen.n_samples, chunk_size):
        X[a : a + chunk_size] = gen.block(mapping, latent[a : a + chunk_size], a)
    return xr.Dataset(
        {"X": (("sample", "feature"), X), "latent": (("sample", "latent_dim"), latent)},
        coords={"sample": np.arange(gen.n_samples, dtype=np.int64)},
        attrs=_attrs(gen, chunk_size, dtype),
    )


def _write_block(
    gen: Generator, mapping: dict, latent: np.ndarray | Location, start: int, array: Location,
    dtype: str, rows: int = 0,
) -> int:
    """Generate rows ``start ..`` of X and write them into the Zarr array at ``array``, from
    their ``latent`` values, or the ``rows`` of them read from the store's latent array at
    that location (on a cluster: each task reads its own, none travels in a task's spec)."""
    if isinstance(latent, Location):
        latent = np.asarray(zarr.open_array(store=latent.zarr_store(), mode="r")[
            start : start + rows])
    block = gen.block(mapping, latent, start).astype(dtype, copy=False)
    zarr.open_array(store=array.zarr_store(), mode="r+")[start : start + len(block)] = block
    return len(block)


def dataset_state(target: Location) -> str:
    """``"absent"``, ``"complete"``, ``"incomplete"`` (a killed ``make``) or ``"foreign"`` (not a
    dataset store: never deleted)."""
    meta = target.child("zarr.json").read_json()
    if meta is None:
        return "foreign" if target.exists() else "absent"
    attrs = meta.get("attributes", {})
    if "generator" not in attrs:
        return "foreign" if meta.get("node_type") != "group" or attrs else "incomplete"
    return "incomplete" if attrs.get("complete") is False else "complete"


def _to_zarr(
    gen: Generator, target: Location, chunk_size: int, dtype: str, overwrite: bool, client
) -> str:
    state = dataset_state(target)
    if state == "foreign":
        # never delete something that is not a dataset store, even when asked to overwrite
        raise FileExistsError(
            f"{target} exists and is not a Zarr store of a dataset; remove it yourself")
    if state == "complete" and not overwrite:
        raise FileExistsError(
            f"{target} already exists; pass overwrite=True (--overwrite) to replace it")
    if state != "absent":
        logger.info("replacing %s dataset store %s", state, target)
        target.delete()
    _write_store(gen, target, chunk_size, dtype, client)
    logger.info("wrote %s: X %d x %d (%s)", target, gen.n_samples, gen.n_features, gen.name)
    return target.url


def _write_store(gen: Generator, store: Location, chunk_size: int, dtype: str, client) -> None:
    T, N = gen.n_samples, gen.n_features
    latent = gen.latents()
    store.check()
    group = zarr.create_group(store=store.zarr_store(), zarr_format=3, attributes={
        "generator": gen.name, "complete": False})
    group.create_array(
        "X", shape=(T, N), chunks=(min(chunk_size, T), N), dtype=dtype,
        dimension_names=("sample", "feature"), fill_value=np.nan,
    )
    group.create_array(
        "latent", shape=latent.shape, chunks=(min(chunk_size, T), latent.shape[1]),
        dtype="float64", dimension_names=("sample", "latent_dim"), fill_value=np.nan,
    )[:] = latent
    group.create_array(
        "sample", shape=(T,), chunks=(min(chunk_size, T),), dtype="int64",
        dimension_names=("sample",), fill_value=-1,
    )[:] = np.arange(T, dtype=np.int64)
    mapping = gen.mapping(latent)
    attrs = _attrs(gen, chunk_size, dtype)  # after mapping: it may record e.g. jitter
    group.attrs.update({**attrs, "complete": False})
    starts = _starts(T, chunk_size)
    array_path = store.child("X")
    if client is None:
        for a in starts:
            _write_block(gen, mapping, latent[a : a + chunk_size], a, array_path, dtype)
    else:
        logger.info("generating %d chunks on %s", len(starts), client)
        mapping_future = share(mapping, client)
        futures = client.map(
            _write_block,
            [gen] * len(starts),
            [mapping_future] * len(starts),
            [store.child("latent")] * len(starts),
            starts,
            [array_path] * len(starts),
            [dtype] * len(starts),
            [min(chunk_size, T - a) for a in starts],
            pure=False,
        )
        written = sum(gather(futures, client))
        if written != T:  # pragma: no cover - would be a bug in the chunking
            raise RuntimeError(f"workers wrote {written} rows of X, expected {T}")
    with warnings.catch_warnings():
        # consolidated metadata lets xarray.open_zarr(path) open the store without a warning;
        # zarr notes that it is not (yet) part of the v3 spec
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        group.attrs["complete"] = True  # the mark: every chunk above is written
        zarr.consolidate_metadata(store.zarr_store())
