"""The partitioned (IVF) neighbour search: exact when every list is probed, the same on a
cluster, from S3 and after a worker is killed mid-search; its recall estimated and warned."""

from __future__ import annotations

import os
import signal

import dask.array as da
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import noisy_curve

from dr_dask.graph import LowRecallWarning, kneighbors
from dr_dask.graph.knn import estimate_recall, knn_algorithm
from dr_dask.graph.knn_tol import DEFAULT_KNN_TOL


@pytest.fixture
def small_lists(dr_config):
    # many tasks and chunks at small T: groups of lists, chunk-aligned regions, block offsets
    dr_config({"knn.ivf-task-rows": 300, "knn.ivf-chunk-rows": 64, "knn.ivf-block-rows": 512})


def test_all_lists_probed_equals_exact(small_lists, tmp_path):
    X = noisy_curve(2500, 30)
    d0, i0 = kneighbors(X, 7, algorithm="exact")
    d, i = kneighbors(X, 7, algorithm="ivf", n_lists=25, n_probe=25, scratch=str(tmp_path))
    np.testing.assert_array_equal(i, i0)
    np.testing.assert_allclose(d, d0, rtol=1e-5)
    assert os.listdir(tmp_path) == []  # the lists are deleted
    # dask input far from the origin, uneven blocks: rows centred before the float32 cast
    Xd = da.from_array(X + 1e4, chunks=((900, 1000, 600), 30))
    d, i = kneighbors(Xd, 7, algorithm="ivf", n_lists=25, n_probe=40)
    assert np.mean(i == i0) >= 0.999
    np.testing.assert_allclose(d, d0, rtol=1e-4)


def test_a_groups_own_lists_give_each_pair_of_rows_once_in_any_order(dr_config, tmp_path):
    """Among a group's own lists the search multiplies each pair of rows once and folds it
    both ways: whatever order and pieces the rows probe the lists in (a list against itself
    whole or in parts, a pair of lists from either side first), every row ends with its exact
    nearest rows of those lists, none twice."""
    import dr_dask.graph._knn_ivf as ivf
    from dr_dask.graph.topk import brute_knn
    from dr_dask.io.storage import location

    dr_config({"knn.ivf-task-rows": 10**6, "knn.ivf-chunk-rows": 64})  # one group
    X = noisy_curve(1500, 10, seed=3)
    lists = ivf.build_lists(X, location(str(tmp_path)), client=None, n_lists=8, n_probe=8)
    first, last = lists.groups[0]
    q = np.asarray(lists.rows[:lists.n_rows])
    sq = np.einsum("ij,ij->i", q, q, dtype=np.float64)
    kk = 9
    cands = ivf._Candidates(lists, 0, q, sq, kk)
    best, idx = np.full((len(q), kk), np.inf), np.full((len(q), kk), -1)
    rng = np.random.default_rng(0)
    requests = []
    for x in range(first, last):
        rows = np.arange(cands.at[x - first], cands.at[x - first + 1])
        for y in range(first, last):
            if x == y and x % 2:  # odd lists meet themselves whole, even ones in two parts
                requests.append((x, y, rows))
            else:
                part = rng.random(len(rows)) < 0.5
                requests += [(x, y, rows[part]), (x, y, rows[~part])]
    for j in rng.permutation(len(requests)):
        x, y, rows = requests[j]
        if len(rows):
            cands.fold(x, y, rows, best, idx)
    keys, ref = brute_knn(q, q, kk)  # own lists first: a candidate is its row's position
    np.testing.assert_array_equal(np.sort(idx, axis=1), np.sort(ref, axis=1))
    np.testing.assert_allclose(best, keys, rtol=1e-5, atol=1e-4)


