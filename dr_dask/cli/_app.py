"""The ``dr-dask`` command groups. Subcommand modules attach their commands to these groups."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

import click

from dr_dask import __version__
from dr_dask.graph import knn_backends
from dr_dask.io.errors import NOT_WRITABLE, unwritable
from dr_dask.runtime import exits

logger = logging.getLogger(__name__)

#: An existing PEM file (a certificate or key) for the ``--tls-*`` options.
PEM = click.Path(exists=True, dir_okay=False)

#: The ``--help`` epilog: the one table of exit codes (:mod:`dr_dask.runtime.exits`).
EXIT_CODES = exits.help_text()

#: A random seed: what numpy's legacy seeding (and so scikit-learn) accepts.
SEED = click.IntRange(0, 2**32 - 1)
#: Counts and sizes.
POSITIVE = click.IntRange(min=1)
#: Scales, bandwidths, thresholds and intervals.
POSITIVE_REAL = click.FloatRange(min=0, min_open=True)

# ------------------------------------------------------------- options several commands share
Command = TypeVar("Command", bound=Callable[..., Any])


def options(*decorators: Callable[[Command], Command]) -> Callable[[Command], Command]:
    """Click options (or other decorators) as one decorator; ``--help`` lists them in the
    order given, as if stacked in that order."""

    def apply(fn: Command) -> Command:
        for decorate in reversed(decorators):
            fn = decorate(fn)
        return fn

    return apply


def seed_option(help: str = "Random seed.", dest: str = "seed") -> Callable[[Command], Command]:
    """``--seed``: what numpy's legacy seeding (and so scikit-learn) accepts, default 0."""
    return click.option("--seed", dest, type=SEED, default=0, show_default=True, help=help)


def n_neighbors_option(help: str, default: int = 10,
                       short: bool = True) -> Callable[[Command], Command]:
    """``-k/--n-neighbors`` (``--n-neighbors`` alone when ``short`` is false)."""
    names = ("-k", "--n-neighbors") if short else ("--n-neighbors",)
    return click.option(*names, type=POSITIVE, default=default, show_default=True, help=help)


#: ``--json PATH`` of the benchmarks: the results also written as JSON.
json_option = click.option("--json", "json_path", default=None,
                           help="Also write the results here.")

#: A command that writes a run group into a store (``embed ikd``, ``embed isomap``).
run_options = options(
    click.option("--input", "source", required=True,
                 help="STORE[:VAR], file.nc[:VAR] or file.npy."),
    click.option("--out", required=True,
                 help="Output Zarr store (a run group is created in it)."),
    click.option("--name", default=None, help="Run name (default: derived from parameters)."),
    click.option("--overwrite", is_flag=True, help="Discard an existing run of the same name."),
    click.option("--drop-cache", is_flag=True,
                 help="Delete the run's tile cache (distance tiles, geodesic rows) once it "
                 "completes."),
)

#: What an embedding is judged against (``evaluate``, ``compare``).
truth_options = options(
    click.option("--labels", default=None,
                 help="Labels: VAR of the input store, PATH:VAR or .npy."),
    click.option("--latent", default=None,
                 help="True latent: VAR of the input store, PATH:VAR or .npy."),
)

#: How rows are mapped through GP-Isomap as they arrive (``stream run``, ``job incremental``).
mapping_options = options(
    click.option("--n-s", type=POSITIVE, default=1000, show_default=True,
                 help="Drift rule: uncertain (buffered) points that trigger a refit."),
    click.option("--chunk-size", type=POSITIVE, default=1000, show_default=True,
                 help="Rows per mapping task (a chunk read from the source)."),
    click.option("--max-in-flight", type=POSITIVE, default=2, show_default=True,
                 help="Chunks mapped on the cluster at once."),
    click.option("--strict", is_flag=True,
                 help="Algorithm 1's point-by-point semantics (refits at reproducible rows)."),
)


