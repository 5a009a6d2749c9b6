"""Credentials given as storage options reach the workers once, never through a task graph.

A :class:`~dr_dask.io.storage.Location` travels inside tasks (workers read and write the stores
themselves), and the scheduler keeps every task's pickled arguments for the whole run: anyone
who can connect to a plaintext scheduler can read them, and its dashboard shows task details.
So a pickled Location carries its non-secret options (``endpoint_url``, ``anon``, …) and, in
place of the secret ones (``key``, ``secret``, ``token``, ``password``… and any option whose
value nests such a key, like ``client_kwargs={"aws_secret_access_key": …}``), a *reference*:
a random name for them in this process's registry.

A worker resolves the reference from its own registry, which
:func:`dr_dask.runtime.credential_delivery.deliver_credentials` fills through a
``distributed`` worker plugin
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
import os
import re
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


def unregister(refs: list[str]) -> None:
    """Forget delivered credential sets (their plugin was withdrawn)."""
    with _LOCK:
        for ref in refs:
            secret = _REGISTRY.pop(ref, None)
            if secret is not None and _BY_CONTENT.get(_content(secret)) == ref:
                del _BY_CONTENT[_content(secret)]


def secret_values() -> list[str]:
    """Every credential string this process knows (to redact them from logs)."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, (str, bytes)) and len(value) >= 4:
            found.append(value.decode() if isinstance(value, bytes) else value)

    with _LOCK:
        for secret in _REGISTRY.values():
            walk(secret)
    return found


#: Environment variables whose values are credentials whatever their name says (an access key
#: ID is not secret alone, but names the account: it is redacted too).
SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
              "AWS_SECURITY_TOKEN", "AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY",
              "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CONNECTION_STRING", "AZURE_CLIENT_SECRET",
              "GOOGLE_OAUTH_ACCESS_TOKEN")

#: What request signing puts in log lines (botocore's and aiobotocore's debug output: the
#: Authorization header, presigned query strings, the signing key's scope).
_SIGNED = re.compile(r"(Credential=|Signature=|X-Amz-Security-Token[=:]\s*|X-Amz-Credential=|"
                     r"X-Amz-Signature=|'Authorization': b?'|\"Authorization\": \")[^,&'\"\s]+")
REDACTED = "[redacted]"


def _known_secrets() -> list[str]:
    found = secret_values()
    for name, value in os.environ.items():
        cloud = secret_name(name) and name.startswith(("AWS_", "AZURE_", "GOOGLE_", "GCS_"))
        if (name in SECRET_ENV or cloud) and len(value) >= 4:
            found.append(value)
    # longest first: a secret that contains another is replaced whole
    return sorted(set(found), key=len, reverse=True)


def redact(text: str) -> str:
    """``text`` with every known credential (delivered sets, the cloud SDKs' variables) and
    every request signature replaced by ``[redacted]``."""
    for value in _known_secrets():
        if value in text:
            text = text.replace(value, REDACTED)
    return _SIGNED.sub(lambda m: m.group(1) + REDACTED, text)


class RedactSecrets(logging.Filter):
    """A handler filter: the record's message and traceback with credentials redacted
    (:func:`redact`), at every level and from every library (botocore's debug output
    included)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001  (a malformed record: let logging report it)
            return True
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True
