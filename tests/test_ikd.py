"""IKD full solver: parity with a dense Algorithm 1, recovery, cluster equality, resumption."""

from __future__ import annotations

import os
import signal
from dataclasses import fields

import dask
import numpy as np
import pytest
import zarr
from _faults import Fault, Stage, cli, tile
from ikd_reference import align_signs, ikd_dense

from dr_dask.methods.ikd import IKD
from dr_dask.methods.ikd_core import IKDConfig

KERNELS = [
    ("se", {}),
    ("rational_quadratic", {"alpha": 1.0}),
    ("gamma_exponential", {"gamma": 1.0}),
    ("matern", {"nu": 1.5}),
    ("matern", {"nu": 0.8}),
]


@pytest.fixture(scope="module")
def smooth_data():
    """Data generated from a smooth 2-D latent: a wide range of correlations in (0, 1]."""
    rng = np.random.default_rng(1)
    T, N = 240, 120
    Z = np.cumsum(rng.normal(size=(T, 2)), axis=0) / 6
    W = rng.normal(size=(2, N))
    return np.sin(Z @ W + rng.uniform(-np.pi, np.pi, N)) + 0.05 * rng.normal(size=(T, N))


@pytest.mark.parametrize(("kernel", "params"), KERNELS, ids=[f"{k}{p}" for k, p in KERNELS])
@pytest.mark.parametrize("reference", ["min_max", "min_mean", "center"])
def test_tiled_path_equals_dense_algorithm1(smooth_data, kernel, params, reference):
    """The tiled Dask path (3x3 tiles, block Lanczos) equals a dense NumPy Algorithm 1."""
    Z_ref, w_ref, r_ref, evr_ref = ikd_dense(
        smooth_data, 3, kernel=kernel, similarity="covariance", reference=reference, **params
    )
    est = IKD(
        n_components=3, kernel=kernel, similarity="covariance", reference=reference, tile_size=96,
        eigen_solver="lanczos", tol=1e-12, random_state=0, **params,
    ).fit(smooth_data)
    Z = align_signs(est.embedding_, Z_ref)
    assert np.max(np.abs(Z - Z_ref)) <= 1e-6 * np.max(np.abs(Z_ref))
    np.testing.assert_allclose(est.eigenvalues_, w_ref, rtol=1e-8)
    assert est.reference_index_ == r_ref
    assert est.explained_variance_ratio_ == pytest.approx(evr_ref, rel=1e-8)
    assert est.eigen_residuals_.max() <= 1e-8 * est.eigenvalues_[0]


