"""GP-Isomap: equivalence with S-Isomap, drift detection and refit on the shift scenario,
kernels, validation, dask and cluster paths."""

from __future__ import annotations

import pickle

import dask.array as da
import numpy as np
import pytest

from dr_dask.datasets.swiss_roll import euler_roll, sample_patches, shift_scenario
from dr_dask.linalg.align import procrustes_disparity, procrustes_fit
from dr_dask.methods._gp import cailliez_constant
from dr_dask.methods.gp_isomap import GPIsomap
from dr_dask.methods.isomap import Isomap
from dr_dask.stream import STATUS, StreamRunner, read_output


@pytest.fixture(scope="module")
def patch():
    U, _ = sample_patches(400, patches=(0,), random_state=0)
    X = euler_roll(U)
    return X[:300], X[300:], U[300:]


def rigid_error(reference: np.ndarray, estimate: np.ndarray) -> float:
    """``estimate``'s distance from ``reference`` after the best rotation, reflection and
    translation (no scaling: a scale error counts), relative to ``reference``'s spread."""
    fit = procrustes_fit(estimate, reference, scaling=False)
    return float(np.linalg.norm(fit.apply(estimate) - reference)
                 / np.linalg.norm(reference - reference.mean(axis=0)))


def test_large_length_scale_matches_isomap_transform(patch):
    """The GP mean is Isomap's out-of-sample map at its scale (eigenvector signs aside): an
    embedding 1 % too large or small fails."""
    Xb, Xs, _ = patch
    gp = GPIsomap(n_neighbors=10, clusterer="single", length_scale=3.0, random_state=0).fit(Xb)
    iso = Isomap(n_neighbors=10, n_components=2).fit(Xb)
    err = rigid_error(iso.transform(Xs), gp.transform(Xs))
    assert err <= 5e-3, err


def test_short_length_scale_breaks_equivalence(patch):
    # the equivalence is a large-length-scale property (docs/decisions.md GPI-HYPER), not an
    # identity
    Xb, Xs, _ = patch
    gp = GPIsomap(n_neighbors=10, clusterer="single", length_scale=0.03, noise_variance=0.5,
                  random_state=0).fit(Xb)
    iso = Isomap(n_neighbors=10, n_components=2).fit(Xb)
    assert procrustes_disparity(iso.transform(Xs), gp.transform(Xs)) > 5e-3


def test_shift_scenario_detects_refits_and_maps_new_patch(tmp_path):
    sc = shift_scenario(200, random_state=1)
    model = GPIsomap(n_neighbors=10, random_state=0).fit(sc.batch)
    assert model.n_manifolds_ == 3
    known = np.arange(len(sc.stream)) < sc.first_unseen
    novel = model.is_novel(sc.stream)
    assert novel[~known].mean() >= 0.90
    assert novel[known].mean() <= 0.05
    chunks = [sc.stream[i : i + 50] for i in range(0, len(sc.stream), 50)]
    out = str(tmp_path / "out")
    summary = StreamRunner(out, chunks, model, n_s=100, strict_sequential=True).run()
    assert summary["n_refits"] >= 1
    o = read_output(out)
    refit_row = o["checkpoint"]["refits"][0]["trigger_row"]
    assert refit_row > sc.first_unseen  # no refit from known-patch noise alone
    new = ~known & np.isin(o["status"], [STATUS["confident"], STATUS["remapped"]])
    assert new.sum() >= 0.9 * (~known).sum()
    # the new patch became a manifold of its own in the refitted model ...
    own = o["manifold"] == np.bincount(o["manifold"][new]).argmax()
    assert (new & own).sum() >= 0.9 * new.sum()
    # ... and maps onto its ground truth
    sel = new & own
    assert procrustes_disparity(sc.stream_truth[sel], o["embedding"][sel]) <= 0.05
    # known points are attributed to their patch's manifold and mapped onto their truth
    for p in range(3):
        kp = known & (sc.stream_labels == p) & (o["status"] == STATUS["confident"])
        own = o["manifold"] == np.bincount(o["manifold"][kp]).argmax()
        assert (kp & own).sum() >= 0.95 * kp.sum()
        assert procrustes_disparity(sc.stream_truth[kp & own], o["embedding"][kp & own]) <= 0.05


