"""A T x T stage says its cost before it starts: logged always, a warning naming the linear
way out past ``dr_dask.quadratic.warn-bytes``, and a scratch location without room refused
before a byte is written (exit 2 from the command line)."""

from __future__ import annotations

import logging
import os
import subprocess
import warnings

import numpy as np
import pytest
from click.testing import CliRunner

import dr_dask
from dr_dask import IKD, GPIsomap, Isomap, QuadraticCostWarning, ScratchSpaceError
from dr_dask.cli import main


@pytest.fixture(scope="module")
def rows() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(300, 8))


@pytest.fixture
def tiny_fs(tmp_path):
    """A real 1 MiB tmpfs (root only): its free space is what the check reads."""
    where = tmp_path / "tiny"
    where.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(where)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def _files(path) -> list[str]:
    return [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs]


@pytest.mark.parametrize("solver", ["full", "geodesic", "blockwise"])
def test_ikd_warns_past_the_threshold_naming_n_landmarks(rows, dr_config, caplog, solver):
    dr_config({"quadratic.warn-bytes": "1 KiB"})
    with caplog.at_level(logging.INFO, logger="dr_dask.linalg.cost"), \
            pytest.warns(QuadraticCostWarning, match="n_landmarks") as record:
        IKD(n_components=2, solver=solver, random_state=0).fit(rows)
    assert "T=300" in str(record[0].message)
    logged = [r.getMessage() for r in caplog.records if "T x T" in r.getMessage()]
    assert logged and "memory" in logged[0] and "of the order of" in logged[0], logged


def test_no_warning_below_the_threshold(rows, caplog):
    with warnings.catch_warnings():
        warnings.simplefilter("error", QuadraticCostWarning)
        with caplog.at_level(logging.INFO, logger="dr_dask.linalg.cost"):
            IKD(n_components=2, random_state=0).fit(rows)
    # said anyway, at INFO: 300 x 300 of float64 upper tiles
    assert any("T=300 rows make a T x T matrix" in r.getMessage() for r in caplog.records)


def test_landmark_ikd_is_not_quadratic(rows, dr_config):
    dr_config({"quadratic.warn-bytes": "1 KiB"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", QuadraticCostWarning)
        IKD(n_components=2, n_landmarks=50, random_state=0).fit(rows)


def test_exact_isomap_warns_and_stays_exact(rows, dr_config):
    quiet = Isomap(n_neighbors=8, n_components=2).fit(rows).embedding_
    dr_config({"quadratic.warn-bytes": "1 KiB"})
    with pytest.warns(QuadraticCostWarning, match="LandmarkIsomap"):
        loud = Isomap(n_neighbors=8, n_components=2).fit(rows).embedding_
    np.testing.assert_array_equal(loud, quiet)


def test_gp_isomap_batch_warns_once(dr_config):
    rng = np.random.default_rng(1)
    t = rng.uniform(0, 3, 200)
    X = np.c_[t, np.sin(t), rng.uniform(0, 1, 200)]
    dr_config({"quadratic.warn-bytes": "1 KiB"})
    with pytest.warns(QuadraticCostWarning) as record:
        GPIsomap(n_components=2, random_state=0).fit(X)
    mine = [w for w in record if issubclass(w.category, QuadraticCostWarning)]
    # the batch's warning, not its manifolds' Isomap fits (advice meant for Isomap)
    assert len(mine) == 1 and "GP-Isomap batch" in str(mine[0].message)


def test_scratch_without_room_is_refused_before_writing(tiny_fs):
    X = np.random.default_rng(0).normal(size=(600, 6))
    est = IKD(n_components=2, tile_cache="disk", scratch=str(tiny_fs), random_state=0)
    with pytest.raises(ScratchSpaceError) as err:
        est.fit(X)
    msg = str(err.value)
    # one block of 600 rows: 600 x 1200 / 2 float64 upper tiles, 2,880,000 bytes
    assert "2,880,000 bytes" in msg and "free" in msg and str(tiny_fs) in msg, msg
    assert _files(tiny_fs) == []


def test_cli_exits_2_naming_bytes_needed_and_free(tmp_path, tiny_fs):
    data = tmp_path / "x.npy"
    np.save(data, np.random.default_rng(0).normal(size=(600, 6)))
    out = tiny_fs / "runs.zarr"
    res = CliRunner().invoke(main, ["--scheduler", "threads", "embed", "ikd", "-n", "2",
                                    "--tile-cache", "disk", "--input", str(data),
                                    "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert "need" in res.output and "free" in res.output and "bytes" in res.output, res.output
    assert "Traceback" not in res.output
    # the run's group may exist (its metadata), its distance tiles were never started
    assert not [f for f in _files(tiny_fs) if f"{os.sep}distance{os.sep}" in f]


def test_object_store_space_is_not_checked(caplog):
    from dr_dask.io.storage import location
    from dr_dask.linalg.cost import quadratic_cost

    with caplog.at_level(logging.INFO, logger="dr_dask.linalg.cost"), \
            pytest.warns(QuadraticCostWarning, match="use fewer rows"):
        quadratic_cost("a stage", 10**6, [(4e12, location("s3://bucket/scratch"))],
                       way_out="fewer rows")
    assert any("not checked" in r.getMessage() for r in caplog.records)


def test_public_names():
    from dr_dask.io.storage import StorageError

    assert dr_dask.QuadraticCostWarning is QuadraticCostWarning
    # the storage boundary's bad-configuration class: exit 2 wherever it escapes
    assert issubclass(ScratchSpaceError, StorageError)


@pytest.mark.cluster
def test_a_fit_on_a_cluster_says_its_tiles_go_to_worker_memory(rows, dr_config, caplog,
                                                              cluster_client):
    dr_config({"quadratic.warn-bytes": "1 KiB"})
    with caplog.at_level(logging.INFO, logger="dr_dask.linalg.cost"), \
            pytest.warns(QuadraticCostWarning, match="n_landmarks"):
        IKD(n_components=2, random_state=0, client=cluster_client).fit(rows)
    logged = [r.getMessage() for r in caplog.records if "T x T" in r.getMessage()]
    assert logged and "worker memory" in logged[0], logged