#: ``--knn``, ``--n-probe`` and ``--knn-tol``: the neighbour search of the commands that build
#: a graph.
knn_options = options(
    click.option("--knn", type=click.Choice(knn_backends.MODES), default="auto",
                 show_default=True, help=knn_backends.modes_help()),
    click.option("--n-probe", type=POSITIVE, default=None,
                 help="Lists each row searches with the ivf search (of about sqrt(T) / 2; default: "
                 "adaptive, as many as hold --knn-tol; at least the number of lists: exact)."),
    click.option("--knn-tol", type=click.FloatRange(0, 1, max_open=True),
                 default=knn_backends.DEFAULT_KNN_TOL,
                 show_default=True,
                 help="The adaptive probe's target: the mean relative error of the k-th "
                 "neighbour's distance, in [0, 1) (0: exact; the summary's knn_distance_error "
                 "is its estimate)."),
)


#: errno values that say a location cannot be written whatever it is (permissions, a read-only
#: filesystem, no room): the user's to fix, wherever below a command they surface.
_NOT_WRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT,
                 errno.EFBIG}


#: The options that name where a command writes (the location a full disk is reported at when
#: the failing write did not name its file).
_OUTPUT_OPTIONS = ("--out", "--html", "--state", "--runs", "--json")


def _outputs(argv: list[str]) -> list[str]:
    """The output locations on the command line (``--out X`` or ``--out=X``), in order."""
    found = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in _OUTPUT_OPTIONS:
            if eq:
                found.append(value)
            elif i + 1 < len(argv):
                found.append(argv[i + 1])
    return found


def _unwritable_output(exc: OSError, argv: list[str]) -> str | None:
    """The error line for ``exc`` when it says an output cannot be written: whatever file it
    names (or, naming none, the command's output) when it can only mean that (permissions, a
    read-only filesystem, no room); a missing or non-directory parent only when the file lies
    in one of the command's outputs (elsewhere it may be a bug)."""
    if exc.errno in _NOT_WRITABLE:
        outs = _outputs(argv)
        return unwritable(str(exc.filename or (outs[0] if outs else "the output")), exc)
    if exc.errno in NOT_WRITABLE and exc.filename:
        here = os.path.abspath(str(exc.filename))
        for out in _outputs(argv):
            if "://" not in out and (here + os.sep).startswith(
                    os.path.abspath(out).rstrip(os.sep) + os.sep):
                return unwritable(out, exc)
    return None


