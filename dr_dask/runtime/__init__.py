"""The runtime every layer stands on: dask configuration, clients and stages, BLAS threads,
progress bars, credentials and resource measurement."""