@pytest.mark.parametrize(("kernel", "params"), KERNELS[:2], ids=["se", "rq"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(("shape", "diagonal"), [((300, 300), True), ((300, 170), False),
                                            ((170, 300), True)])
def test_inverse_kernel_tile_equals_whole_tile_ufuncs(kernel, params, dtype, shape, diagonal):
    """The in-place, chunked tile transform against the ufuncs on the whole tile (the old
    path) and np.fill_diagonal: float64 bit for bit, float32 to float32 precision."""
    from dr_dask.linalg.kernels import get_kernel
    from dr_dask.linalg.tiles import tile_stats
    from dr_dask.methods.ikd_core import InverseKernel

    rng = np.random.default_rng(7)
    S = rng.uniform(-0.2, 1.3, size=shape).astype(dtype)
    inv = InverseKernel(get_kernel(kernel, **params), 1.1, 1e-3, 1 - 1e-5, 1.7)
    k = np.clip(S.astype(np.float64) / 1.1, 1e-3, 1 - 1e-5)
    ref = (inv.kernel.inverse(k) * 1.7**2).astype(dtype)
    if diagonal:
        np.fill_diagonal(ref, 0.0)
    # chunks of 7 rows: a ragged last one
    with dask.config.set({"dr_dask.tiles.kernel-chunk-bytes": 7 * shape[1] * S.itemsize}):
        D, stats = inv.tile(S.copy(), diagonal)
    if dtype == np.float64:
        np.testing.assert_array_equal(D, ref)
    else:
        np.testing.assert_allclose(D, ref, rtol=2e-6, atol=2e-6)
    for got, want in zip(stats, tile_stats(D)):
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_array_equal(inv(S, diagonal), D)  # __call__ leaves S and agrees


def test_stored_tiles_by_bands_equal_tiles_in_memory(tmp_path, dr_config):
    """On disk a task computes and writes its tile one chunk row at a time (diagonal tiles
    and a short last block too): the stored matrix and the tiles' statistics are those of
    the whole tiles in memory, and of the dense D."""
    import dask.array as da

    from dr_dask.linalg.kernels import get_kernel
    from dr_dask.linalg.tiles import TileGrid, band_stats, build_tiles
    from dr_dask.methods._ikd_full import distance_tile
    from dr_dask.methods.ikd_core import InverseKernel

    dr_config({"tiles.chunk-rows": 16})  # 50-row tiles in bands of 10 rows
    rng = np.random.default_rng(2)
    X = rng.normal(size=(130, 12)) + 0.5
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    Xd = da.from_array(X, chunks=(50, 12))
    grid = TileGrid.from_chunks(Xd.chunks[0])
    blocks = list(Xd.to_delayed().ravel())
    inv = InverseKernel(get_kernel("rational_quadratic", alpha=1.0), 1.0, 1e-3, 1 - 1e-5, 1.3)
    memory, stats = build_tiles(grid, blocks, distance_tile, fn_args=(inv,))
    disk, banded = build_tiles(grid, blocks, distance_tile, fn_args=(inv,),
                               store=str(tmp_path / "D"), band_stats=band_stats)
    assert zarr.open_array(str(tmp_path / "D"), mode="r").chunks == (10, 50)
    V = rng.normal(size=(130, 3))
    np.testing.assert_allclose(disk.matmat(V), memory.matmat(V), rtol=1e-12)
    np.testing.assert_allclose(disk.matmat(V), inv(X @ X.T, True) @ V, rtol=1e-10)
    for got, want in zip(banded, stats):
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-12)


def test_correlation_and_float32_disk_tiles_match(smooth_data):
    Z_ref, *_ = ikd_dense(smooth_data, 2, similarity="correlation")
    est = IKD(n_components=2, tile_size=64, tile_cache="disk", random_state=0).fit(smooth_data)
    np.testing.assert_allclose(align_signs(est.embedding_, Z_ref), Z_ref, atol=1e-7)
    est32 = IKD(n_components=2, tile_size=64, dtype="float32", random_state=0).fit(smooth_data)
    Z32 = align_signs(est32.embedding_, Z_ref)
    assert np.max(np.abs(Z32 - Z_ref)) <= 1e-3 * np.max(np.abs(Z_ref))


def test_recovers_gp_latent_better_than_pca():
    """Model-matched GP mapping (M=3, l=3, T=1000, N=500): full IKD beats PCA's R^2."""
    from sklearn.decomposition import PCA

    from dr_dask.datasets import make_dataset
    from dr_dask.metrics import r2_affine

    ds = make_dataset("gp", n_samples=1000, n_features=500, n_components=3, length_scale=3.0,
                      random_state=0)
    X, Z = ds["X"].values, ds["latent"].values
    r2_ikd = r2_affine(Z, IKD(n_components=3, random_state=0).fit_transform(X))
    r2_pca = r2_affine(Z, PCA(3).fit_transform(X))
    assert r2_ikd > r2_pca
    assert r2_ikd > 0.75


@pytest.mark.cluster
def test_multiprocess_cluster_equals_threaded(smooth_data, cluster_client):
    threaded = IKD(n_components=3, tile_size=64, random_state=0).fit(smooth_data)
    for cache in ("memory", "disk"):
        distributed = IKD(n_components=3, tile_size=64, random_state=0, tile_cache=cache,
                          client=cluster_client).fit(smooth_data)
        np.testing.assert_allclose(
            align_signs(distributed.embedding_, threaded.embedding_), threaded.embedding_,
            atol=1e-8,
        )


def test_fit_accepts_dask_zarr_xarray(smooth_data, tmp_path):
    import dask.array as da
    import xarray as xr

    ref = IKD(n_components=2, random_state=0).fit_transform(smooth_data)
    z = zarr.create_array(tmp_path / "x.zarr", shape=smooth_data.shape, chunks=(50, 120),
                          dtype="f8")
    z[...] = smooth_data
    inputs = [
        da.from_array(smooth_data, chunks=(77, 60)),
        z,
        xr.DataArray(smooth_data, dims=("sample", "feature")),
        str(tmp_path / "x.zarr"),
    ]
    for X in inputs:
        np.testing.assert_allclose(
            align_signs(IKD(n_components=2, random_state=0).fit_transform(X), ref), ref, atol=1e-8
        )


def test_bad_parameters_are_named(smooth_data):
    with pytest.raises(ValueError, match="kernel"):
        IKD(n_components=2, kernel="cosine").fit(smooth_data)
    with pytest.raises(ValueError, match="reference"):
        IKD(n_components=2, reference="median").fit(smooth_data)
    with pytest.raises(ValueError, match="floor"):
        IKD(n_components=2, floor=0.0).fit(smooth_data)
    with pytest.raises(ValueError, match="n_components"):
        IKD(n_components=0).fit(smooth_data)


def test_the_solvers_configuration_is_the_estimators_parameters():
    """IKDConfig is derived from IKD's parameters, never copied by hand: each field is the
    parameter of its name (or a value the estimator resolves from it), so a new option cannot
    be declared on the estimator and silently miss the solvers."""
    names = {f.name for f in fields(IKDConfig)}
    params = set(IKD().get_params())
    assert names <= params
    assert params - names == {"alpha", "gamma", "nu"}  # the kernel object's hyper-parameters
    cfg = IKD(n_components=np.int64(2), solver="geodesic", n_neighbors=7, variance=2,
              kernel="rq", alpha=3.0, dtype="float32", threshold=0.4,
              tile_cache="disk")._config(100, 5)
    assert (cfg.n_components, cfg.n_neighbors, cfg.variance, cfg.threshold) == (2, 7, 2.0, 0.4)
    assert type(cfg.n_components) is int and type(cfg.variance) is float
    assert (cfg.tile_cache, cfg.dtype, cfg.reference) == ("disk", np.float32, "center")
    assert cfg.kernel.name == "rational_quadratic" and cfg.kernel.alpha == 3.0


def test_sklearn_estimator_conventions():
    from sklearn.base import clone

    est = IKD(n_components=3, kernel="matern", nu=2.5, random_state=4)
    assert clone(est).get_params() == est.get_params()
    assert not [k for k in vars(est) if k.endswith("_")]


def _run(out) -> tuple[dict, bool, dict]:
    """The run group in ``out``: its stages (name -> info), whether it is complete, and its
    tile done marks (name -> (inode, mtime): a rewritten mark is a new file). A thread killed
    mid-write leaves its store's temporary ``*.partial`` file, which is no mark."""
    root = zarr.open_group(out, mode="r")
    (name,) = list(root.group_keys())
    attrs = root[name].attrs
    done = os.path.join(out, name, "distance", "done")
    marks = {f: (os.stat(os.path.join(done, f)).st_ino, os.stat(os.path.join(done, f)).st_mtime_ns)
             for f in os.listdir(done) if f.endswith(".npz")} if os.path.isdir(done) else {}
    return dict(attrs.get("stages", {})), bool(attrs.get("complete")), marks


@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_result(tmp_path):
    """SIGKILLed by its own write of a tile mark, rerun SIGKILLed by its own write of the
    distance stage's mark, rerun to the end: the result equals an uninterrupted run's, no run
    is marked complete before it is, and each rerun reuses what was marked (tiles, then the
    distance stage) and recomputes the rest."""
    rng = np.random.default_rng(3)
    T, N = 1600, 60  # 5 row blocks of 320: 15 tiles; above DENSE_MAX, so Lanczos
    Z = np.cumsum(rng.normal(size=(T, 2)), axis=0) / 10
    X = np.sin(Z @ rng.normal(size=(2, N))) + 0.05 * rng.normal(size=(T, N))
    src = tmp_path / "in.npy"
    np.save(src, X)
    args = ["--scheduler", "threads", "embed", "ikd", "--input", str(src), "-n", "2",
            "--tile-cache", "disk", "--tile-size", "320"]
    n_tiles = 15

    clean = cli(*args, "--out", str(tmp_path / "clean.zarr"), text=True)
    assert clean.wait(timeout=300) == 0, clean.stderr.read()

    out = str(tmp_path / "killed.zarr")
    fault = Fault(tmp_path / "tile", tile(4))
    proc = fault.cli(*args, "--out", out)
    assert proc.wait(timeout=300) == -signal.SIGKILL, proc.stderr.read()
    assert fault.fired is not None and fault.fired["key"].endswith(".npz")
    stages, complete, first = _run(out)
    # killed inside the distance stage: 4 tiles marked (a few more by the other threads)
    assert not stages and not complete and 4 <= len(first) < n_tiles

    fault = Fault(tmp_path / "distance", Stage("distance"))
    proc = fault.cli(*args, "--out", out)
    assert proc.wait(timeout=300) == -signal.SIGKILL, proc.stderr.read()
    assert fault.fired is not None
    stages, complete, marks = _run(out)
    assert set(stages) == {"distance"} and not complete and len(marks) == n_tiles
    assert {f: marks[f] for f in first} == first, "a tile marked before the kill was redone"

    resumed = cli(*args, "--out", out, text=True)
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    done, complete, final = _run(out)
    assert set(done) == {"distance", "eigen"} and complete
    assert done["distance"] == stages["distance"], "the finished distance stage was redone"
    assert final == marks

    def embedding(path):
        root = zarr.open_group(path, mode="r")
        (name,) = list(root.group_keys())
        return np.asarray(root[name]["embedding"][...])

    np.testing.assert_allclose(embedding(out), embedding(tmp_path / "clean.zarr"), atol=1e-8)
