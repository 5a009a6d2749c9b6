"""The workflow files shipped with dr_dask, run by name (``dr-dask run nightly-gp-isomap``).

This folder is installed as the package ``dr_dask.workflows`` (``pyproject.toml``); the format
is documented in ``docs/workflows.md``.
"""
