"""The benchmarks behind ``dr-dask bench``: each measures against a baseline in the same run.

Like the command modules (:mod:`dr_dask.cli`), a benchmark imports what it measures inside the
function that runs it: the CLI imports these modules before it configures logging.
"""