class App(click.Group):
    """The root group: turns any exception escaping a command into the documented exit code."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["argv"] = list(args)  # kept: click clears its copy before the command runs
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001  (every failure maps to a documented code)
            # imported only now: importing distributed before main() configured logging
            # would let it install its own handlers
            from dr_dask.io.inputs import InputError
            from dr_dask.io.storage import StorageError, StorageUnavailable
            from dr_dask.io.validation import parameter_errors
            from dr_dask.jobs._common import JobIncomplete
            from dr_dask.methods.gp_isomap_io import ModelFormatError
            from dr_dask.runs.lease import LeaseHeld, LeaseLost
            from dr_dask.runtime.cluster import (
                ClusterLost,
                NoWorkers,
                WorkerOutOfMemory,
                cluster_gone,
                where_now,
            )

            # rejected below a command that did not catch it: bad input, an unusable location,
            # a model file that is not a model, workers too small for the work
            # a parameter out of its range or type (the estimators' constraints), from a
            # command that passed it on unchecked
            if isinstance(exc, (InputError, StorageError, ModelFormatError, WorkerOutOfMemory,
                                *parameter_errors())):
                fail(str(exc))
            if isinstance(exc, OSError):
                line = _unwritable_output(exc, ctx.meta.get("argv", []))
                if line is not None:
                    fail(line)
            # transient: another run holds the lease (or took it over from this one while it
            # was paused), the cluster went away, the store did not answer or asked to slow
            # down; a rerun resumes
            if isinstance(exc, (LeaseHeld, LeaseLost, ClusterLost, StorageUnavailable,
                                JobIncomplete, NoWorkers)):
                busy(str(exc))
            if cluster_gone(exc):
                busy(f"the Dask cluster was lost {where_now()} ({type(exc).__name__}: {exc}). "
                     "Rerun to resume (completed stages of a run are kept)")
            # a bug: say so briefly, the traceback only when asked
            click.echo(f"internal error: {type(exc).__name__}: {exc}", err=True)
            if (ctx.obj or {}).get("verbose"):
                traceback.print_exc(file=sys.stderr)
            else:
                click.echo("(rerun with -v for the traceback)", err=True)
            sys.exit(exits.EXIT_TRANSIENT)


@click.group(cls=App, context_settings={"help_option_names": ["-h", "--help"]},
             epilog=EXIT_CODES)
@click.version_option(__version__, prog_name="dr-dask")
@click.option(
    "--scheduler",
    envvar="DASK_SCHEDULER_ADDRESS",
    default=None,
    help="Address of an existing Dask scheduler (default: $DASK_SCHEDULER_ADDRESS, "
    "else a LocalCluster sized to this machine); 'threads' runs in this process on dask's "
    "threaded scheduler.",
)
@click.option(
    "--scheduler-file",
    envvar="DASK_SCHEDULER_FILE",
    default=None,
    help="Join the cluster described by this scheduler file (dask-jobqueue, dask-mpi, "
    "'dask scheduler --scheduler-file'); default: $DASK_SCHEDULER_FILE.",
)
@click.option("--workers", type=POSITIVE, default=None,
              help="Worker processes for the LocalCluster (default: one per core); threads of "
              "dask's pool with --scheduler threads.")
@click.option("--tls-ca-file", type=PEM, default=None,
              help="CA certificate (PEM): talk TLS to the scheduler (tls://HOST:8786) and "
              "check its certificate. Needs --tls-cert and --tls-key. Default: the dask config "
              "distributed.comm.tls.* (e.g. $DASK_DISTRIBUTED__COMM__TLS__CA_FILE).")
@click.option("--tls-cert", type=PEM, default=None, help="This client's certificate (PEM).")
@click.option("--tls-key", type=PEM, default=None, help="The certificate's private key (PEM).")
@click.option("--wait-for-workers", "wait_workers", default=None, metavar="DURATION",
              help="How long a command waits for a worker when the scheduler has none (at "
              "start, or after losing them all), with a progress line, before it exits 1 "
              "naming the scheduler, e.g. 15m for an autoscaling node pool or a batch queue. "
              "Default: dr_dask.cluster.wait-for-workers (60s; "
              "$DASK_DR_DASK__CLUSTER__WAIT_FOR_WORKERS).")
@click.option(
    "--storage-option",
    "storage_option",
    multiple=True,
    metavar="KEY=VALUE",
    help="fsspec storage option for every URL (repeatable), e.g. endpoint_url=http://host:9000 "
    "or anon=true; credentials otherwise come from AWS_* / GOOGLE_* / AZURE_* and config files.",
)
@click.option("-v", "--verbose", count=True,
              help="-v for info logs (dask's included), -vv for debug, -vvv also the cloud "
              "SDKs' debug output. Credentials are redacted at every level. Default: warnings "
              "only.")
@click.pass_context
def main(
    ctx: click.Context,
    scheduler: str | None,
    scheduler_file: str | None,
    workers: int | None,
    tls_ca_file: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    wait_workers: str | None,
    storage_option: tuple[str, ...],
    verbose: int,
) -> None:
    """Out-of-core, distributed nonlinear dimensionality reduction on Dask and Zarr.

    Every location (inputs, outputs, reports) is a local path or a URL: s3://, gs://, az://,
    memory://, file://. Results and JSON summaries go to stdout; logs, progress bars (on a
    terminal only) and errors go to stderr.
    """
    from dr_dask.io.storage import StorageError
    from dr_dask.io.storage_options import parse_storage_options

    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    # the application, not the library, configures logging
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    redact_logs(verbose)
    if not verbose:
        quiet_distributed()
        quiet_unraisable()
    try:
        options = parse_storage_options(storage_option)
    except StorageError as exc:
        fail(str(exc))
    from dr_dask.runtime import credentials

    _, secret = credentials.split(options)
    if secret:
        credentials.reference(secret)  # known from now on: redacted from every log line
    if wait_workers is not None:
        set_worker_wait(wait_workers)
    from dr_dask.runtime import config

    try:
        config.check()
    except ValueError as exc:
        fail(str(exc))
    tls = {"ca_file": tls_ca_file, "cert": tls_cert, "key": tls_key}
    ctx.obj = {"scheduler": scheduler, "scheduler_file": scheduler_file, "workers": workers,
               "verbose": verbose, "tls": {k: v for k, v in tls.items() if v},
               "storage_options": options}


def set_worker_wait(value: str) -> None:
    """``--wait-for-workers``: a duration (``90``, ``15m``) into dask's configuration."""
    import dask
    from dask.utils import parse_timedelta

    try:
        seconds = parse_timedelta(value, default="seconds")
    except (ValueError, KeyError, TypeError):
        seconds = None
    if seconds is None or seconds < 0:
        fail(f"--wait-for-workers: {value!r} is not a duration (e.g. 90, 90s, 15m)")
    dask.config.set({"dr_dask.cluster.wait-for-workers": seconds})
    # and for the commands this one starts (a workflow's steps)
    os.environ["DASK_DR_DASK__CLUSTER__WAIT_FOR_WORKERS"] = f"{seconds}s"


