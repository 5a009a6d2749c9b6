"""A safe, versioned file format for fitted :class:`~dr_dask.methods.gp_isomap.GPIsomap` models.

A model is a Zarr group: every array (batch points, neighbour graphs, GP weights, stitch) is a
Zarr array of a numeric dtype, everything else (parameters, scalars) is JSON in the group's
attributes. Reading one runs no code from the file, unlike pickle, so a model found on a
shared store is safe to load. The group carries ``format`` and ``format_version``; a model
written by another format version is refused with a clear error instead of being misread.
The attributes are written last, so a group whose writer died half-way is refused too.

Layout::

    attrs   format, format_version, params (JSON), fitted (JSON scalars), has_batch
    labels, outliers, embedding, stitch_rotation, stitch_translation, support, [batch]
    manifold_{i}/   attrs: scalars of the GP and its kernel
                    points, graph_data, graph_indices, graph_indptr (the neighbour graph,
                    CSR), beta, local_embedding, [eigvals, eigvecs, row_means]

Version 2 keeps each manifold's neighbour graph where version 1 kept its n x n geodesics
(recomputed from the graph by the first mapping): a model of n points is O(n k), not O(n^2).

``save_gp_isomap``/``load_gp_isomap`` take a Zarr group (any store: local, s3, memory) or a
path/URL that ``zarr.open_group`` accepts.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp
import zarr
from sklearn.utils.validation import check_is_fitted
from zarr.core.metadata import ArrayV3Metadata

from dr_dask.io.storage import Location
from dr_dask.io.validation import ParameterError, check_params
from dr_dask.methods._gp import KERNELS, KernelSpec, ManifoldGP
from dr_dask.methods.gp_isomap import GPIsomap
from dr_dask.methods.persistence import ModelFormatError

logger = logging.getLogger(__name__)

FORMAT = "dr_dask.GPIsomap"
FORMAT_VERSION = 2

_ARRAYS = ("labels_", "outliers_", "embedding_", "stitch_rotation_", "stitch_translation_",
           "support_")
_SCALARS = ("n_manifolds_", "n_features_in_", "sigma_t_", "threshold_source_",
            "threshold_quantile_")
_GP_ARRAYS = ("points", "beta")
_GRAPH_ARRAYS = ("data", "indices", "indptr")
_GP_SCALARS = ("length_scale", "noise_variance", "jitter", "novelty_length_scale",
               "novelty_noise", "link_scale", "n_neighbors")
_SPEC_ARRAYS = ("eigvals", "eigvecs", "row_means")


def _group(where: Any, mode: Literal["r", "a"]) -> zarr.Group:

    if isinstance(where, zarr.Group):
        return where
    if isinstance(where, Location):  # any local path or URL, with its storage options
        where = where.zarr_store(read_only=mode == "r")
    try:
        return zarr.open_group(where, mode=mode)
    except (FileNotFoundError, zarr.errors.GroupNotFoundError) as exc:
        raise ModelFormatError(f"{where} holds no GPIsomap model (no Zarr group)") from exc


def _plain(v: Any) -> Any:
    """A JSON value from a parameter (NumPy scalars to Python)."""
    return v.item() if isinstance(v, np.generic) else v


def _params(model: Any) -> tuple[dict, np.ndarray | None]:
    params = model.get_params(deep=False)
    params.pop("client", None)  # a live connection is not state
    labels = None
    c = params["clusterer"]
    if callable(c):
        raise TypeError("a GPIsomap with a callable clusterer cannot be saved safely (the "
                        "file would have to carry code); pass labels or 'tangent'")
    if not isinstance(c, str):
        labels, params["clusterer"] = np.asarray(c), None
    rs = params["random_state"]
    if rs is not None and not isinstance(rs, (int, np.integer)):
        params["random_state"] = None  # a RandomState's stream is not a parameter to keep
        logger.info("random_state object not saved (only an int seed is)")
    return {k: _plain(v) for k, v in params.items()}, labels


def save_gp_isomap(model: Any, where: Any, batch: np.ndarray | None = None) -> zarr.Group:
    """Write a fitted GPIsomap (and optionally its batch) into a Zarr group.

    Parameters
    ----------
    model : GPIsomap
        Fitted.
    where : zarr.Group or str
        The group (it is overwritten) or a path/URL to create it at.
    batch : ndarray of shape (n, D), optional
        The batch the model was fitted on (the stream runner refits on it).

    Returns
    -------
    zarr.Group
    """

    check_is_fitted(model, "manifolds_")
    params, labels = _params(model)
    g = _group(where, "a")
    g.attrs.clear()  # incomplete until the attributes are written back, last
    for name in list(g.keys()):
        del g[name]

    def put(grp, name, arr):
        grp.create_array(name, data=np.ascontiguousarray(arr))

    for name in _ARRAYS:
        put(g, name.rstrip("_"), getattr(model, name))
    if labels is not None:
        put(g, "clusterer_labels", labels)
    if batch is not None:
        put(g, "batch", np.asarray(batch, dtype=np.float64))
    for i, gp in enumerate(model.manifolds_):
        _put_manifold(g.create_group(f"manifold_{i}"), gp, model.local_embedding_[i])
    fitted = {k: _plain(getattr(model, k)) for k in _SCALARS if hasattr(model, k)}
    g.attrs.update({"format": FORMAT, "format_version": FORMAT_VERSION, "params": params,
                    "fitted": fitted, "has_batch": batch is not None})
    return g


def _put_manifold(m: zarr.Group, gp: Any, local_embedding: np.ndarray) -> None:
    """One manifold's GP into its group ``m``."""
    arrays = {**{name: getattr(gp, name) for name in _GP_ARRAYS},
              **{f"graph_{name}": getattr(gp.graph, name) for name in _GRAPH_ARRAYS},
              "local_embedding": local_embedding,
              **{name: getattr(gp.spec, name) for name in _SPEC_ARRAYS
                 if getattr(gp.spec, name) is not None}}
    for name, arr in arrays.items():
        m.create_array(name, data=np.ascontiguousarray(arr))
    m.attrs.update({**{k: _plain(getattr(gp, k)) for k in _GP_SCALARS},
                    "kind": gp.spec.kind, "cailliez": float(gp.spec.cailliez),
                    "grand_mean": float(gp.spec.grand_mean)})


