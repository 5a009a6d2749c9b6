"""Fitted estimators saved to any location and loaded back: ``est.save(path)``,
``dr_dask.load(path)``.

A saved model is one object (a local file or an object in a store, through
:class:`~dr_dask.io.storage.Location`): a first line naming the format, a JSON header
(format, format version, estimator class, the dr_dask version that wrote it), then the
estimator pickled without its client. ``load`` reads the header first and refuses a file of
another format version by name, before unpickling anything. ``transform`` of a loaded model
equals the saved one's bit for bit: every array is kept as it was, and what an estimator
rebuilds on demand (GP-Isomap's geodesics, neighbour indices) is rebuilt by the same code
from the same arrays.

Loading unpickles, which runs code named in the file, as ``pickle`` and ``joblib`` do: load
only models you or your pipeline saved. GP-Isomap's stream models also have a code-free Zarr
format (:mod:`dr_dask.methods.gp_isomap_io`) for stores shared with others.
"""

from __future__ import annotations

import copy
import io
import json
import logging
import pickle
from typing import Any

from sklearn.utils.validation import check_is_fitted

from dr_dask.io.storage import location

logger = logging.getLogger(__name__)

FORMAT = "dr_dask.model"
#: Bumped whenever a fitted estimator's attributes change meaning or layout.
FORMAT_VERSION = 1
_MAGIC = b"dr_dask model\n"


class ModelFormatError(ValueError):
    """A file or group does not hold a model this version of dr_dask can read: not a model,
    an incomplete one, or one of another format version (bad input: exit 2)."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dr-dask")
    except PackageNotFoundError:
        return "0.0.0+unknown"


def save_model(estimator: Any, path: Any, storage_options: dict | None = None) -> None:
    """Write a fitted estimator to ``path`` (see :meth:`SavedModel.save`)."""
    check_is_fitted(estimator)
    saved = copy.copy(estimator)  # shallow: the fitted arrays are shared, not copied
    if hasattr(saved, "client"):
        saved.client = None  # a live connection is not state
    cls = type(estimator)
    header = {"format": FORMAT, "format_version": FORMAT_VERSION,
              "estimator": f"{cls.__module__}.{cls.__qualname__}", "dr_dask": _version()}
    buf = io.BytesIO()
    buf.write(_MAGIC)
    buf.write(json.dumps(header).encode() + b"\n")
    pickle.dump(saved, buf, protocol=pickle.HIGHEST_PROTOCOL)
    loc = location(path, storage_options)
    loc.write_bytes(buf.getvalue())
    logger.info("%s saved to %s (%d bytes)", cls.__name__, loc, buf.tell())


def load(path: Any, storage_options: dict | None = None) -> Any:
    """Load an estimator saved with ``save``.

    Parameters
    ----------
    path : str, os.PathLike or Location
        A local path or URL (``s3://...``), as given to ``save``.
    storage_options : dict, optional
        Of the store (credentials, endpoint).

    Returns
    -------
    estimator
        Fitted, with ``client=None`` (the active client, if any, is used).

    Raises
    ------
    ModelFormatError
        ``path`` is not a dr_dask model, or was saved in another format version.

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> from dr_dask import Isomap, load
    >>> X = np.random.default_rng(0).normal(size=(100, 3))
    >>> path = os.path.join(tempfile.mkdtemp(), "iso.model")
    >>> Isomap(n_neighbors=8, n_components=2).fit(X).save(path)
    >>> load(path).transform(X[:2]).shape
    (2, 2)
    """
    loc = location(path, storage_options)
    data = loc.read_bytes()
    if not data.startswith(_MAGIC):
        raise ModelFormatError(f"{loc} is not a dr_dask model (saved with est.save(path))")
    end = data.find(b"\n", len(_MAGIC))
    try:
        header = json.loads(data[len(_MAGIC):end])
    except ValueError as exc:
        raise ModelFormatError(f"{loc} is not a dr_dask model: its header is not JSON "
                               f"({exc})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ModelFormatError(f"{loc} is not a dr_dask model (format {header!r})")
    version = header.get("format_version")
    if version != FORMAT_VERSION:
        raise ModelFormatError(
            f"{loc} was saved in dr_dask model format version {version} (by dr_dask "
            f"{header.get('dr_dask')}); this dr_dask ({_version()}) reads version "
            f"{FORMAT_VERSION} only: load it with that version, or refit and save it again")
    try:
        estimator = pickle.loads(data[end + 1:])
    except Exception as exc:  # any unpickling failure: a damaged or truncated file
        raise ModelFormatError(f"{loc}: the {header.get('estimator')} model could not be "
                               f"read ({type(exc).__name__}: {exc})") from exc
    cls = type(estimator)
    if f"{cls.__module__}.{cls.__qualname__}" != header.get("estimator"):
        raise ModelFormatError(f"{loc}: header names {header.get('estimator')}, the file holds "
                               f"{cls.__module__}.{cls.__qualname__}")
    return estimator


class SavedModel:
    """``save(path)`` for the estimators; :func:`load` reads it back."""

    def save(self, path: Any, storage_options: dict | None = None) -> None:
        """Save the fitted estimator to ``path``; :func:`dr_dask.load` reads it back.

        One object at any location (a local path, ``s3://…``): a versioned header, then the
        estimator pickled without its client. ``transform`` of the loaded model equals this
        one's bit for bit. A model fitted on a stored input keeps reading that store's rows
        where ``transform`` needs the training rows: it stays valid while the store does. A
        model whose ``transform`` reads landmark rows from a temporary
        scratch store (landmark geodesics above ``dr_dask.tiles.memory-bytes``, fitted outside
        a run without ``geodesic_store``) refers to that store, which is deleted with this
        estimator: give ``geodesic_store`` (or fit in a run) to save such a model.

        Parameters
        ----------
        path : str, os.PathLike or Location
            Where to write (replaced whole if it exists).
        storage_options : dict, optional
            Of the store (credentials, endpoint).

        Raises
        ------
        sklearn.exceptions.NotFittedError
            Before ``fit``.
        """
        save_model(self, path, storage_options)
