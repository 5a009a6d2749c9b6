"""``dr-dask job incremental`` (nightly) and ``dr-dask job refit`` (weekly)."""

from __future__ import annotations

import json
import logging

import click

from dr_dask.cli._app import (
    EXIT_CODES,
    POSITIVE,
    POSITIVE_REAL,
    cluster,
    job,
    mapping_options,
    n_neighbors_option,
    seed_option,
    storage_options,
)

logger = logging.getLogger(__name__)


@job.command("incremental", epilog=EXIT_CODES)
@click.argument("source")
@click.option("--state", required=True,
              help="The job's state location (stream store, models/v{k}, drift history, "
              "report), path or URL; created by the first run.")
@click.option("--n-batch", type=POSITIVE, default=1000, show_default=True,
              help="First run: the batch phase is fitted on the first N-BATCH rows.")
@mapping_options
@n_neighbors_option("First run: graph k of the model.", short=False)
@click.option("--sigma-t", type=POSITIVE_REAL, default=None,
              help="First run: novelty threshold (default: leave-one-out calibration).")
@seed_option("First run: random seed of the model fit.")
@click.option("--no-report", is_flag=True, help="Do not write STATE/report.png.")
@click.pass_context
def incremental(ctx, source, state, n_batch, n_s, chunk_size, max_in_flight, strict,
                n_neighbors, sigma_t, seed, no_report):
    """Map the rows of SOURCE (a Zarr array, STORE:VAR) appended since the last run.

    Rows beyond the watermark in STATE are mapped through the current GP-Isomap model on the
    cluster and written with their variance, manifold and model version; the drift history is
    extended, and a refit runs in the same job when the drift rule fires. The first run fits
    the model on the first --n-batch rows. A rerun with no new rows does nothing (exit 0); a
    killed run, rerun, loses and duplicates no row. Prints a JSON summary.
    """
    from dr_dask.jobs import run_incremental

    with cluster(ctx) as client:
        summary = run_incremental(
            source, state, storage_options=storage_options(ctx), client=client,
            n_batch=n_batch, n_s=n_s, chunk_size=chunk_size, max_in_flight=max_in_flight,
            strict=strict, n_neighbors=n_neighbors, sigma_t=sigma_t, random_state=seed,
            report=not no_report)
    click.echo(json.dumps(summary, indent=2))


@job.command("refit", epilog=EXIT_CODES)
@click.argument("source")
@click.option("--runs", required=True,
              help="Run store (Zarr, path or URL): every run, its report and latest.json.")
@click.option("--method", type=click.Choice(["ikd", "isomap"]), default="ikd",
              show_default=True, help="The reduction fitted on the whole store.")
@click.option("-n", "--n-components", type=POSITIVE, default=2, show_default=True,
              help="Embedding dimension.")
@n_neighbors_option("Graph k of the method and k of trustworthiness.")
@click.option("--eval-rows", type=POSITIVE, default=500, show_default=True,
              help="Rows of the seeded subsample TI and TCI are computed on.")
@click.option("--tci-candidates", type=POSITIVE, default=16, show_default=True,
              help="Sampled TCI warps (each one refit of --eval-rows rows).")
@seed_option("Random seed of the fit and of the evaluation subsample.")
@click.pass_context
def refit(ctx, source, runs, method, n_components, n_neighbors, eval_rows, tci_candidates,
          seed):
    """Refit METHOD on every row of SOURCE (a Zarr array, STORE:VAR), evaluate, move latest.

    Writes the run into --runs, an evaluation report against the previous run (RUNS/NAME.report:
    trustworthiness, TI/TCI, Procrustes disparity between runs, time, peak memory), then
    RUNS/latest.json naming the run (written last). A rerun when latest already names the run
    of this input and these parameters does nothing (exit 0). Prints a JSON summary.
    """
    from dr_dask.jobs import run_refit

    with cluster(ctx) as client:
        summary = run_refit(
            source, runs, method=method, n_components=n_components,
            storage_options=storage_options(ctx), client=client, n_neighbors=n_neighbors,
            eval_rows=eval_rows, tci_candidates=tci_candidates, random_state=seed)
    click.echo(json.dumps(summary, indent=2))