#: Codecs a model array may use: byte layout, compression and checksums only, so that no
#: codec that deserialises objects is ever run on a file from a shared store.
SAFE_CODECS = {"bytes", "zstd", "blosc", "gzip", "crc32c", "transpose"}


def _array(grp: zarr.Group, name: str) -> np.ndarray:
    arr = grp[name]
    if not isinstance(arr, zarr.Array) or arr.dtype.kind not in "biuf":
        raise ModelFormatError(f"model array {name!r} is not a numeric array")
    if not isinstance(arr.metadata, ArrayV3Metadata):  # v2 arrays name codecs another way
        raise ModelFormatError(f"model array {name!r} is not a Zarr v3 array")
    codecs = {str(c.to_dict()["name"]) for c in arr.metadata.codecs}
    if not codecs <= SAFE_CODECS:
        raise ModelFormatError(f"model array {name!r} uses codecs {sorted(codecs - SAFE_CODECS)}"
                               f"; a model may only use {sorted(SAFE_CODECS)}")
    return np.asarray(arr[...])


def load_gp_isomap(where: Any) -> tuple[Any, np.ndarray | None]:
    """Read a model written by :func:`save_gp_isomap`.

    Parameters
    ----------
    where : zarr.Group or str

    Returns
    -------
    model : GPIsomap
        Fitted, ``client=None``.
    batch : ndarray of shape (n, D) or None

    Raises
    ------
    ModelFormatError
        Not a GPIsomap model, an incomplete one, or one of another format version.
    """

    g = _group(where, "r")
    attrs = dict(g.attrs)
    if attrs.get("format") != FORMAT:
        raise ModelFormatError(f"{where} holds no complete GPIsomap model (format attribute "
                               f"{attrs.get('format')!r}, expected {FORMAT!r})")
    version = attrs.get("format_version")
    if version != FORMAT_VERSION:
        raise ModelFormatError(
            f"{where} was written in GPIsomap model format version {version}; this dr_dask "
            f"reads version {FORMAT_VERSION} only: refit the model with this version")
    try:
        model, batch = _read(g, attrs, GPIsomap, KernelSpec, ManifoldGP)
    except ModelFormatError as exc:
        raise ModelFormatError(f"{where}: {exc}") from exc
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise ModelFormatError(f"{where} is not a readable GPIsomap model of format version "
                               f"{FORMAT_VERSION}: {exc!r}") from exc
    check_model(model, str(where))
    if batch is not None:
        _finite(batch, str(where), "batch")
        if batch.ndim != 2 or batch.shape[1] != model.n_features_in_:
            raise ModelFormatError(f"{where}: batch has shape {batch.shape}, expected "
                                   f"(n, {model.n_features_in_})")
    return model, batch


def _finite(value: Any, where: str, field: str) -> None:
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf" or not np.isfinite(arr).all():
        raise ModelFormatError(f"{where}: {field} holds non-finite or non-numeric values")


