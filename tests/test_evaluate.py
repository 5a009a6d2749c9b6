"""``dr-dask compare`` and ``dr-dask evaluate`` end to end, on the cluster fixture."""

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner
from conftest import idle_rss_gb, plausible_peak
from matplotlib.image import imread
from sklearn.datasets import load_digits

from dr_dask.cli import main

pytestmark = pytest.mark.cluster  # every test runs on the session's cluster


@pytest.fixture(scope="module")
def digits_store(tmp_path_factory):
    X, y = load_digits(return_X_y=True)
    path = str(tmp_path_factory.mktemp("digits") / "digits.zarr")
    group = zarr.open_group(path, mode="w")
    group.create_array("X", data=X.astype(np.float64), chunks=(600, 64))
    group.create_array("labels", data=y.astype(np.int64), chunks=(1797,))
    group.create_array("short_labels", data=y[:-5].astype(np.int64), chunks=(1792,))
    return path


def run(args, client):
    return CliRunner().invoke(main, ["--scheduler", client.scheduler.address, *args])


def test_compare_digits(digits_store, tmp_path, cluster_client):
    out = str(tmp_path / "cmp")
    idle = idle_rss_gb()  # this process and the cluster's workers
    res = run(["compare", "--input", f"{digits_store}:X", "-n", "2",
               "--methods", "pca,lsdr,umap", "--labels", "labels", "--out", out], cluster_client)
    assert res.exit_code == 0, res.output
    report = json.loads(Path(out, "compare.json").read_text())
    if importlib.util.find_spec("umap") is None:  # the optional extra is absent: a message
        assert "umap skipped" in res.output
        assert set(report["methods"]) == {"pca", "lsdr"} and "umap" in report["skipped"]
    else:
        assert set(report["methods"]) == {"pca", "lsdr", "umap"}
        assert "umap" not in report.get("skipped", {})
    for name, entry in report["methods"].items():
        assert entry["seconds"] > 0 and plausible_peak(entry["peak_rss_gb"], idle)
        m = entry["metrics"]
        assert 0.5 < m["trustworthiness"] <= 1 and 0.3 < m["knn_accuracy"] <= 1, name
    assert "PCA" in report["methods"]["lsdr"]["note"]  # p=64 > Delaunay limit: reduced first
    # one readable panel per method (640 x 480 px each), the metrics table beside them
    img = imread(os.path.join(out, "compare.png"))
    assert img.ndim == 3 and img.shape[0] >= 480 and img.shape[1] > 2 * 640
    assert np.load(os.path.join(out, "embeddings.npz"))["pca"].shape == (1797, 2)


def test_compare_rejects_labels_of_wrong_length(digits_store, tmp_path, cluster_client):
    res = run(["compare", "--input", f"{digits_store}:X", "-n", "2", "--methods", "pca",
               "--labels", "short_labels", "--out", str(tmp_path / "x")], cluster_client)
    assert res.exit_code == 2
    assert "labels has 1792 rows but the input has 1797 samples" in res.output


def test_evaluate_stored_run(digits_store, tmp_path, cluster_client):
    from sklearn.decomposition import PCA

    from dr_dask.io.inputs import open_dataset
    from dr_dask.runs.group import RunGroup

    store = str(tmp_path / "runs.zarr")
    X, _ = load_digits(return_X_y=True)
    pca = PCA(2)
    emb = pca.fit_transform(X)
    group = RunGroup(store, "pca2", params={"method": "pca"},
                     identity=open_dataset(f"{digits_store}:X").identity)
    group.write("embedding", emb, ("sample", "component"))
    group.mark_complete(eigenvalues=pca.explained_variance_.tolist())
    res = run(["evaluate", "--store", store, "--embedding", "pca2", "--labels", "labels"],
              cluster_client)
    assert res.exit_code == 0, res.output
    with open(os.path.join(store, "pca2.report", "metrics.json")) as fh:
        report = json.load(fh)
    from sklearn.manifold import trustworthiness

    from dr_dask.metrics import trustworthiness as ours

    assert report["metrics"]["trustworthiness"] == pytest.approx(ours(X, emb, 10), abs=1e-12)
    # digits are integer-valued: input distances tie, and sklearn's argsort ranks ties in an
    # arbitrary order while we rank a tie as the closer position (1 + #strictly closer)
    assert report["metrics"]["trustworthiness"] == pytest.approx(
        trustworthiness(X, emb, n_neighbors=10), abs=1e-3)
    # the spectrum drawn is the run's, and the report's JSON carries it
    assert report["eigenvalues"] == pytest.approx(pca.explained_variance_.tolist())
    img = imread(os.path.join(store, "pca2.report", "embedding.png"))
    assert img.ndim == 3 and img.shape[0] >= 480 and img.shape[1] > 2 * 640
    bad = run(["evaluate", "--store", store, "--embedding", "pca2", "--labels", "short_labels"],
              cluster_client)
    assert bad.exit_code == 2 and "labels has 1792 entries" in bad.output
