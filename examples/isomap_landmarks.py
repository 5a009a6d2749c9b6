"""Full Isomap (equal to scikit-learn's) and Landmark Isomap on a swiss roll, on a LocalCluster.

    python examples/isomap_landmarks.py [N_SAMPLES]
"""

import sys

import numpy as np
from distributed import Client, LocalCluster

import dr_dask
from dr_dask.metrics import procrustes_disparity

if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    rng = np.random.default_rng(0)
    t = 1.5 * np.pi * (1 + 2 * rng.random(n))
    h = 20 * rng.random(n)
    X = np.column_stack([t * np.cos(t), h, t * np.sin(t)])
    arc = 0.5 * (t * np.sqrt(1 + t**2) + np.arcsinh(t))  # arc length along the spiral r = t
    truth = np.column_stack([arc, h])  # the roll's intrinsic (isometric) coordinates
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        full = dr_dask.Isomap(n_neighbors=10, n_components=2, client=client).fit(X)
        lm = dr_dask.LandmarkIsomap(n_neighbors=10, n_components=2, n_landmarks=500,
                                    random_state=0, client=client).fit(X)
    print(f"full Isomap stages (s): {full.timings_}")
    print(f"landmark vs full Isomap, Procrustes disparity: "
          f"{procrustes_disparity(full.embedding_, lm.embedding_):.2e}")
    print(f"full Isomap vs the roll's parameters: "
          f"{procrustes_disparity(truth, full.embedding_):.2e}")