def storage_options(ctx: click.Context) -> dict:
    """The ``--storage-option`` values of this invocation."""
    return dict((ctx.find_root().obj or {}).get("storage_options") or {})


def security(tls: dict[str, str]):  # -> distributed.Security | None (imported lazily)
    """The ``Security`` for ``--tls-*`` options (all three or none), else None (dask config)."""
    if not tls:
        return None
    missing = [f"--tls-{k.replace('_', '-')}" for k in ("ca_file", "cert", "key") if k not in tls]
    if missing:
        fail(f"TLS needs --tls-ca-file, --tls-cert and --tls-key; missing {', '.join(missing)}")
    check_tls_files(tls["ca_file"], tls["cert"], tls["key"])
    from dr_dask.runtime.cluster import tls_security

    return tls_security(tls["ca_file"], tls["cert"], tls["key"])


def check_tls_files(ca_file: str, cert: str, key: str) -> None:
    """Exit 2 naming the file when a ``--tls-*`` file is not a PEM certificate (or key, or one
    that matches the certificate): a configuration error, never one to retry."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=ca_file)
    except (ssl.SSLError, ValueError, OSError) as exc:
        fail(f"--tls-ca-file {ca_file} is not a PEM CA certificate ({exc})")
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, ValueError, OSError) as exc:
        fail(f"--tls-cert {cert} / --tls-key {key}: not a PEM certificate and its matching "
             f"private key ({exc})")


#: The cloud SDKs' loggers: their debug output signs requests in the open (held at INFO below
#: -vvv, and redacted at every level).
SDK_LOGGERS = ("botocore", "aiobotocore", "boto3", "s3fs", "urllib3", "gcsfs", "adlfs",
               "azure")


def redact_logs(verbose: int) -> None:
    """Credentials never reach a log line: a redacting filter on this process's handlers (see
    :class:`dr_dask.runtime.credentials.RedactSecrets`), and the cloud SDKs' debug output only with
    -vvv."""
    from dr_dask.runtime.credentials import RedactSecrets

    # the root's handlers, and those distributed installs on its own loggers once imported
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in
                                      list(logging.root.manager.loggerDict))]
    for lg in loggers:
        for handler in getattr(lg, "handlers", ()):
            if not any(isinstance(f, RedactSecrets) for f in handler.filters):
                handler.addFilter(RedactSecrets())
    if verbose < 3:
        for name in SDK_LOGGERS:
            logging.getLogger(name).setLevel(max(logging.INFO, logging.getLogger().level))


def _unraisable_to_debug(unraisable: Any) -> None:
    logger.debug("%s: %s: %s", unraisable.err_msg or "Exception ignored in",
                 unraisable.object, unraisable.exc_value,
                 exc_info=(unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback))


class _NeverRetrievedToDebug(logging.Filter):
    """asyncio's "Task exception was never retrieved" (its loop's default handler, at ERROR
    with the traceback) moved to this module's debug log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).partition("\n")[0].endswith("exception was never retrieved"):
            return True
        logger.debug("%s", record.getMessage(), exc_info=record.exc_info)
        return False


def quiet_unraisable() -> None:
    """Without -v, what Python can only ignore goes to the debug log, not the terminal: a
    coroutine of the store's client (zarr's ``FsspecStore.get``, an aiohttp session) collected
    after the event loop that ran it stopped, or a task of it whose exception nobody awaits
    (aiohttp's request body written to a connection the server closed), as a command ends on
    a store that went away; the command's own error line says what happened. With -v Python
    and asyncio print them, tracebacks and all. A hook someone else installed (a test
    runner's) is left alone."""
    if sys.unraisablehook is sys.__unraisablehook__:
        sys.unraisablehook = _unraisable_to_debug
    asyncio_logger = logging.getLogger("asyncio")
    if not any(isinstance(f, _NeverRetrievedToDebug) for f in asyncio_logger.filters):
        asyncio_logger.addFilter(_NeverRetrievedToDebug())