def check_model(model: Any, where: str) -> None:
    """Refuse a GPIsomap that fit could not have produced: a loaded (or refitted) model is
    held to what ``fit`` guarantees before it maps a single point.

    Checked: every parameter against ``GPIsomap._parameter_constraints`` (the rule ``fit``
    applies), every array and scalar finite, and the shapes that mapping combines consistent.

    Raises
    ------
    ModelFormatError
        Naming ``where`` and the field.
    """
    try:
        check_params(model)
    except ParameterError as exc:
        raise ModelFormatError(f"{where}: {exc}") from None
    p = len(model.manifolds_)
    D = model.n_features_in_
    if not (isinstance(D, int) and D >= 1 and model.n_manifolds_ == p >= 1):
        raise ModelFormatError(f"{where}: n_features_in_ {D!r} / n_manifolds_ "
                               f"{model.n_manifolds_!r} do not describe the manifolds stored")
    sigma_t = model.sigma_t_
    if not isinstance(sigma_t, (int, float)) or not (np.isfinite(sigma_t) and sigma_t > 0):
        raise ModelFormatError(f"{where}: sigma_t_ must be a positive number, got {sigma_t!r}")
    for name in _ARRAYS:
        _finite(getattr(model, name), where, name)
    R = model.stitch_rotation_
    d = int(model.n_components)
    if R.ndim != 3 or R.shape[0] != p or R.shape[2] != d or \
            model.stitch_translation_.shape != R.shape[:2]:
        raise ModelFormatError(f"{where}: stitch_rotation_ {R.shape} / stitch_translation_ "
                               f"{model.stitch_translation_.shape} do not fit {p} manifolds of "
                               f"dimension {d}")
    for i, gp in enumerate(model.manifolds_):
        _check_manifold(model, i, gp, where)


def _check_manifold(model: Any, i: int, gp: Any, where: str) -> None:
    """Manifold ``i``'s GP of a model: finite arrays, non-negative scalars, a known kernel and
    shapes consistent with the model's features and components."""
    D, d = model.n_features_in_, int(model.n_components)
    field = f"manifold_{i}"
    for name in (*_GP_ARRAYS, *_SPEC_ARRAYS):
        value = getattr(gp, name, None)
        if value is None:
            value = getattr(gp.spec, name, None)
        if value is not None:
            _finite(value, where, f"{field}/{name}")
    _finite(model.local_embedding_[i], where, f"{field}/local_embedding")
    for name in _GP_SCALARS:
        value = getattr(gp, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not np.isfinite(value) or value < 0:
            raise ModelFormatError(f"{where}: {field} {name} must be a non-negative "
                                   f"number, got {value!r}")
    if gp.spec.kind not in KERNELS:
        raise ModelFormatError(f"{where}: {field} kind must be one of {list(KERNELS)}, "
                               f"got {gp.spec.kind!r}")
    n = len(gp.points)
    if gp.points.shape != (n, D) or gp.graph.shape != (n, n) or len(gp.beta) != n \
            or model.local_embedding_[i].shape != (n, d):
        raise ModelFormatError(f"{where}: {field} arrays have inconsistent shapes (points "
                               f"{gp.points.shape}, graph {gp.graph.shape}, beta "
                               f"{gp.beta.shape}, local_embedding "
                               f"{model.local_embedding_[i].shape}) for {D} features")
    _finite(gp.graph.data, where, f"{field}/graph_data")
    try:
        gp.graph.check_format(full_check=True)  # indices in range, indptr monotone
    except ValueError as exc:
        raise ModelFormatError(f"{where}: {field} graph is not a valid CSR matrix: "
                               f"{exc}") from None
    if gp.graph.nnz and gp.graph.data.min() < 0:
        raise ModelFormatError(f"{where}: {field} graph has negative edge lengths")


def _read(g: zarr.Group, attrs: dict, GPIsomap, KernelSpec, ManifoldGP):
    params = dict(attrs["params"])
    unknown = set(params) - set(GPIsomap().get_params())
    if unknown:
        raise TypeError(f"unknown parameters {sorted(unknown)}")
    if params.get("clusterer") is None:
        params["clusterer"] = _array(g, "clusterer_labels")
    model = GPIsomap(**params)
    for name in _ARRAYS:
        setattr(model, name, _array(g, name.rstrip("_")))
    for k, v in attrs["fitted"].items():
        setattr(model, k, v)
    model.manifolds_, model.local_embedding_ = [], []
    for i in range(int(model.n_manifolds_)):
        m = g[f"manifold_{i}"]
        if not isinstance(m, zarr.Group):
            raise ModelFormatError(f"model entry manifold_{i} is not a Zarr group")
        a = dict(m.attrs)
        spec = KernelSpec(a["kind"], cailliez=a["cailliez"], grand_mean=a["grand_mean"],
                          **{k: _array(m, k) for k in _SPEC_ARRAYS if k in m})
        n = len(_array(m, "points"))
        graph = sp.csr_matrix(tuple(_array(m, f"graph_{k}") for k in _GRAPH_ARRAYS),
                              shape=(n, n))
        model.manifolds_.append(ManifoldGP(
            spec=spec, graph=graph, **{k: _array(m, k) for k in _GP_ARRAYS},
            **{k: a[k] for k in _GP_SCALARS}))
        model.local_embedding_.append(_array(m, "local_embedding"))
    batch = _array(g, "batch") if attrs.get("has_batch") else None
    return model, batch
