"""``dr-dask datasets make``: generate a paper dataset into a Zarr store."""

from __future__ import annotations

import contextlib
import logging

import click

from dr_dask.cli._app import (
    POSITIVE,
    POSITIVE_REAL,
    cluster,
    datasets,
    fail,
    seed_option,
    storage_options,
)

logger = logging.getLogger(__name__)


def _names() -> list[str]:
    from dr_dask.datasets import GENERATORS

    return sorted(GENERATORS)


@datasets.command("make")
@click.argument("name")
@click.option("--out", "out", required=True, help="Zarr store to write (path or URL).")
@click.option("-T", "--n-samples", "n_samples", type=POSITIVE, default=1000, show_default=True,
              help="Samples (rows).")
@click.option("-N", "--n-features", "n_features", type=POSITIVE, default=400, show_default=True,
              help="Features (columns).")
@click.option("-M", "--n-components", "n_components", type=POSITIVE, default=None,
              help="Latent dimensions [dataset default].")
@click.option("--noise", type=click.FloatRange(min=0), default=None,
              help="Noise standard deviation [dataset default].")
@seed_option()
@click.option("--length-scale", type=POSITIVE_REAL, default=None,
              help="GP length scale [3.0] (gp only).")
@click.option("--method", type=click.Choice(["auto", "exact", "rff"]), default=None,
              help="GP sampling [auto] (gp only).")
@click.option("--bump", type=click.Choice(["l2", "l1"]), default=None,
              help="Bump form [l2] (bump only).")
@click.option("--chunk-size", type=POSITIVE, default=5000, show_default=True,
              help="Rows per Zarr chunk.")
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float64",
              show_default=True, help="Storage type of X.")
@click.option("--overwrite", is_flag=True, help="Replace an existing store.")
@click.option("--if-missing", is_flag=True,
              help="Do nothing if OUT holds a complete dataset (an interrupted one is redone).")
@click.option("--parallel", is_flag=True,
              help="Generate chunks on the dask cluster (--scheduler or a LocalCluster).")
@click.pass_context
def make(ctx: click.Context, name: str, out: str, n_samples: int, n_features: int,
         n_components, noise, seed: int, length_scale, method, bump, chunk_size: int, dtype: str,
         overwrite: bool, if_missing: bool, parallel: bool) -> None:
    """Generate dataset NAME (gp, sinusoidal, bump, ...) into the Zarr store OUT."""
    from dr_dask.datasets import make_dataset
    from dr_dask.datasets._zarr import dataset_state
    from dr_dask.io.storage import location

    try:
        loc = location(out, storage_options(ctx))
        if if_missing and not overwrite and dataset_state(loc) == "complete":
            click.echo(f"{loc} exists; nothing to do (--if-missing)")
            return
    except ValueError as exc:
        fail(str(exc))
    if name not in _names():
        fail(f"unknown dataset {name!r}; valid names: {', '.join(_names())}")
    # pass only what the user set, so each generator keeps its own defaults and an option
    # that does not apply to NAME is reported instead of silently ignored
    given = {"n_components": n_components, "noise": noise, "length_scale": length_scale,
             "method": method, "bump": bump}
    options = {key: value for key, value in given.items() if value is not None}
    use_cluster = parallel or (ctx.find_root().obj or {}).get("scheduler")
    with cluster(ctx) if use_cluster else contextlib.nullcontext() as client:
        try:
            path = make_dataset(
                name, loc, n_samples=n_samples, n_features=n_features, chunk_size=chunk_size,
                dtype=dtype, random_state=seed, overwrite=overwrite, client=client, **options,
            )
        except (ValueError, FileExistsError) as exc:
            fail(str(exc))
    click.echo(f"wrote {name} to {path}: X {n_samples} x {n_features} ({dtype}), "
               f"chunks of {chunk_size} rows")
