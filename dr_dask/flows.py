"""The Prefect flows at their public path: :mod:`dr_dask.jobs.flows` is where they live."""

from dr_dask.jobs.flows import deployments, nightly_flow, serve, weekly_flow

__all__ = ["deployments", "nightly_flow", "serve", "weekly_flow"]