def test_each_list_holds_the_rows_nearest_its_centroid(small_lists, tmp_path):
    """A probe reads a list's rows by its span: every row there is nearest that list's centroid
    (rows arrive from many assignment blocks), and every row is in exactly one list."""
    from dr_dask.graph._knn_ivf import build_lists
    from dr_dask.io.storage import location

    X = noisy_curve(3000, 20, seed=2)
    lists = build_lists(X, location(str(tmp_path)), client=None, n_lists=30, n_probe=3)
    assert len(lists.groups) > 1 and lists.n_rows == len(X)
    rows, ids = np.asarray(lists.rows), np.asarray(lists.ids)
    seen = []
    for u, (s, n) in enumerate(zip(lists.list_start, lists.sizes)):
        x = rows[s:s + n].astype(np.float64)
        d2 = ((x[:, None, :] - lists.cent32[None, :, :].astype(np.float64)) ** 2).sum(-1)
        assert np.all(d2[:, u] <= d2.min(axis=1) * (1 + 1e-5) + 1e-9), f"list {u}"
        seen.append(ids[s:s + n])
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(len(X)))


def test_kmeans_plusplus_seeds_one_centroid_per_cluster():
    """The quantizer's seeds are sample rows drawn by D² sampling: on well separated clusters
    of unequal size each cluster gets one seed (a uniform draw would most likely miss the
    smallest), the same for the same seed."""
    from dr_dask.graph._ivf_quantizer import kmeans_plusplus

    rng = np.random.RandomState(0)
    centres = rng.uniform(-50, 50, (6, 8))
    sizes = [2000, 1000, 500, 200, 50, 10]
    raw = np.vstack([c + rng.normal(size=(n, 8)) for c, n in zip(centres, sizes)])
    rows = (raw - raw.mean(axis=0)).astype(np.float32)
    seeds = kmeans_plusplus(rows, 6, np.random.RandomState(1))
    assert all((rows == seed).all(axis=1).any() for seed in seeds)
    owner = np.argmin(((seeds[:, None] - (centres - raw.mean(axis=0))[None]) ** 2).sum(-1), 1)
    assert sorted(owner) == list(range(6))
    np.testing.assert_array_equal(seeds, kmeans_plusplus(rows, 6, np.random.RandomState(1)))


def test_few_probes_are_approximate_and_warned(small_lists):
    from dr_dask.methods.landmark_isomap import LandmarkIsomap

    X = noisy_curve(2000, 30, seed=1)
    _, i0 = kneighbors(X, 10, algorithm="exact")
    _, i = kneighbors(X, 10, algorithm="ivf", n_lists=45, n_probe=1)
    true = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(i, i0)])
    assert true < 0.9  # one list of 45 misses neighbours on this noisy curve
    est = estimate_recall(X, i, n_rows=400, random_state=0)
    assert abs(est - true) < 0.05  # the sampled estimate tracks the true recall
    with pytest.warns(LowRecallWarning, match="raise it"):
        model = LandmarkIsomap(n_neighbors=10, n_components=1, n_landmarks=50, knn="ivf",
                               n_probe=1, random_state=0).fit(X)
    assert model.knn_recall_ < 0.9
    exact = LandmarkIsomap(n_neighbors=10, n_components=1, n_landmarks=50, knn="exact",
                           random_state=0).fit(X)
    assert exact.knn_recall_ == 1.0


def test_the_recall_is_not_measured_on_the_quantizers_training_rows():
    """The search and its recall sample share a seed, but the sample is not the rows the
    quantizer trained on (drawn first from that seed): a training row sits nearer its own
    centroid and is found less well, so such a sample understated the recall."""
    from dr_dask.graph.knn import recall_rows

    T, n_train = 100_000, 20_000
    training = np.random.RandomState(7).choice(T, n_train, replace=False)
    rows = recall_rows(T, 200, 7)
    assert len(np.unique(rows)) == 200
    assert len(np.intersect1d(rows, training)) < 2 * 200 * n_train / T  # chance: 40
    np.testing.assert_array_equal(rows, recall_rows(T, 200, 7))


