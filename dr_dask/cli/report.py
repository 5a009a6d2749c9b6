"""``dr-dask report RUN_OR_STATE --html OUT.html``: a run, stream or job as one interactive,
self-contained page (:mod:`dr_dask.report.html`)."""

from __future__ import annotations

import json
import logging

import click

from dr_dask.cli._app import POSITIVE, main, seed_option, storage_options

logger = logging.getLogger(__name__)


@main.command("report")
@click.argument("run_or_state")
@click.option("--html", "out_html", required=True,
              help="Where the page goes (path or URL); one self-contained HTML file.")
@click.option("--max-points", type=POSITIVE, default=100_000, show_default=True,
              help="Points drawn per scatter; above it a seeded sample of this size (stated "
              "on the page).")
@click.option("--window", type=POSITIVE, default=50, show_default=True,
              help="Running-mean window of a stream's predictive variance.")
@click.option("--color", "color", default=None, metavar="VAR",
              help="Colour the embedding by VAR of the run's input store, STORE:VAR, VAR[j] "
              "(a column) or a .npy file; categories get a legend, numbers a colour bar "
              "[row order; a stream's manifold].")
@click.option("--resources", type=click.Choice(["inline", "cdn"]), default="inline",
              show_default=True,
              help="BokehJS in the page (compressed, 0.45 MB: opens with no network) or "
              "fetched by the browser when the page opens.")
@seed_option("Seeds the samples.")
@click.pass_context
def report(ctx, run_or_state, out_html, max_points, window, color, resources, seed):
    """Explore a run, a stream output or a job's state in the browser.

    RUN_OR_STATE is a run group (e.g. runs.zarr/ikd-...), a refit job's run store (its
    latest.json names the run), a stream output store or an incremental job's state. The page
    (Bokeh, inline: it opens with no network) has the embedding as a scatter with pan, zoom
    and hover, the spectrum and the numbers; for streams and jobs also the variance over time
    with the threshold and refits, the manifolds and the drift history. Prints a JSON summary.
    """
    from dr_dask.report.html import html_report

    summary = html_report(run_or_state, out_html, storage_options=storage_options(ctx),
                          max_points=max_points, window=window, random_state=seed,
                          color=color, resources=resources)
    click.echo(json.dumps(summary))
