"""IKD on a dataset bigger than you would want as a dense T x T matrix, on a LocalCluster.

T=20,000 samples: the dense float64 T x T would be 3.2 GB; here the distance tiles go to disk
(float32, 0.8 GB) and no process holds more than a few tiles. Takes a minute or two on 2 cores.

    python examples/ikd_out_of_core.py [WORKDIR]
"""

import os
import sys
import tempfile

from distributed import Client, LocalCluster

import dr_dask
from dr_dask.datasets import make_dataset
from dr_dask.metrics import r2_affine
from dr_dask.runs.group import run_embedding

if __name__ == "__main__":
    workdir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="dr_dask_example_")
    data = os.path.join(workdir, "gp.zarr")
    if not os.path.exists(data):
        # GP-mapping data (IKD paper, M=3, l=3) by random Fourier features, written chunk by chunk
        make_dataset("gp", data, n_samples=20_000, n_features=500, n_components=3,
                     dtype="float32", random_state=0)
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        ikd = dr_dask.IKD(n_components=3, dtype="float32", tile_cache="disk", random_state=0,
                          client=client, progress=True)
        # the run group keeps tiles and stage marks: rerun this script after Ctrl-C and it resumes
        run = run_embedding(ikd, data + ":X", os.path.join(workdir, "runs.zarr"), method="ikd",
                            name="example")
    latent = dr_dask.open_dataset(data, "latent").data.compute()
    print(f"run: {run.path}")
    print(f"R^2 against the true latent: {r2_affine(latent, run.read('embedding')):.3f}")