def test_the_bounded_probe_order_searches_what_the_whole_order_does(small_lists, tmp_path,
                                                                    monkeypatch):
    """After its first round the adaptive search selects only the lists within a row's gap
    bound (its k-th distance only falls): the same neighbours, to the bit, as selecting
    every row's 64 nearest lists up front; a bounded selection keeps exactly the rows below
    the bound, nearest first."""
    import dr_dask.graph._knn_ivf as ivf
    from dr_dask.graph.topk import brute_knn
    from dr_dask.io.storage import location

    X = noisy_curve(4000, 30, seed=5) + 0.3 * np.random.RandomState(6).normal(size=(4000, 30))
    lists = ivf.build_lists(X, location(str(tmp_path)), client=None)
    lists = ivf.calibrated(lists, 10, client=None, random_state=0)
    q, cent = np.asarray(lists.rows[:50]), lists.cent32
    keys, idx = brute_knn(q, cent, len(cent))
    bound = keys[:, 7] + 1e-9 * np.abs(keys[:, 7])  # the 8 nearest lists, no more
    bk, bi = brute_knn(q, cent, 20, bound=bound)
    np.testing.assert_array_equal(bi[:, :8], idx[:, :8])
    assert (bi[:, 8:] == -1).all() and (bk[:, 8:] == bound[:, None]).all()
    # where rounding reorders a near-tie, the first round's lists still lead, none twice
    gaps, probes, nearest = ivf._probe_order(q, cent, 4)
    swap = [1, 0, 2, 3]
    _, wide = ivf._wider_order(q, cent, nearest, gaps[:, swap], probes[:, swap],
                               np.arange(len(q)), np.full(len(q), np.inf), 12)
    np.testing.assert_array_equal(wide[:, :4], probes[:, swap])
    np.testing.assert_array_equal(wide[:, 4:], idx[:, 4:12])
    got = [ivf._search_group(lists, g, 10, True) for g in range(len(lists.groups))]

    def whole_order(q, cent32, nearest, gaps, probes, rows, within, width):
        return ivf._probe_order(q, cent32, width)[:2]

    monkeypatch.setattr(ivf, "_wider_order", whole_order)
    for g, mine in enumerate(got):
        ref = ivf._search_group(lists, g, 10, True)
        for a, b in zip(mine, ref):
            np.testing.assert_array_equal(a, b)


def test_auto_makes_one_search_and_reports_its_recall(small_lists, dr_config, monkeypatch):
    """knn="auto" above dr_dask.knn.ivf-min-rows builds the lists once, searches once (no
    exact search of every row after it) and stores the estimated recall and distance error,
    the latter within the default knn_tol."""
    import dr_dask.graph.knn as knn_module
    import dr_dask.graph.partitioned as partitioned
    from dr_dask.methods.landmark_isomap import LandmarkIsomap

    dr_config({"knn.ivf-min-rows": 1000})
    calls = {"lists": 0, "full": 0}
    build, search = partitioned.build_lists, knn_module.kneighbors

    def counted_build(*args, **kw):
        calls["lists"] += 1
        return build(*args, **kw)

    def counted_search(X, k, **kw):
        calls["full"] += kw.get("query") is None
        return search(X, k, **kw)

    monkeypatch.setattr(partitioned, "build_lists", counted_build)
    monkeypatch.setattr(knn_module, "kneighbors", counted_search)
    X = noisy_curve(2000, 30, seed=1)
    auto = LandmarkIsomap(knn="auto", n_neighbors=10, n_components=1, n_landmarks=50,
                          random_state=0).fit(X)
    assert calls == {"lists": 1, "full": 0}
    assert 0.9 <= auto.knn_recall_ <= 1 and 0 <= auto.knn_distance_error_ <= DEFAULT_KNN_TOL


def test_knn_modes():
    assert knn_algorithm("ivf", 100, 3) == "ivf"
    assert knn_algorithm("exact", 10**7, 100) == "auto"
    assert knn_algorithm("auto", 10**7, 100) == "ivf"
    assert knn_algorithm("auto", 10**4, 100) == "auto"
    assert knn_algorithm("auto", 10**7, 3) == "auto"  # KD-trees: exact is cheap
    with pytest.raises(ValueError, match="algorithm='ivf' searches X among itself"):
        kneighbors(np.zeros((10, 2)), 2, query=np.zeros((3, 2)), algorithm="ivf")