@pytest.mark.parametrize("kernel", ["geodesic_se", "geodesic_se_cailliez"])
def test_kernels_give_finite_calibrated_variance(kernel, patch):
    Xb, Xs, _ = patch
    gp = GPIsomap(n_neighbors=10, clusterer="single", kernel=kernel, random_state=0).fit(Xb)
    emb, var = gp.transform(Xs, return_variance=True)
    assert np.isfinite(emb).all() and np.all(var >= gp.manifolds_[0].noise_variance)
    far = Xs + np.array([0.0, 0.0, 3.0])  # shifted off the patch along the roll's axis
    assert np.median(gp.predict_variance(far)) > np.quantile(var, 0.99)


def test_spectral_kernel_mean_is_usable_and_variance_not_below_noise(patch):
    # K2 train kernel with the K3 cross kernel (Mahapatra & Chandola 2020, §5.1; docs/decisions.md
    # GPI-KERNEL): the mean approximates S-Isomap only roughly (Theorem 6.1 mixes eigenpairs of B
    # and B~), the variance is not calibrated
    Xb, Xs, U = patch
    gp = GPIsomap(n_neighbors=10, clusterer="single", kernel="spectral", length_scale=3.0,
                  random_state=0).fit(Xb)
    emb, var = gp.transform(Xs, return_variance=True)
    assert procrustes_disparity(U, emb) < 0.2
    assert np.all(var >= gp.manifolds_[0].noise_variance)


def test_literal_btilde_warns(patch):
    Xb, _, _ = patch
    with pytest.warns(UserWarning, match="ablation"):
        GPIsomap(n_neighbors=10, clusterer="single", kernel="literal_btilde",
                 length_scale=1.0, random_state=0).fit(Xb[:150])


def test_cailliez_constant_makes_distances_euclidean(patch):
    from dr_dask.methods.isomap import Isomap

    G = Isomap(n_neighbors=10).fit(patch[0][:150]).dist_matrix_
    c = cailliez_constant(G)
    Gc = G + c
    np.fill_diagonal(Gc, 0)
    H = np.eye(len(G)) - 1.0 / len(G)
    w_plain = np.linalg.eigvalsh(-0.5 * H @ G**2 @ H)
    w = np.linalg.eigvalsh(-0.5 * H @ Gc**2 @ H)
    assert c > 0 and w_plain.min() < -1e-6
    assert w.min() >= -1e-8 * w.max()


def test_mapping_restores_the_callers_blas_threads(patch):
    """Mapping runs BLAS single-threaded, but leaves the user's process as it found it."""
    from dr_dask.runtime.blas import blas_threads

    before = blas_threads()
    if max(before, default=1) < 2:
        pytest.skip("BLAS runs one thread here: nothing to restore")
    gp = GPIsomap(n_neighbors=10, clusterer="single", random_state=0).fit(patch[0])
    gp.transform(patch[1])
    assert blas_threads() == before


def test_calibrate_threshold_and_manual_sigma(patch):
    Xb, Xs, _ = patch
    gp = GPIsomap(n_neighbors=10, clusterer="single", random_state=0).fit(Xb)
    assert gp.threshold_source_ == "loo"
    assert set(gp.timings_) == {"clustering", "manifolds", "stitch", "threshold"}
    t = gp.calibrate_threshold(Xs, quantile=0.9)
    assert gp.sigma_t_ == t and gp.threshold_source_ == "holdout"
    assert abs(gp.is_novel(Xs).mean() - 0.1) <= 0.02
    manual = GPIsomap(n_neighbors=10, clusterer="single", sigma_t=5.0).fit(Xb)
    assert manual.sigma_t_ == 5.0 and not manual.is_novel(Xs).any()


