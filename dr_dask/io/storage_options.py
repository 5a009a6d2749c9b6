"""Storage options given on the command line: ``--storage-option KEY=VALUE`` parsed into the
``storage_options`` a :class:`~dr_dask.io.storage.Location` takes, a name no installed
filesystem takes refused (with the closest one it may have meant) before any location is opened.
"""

from __future__ import annotations

import difflib
import json
import logging

from dr_dask.io.errors import StorageError
from dr_dask.runtime import credentials

logger = logging.getLogger(__name__)

#: Options every fsspec filesystem takes (fsspec's own, whatever the backend).
_COMMON_OPTIONS = ("skip_instance_cache", "use_listings_cache", "listings_expiry_time",
                   "max_paths", "auto_mkdir")
#: The packages whose filesystems' constructors name the options a URL may take (s3fs passes
#: the names it does not take itself to aiobotocore's session: ``profile``).
_OPTION_CLASSES = (("s3fs", "S3FileSystem"), ("aiobotocore.session", "AioSession"),
                   ("gcsfs", "GCSFileSystem"),
                   ("adlfs", "AzureBlobFileSystem"),
                   ("fsspec.implementations.http", "HTTPFileSystem"))


def known_storage_options() -> set[str]:
    """Option names some installed filesystem takes (its constructor's named parameters)."""
    import importlib
    import inspect

    names = set(_COMMON_OPTIONS)
    for module, cls in _OPTION_CLASSES:
        try:
            init = getattr(importlib.import_module(module), cls).__init__
        except (ImportError, AttributeError):
            continue
        names.update(name for name, p in inspect.signature(init).parameters.items()
                     if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))
    return names


def parse_storage_options(pairs: tuple[str, ...] | list[str]) -> dict:
    """``("KEY=VALUE", ...)`` from the CLI as storage_options (JSON values parsed: numbers,
    booleans, nested dicts such as ``client_kwargs={"region_name": "eu-west-1"}``). A name no
    installed filesystem takes is a :class:`StorageError` whatever the locations are (a local
    path would ignore it, an S3 URL refuse it)."""
    out: dict = {}
    known = known_storage_options() if pairs else set()
    for pair in pairs:
        if "=" not in pair:
            raise StorageError(f"--storage-option {pair!r} must be KEY=VALUE")
        key, value = pair.split("=", 1)
        key = key.strip()
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            raise StorageError(f"--storage-option {key!r} is not an option of any installed "
                               "filesystem" + (f" (did you mean {close[0]!r}?)" if close else ""))
        if credentials.secret_name(key):  # a key id or secret of digits stays a string
            out[key] = value
            continue
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out
