"""Workflow files: parse and validate strictly, resolve parameters, run the steps with retries.

A workflow is a TOML file of ``dr-dask`` command lines (its steps), run in order on one Dask
cluster. The format is documented in ``docs/workflows.md``; in short::

    [job]
    name = "nightly-ikd"
    retries = 1            # defaults for every step (a step may override them)
    timeout = "30m"

    [params]               # defaults; override with --param KEY=VALUE or $DR_DASK_PARAM_KEY
    root = "nightly"
    T = 2000

    [[steps]]
    name = "generate"
    args = ["datasets", "make", "gp", "--out", "${root}/data.zarr", "-T", "${T}"]

Everything is checked before anything runs (:func:`load` raises :class:`WorkflowError` naming
the key, step and field). Each step runs as its own process so that a timeout can really stop it
and a crash cannot take the runner down; exit codes follow the CLI's contract: 0 done (including
"nothing to do"), 2 bad input or configuration (never retried), anything else transient
(retried, then reported as 1).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import signal
import subprocess
import threading
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from importlib.resources import files
from string import Template
from typing import Any

from dr_dask.io.storage import StorageError, location
from dr_dask.runtime.exits import EXIT_TRANSIENT, retried

logger = logging.getLogger(__name__)

#: Environment variables ``DR_DASK_PARAM_<NAME>`` override a parameter's default.
PARAM_ENV_PREFIX = "DR_DASK_PARAM_"

_TOP_KEYS = {"job": "table", "params": "table", "tls": "table", "steps": "array of tables"}
# key -> (accepted types, description shown in errors)
_JOB_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "name": ((str,), "a string"),
    "description": ((str,), "a string"),
    "scheduler": ((str,), "a string (a scheduler address)"),
    "retries": ((int,), "an integer >= 0"),
    "retry_delay": ((int, float, str), "a duration (seconds or '30s', '5m', '1h')"),
    "timeout": ((int, float, str), "a duration (seconds or '30s', '5m', '1h')"),
}
_STEP_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "name": ((str,), "a string"),
    "args": ((list,), "an array of strings and numbers"),
    "retries": _JOB_KEYS["retries"],
    "retry_delay": _JOB_KEYS["retry_delay"],
    "timeout": _JOB_KEYS["timeout"],
}
_TLS_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "ca_file": ((str,), "a string (path of the CA certificate, PEM)"),
    "cert": ((str,), "a string (path of this client's certificate, PEM)"),
    "key": ((str,), "a string (path of the certificate's private key, PEM)"),
}
_PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# parameters are echoed in logs and plans: credentials must come from the environment instead
_CREDENTIAL = re.compile(r"secret|passw|token|credential|access_key|private_key", re.IGNORECASE)
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*\Z")
_UNITS = {None: 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


class WorkflowError(ValueError):
    """A workflow file that cannot run: bad TOML, unknown keys, wrong types, unknown params."""


@dataclasses.dataclass(frozen=True)
class Step:
    """One step: a ``dr-dask`` command line and how hard to try it.

    Attributes
    ----------
    name : str
    args : tuple of str
        The command line after ``dr-dask`` (parameters already substituted).
    retries : int
        Extra attempts after a transient failure (exit code other than 0 and 2, or a timeout).
    retry_delay : float
        Seconds between attempts.
    timeout : float or None
        Seconds an attempt may take before it is stopped (None: no limit).
    """

    name: str
    args: tuple[str, ...]
    retries: int = 0
    retry_delay: float = 10.0
    timeout: float | None = None


@dataclasses.dataclass(frozen=True)
class Workflow:
    """A validated workflow with its parameters resolved.

    Attributes
    ----------
    name : str
    description : str
    params : dict
        Parameter values after defaults, environment and command-line overrides.
    steps : tuple of Step
    scheduler : str or None
        Scheduler address the job asks for (the command line's ``--scheduler`` wins).
    tls : dict
        ``ca_file``, ``cert``, ``key`` paths for TLS to the scheduler (may be empty).
    """

    name: str
    description: str
    params: dict[str, Any]
    steps: tuple[Step, ...]
    scheduler: str | None = None
    tls: dict[str, str] = dataclasses.field(default_factory=dict)


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "a table"}.get(type(value), type(value).__name__)


def _check_keys(table: Any, spec: Mapping[str, tuple[tuple[type, ...], str]], where: str) -> None:
    """Reject unknown keys (listing the valid ones) and values of the wrong type."""
    if not isinstance(table, dict):
        raise WorkflowError(f"{where} must be a table, not {_type_name(table)}")
    for key, value in table.items():
        if key not in spec:
            raise WorkflowError(
                f"{where}: unknown key {key!r} (valid keys: {', '.join(sorted(spec))})")
        types, expected = spec[key]
        # TOML booleans are Python ints: never accept one where a number is meant
        if isinstance(value, bool) or not isinstance(value, types):
            raise WorkflowError(f"{where}: {key!r} must be {expected}, not "
                                f"{_type_name(value)} {value!r}")


def parse_duration(value: float | str, where: str) -> float:
    """Seconds from ``90``, ``"90s"``, ``"30m"`` or ``"2h"``; must be positive."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise WorkflowError(f"{where}: {value!r} is not a duration (e.g. 90, '90s', '30m', "
                                "'2h')")
        value = float(match[1]) * _UNITS[match[2]]
    if value <= 0:
        raise WorkflowError(f"{where}: a duration must be > 0, got {value!r}")
    return float(value)


def _coerce(name: str, default: Any, text: str, origin: str) -> Any:
    """Convert an override given as text to the type of the parameter's default."""
    try:
        if isinstance(default, bool):
            lowered = text.strip().lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return lowered in ("true", "1", "yes")
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        raise WorkflowError(f"parameter {name!r} from {origin}: {text!r} is not "
                            f"{_type_name(default)} (its default is {default!r})") from None
    return text


def resolve_params(defaults: Mapping[str, Any], overrides: Mapping[str, str],
                   environ: Mapping[str, str]) -> dict[str, Any]:
    """Parameter values: defaults, then ``$DR_DASK_PARAM_<NAME>``, then ``overrides``.

    Parameters
    ----------
    defaults : mapping
        The workflow's ``[params]`` table.
    overrides : mapping of str to str
        ``--param NAME=VALUE`` pairs from the command line.
    environ : mapping of str to str
        The environment (``os.environ``).
    """
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise WorkflowError(f"unknown parameter {unknown[0]!r} (the workflow's parameters: "
                            f"{', '.join(sorted(defaults)) or 'none'})")
    values = dict(defaults)
    for name, default in defaults.items():
        env = PARAM_ENV_PREFIX + name.upper()
        if env in environ:
            values[name] = _coerce(name, default, environ[env], f"${env}")
        if name in overrides:
            values[name] = _coerce(name, default, overrides[name], "--param")
    return values


def _substitute(text: str, params: Mapping[str, Any], where: str) -> str:
    template = Template(text)
    if not template.is_valid():
        raise WorkflowError(f"{where}: {text!r} has a malformed '$' reference "
                            "(write ${name} for a parameter, $$ for a literal $)")
    missing = [name for name in template.get_identifiers() if name not in params]
    if missing:
        raise WorkflowError(f"{where}: unknown parameter {missing[0]!r} in {text!r} "
                            f"(the workflow's parameters: {', '.join(sorted(params)) or 'none'})")
    return template.substitute({k: str(v).lower() if isinstance(v, bool) else str(v)
                                for k, v in params.items()})


def _parse_step(i: int, raw: Any, job: Mapping[str, Any], params: Mapping[str, Any]) -> Step:
    name = raw.get("name", f"step-{i}") if isinstance(raw, dict) else f"step-{i}"
    where = f"step {i} ({name!r})"
    _check_keys(raw, _STEP_KEYS, where)
    if "args" not in raw:
        raise WorkflowError(f"{where}: missing 'args' (the dr-dask command line, e.g. "
                            "['embed', 'ikd', '--input', 'data.zarr:X', ...])")
    args = []
    for j, arg in enumerate(raw["args"]):
        if isinstance(arg, bool) or not isinstance(arg, (str, int, float)):
            raise WorkflowError(f"{where}: args[{j}] must be a string or number, not "
                                f"{_type_name(arg)} {arg!r}")
        args.append(_substitute(str(arg), params, f"{where}, args[{j}]"))
    if not args:
        raise WorkflowError(f"{where}: 'args' is empty")
    retries = raw.get("retries", job.get("retries", 0))
    if retries < 0:
        raise WorkflowError(f"{where}: 'retries' must be >= 0, got {retries}")
    timeout = raw.get("timeout", job.get("timeout"))
    return Step(
        name=name,
        args=tuple(args),
        retries=retries,
        retry_delay=parse_duration(raw.get("retry_delay", job.get("retry_delay", 10)),
                                   f"{where}, 'retry_delay'"),
        timeout=None if timeout is None else parse_duration(timeout, f"{where}, 'timeout'"),
    )


def _param_defaults(defaults: Any, source: str) -> dict:
    """The ``[params]`` table, checked: names, value types, and no credential among them."""
    if not isinstance(defaults, dict):
        raise WorkflowError(f"{source}: [params] must be a table, not {_type_name(defaults)}")
    for name, value in defaults.items():
        if not _PARAM_NAME.match(name):
            raise WorkflowError(f"{source}: [params] {name!r} is not a valid parameter name "
                                "(letters, digits and _, not starting with a digit)")
        if not isinstance(value, (str, int, float, bool)):
            raise WorkflowError(f"{source}: [params] {name!r} must be a string, number or "
                                f"boolean, not {_type_name(value)}")
        if _CREDENTIAL.search(name):
            raise WorkflowError(f"{source}: [params] {name!r} looks like a credential; "
                                "parameters are logged, so pass credentials in the environment "
                                "(e.g. AWS_SECRET_ACCESS_KEY from a Kubernetes Secret)")
    return defaults


def parse(spec: Mapping[str, Any], overrides: Mapping[str, str] | None = None,
          environ: Mapping[str, str] | None = None, source: str = "workflow") -> Workflow:
    """Validate a parsed workflow document and resolve its parameters.

    Parameters
    ----------
    spec : mapping
        The TOML document as a dict.
    overrides : mapping of str to str, optional
        ``--param`` values.
    environ : mapping of str to str, optional
        Environment for ``DR_DASK_PARAM_*`` (default ``os.environ``).
    source : str
        Name used in error messages (the file's path).

    Raises
    ------
    WorkflowError
        Naming the key, step and field at fault.
    """
    environ = os.environ if environ is None else environ
    for key in spec:
        if key not in _TOP_KEYS:
            raise WorkflowError(f"{source}: unknown top-level key {key!r} (valid keys: "
                                f"{', '.join(sorted(_TOP_KEYS))})")
    job = spec.get("job", {})
    _check_keys(job, _JOB_KEYS, f"{source}: [job]")
    if job.get("retries", 0) < 0:
        raise WorkflowError(f"{source}: [job] 'retries' must be >= 0, got {job['retries']}")
    defaults = _param_defaults(spec.get("params", {}), source)
    params = resolve_params(defaults, overrides or {}, environ)
    tls = spec.get("tls", {})
    _check_keys(tls, _TLS_KEYS, f"{source}: [tls]")
    steps = spec.get("steps")
    if not isinstance(steps, list) or not steps:
        raise WorkflowError(f"{source}: needs [[steps]] tables, each with an 'args' list "
                            f"(got {_type_name(steps) if steps is not None else 'none'})")
    parsed = tuple(_parse_step(i, raw, job, params) for i, raw in enumerate(steps, 1))
    names = [s.name for s in parsed]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise WorkflowError(f"{source}: two steps are named {duplicate!r}")
    scheduler = job.get("scheduler")
    return Workflow(
        name=job.get("name", os.path.splitext(os.path.basename(source))[0]),
        description=job.get("description", ""),
        params=params,
        steps=parsed,
        scheduler=None if scheduler is None else _substitute(scheduler, params, "[job] scheduler"),
        tls={k: _substitute(v, params, f"[tls] {k}") for k, v in tls.items()},
    )


def shipped() -> dict[str, Any]:
    """The workflows shipped with the package (``workflows/*.toml`` in the repository, installed
    as ``dr_dask.workflows``), by name: what ``dr-dask run NAME`` runs from an installed wheel or
    image."""
    folder = files("dr_dask.workflows")
    return {entry.name.removesuffix(".toml"): entry for entry in folder.iterdir()
            if entry.name.endswith(".toml")}


def _read(path: str, storage_options: dict | None) -> tuple[bytes, str]:
    """The bytes of the workflow ``path`` (a file, URL or shipped name) and how to name it."""
    is_name = "/" not in path and "://" not in path and not path.endswith(".toml")
    if is_name and not os.path.exists(path):
        found = shipped()
        if path not in found:
            raise WorkflowError(f"cannot read {path}: no such file, and no shipped workflow of "
                                f"that name (shipped: {', '.join(sorted(found))})")
        return found[path].read_bytes(), f"{path}.toml"
    return location(path, storage_options).read_bytes(), path


def load(path: str, overrides: Mapping[str, str] | None = None,
         environ: Mapping[str, str] | None = None,
         storage_options: dict | None = None) -> Workflow:
    """Read and validate the workflow ``path`` (see :func:`parse`): a local path, a URL, or
    the name of a shipped workflow (:func:`shipped`, e.g. ``nightly-gp-isomap``)."""

    try:
        data, source = _read(path, storage_options)
        spec = tomllib.loads(data.decode())
    except FileNotFoundError:
        raise WorkflowError(f"cannot read {path}: no such file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise WorkflowError(f"{path} is not valid TOML: {exc}") from None
    except StorageError as exc:  # unreadable: scheme, permissions, credentials, endpoint
        raise WorkflowError(f"cannot read {path}: {exc}") from None
    return parse(spec, overrides, environ, source=source)


@dataclasses.dataclass(frozen=True)
class StepResult:
    """How a step ended.

    Attributes
    ----------
    code : int
        0, 2 (bad input: not retried) or 1 (a transient failure that outlived the retries).
    attempts : int
    seconds : float
        Wall time of all attempts and the waits between them.
    stdout : str
        What the last attempt printed on its stdout (a ``dr-dask`` command's result, e.g. a
        job's JSON summary).
    """

    code: int
    attempts: int
    seconds: float
    stdout: str


def _pump(stream: Any, echo: Callable[[str], None], keep: list[str] | None = None) -> None:
    for line in stream:
        echo(line.rstrip("\n"))
        if keep is not None:
            keep.append(line)


def _stop(proc: subprocess.Popen) -> None:
    """Stop a step's process group: SIGTERM, then SIGKILL after 10 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _attempt(command: Sequence[str], timeout: float | None,
             echo: Callable[[str], None]) -> tuple[int | None, str]:
    """Run one attempt: its exit code (None when its timeout stopped it) and its stdout.

    Both of the step's streams are echoed (to the job's log); its stdout is also kept, since
    it is the step's result."""
    # its own session: a timeout stops the step and anything it started, nothing else
    proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    out: list[str] = []
    pumps = [threading.Thread(target=_pump, args=(proc.stdout, echo, out), daemon=True),
             threading.Thread(target=_pump, args=(proc.stderr, echo), daemon=True)]
    for pump in pumps:
        pump.start()
    try:
        return proc.wait(timeout=timeout), "".join(out)
    except subprocess.TimeoutExpired:
        _stop(proc)
        return None, "".join(out)
    except BaseException:  # the runner is interrupted or terminated: take the step with it
        _stop(proc)
        raise
    finally:
        for pump in pumps:
            pump.join(timeout=5)


def run_step(step: Step, command: Sequence[str], echo: Callable[[str], None]) -> StepResult:
    """Run ``command`` (the step's full argv) with the step's retries and timeout; ``echo``
    receives every line the attempts print and the runner's notes."""
    start = time.monotonic()
    for attempt in range(step.retries + 1):
        code, stdout = _attempt(command, step.timeout, echo)
        if not retried(code):  # done, or bad input that a retry fails the same way
            assert code is not None  # a timeout (None) is retried
            return StepResult(code, attempt + 1, time.monotonic() - start, stdout)
        reason = f"timed out after {step.timeout:g}s" if code is None else f"exit code {code}"
        if attempt < step.retries:
            logger.warning("step %r %s; retry %d of %d in %gs", step.name, reason, attempt + 1,
                           step.retries, step.retry_delay)
            echo(f"step {step.name!r} {reason}; retry {attempt + 1} of {step.retries} "
                 f"in {step.retry_delay:g}s")
            time.sleep(step.retry_delay)
        else:
            echo(f"step {step.name!r} {reason}"
                 + (f" after {step.retries + 1} attempts" if step.retries else ""))
    return StepResult(EXIT_TRANSIENT, step.retries + 1, time.monotonic() - start, stdout)
