"""``dr-dask write-obsm RUN STORE``: a run's embedding into ``obsm`` of an AnnData
(:func:`dr_dask.io.anndata.write_obsm`). The one command that writes into a user's data, and
only what it is asked to."""

from __future__ import annotations

import json
import logging

import click

from dr_dask.cli._app import main, storage_options

logger = logging.getLogger(__name__)


@main.command("write-obsm")
@click.argument("run")
@click.argument("store")
@click.option("--key", default=None,
              help="The obsm key [default: X_<method> of the run, e.g. X_ikd].")
@click.option("--overwrite", is_flag=True, help="Replace an existing obsm[KEY].")
@click.pass_context
def write_obsm_command(ctx, run, store, key, overwrite):
    """Write the embedding of RUN into obsm of the AnnData STORE (.h5ad or AnnData-Zarr).

    RUN is a complete run group (e.g. runs.zarr/ikd-...). Its rows are matched by name: the
    run's sample coordinate must be STORE's cells (obs_names) in order, as it is for a run of
    STORE's X, a layer or an obsm element. Nothing is written unless every check passes.
    Prints a JSON summary.
    """
    import pandas as pd
    import zarr

    from dr_dask.io.anndata import write_obsm
    from dr_dask.io.inputs import InputError
    from dr_dask.io.storage import location, raise_if_transient, read_array
    from dr_dask.runs.group import run_attr

    options = storage_options(ctx)
    loc = location(run, options)
    try:
        group = zarr.open_group(store=loc.zarr_store(read_only=True), mode="r")
    except Exception as exc:  # noqa: BLE001  (zarr raises many types for "no group here")
        raise_if_transient(exc, loc)
        raise InputError(f"{loc} is not a run group (a Zarr group of `dr-dask embed`)") from None
    if group.attrs.get("complete") is not True or "embedding" not in group:
        raise InputError(f"{loc} is not a complete run (no completed embedding); finish it "
                         "first (rerun the same command: it resumes)")
    method = run_attr(group, "summary").get("method", "embedding")
    key = key or f"X_{method}"
    names = read_array(group, "sample").tolist() if "sample" in group else None
    embedding = pd.DataFrame(read_array(group, "embedding"), index=names)
    write_obsm(store, key, embedding, overwrite=overwrite, storage_options=options)
    click.echo(f"obsm[{key!r}] written into {store}", err=True)
    click.echo(json.dumps({"store": store, "key": key, "shape": list(embedding.shape),
                           "run": loc.url}, indent=2))
