"""IKD paper generators, the Zarr writer and ``dr-dask datasets make``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import xarray as xr
import zarr
from click.testing import CliRunner

from dr_dask.cli import main
from dr_dask.datasets import GENERATORS, latent_prior, make_dataset


def test_latent_prior_matches_ou_covariance():
    z = latent_prior(60_000, 2, random_state=3, clip=None)
    # sample variance and lag-1 autocorrelation of an AR(1) with T=60k: sd ~0.1 and ~0.003
    np.testing.assert_allclose(z.var(axis=0), 6.0, rtol=0.08)
    for m in range(2):
        lag1 = np.corrcoef(z[:-1, m], z[1:, m])[0, 1]
        lag5 = np.corrcoef(z[:-5, m], z[5:, m])[0, 1]
        assert lag1 == pytest.approx(np.exp(-1 / 5), abs=0.015)
        assert lag5 == pytest.approx(np.exp(-1.0), abs=0.03)
    assert abs(np.corrcoef(z[:, 0], z[:, 1])[0, 1]) < 0.05  # independent dimensions


def test_latent_prior_clip_and_prefix_consistency():
    long = latent_prior(20_000, 3, random_state=5, clip=None)
    np.testing.assert_array_equal(latent_prior(777, 3, random_state=5, clip=None), long[:777])
    clipped = latent_prior(20_000, 3, random_state=5, clip=2.0)
    assert clipped.max() == 2.0 and clipped.min() == -2.0
    np.testing.assert_array_equal(clipped, np.clip(long, -2, 2))
    assert not np.array_equal(long, latent_prior(20_000, 3, random_state=6, clip=None))


@pytest.mark.parametrize(
    ("name", "M", "options"),
    [("gp", 3, {}), ("sinusoidal", 1, {}), ("bump", 2, {}), ("bump", 2, {"bump": "l1"}),
     ("gp", 2, {"method": "rff", "n_features_rff": 300, "n_components": 2})],
)
def test_shapes_defaults_and_determinism(name, M, options):
    ds = make_dataset(name, n_samples=300, n_features=20, chunk_size=64, random_state=1, **options)
    assert ds.X.dims == ("sample", "feature") and ds.X.shape == (300, 20)
    assert ds.latent.shape == (300, M) and np.all(np.isfinite(ds.X.values))
    assert ds.attrs["generator"] == name and ds.attrs["params"]["random_state"] == 1
    again = make_dataset(name, n_samples=300, n_features=20, chunk_size=64, random_state=1,
                         **options)
    np.testing.assert_array_equal(ds.X.values, again.X.values)
    other_chunks = make_dataset(name, n_samples=300, n_features=20, chunk_size=100,
                                random_state=1, **options)
    # noise and latents are chunk-independent exactly; GEMMs of other shapes round differently
    np.testing.assert_allclose(ds.X.values, other_chunks.X.values, rtol=0, atol=1e-12)
    other_seed = make_dataset(name, n_samples=300, n_features=20, random_state=2, **options)
    assert not np.allclose(ds.X.values, other_seed.X.values)


def test_mappings_follow_the_paper_formulas():
    sin = make_dataset("sinusoidal", n_samples=200, n_features=30, noise=0.0)
    assert np.abs(sin.X.values).max() <= 1.0
    bump = make_dataset("bump", n_samples=200, n_features=30, noise=0.0)
    assert bump.X.values.min() >= 0 and bump.X.values.max() <= 20.0
    l1 = make_dataset("bump", n_samples=200, n_features=30, noise=0.0, bump="l1")
    assert not np.allclose(bump.X.values, l1.X.values)
    noisy = make_dataset("sinusoidal", n_samples=200, n_features=30)
    assert np.std(noisy.X.values - sin.X.values) == pytest.approx(0.1, rel=0.1)


def test_gp_exact_and_rff_covariances_agree():
    T, N = 150, 3000
    common = dict(n_samples=T, n_features=N, noise=0.0, n_components=1, random_state=4)
    exact = make_dataset("gp", method="exact", **common)
    rff = make_dataset("gp", method="rff", **common)
    z = exact.latent.values
    np.testing.assert_array_equal(z, rff.latent.values)
    K = np.exp(-0.5 * (z - z.T) ** 2 / 3.0**2)
    for ds in (exact, rff):
        X = ds.X.values
        S = X @ X.T / N
        # sampling error sd <= sqrt(2/N) ~ 0.026; RFF adds <= sqrt(1.5/2000) ~ 0.027
        assert np.abs(S - K).mean() < 0.05 and np.abs(S - K).max() < 0.3
    with pytest.raises(ValueError, match="n_samples <= 5000"):
        make_dataset("gp", n_samples=5001, n_features=2, method="exact")


def test_zarr_store_opens_with_xarray_and_refuses_overwrite(tmp_path):
    path = tmp_path / "bump.zarr"
    out = make_dataset("bump", path, n_samples=500, n_features=12, chunk_size=128, dtype="float32")
    assert out == str(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # consolidated metadata: no fallback warning
        ds = xr.open_zarr(path)
    assert ds.X.dims == ("sample", "feature") and ds.X.dtype == np.float32
    assert ds.X.encoding["chunks"] == (128, 12)
    np.testing.assert_array_equal(ds.sample.values, np.arange(500))
    memory = make_dataset("bump", n_samples=500, n_features=12, chunk_size=128, dtype="float32")
    np.testing.assert_array_equal(ds.X.values, memory.X.values)
    np.testing.assert_array_equal(ds.latent.values, memory.latent.values)
    assert ds.attrs["params"]["bump"] == "l2" and "dr_dask_version" in ds.attrs
    with pytest.raises(FileExistsError, match="overwrite"):
        make_dataset("bump", path, n_samples=500, n_features=12)
    make_dataset("sinusoidal", path, n_samples=40, n_features=3, overwrite=True)
    assert zarr.open_group(str(path), mode="r")["X"].shape == (40, 3)
    assert [p.name for p in tmp_path.iterdir()] == ["bump.zarr"]  # no partial leftovers
    (tmp_path / "notes").mkdir()
    with pytest.raises(FileExistsError, match="not a Zarr store"):
        make_dataset("bump", tmp_path / "notes", n_samples=50, n_features=3, overwrite=True)


def test_bad_names_and_options_rejected(tmp_path):
    with pytest.raises(ValueError, match=r"valid names: .*bump.*gp.*sinusoidal"):
        make_dataset("swirl", n_samples=10, n_features=2)
    with pytest.raises(ValueError, match=r"does not take option.*length_scale"):
        make_dataset("bump", n_samples=10, n_features=2, length_scale=1.0)
    for bad, match in [({"noise": -1.0}, "noise"), ({"n_components": 0}, "n_components"),
                       ({"bump": "l3"}, "bump"), ({"chunk_size": 0}, "chunk_size"),
                       ({"dtype": "int8"}, "dtype"), ({"n_samples": 1}, "n_samples")]:
        kwargs = {"n_samples": 10, "n_features": 2, **bad}
        with pytest.raises(ValueError, match=match):
            make_dataset("bump", **kwargs)
    with pytest.raises(ValueError, match="without replacement"):
        make_dataset("bump", n_samples=10, n_features=50, bump="l1", grid_size=5, n_components=2)
    assert set(GENERATORS) >= {"gp", "sinusoidal", "bump"}


@pytest.mark.cluster
def test_cluster_writes_same_store(tmp_path, cluster_client):
    from dr_dask.bench.traffic import SpecBytes, spec_bytes

    kwargs = dict(n_samples=7000, n_features=16, chunk_size=1000, random_state=9,
                  n_features_rff=200)
    cluster_client.register_plugin(SpecBytes())
    spec_bytes(cluster_client)
    dist = make_dataset("gp", tmp_path / "d.zarr", client=cluster_client, **kwargs)
    # each task reads its chunk's latent values from the store: its spec does not carry them
    # (8 kB a chunk here; at T = 10^7 they were a 76 MB graph)
    n, _, largest = spec_bytes(cluster_client)["write_block"]
    assert n == 7 and largest < 2000, (n, largest)
    local = make_dataset("gp", tmp_path / "l.zarr", **kwargs)
    a, b = xr.open_zarr(dist), xr.open_zarr(local)
    assert a.attrs["params"]["method"] == "rff"
    np.testing.assert_array_equal(a.X.values, b.X.values)
    np.testing.assert_array_equal(a.latent.values, b.latent.values)


def test_cli_make(tmp_path):
    runner = CliRunner()
    out = tmp_path / "sin.zarr"
    args = ["datasets", "make", "sinusoidal", "--out", str(out), "-T", "300", "-N", "7",
            "--noise", "0.2", "--seed", "3", "--chunk-size", "100", "--dtype", "float32"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert str(out) in result.output and "300 x 7" in result.output
    ds = xr.open_zarr(out)
    assert ds.X.shape == (300, 7) and ds.attrs["params"]["noise"] == 0.2
    assert ds.attrs["params"]["random_state"] == 3
    again = runner.invoke(main, args)
    assert again.exit_code == 2 and "already exists" in again.output
    assert runner.invoke(main, [*args, "--overwrite"]).exit_code == 0
    unknown = runner.invoke(main, ["datasets", "make", "spiral", "--out", str(tmp_path / "x.zarr")])
    assert unknown.exit_code == 2 and "valid names" in unknown.output
    wrong = runner.invoke(main, ["datasets", "make", "bump", "--out", str(tmp_path / "y"),
                                 "--method", "rff"])
    assert wrong.exit_code == 2 and "method" in wrong.output
