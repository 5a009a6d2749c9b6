"""Make the AnnData fixtures of tests/test_anndata.py with the real anndata package.

dr_dask reads AnnData's on-disk format itself (anndata pins pandas < 3, the project pins
pandas 3), so these files are written by anndata in a separate virtualenv:

    python3 -m venv .venv-anndata
    .venv-anndata/bin/pip install anndata zarr h5py
    .venv-anndata/bin/python tests/data/anndata/make_fixtures.py

Made with anndata 0.12.19, zarr 3.1.6, h5py 3.16.0, numpy 2.4.6, pandas 2.3.3, scipy 1.17.1.

300 cells x 20 genes, as a single-cell user holds them: ``X`` dense (log1p of the counts,
float32, stored in chunks of 100 rows in Zarr), ``layers["counts"]`` CSR (float32),
``layers["counts_csc"]`` the same counts CSC, ``obsm["X_pca"]`` (300 x 5, float32, as
scanpy writes it), ``obsm["cell_meta"]`` a DataFrame (not an array: refused by name), obs
names ``cell-000``... Written as ``cells.h5ad``, ``cells.zarr`` (Zarr format 2, anndata's
default) and ``cells_v3.zarr`` (format 3); the values as ``.npy`` ground truth beside them.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

HERE = Path(__file__).resolve().parent
T, N, PCS = 300, 20, 5


def make() -> ad.AnnData:
    rng = np.random.default_rng(20261205)
    counts = rng.poisson(0.4, size=(T, N)).astype(np.float32)
    X = np.log1p(counts).astype(np.float32)
    centred = X - X.mean(axis=0)
    u, s, _ = np.linalg.svd(centred.astype(np.float64), full_matrices=False)
    pca = (u[:, :PCS] * s[:PCS]).astype(np.float32)
    obs = pd.DataFrame({"cluster": pd.Categorical(rng.choice(["a", "b", "c"], size=T))},
                       index=[f"cell-{i:03d}" for i in range(T)])
    var = pd.DataFrame(index=[f"gene-{j:02d}" for j in range(N)])
    adata = ad.AnnData(X=X, obs=obs, var=var)
    adata.layers["counts"] = sp.csr_matrix(counts)
    adata.layers["counts_csc"] = sp.csc_matrix(counts)
    adata.obsm["X_pca"] = pca
    adata.obsm["cell_meta"] = pd.DataFrame({"depth": counts.sum(axis=1)}, index=obs.index)
    np.save(HERE / "X.npy", X)
    np.save(HERE / "counts.npy", counts)
    np.save(HERE / "X_pca.npy", pca)
    np.save(HERE / "obs_names.npy", np.asarray(obs.index, dtype=str))
    return adata


def main() -> None:
    adata = make()
    adata.write_h5ad(HERE / "cells.h5ad")
    for fmt, name in ((2, "cells.zarr"), (3, "cells_v3.zarr")):
        ad.settings.zarr_write_format = fmt
        adata.write_zarr(HERE / name, chunks=(100, N))
    versions = {p: importlib.metadata.version(p)
                for p in ("anndata", "zarr", "h5py", "numpy", "pandas", "scipy")}
    print("written with", versions)


if __name__ == "__main__":
    main()
