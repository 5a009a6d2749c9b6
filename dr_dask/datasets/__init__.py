"""The papers' dataset generators, written to Zarr chunk by chunk.

``make_dataset(name, path, ...)`` dispatches to the generators registered in ``GENERATORS``;
each generator module registers itself when imported below, so adding one is one import line.
"""

from dr_dask.datasets._zarr import GENERATORS, Generator, make_dataset, register
from dr_dask.datasets.digits import augmented_digits
from dr_dask.datasets.ikd import GaussianBump, GPMapping, Sinusoidal, latent_prior

__all__ = [
    "GENERATORS",
    "GPMapping",
    "GaussianBump",
    "Generator",
    "Sinusoidal",
    "augmented_digits",
    "latent_prior",
    "make_dataset",
    "register",
]
