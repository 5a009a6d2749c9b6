"""Credentials given as storage options reach the workers once, never through a task graph.

A :class:`~dr_dask.io.storage.Location` travels inside tasks (workers read and write the stores
themselves), and the scheduler keeps every task's pickled arguments for the whole run: anyone
who can connect to a plaintext scheduler can read them, and its dashboard shows task details.
So a pickled Location carries its non-secret options (``endpoint_url``, ``anon``, …) and, in
place of the secret ones (``key``, ``secret``, ``token``, ``password``… and any option whose
value nests such a key, like ``client_kwargs={"aws_secret_access_key": …}``), a *reference*:
a random name for them in this process's registry.

A worker resolves the reference from its own registry, which
:func:`dr_dask.runtime.cluster.deliver_credentials` fills through a ``distributed`` worker plugin
registered once per client and credential set: the scheduler passes the plugin to every
current and future worker. That registration message (and the
scheduler's copy of the plugin, kept for workers that join later) is where the secret does
travel; a TLS cluster (``--tls-*``, :func:`dr_dask.runtime.cluster.tls_security`) is what protects
that channel, as it protects the data. Workers that have credentials of their own (``AWS_*``,
config files, an instance role) need nothing: an unresolved reference falls back to them.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from typing import Any

logger = logging.getLogger(__name__)

#: Words that mark a storage option (or a key nested in one) as a credential.
SECRET_WORDS = ("secret", "key", "token", "password", "credential")

#: reference -> secret options, in this process (the client's, or a worker's from the plugin).
_REGISTRY: dict[str, dict] = {}
_BY_CONTENT: dict[str, str] = {}
_LOCK = threading.Lock()
_WARNED: set[str] = set()


def secret_name(name: str) -> bool:
    """An option name that names a credential."""
    return any(word in name.lower() for word in SECRET_WORDS)


def _holds_secret(name: str, value: Any) -> bool:
    if secret_name(name):
        return True
    if isinstance(value, dict):
        return any(_holds_secret(str(k), v) for k, v in value.items())
    return False


def split(options: dict) -> tuple[dict, dict]:
    """``(public, secret)``: the options that may travel in a graph, and the credentials."""
    public: dict = {}
    secret: dict = {}
    for name, value in options.items():
        (secret if _holds_secret(name, value) else public)[name] = value
    return public, secret


def _content(secret: dict) -> str:
    return json.dumps(secret, sort_keys=True, default=str)


def reference(secret: dict) -> str:
    """The name of ``secret`` in this process's registry (one name per distinct set)."""
    content = _content(secret)
    with _LOCK:
        ref = _BY_CONTENT.get(content)
        if ref is None:
            ref = f"dr_dask-credentials-{secrets.token_hex(8)}"
            _BY_CONTENT[content], _REGISTRY[ref] = ref, dict(secret)
        return ref


def resolve(ref: str) -> dict:
    """The credentials named ``ref``, or ``{}`` when they were never delivered to this process
    (the scheduler, which passes graphs on, or a worker with credentials of its own)."""
    return dict(_REGISTRY.get(ref) or {})


def warn_missing(ref: str, where: str) -> None:
    """Say once per reference that ``where`` is reached with this process's own credentials."""
    if ref not in _WARNED:
        _WARNED.add(ref)
        logger.warning("the storage credentials for %s were not delivered to this process; "
                       "using its own (environment, config files)", where)


def register(credentials: dict[str, dict]) -> None:
    """Add delivered credential sets (reference -> options) to this process's registry."""
    with _LOCK:
        for ref, secret in credentials.items():
            _REGISTRY[ref] = dict(secret)
            _BY_CONTENT[_content(secret)] = ref