def test_user_labels_and_validation():
    sc = shift_scenario(60, random_state=2)
    labels = np.repeat([7, 3, 5], 60)
    gp = GPIsomap(n_neighbors=8, clusterer=labels, random_state=0).fit(sc.batch)
    assert gp.n_manifolds_ == 3 and gp.embedding_.shape == (180, 2)
    X = sc.batch.copy()
    X[[4, 9]] = np.nan
    with pytest.raises(ValueError, match=r"Input X contains NaN\. .* 2 row\(s\): 4, 9"):
        GPIsomap(n_neighbors=8).fit(X)
    with pytest.raises(ValueError, match="X has 2 features, but GPIsomap is expecting 3"):
        gp.transform(sc.stream[:, :2])
    with pytest.raises(ValueError, match="X has 2 features, but GPIsomap is expecting 3"):
        gp.transform(da.from_array(sc.stream[:, :2]))
    with pytest.raises(ValueError, match="The 'kernel' parameter of GPIsomap must be a str among"):
        GPIsomap(kernel="rbf").fit(sc.batch)
    with pytest.raises(ValueError, match="fewer than"):
        GPIsomap(n_neighbors=8, clusterer=np.r_[np.zeros(175), np.ones(5)]).fit(sc.batch)


def test_dask_transform_keeps_row_chunks_and_pickles(patch):
    Xb, Xs, _ = patch
    gp = GPIsomap(n_neighbors=10, clusterer="single", random_state=0).fit(Xb)
    Xd = da.from_array(Xs, chunks=(30, 3))
    emb, var = gp.transform(Xd, return_variance=True)
    assert isinstance(emb, da.Array) and emb.chunks[0] == Xd.chunks[0]
    e2, v2 = gp.transform(Xs, return_variance=True)
    np.testing.assert_allclose(emb.compute(), e2)
    np.testing.assert_allclose(var.compute(), v2)
    clone = pickle.loads(pickle.dumps(gp))
    np.testing.assert_array_equal(clone.transform(Xs), e2)


@pytest.mark.cluster
def test_fit_and_transform_on_cluster(cluster_client):
    sc = shift_scenario(50, random_state=4)
    local = GPIsomap(n_neighbors=8, random_state=0).fit(sc.batch)
    remote = GPIsomap(n_neighbors=8, random_state=0, client=cluster_client).fit(sc.batch)
    np.testing.assert_array_equal(local.labels_, remote.labels_)
    np.testing.assert_allclose(local.embedding_, remote.embedding_, rtol=1e-6, atol=1e-9)
    Xd = da.from_array(sc.stream, chunks=(100, 3))
    emb = cluster_client.compute(remote.transform(Xd)).result()
    np.testing.assert_allclose(emb, local.transform(sc.stream), rtol=1e-6, atol=1e-9)


# ---------------------------------------------------------------- drift detection on layouts (kind,
# batch points per patch, seed): seeds chosen here; layouts are generated, not stored
LAYOUT_CASES = [("separated", 150, 11), ("touching", 300, 12), ("unequal", 80, 13),
                ("noise", 150, 14)]


@pytest.mark.parametrize(("kind", "n_batch", "seed"), LAYOUT_CASES)
def test_layout_assignment_variance_stitch_and_refit(kind, n_batch, seed):
    from dr_dask.datasets.roll_layouts import patch_layout
    from dr_dask.stream.evaluate import layout_figures

    sc = patch_layout(kind, n_batch, 120, random_state=seed)
    model = GPIsomap(n_neighbors=10, random_state=0).fit(sc.batch)
    f = layout_figures(model, sc)
    assert f["n_manifolds"] == 3, f
    assert max(f["patch_disparity"]) <= 0.01, f  # known patches mapped through their manifold
    assert f["beside_own_patch"] >= 0.99, f
    assert f["flagged_unseen"] >= 0.95 and f["flagged_known"] <= 0.02, f
    assert f["variance_ratio"] >= 3, f
    assert f["refit_n_manifolds"] == 4, f
    assert f["new_patch_disparity"] <= 0.02 and f["old_points_move"] <= 0.01, f