def test_bad_knn_parameters_are_refused_naming_them(tmp_path):
    from dr_dask.cli import main
    from dr_dask.methods.ikd import IKD
    from dr_dask.methods.isomap import Isomap

    X = noisy_curve(100, 5)
    with pytest.raises(ValueError, match="'knn' parameter"):
        Isomap(knn="fast").fit(X)
    with pytest.raises(ValueError, match="'n_probe' parameter"):
        IKD(n_components=1, solver="geodesic", n_probe=0).fit(X)
    np.save(tmp_path / "x.npy", X)
    for cmd in (["ikd", "-n", "1", "--solver", "geodesic"], ["isomap", "-n", "1"]):
        for opt, bad in (("--knn", "fast"), ("--n-probe", "0")):
            res = CliRunner().invoke(main, ["--scheduler", "threads", "embed", *cmd, "--input",
                                            str(tmp_path / "x.npy"), "--out",
                                            str(tmp_path / "o.zarr"), opt, bad])
            assert res.exit_code == 2 and f"'{opt}'" in res.output, res.output
            assert res.exception is None or isinstance(res.exception, SystemExit)
    assert not (tmp_path / "o.zarr").exists()


def _landmark_ikd(**kw):
    from dr_dask.methods.ikd import IKD

    return IKD(n_components=1, solver="geodesic", n_neighbors=8, n_landmarks=60, knn="ivf",
               n_probe=4, random_state=0, **kw)


@pytest.mark.cluster
def test_landmark_ivf_fit_on_cluster_equals_threaded(small_lists, cluster_client):
    X = noisy_curve(2000, 30, seed=2)
    threads = _landmark_ikd().fit(X)
    on_cluster = _landmark_ikd(client=cluster_client).fit(X)
    assert threads.knn_recall_ == on_cluster.knn_recall_
    np.testing.assert_allclose(on_cluster.embedding_, threads.embedding_, rtol=1e-6,
                               atol=1e-9)
    # rows read from a store by the workers, in uneven blocks
    stored = _landmark_ikd(client=cluster_client).fit(
        da.from_array(X, chunks=((700, 900, 400), 30)))
    np.testing.assert_allclose(stored.embedding_, threads.embedding_, rtol=1e-6, atol=1e-9)


