"""``dr-dask run WORKFLOW.toml``: a scheduled job of dr-dask steps (format: docs/workflows.md).

The file is parsed and validated by :mod:`dr_dask.jobs.workflow`; here each step's command line is
also checked against the CLI itself (unknown commands and options, missing or mistyped values),
so ``--check`` finds every mistake a run would hit before anything runs. Steps then run in order
as child processes on one cluster: the ``--scheduler`` one, the workflow's ``scheduler``, or a
LocalCluster started for the whole job.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import sys
from typing import TYPE_CHECKING, Any

import click

from dr_dask.cli._app import cluster, fail, main, storage_options
from dr_dask.runtime.exits import EXIT_BAD_INPUT, EXIT_OK, EXIT_TRANSIENT

if TYPE_CHECKING:
    from dr_dask.jobs.workflow import Step, StepResult, Workflow

logger = logging.getLogger(__name__)


def check_command(step: Step) -> None:
    """Parse ``step.args`` with the real ``dr-dask`` commands without running them."""
    from dr_dask.jobs.workflow import WorkflowError

    ctx = click.Context(main, info_name="dr-dask")
    command: click.Command = main
    args = list(step.args)
    path: list[str] = []
    while isinstance(command, click.Group):
        if not args or args[0].startswith("-"):
            raise WorkflowError(
                f"step {step.name!r}: args must start with a dr-dask command "
                f"({' '.join(path) or 'dr-dask'} has: {', '.join(command.list_commands(ctx))}); "
                "global options (--scheduler, --tls-*) belong on the 'dr-dask run' line")
        name, *args = args
        sub = command.get_command(ctx, name)
        if sub is None:
            raise WorkflowError(
                f"step {step.name!r}: unknown command {' '.join([*path, name])!r} (valid: "
                f"{', '.join(command.list_commands(ctx))})")
        if sub is run_workflow:
            raise WorkflowError(f"step {step.name!r}: a workflow cannot run a workflow")
        path.append(name)
        ctx = click.Context(sub, info_name=name, parent=ctx)
        command = sub
    try:
        command.make_context(path[-1], args, parent=ctx.parent)
    except click.ClickException as exc:
        # an input that an earlier step of the job writes need not exist yet
        if (isinstance(exc, click.BadParameter) and exc.param is not None
                and isinstance(exc.param.type, click.Path) and "does not exist" in str(exc)):
            return
        raise WorkflowError(f"step {step.name!r} (dr-dask {' '.join(path)}): "
                            f"{exc.format_message()}") from None


def _plan(wf: Workflow) -> None:
    click.echo(f"workflow {wf.name!r}: {len(wf.steps)} steps" +
               (f" ({wf.description})" if wf.description else ""))
    for key, value in sorted(wf.params.items()):
        click.echo(f"  param {key} = {value!r}")
    for step in wf.steps:
        limits = f"retries={step.retries}" + (f", timeout={step.timeout:g}s" if step.timeout
                                              else "")
        click.echo(f"  {step.name} ({limits}): dr-dask {shlex.join(step.args)}")


@main.command("run")
@click.argument("workflow")
@click.option("--check", is_flag=True,
              help="Validate the file and every step's command line, print the plan, run nothing.")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE",
              help="Override a [params] default (repeatable); also $DR_DASK_PARAM_<NAME>.")
@click.pass_context
def run_workflow(ctx: click.Context, workflow: str, check: bool, params: tuple[str, ...]) -> None:
    """Run the steps of WORKFLOW in order on one cluster.

    WORKFLOW is a TOML file (path or URL) or the name of a shipped workflow:
    nightly-gp-isomap, weekly-refit, demo-ikd. Steps' output goes to stderr; stdout gets one
    JSON summary of the job (status, exit code, each step's attempts and result).

    Exit codes: 0 done (including nothing to do), 2 bad workflow or input (do not retry),
    1 a transient or internal failure that outlived the step's retries (retry the job).
    """
    from dr_dask.jobs.workflow import WorkflowError, load

    overrides: dict[str, str] = {}
    for item in params:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            fail(f"--param {item!r}: expected NAME=VALUE")
        overrides[name.strip()] = value
    try:
        wf = load(workflow, overrides, storage_options=storage_options(ctx))
        for step in wf.steps:
            check_command(step)
    except WorkflowError as exc:
        fail(str(exc))
    if check:
        _plan(wf)
        click.echo("ok")
        return
    root = ctx.find_root().obj
    # the command line and $DASK_SCHEDULER_ADDRESS win over the file; so do --tls-* options
    root["scheduler"] = root.get("scheduler") or wf.scheduler
    root["tls"] = root.get("tls") or wf.tls
    missing = [f"{key} = {path!r}" for key, path in root["tls"].items() if not os.path.isfile(path)]
    if missing:
        fail(f"{workflow}: [tls] {', '.join(missing)}: no such file")
    # a terminated job (cron, a pod's deadline) stops its running step and closes its cluster
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        _run(ctx, wf)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminated(signum: int, frame: object) -> None:

    click.echo("error: terminated; stopping the running step", err=True)
    sys.exit(EXIT_TRANSIENT)


def _run(ctx: click.Context, wf: Workflow) -> None:
    """Run the steps; the steps' output goes to stderr (the job's log), and stdout gets one
    JSON summary (:func:`_summary`), so that a script or a BashOperator can read the result."""
    from dr_dask.jobs.workflow import run_step

    root = ctx.find_root().obj
    results: dict[str, StepResult] = {}
    code = EXIT_TRANSIENT  # until the job ends otherwise (a SIGTERM or a crash in between)
    try:
        with cluster(ctx) as client:
            address = client.scheduler.address if client is not None else "threads"
            verbose = ["-" + "v" * root["verbose"]] if root.get("verbose") else []
            prefix = [sys.executable, "-m", "dr_dask.cli", "--scheduler", address, *verbose]
            for key, value in root["tls"].items():
                prefix += [f"--tls-{key.replace('_', '-')}", value]
            for key, value in (root.get("storage_options") or {}).items():
                text = value if isinstance(value, str) else json.dumps(value)
                prefix += ["--storage-option", f"{key}={text}"]
            for step in wf.steps:
                click.echo(f"[{wf.name}] {step.name}: dr-dask {shlex.join(step.args)}", err=True)
                result = results[step.name] = run_step(step, [*prefix, *step.args], _log)
                if result.code:
                    click.echo(f"error: step {step.name!r} failed (exit {result.code}); the job "
                               "stops", err=True)
                    code = result.code
                    break
            else:
                code = EXIT_OK
                click.echo(f"[{wf.name}] done", err=True)
    except SystemExit as exc:  # terminated, or the cluster could not be joined
        code = exc.code if isinstance(exc.code, int) else EXIT_TRANSIENT
        raise
    finally:
        click.echo(json.dumps(_summary(wf, results, code), indent=2))
    if code:
        sys.exit(code)


def _log(line: str) -> None:
    click.echo(line, err=True)


def _summary(wf: Workflow, results: dict[str, StepResult], code: int) -> dict:
    """The job's result: its status and exit code, and per step the attempts, the time and the
    step's own result (its stdout, parsed when it is JSON, as the jobs' summaries are)."""
    steps: list[dict[str, Any]] = []
    for step in wf.steps:
        if step.name not in results:
            steps.append({"name": step.name, "status": "not run"})
            continue
        r = results[step.name]
        try:
            output: Any = json.loads(r.stdout)
        except ValueError:
            output = r.stdout.strip() or None
        steps.append({"name": step.name, "exit_code": r.code, "attempts": r.attempts,
                      "seconds": round(r.seconds, 3), "result": output})
    status = {EXIT_OK: "done", EXIT_BAD_INPUT: "bad input"}.get(code, "failed")
    return {"workflow": wf.name, "status": status, "exit_code": code, "params": wf.params,
            "steps": steps}
