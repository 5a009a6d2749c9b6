"""Run names that cannot hurt: one safe path segment, never a reserved name; ``--overwrite``
replaces only a run of this package and only under the lease; a run whose arrays were removed
is not complete."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from dr_dask.cli import main
from dr_dask.io.storage import Location
from dr_dask.runs.group import open_run
from dr_dask.runs.lease import Lease


@pytest.fixture
def npy(tmp_path):
    path = tmp_path / "x.npy"
    rng = np.random.default_rng(0)
    np.save(path, np.tanh(rng.normal(size=(60, 2)) @ rng.normal(size=(2, 6))))
    return str(path)


def _embed(npy: str, out: str, *extra: str):
    return CliRunner().invoke(main, ["--scheduler", "threads", "embed", "ikd", "-n", "2",
                                     "--input", npy, "--out", out, *extra])


@pytest.fixture
def done(npy, tmp_path):
    """A store holding one complete run ``r`` and its embedding."""
    out = str(tmp_path / "o.zarr")
    res = _embed(npy, out, "--name", "r")
    assert res.exit_code == 0, res.output
    return out, np.asarray(open_run(out, "r")["embedding"][...])


@pytest.mark.parametrize(("name", "rule"), [
    ("r/embedding", "one path segment"),   # another run's array
    ("/r", "one path segment"),            # a leading /
    (" ", "one path segment"),             # a lone space
    ("..", "one path segment"),
    (".hidden", "one path segment"),
    ("x" * 129, "at most 128"),
    ("lease.json", "reserved"),
    ("zarr.json", "reserved"),
    ("embedding", "reserved"),
    ("done", "reserved"),
])
def test_unsafe_or_reserved_names_exit_2_and_touch_nothing(npy, done, name, rule):
    out, emb = done
    before = sorted(Location(out).find())
    res = _embed(npy, out, "--name", name, "--overwrite")
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error: run name") and rule in res.output
    assert "Traceback" not in res.output
    assert sorted(Location(out).find()) == before
    run = open_run(out, "r")
    assert run.attrs["complete"]
    np.testing.assert_array_equal(np.asarray(run["embedding"][...]), emb)


def test_overwrite_refuses_a_group_that_is_not_a_run(npy, tmp_path):
    out = str(tmp_path / "o.zarr")
    g = zarr.open_group(out, mode="w").create_group("mine")
    g.create_array("data", data=np.arange(5.0))
    res = _embed(npy, out, "--name", "mine", "--overwrite")
    assert res.exit_code == 2 and "not a run of dr_dask" in res.output, res.output
    np.testing.assert_array_equal(zarr.open_group(out, mode="r")["mine/data"][...],
                                  np.arange(5.0))


def test_overwrite_waits_for_the_lease(npy, done):
    """A live run holds the lease: --overwrite exits 1 (retry later) and deletes nothing."""
    out, emb = done
    with Lease(Location(out).child("r", "lease.json")):
        res = _embed(npy, out, "--name", "r", "--overwrite")
    assert res.exit_code == 1 and "retry later" in res.output, res.output
    run = open_run(out, "r")
    assert run.attrs["complete"]
    np.testing.assert_array_equal(np.asarray(run["embedding"][...]), emb)
    # once the lease is free, --overwrite replaces the run (a new run, the same result)
    res = _embed(npy, out, "--name", "r", "--overwrite")
    assert res.exit_code == 0, res.output
    run = open_run(out, "r")
    assert run.attrs["created"] and run.attrs["lease"]["token"] >= 1
    np.testing.assert_allclose(np.asarray(run["embedding"][...]), emb, atol=1e-10)


def test_a_run_whose_arrays_were_removed_is_not_complete(npy, done):
    out, emb = done
    Location(out).child("r", "embedding").delete()
    res = _embed(npy, out, "--name", "r")
    assert res.exit_code == 0, res.output
    np.testing.assert_allclose(np.asarray(open_run(out, "r")["embedding"][...]), emb,
                               atol=1e-10)


def test_a_run_from_before_the_marker_is_still_a_run(npy, done):
    """Run stores written before runs carried their marker are resumed, not refused."""
    out, emb = done
    group = zarr.open_group(Location(out).zarr_store(), path="r", mode="r+",
                            use_consolidated=False)
    del group.attrs["dr_dask_run"]
    res = _embed(npy, out, "--name", "r")
    assert res.exit_code == 0, res.output
    np.testing.assert_array_equal(np.asarray(open_run(out, "r")["embedding"][...]), emb)