@pytest.mark.cluster
def test_worker_killed_in_the_search_leaves_the_result_unchanged(small_lists, tmp_path):
    from distributed import Client, LocalCluster

    X = noisy_curve(2000, 20, seed=3)
    expected = kneighbors(X, 6, algorithm="ivf", n_lists=30)  # the adaptive probe
    flag = str(tmp_path / "killed")

    def arm() -> None:
        # in each worker: the first list-search task to start SIGKILLs its own process
        import dr_dask.graph._knn_ivf as ivf

        real = ivf._search_group

        def search_group(*args):
            try:
                os.close(os.open(flag, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return real(*args)
            os.kill(os.getpid(), signal.SIGKILL)

        ivf._search_group = search_group

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        client.run(arm)
        got = kneighbors(X, 6, algorithm="ivf", n_lists=30, client=client,
                         scratch=str(tmp_path / "lists"))
    assert os.path.exists(flag)  # a worker did die in the search
    np.testing.assert_array_equal(got[1], expected[1])
    np.testing.assert_array_equal(got[0], expected[0])


def test_ivf_fit_from_s3_equals_local(s3_bucket, tmp_path):
    import zarr

    from dr_dask.cli import main
    from dr_dask.io.storage import Location
    from dr_dask.runs.group import open_run

    X = noisy_curve(600, 12, seed=4)
    for url in (str(tmp_path / "in.zarr"), f"s3://{s3_bucket}/in.zarr"):
        zarr.open_group(Location(url).zarr_store(), mode="w").create_array(
            "X", data=X, chunks=(200, 12), dimension_names=("sample", "feature"))
    args = ["--scheduler", "threads", "embed", "ikd", "-n", "1", "--solver", "geodesic",
            "--n-neighbors", "8", "--landmarks", "40", "--knn", "ivf", "--name", "r"]
    local_out, s3_out = str(tmp_path / "out.zarr"), f"s3://{s3_bucket}/out.zarr"
    res = CliRunner().invoke(main, [*args, "--input", f"{tmp_path}/in.zarr:X", "--out",
                                    local_out])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, [*args, "--input", f"s3://{s3_bucket}/in.zarr:X", "--out",
                                    s3_out])
    assert res.exit_code == 0, res.output
    local, remote = open_run(local_out, "r"), open_run(s3_out, "r")
    np.testing.assert_allclose(np.asarray(remote["embedding"][...]),
                               np.asarray(local["embedding"][...]), rtol=1e-6, atol=1e-9)
    recall = remote.attrs["summary"]["knn_recall"]
    assert recall == local.attrs["summary"]["knn_recall"] and 0 < recall <= 1
    # the lists were written next to the input, in its bucket, and deleted
    assert sorted(Location(f"s3://{s3_bucket}").listdir()) == ["in.zarr", "out.zarr"]


def test_every_graph_building_estimator_takes_the_search():
    """LSDR's kNN graph and GP-Isomap's batch clustering run the IVF search when asked: with
    every list probed their fits equal the exact ones, and they report the recall."""
    from dr_dask.datasets.swiss_roll import shift_scenario
    from dr_dask.methods.gp_isomap import GPIsomap
    from dr_dask.methods.lsdr import LSDR

    rng = np.random.default_rng(0)
    t = rng.uniform(0, 3 * np.pi, 400)
    X = np.c_[np.cos(t), np.sin(t), t / 3, np.zeros((400, 5))] + 0.02 * rng.normal(size=(400, 8))
    exact = LSDR(n_components=1, graph="knn", knn="exact", random_state=0).fit(X)
    ivf = LSDR(n_components=1, graph="knn", knn="ivf", n_probe=400, random_state=0).fit(X)
    np.testing.assert_allclose(ivf.embedding_, exact.embedding_, atol=1e-8)
    assert exact.knn_recall_ == ivf.knn_recall_ == 1.0
    assert LSDR(n_components=1, random_state=0).fit(X[:, :3]).knn_recall_ is None  # Delaunay
    batch = shift_scenario(200, random_state=1).batch
    exact = GPIsomap(n_neighbors=10, knn="exact", random_state=0).fit(batch)
    ivf = GPIsomap(n_neighbors=10, knn="ivf", n_probe=1000, random_state=0).fit(batch)
    np.testing.assert_array_equal(ivf.labels_, exact.labels_)
    np.testing.assert_allclose(ivf.embedding_, exact.embedding_, atol=1e-8)
    assert ivf.knn_recall_ == 1.0


def test_lists_numbered_along_the_manifold():
    """The lists' numbering walks the curve the centroids sample (in 60 dimensions, shuffled):
    consecutive lists are near each other, so a block of consecutive lists is a compact
    region whose boundary with the rest is short."""
    from dr_dask.graph._ivf_quantizer import list_order

    rng = np.random.default_rng(0)
    t = rng.permutation(np.linspace(0, 4 * np.pi, 400))
    basis = np.linalg.qr(rng.standard_normal((60, 3)))[0]
    cent = np.column_stack([np.cos(t), np.sin(t), 0.3 * t]) @ basis.T
    cent += 0.01 * rng.standard_normal(cent.shape)
    order = list_order(cent)
    assert np.array_equal(np.sort(order), np.arange(400))
    steps = np.abs(np.diff(t[order]))
    assert np.median(steps) < 1.5 * 4 * np.pi / 400  # a walk along t, not jumps across it
    # blocks of 50 consecutive lists span short stretches of the curve
    assert max(np.ptp(t[order[a:a + 50]]) for a in range(0, 400, 50)) < 0.35 * 4 * np.pi