def quiet_distributed() -> None:
    """Hold distributed's loggers (which it configures itself, at INFO) to warnings, here and
    in the worker processes a LocalCluster starts (they read it from the environment)."""
    os.environ["DASK_LOGGING__DISTRIBUTED"] = "warning"
    import dask

    dask.config.set({"logging.distributed": "warning"})
    logging.getLogger("distributed").setLevel(logging.WARNING)


@contextlib.contextmanager
def cluster(ctx: click.Context) -> Iterator:
    """The client for a command: the ``--scheduler`` one, a LocalCluster it closes after, or
    ``None`` (dask's threads) for ``--scheduler threads``."""
    from dr_dask.runtime.cluster import session

    obj = ctx.find_root().obj or {}
    if obj.get("scheduler") == "threads":
        import dask

        # --workers sizes dask's thread pool, as it sizes a LocalCluster otherwise
        with dask.config.set({"num_workers": obj["workers"]} if obj.get("workers") else {}):
            yield None
        return
    from dr_dask.runtime.cluster import NoWorkers

    try:
        started = session(obj.get("scheduler"), obj.get("workers"), obj.get("scheduler_file"),
                          security=security(obj.get("tls", {})))
        client = started.__enter__()  # waits for a worker (--wait-for-workers)
    except ValueError as exc:  # a malformed address, a missing scheduler file
        fail(f"cannot join the Dask cluster: {exc}")
    except OSError as exc:  # no answer (yet): a scheduler starting or restarting is transient
        busy(f"cannot reach the Dask scheduler (retry later): {exc}")
    except NoWorkers as exc:
        busy(str(exc))
    with contextlib.ExitStack() as stack:
        stack.push(started)
        assert client.scheduler is not None  # a started Client holds its scheduler's rpc
        click.echo(f"dask cluster: {client.dashboard_link or client.scheduler.address}", err=True)
        from dr_dask.runtime.credential_delivery import credentials_delivered

        # once per worker, so that task graphs carry only a reference to them; withdrawn from
        # the scheduler when the command ends, also on failure
        stack.enter_context(credentials_delivered(client, obj.get("storage_options")))
        redact_logs(obj.get("verbose") or 0)  # distributed's handlers exist now
        if not obj.get("verbose"):
            drop_tracebacks()
        yield client


class _NoTraceback(logging.Filter):
    """Keeps a log record's message, drops its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


def drop_tracebacks() -> None:
    """Without -v, distributed's log lines (a lost scheduler, a closed comm) keep their one-line
    message but not their traceback: the command's own error says what happened."""
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in
                                      list(logging.root.manager.loggerDict)
                                      if name.startswith("distributed"))]
    for lg in loggers:
        for handler in lg.handlers:
            # the terminal's handlers only (a test's capture handler keeps what it captures)
            if getattr(handler, "stream", None) not in (sys.stderr, sys.__stderr__):
                continue
            if not any(isinstance(f, _NoTraceback) for f in handler.filters):
                handler.addFilter(_NoTraceback())


def busy(message: str) -> NoReturn:
    """Exit 1 (transient: retry later) with a clear message, e.g. another run holds the lease."""
    click.echo(f"error: {message}", err=True)
    sys.exit(exits.EXIT_TRANSIENT)


def fail(message: str) -> NoReturn:
    """Print a clear error and exit non-zero (no traceback for user errors)."""
    click.echo(f"error: {message}", err=True)
    sys.exit(exits.EXIT_BAD_INPUT)


@main.group()
def datasets() -> None:
    """Generate the papers' datasets into Zarr stores."""


@main.group()
def embed() -> None:
    """Fit a reduction on a stored dataset and write the embedding."""


@main.group()
def bench() -> None:
    """Benchmarks: medians, peak RSS and ratios against a baseline measured in the same run."""


@main.group()
def stream() -> None:
    """Stream chunks through a GP-Isomap model with drift-triggered refits."""


@main.group()
def job() -> None:
    """Scheduled jobs: the nightly incremental GP-Isomap job and the weekly refit."""