def test_link_rule_beats_least_variance_on_unequal_patches():
    """The paper's least-variance rule sends points through a far manifold; the link rule
    maps each through the one it lies on (given the true batch labels)."""
    from dr_dask.datasets.roll_layouts import patch_layout

    sc = patch_layout("unequal", 80, 100, random_state=1)
    model = GPIsomap(n_neighbors=10, clusterer=sc.batch_labels, random_state=0).fit(sc.batch)
    known = sc.stream_labels < 3
    _, _, man = model.map_points(sc.stream[known])
    assert np.mean(man == sc.stream_labels[known]) >= 0.995
    # the variance under the own manifold is at the floor, under the others far above it
    preds = [gp.predict(sc.stream[known]) for gp in model.manifolds_]
    V = np.column_stack([v for _, v in preds])
    own = V[np.arange(known.sum()), sc.stream_labels[known]]
    other = np.where(np.arange(3)[None, :] != sc.stream_labels[known][:, None], V, np.inf).min(1)
    assert np.median(other / own) >= 10


def test_density_split_separates_touching_patches():
    from dr_dask.datasets.roll_layouts import patch_layout
    from dr_dask.methods._manifolds import tangent_clusters

    sc = patch_layout("touching", 300, 10, random_state=12)
    merged = tangent_clusters(sc.batch, 10, 2, density_persistence=None)
    split = tangent_clusters(sc.batch, 10, 2)
    assert len(np.unique(merged)) < 3  # one smooth surface: tangents alone keep it whole
    assert len(np.unique(split)) == 3
    for p in range(3):
        mine = split[sc.batch_labels == p]
        assert np.mean(mine == np.bincount(mine[mine >= 0]).argmax()) >= 0.98


def _axis_ratio(Y: np.ndarray, E: np.ndarray) -> np.ndarray:
    """Per-axis least-squares scale of Y against E about their means (1 = same scale)."""
    Yc, Ec = Y - Y.mean(0), E - E.mean(0)
    return (Yc * Ec).sum(0) / (Ec * Ec).sum(0)


def test_one_scale_for_batch_transform_stream_and_refit(tmp_path):
    """fit_transform is embedding_; transform of the batch, the stream's rows and a refit are
    in embedding_'s frame and scale (per axis, not only up to a Procrustes similarity)."""
    import zarr

    from dr_dask.datasets import make_dataset
    from dr_dask.stream.models import refit_model, refit_params

    make_dataset("gp", str(tmp_path / "gp.zarr"), n_samples=360, n_features=60,
                 random_state=0)
    X = np.asarray(zarr.open_group(str(tmp_path / "gp.zarr"), mode="r")["X"])
    batch, extra = X[:300], X[300:]
    model = GPIsomap(random_state=0)
    E = model.fit_transform(batch)
    np.testing.assert_array_equal(E, model.embedding_)
    radius = np.linalg.norm(E - E.mean(0), axis=1).mean()
    np.testing.assert_allclose(_axis_ratio(model.transform(batch), E), 1, atol=0.02)
    assert np.median(np.linalg.norm(model.transform(batch) - E, axis=1)) < 0.01 * radius

    # the stream writes the batch rows where embedding_ has them
    out = str(tmp_path / "out")
    StreamRunner(out, [batch[i : i + 100] for i in range(0, 300, 100)], model, n_s=10**6,
                 strict_sequential=True).run()
    streamed = read_output(out)["embedding"]
    np.testing.assert_allclose(_axis_ratio(streamed, E), 1, atol=0.02)
    assert np.median(np.linalg.norm(streamed - E, axis=1)) < 0.01 * radius

    # a refit on batch + buffer continues the frame and the scale (one similarity: its
    # Isomap of more points may stretch one axis against the other by a few percent), and
    # maps in its own embedding_'s scale
    new = refit_model(refit_params(model), np.vstack([batch, extra]), model.embedding_)
    old = new.embedding_[:300]
    Oc, Ec = old - old.mean(0), E - E.mean(0)
    assert abs((Oc * Ec).sum() / (Ec * Ec).sum() - 1) < 0.02
    np.testing.assert_allclose(_axis_ratio(old, E), 1, atol=0.05)
    np.testing.assert_allclose(_axis_ratio(new.transform(batch), old), 1, atol=0.02)
