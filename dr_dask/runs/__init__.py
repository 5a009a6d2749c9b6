"""Persistence: a run's Zarr group (:mod:`~dr_dask.runs.group`, which implements the
:class:`~dr_dask.io.checkpoint.Checkpoint` a solver asks of a run) and the fenced lease that makes
one writer of it (:mod:`~dr_dask.runs.lease`)."""

from dr_dask.runs.group import RunGroup, open_run, run_attr, run_embedding

__all__ = ["RunGroup", "open_run", "run_attr", "run_embedding"]
