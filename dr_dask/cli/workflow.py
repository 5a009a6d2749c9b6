"""``dr-dask run WORKFLOW.toml``: a declarative job of dr-dask steps for schedulers (cron, k8s).

A workflow is a TOML file::

    [job]
    name = "nightly-ikd"
    # scheduler = "tcp://dask-scheduler:8786"   # optional; else --scheduler / env / LocalCluster

    [[steps]]
    name = "data"
    args = ["datasets", "make", "gp", "--out", "data.zarr", "-T", "5000", "-N", "500"]

    [[steps]]
    name = "embed"
    args = ["embed", "ikd", "--input", "data.zarr:X", "--out", "runs.zarr", "-n", "3"]

All steps share one cluster. Each step is an ordinary dr-dask command, so each is resumable on
its own: rerunning a workflow that was interrupted skips the work its steps already completed.
The job stops at the first failing step with that step's exit code.
"""

from __future__ import annotations

import logging
import tomllib

import click

from dr_dask.cli._app import cluster, fail, main

logger = logging.getLogger(__name__)


@main.command("run")
@click.argument("workflow", type=click.Path(exists=True, dir_okay=False))
@click.pass_context
def run_workflow(ctx: click.Context, workflow: str) -> None:
    """Run the steps of a TOML WORKFLOW in order on one cluster."""
    try:
        with open(workflow, "rb") as fh:
            spec = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        fail(f"{workflow} is not valid TOML: {exc}")
    steps = spec.get("steps", [])
    if not steps or not all(isinstance(s.get("args"), list) for s in steps):
        fail(f"{workflow} needs [[steps]] tables, each with an 'args' list")
    job = spec.get("job", {})
    if job.get("scheduler"):
        ctx.find_root().obj["scheduler"] = job["scheduler"]
    with cluster(ctx) as client:
        address = client.scheduler.address if client is not None else "threads"
        for i, step in enumerate(steps, 1):
            label = step.get("name", f"step {i}")
            click.echo(f"[{job.get('name', workflow)}] {label}: dr-dask {' '.join(step['args'])}",
                       err=True)
            try:
                main.main(args=["--scheduler", address, *map(str, step["args"])],
                          standalone_mode=False, obj={})
            except SystemExit as exc:
                if exc.code:
                    fail(f"step {label!r} failed with exit code {exc.code}")
            except click.ClickException as exc:
                fail(f"step {label!r}: {exc.format_message()}")
