"""The smallest use: IKD on a NumPy array with the scikit-learn API, compared with PCA.

    python examples/ikd_in_memory.py
"""

from sklearn.decomposition import PCA

import dr_dask
from dr_dask.datasets import make_dataset
from dr_dask.metrics import r2_affine

ds = make_dataset("gp", n_samples=1000, n_features=500, n_components=3, random_state=0)
X, Z = ds["X"].values, ds["latent"].values

for kernel in ("se", "rational_quadratic", "gamma_exponential", "matern"):
    ikd = dr_dask.IKD(n_components=3, kernel=kernel, random_state=0).fit(X)
    print(f"IKD {kernel:>18}: R^2 {r2_affine(Z, ikd.embedding_):.3f}  "
          f"explained variance ratio {ikd.explained_variance_ratio_:.3f}")
print(f"PCA {'':>18}: R^2 {r2_affine(Z, PCA(3).fit_transform(X)):.3f}")
