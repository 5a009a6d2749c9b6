"""dr_dask: out-of-core, distributed nonlinear dimensionality reduction on Dask and Zarr."""

import importlib
import logging
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dr-dask")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

logging.getLogger(__name__).addHandler(logging.NullHandler())

# registers the dr_dask.* defaults with dask's configuration
from dr_dask.runtime import config  # noqa: E402,F401  (imported for its registration, after the logger)

# Public names, imported lazily so that `import dr_dask` stays cheap (no sklearn/matplotlib
# until a method is used) and each submodule is loaded only when asked for.
#
# Imports sit at the top of each module, with one exception, marked `# lazy: not on workers
# (__init__)`: workers import the modules whose functions they run (the graph, paths, tiles,
# eigensolver, validation, cluster and metrics modules), so those import scikit-learn inside the
# functions that use it: a worker that runs no scikit-learn code never loads it (its RSS stays
# lower; test_workers_import_no_sklearn). The estimators' modules, which only the client
# imports, import it at the top. `dr_dask.methods` itself is empty for the same reason.
_PUBLIC = {
    "IKD": "dr_dask.methods.ikd",
    "Isomap": "dr_dask.methods.isomap",
    "LandmarkIsomap": "dr_dask.methods.landmark_isomap",
    "GPIsomap": "dr_dask.methods.gp_isomap",
    "LSDR": "dr_dask.methods.lsdr",
    "open_dataset": "dr_dask.io.inputs",
    "load": "dr_dask.methods.persistence",
    "ModelFormatError": "dr_dask.methods.persistence",
    "QuadraticCostWarning": "dr_dask.linalg.cost",
    "ScratchSpaceError": "dr_dask.linalg.cost",
    "write_obsm": "dr_dask.io.anndata",
}

__all__ = [*_PUBLIC, "__version__"]


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'dr_dask' has no attribute {name!r}")
