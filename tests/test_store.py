"""The storage boundary: every bad input is a clear error naming the problem; inputs never
change."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
import xarray as xr
import zarr
from click.testing import CliRunner

from dr_dask.cli import main
from dr_dask.io.inputs import InputError, open_dataset, parse_source
from dr_dask.io.validation import check_values
from dr_dask.methods.ikd import IKD
from dr_dask.runs.group import RunGroup


def tree_digest(path) -> str:
    """Hash of every file's bytes under a path: proves an input was not modified."""
    h = hashlib.sha256()
    paths = [path] if os.path.isfile(path) else sorted(
        os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs
    )
    for p in paths:
        h.update(p.encode())
        with open(p, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()


@pytest.fixture
def group_store(tmp_path):
    """An xarray-written Zarr group with X (sample, feature), a 1-D variable and labels."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 6))
    ds = xr.Dataset(
        {"X": (("sample", "feature"), X), "y": (("sample",), np.arange(40.0))},
        coords={"sample": np.arange(100, 140)},
    )
    path = str(tmp_path / "data.zarr")
    ds.to_zarr(path, zarr_format=3, consolidated=False)
    return path, X


def test_opens_every_documented_source(group_store, tmp_path):
    path, X = group_store
    inp = open_dataset(path + ":X")
    np.testing.assert_array_equal(inp.data.compute(), X)
    np.testing.assert_array_equal(inp.sample_ids, np.arange(100, 140))
    assert inp.identity["variable"] == "X" and inp.identity["shape"] == [40, 6]
    np.save(tmp_path / "x.npy", X)
    np.testing.assert_array_equal(open_dataset(str(tmp_path / "x.npy")).data.compute(), X)
    xr.Dataset({"X": (("sample", "feature"), X)}).to_netcdf(tmp_path / "x.nc", engine="h5netcdf")
    np.testing.assert_array_equal(open_dataset(str(tmp_path / "x.nc"), "X").data.compute(), X)
    assert parse_source("a.zarr:X") == ("a.zarr", "X")


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda X: np.where(np.arange(40)[:, None] == 7, np.nan, X), r"NaN or infinite .* 107"),
        (lambda X: np.where(np.arange(40)[:, None] == 3, np.inf, X), r"NaN or infinite .* 103"),
        (lambda X: np.where(np.arange(40)[:, None] == 5, 1.0, X), r"constant rows .* 105"),
    ],
    ids=["nan", "inf", "constant-row"],
)
def test_bad_values_name_the_rows_and_leave_the_input_alone(tmp_path, make, match):
    X = make(np.random.default_rng(1).normal(size=(40, 6)))
    path = str(tmp_path / "bad.zarr")
    xr.Dataset({"X": (("sample", "feature"), X)}, coords={"sample": np.arange(100, 140)}).to_zarr(
        path, zarr_format=3, consolidated=False
    )
    before = tree_digest(path)
    with pytest.raises(InputError, match=match):
        IKD(n_components=2).fit(path + ":X")
    assert tree_digest(path) == before


def test_structural_errors(group_store, tmp_path):
    path, _ = group_store
    with pytest.raises(InputError, match=r"has no variable 'Q'.*'X'"):
        open_dataset(path + ":Q")
    with pytest.raises(InputError, match="2-D"):
        open_dataset(path + ":y")
    with pytest.raises(InputError, match="numeric"):
        open_dataset(np.array([["a", "b"], ["c", "d"]]))
    with pytest.raises(InputError, match="does not exist"):
        open_dataset(str(tmp_path / "nope.zarr"))
    # in-memory input: scikit-learn's checks and wording (dr_dask.io.validation)
    with pytest.raises(ValueError, match=r"4 sample\(s\) .* minimum of 5 is required by IKD"):
        IKD(n_components=3).fit(np.random.default_rng(0).normal(size=(4, 10)))
    with pytest.raises(ValueError, match="Expected 2D array, got 1D array"):
        IKD(n_components=1).fit(np.arange(10.0))


def test_input_opened_read_only(group_store):
    path, _ = group_store
    inp = open_dataset(path + ":X")
    store_array = inp.data.dask[next(iter(inp.data.dask))]  # the zarr array behind the graph
    if isinstance(store_array, zarr.Array):
        with pytest.raises(Exception, match="read-only"):
            store_array[0, 0] = 1.0


def test_cli_refuses_output_over_input_and_unknown_kernel(group_store):
    path, _ = group_store
    before = tree_digest(path)
    runner = CliRunner()
    res = runner.invoke(main, ["--scheduler", "threads", "embed", "ikd", "--input", path + ":X",
                               "--out", path, "-n", "2"])
    assert res.exit_code == 2 and "would overwrite the input" in res.output
    res = runner.invoke(main, ["--scheduler", "threads", "embed", "ikd", "--input", path + ":X",
                               "--out", path + "/inside", "-n", "2"])
    assert res.exit_code == 2 and "would overwrite the input" in res.output
    res = runner.invoke(main, ["--scheduler", "threads", "embed", "ikd", "--input", path + ":X",
                               "--out", path + ".out", "-n", "2", "--kernel", "cosine"])
    assert res.exit_code == 2 and "kernel" in res.output
    res = runner.invoke(main, ["--scheduler", "threads", "embed", "ikd", "--input", path + ":Q",
                               "--out", path + ".out", "-n", "2"])
    assert res.exit_code == 2 and "no variable 'Q'" in res.output
    assert tree_digest(path) == before


def test_cli_embed_writes_a_self_describing_run(group_store, tmp_path):
    path, _ = group_store
    out = str(tmp_path / "out.zarr")
    res = CliRunner().invoke(main, ["--scheduler", "threads", "embed", "ikd", "--input",
                                    path + ":X", "--out", out, "-n", "2"])
    assert res.exit_code == 0, res.output
    root = zarr.open_group(out, mode="r")
    (name,) = list(root.group_keys())
    run = root[name]
    assert run.attrs["complete"] and run.attrs["params"]["n_components"] == 2
    assert run.attrs["input"]["variable"] == "X" and "dask" in run.attrs["versions"]
    ds = xr.open_zarr(out, group=name, consolidated=False)
    assert ds["embedding"].dims == ("sample", "component")
    np.testing.assert_array_equal(ds["sample"].values, np.arange(100, 140))
    # a second identical command finds the complete run and does not redo it
    res = CliRunner().invoke(main, ["--scheduler", "threads", "embed", "ikd", "--input",
                                    path + ":X", "--out", out, "-n", "2"])
    assert res.exit_code == 0 and list(zarr.open_group(out, mode="r").group_keys()) == [name]


def test_run_group_refuses_other_parameters(tmp_path):
    RunGroup(str(tmp_path / "o.zarr"), "r", params={"a": 1}, identity={})
    with pytest.raises(InputError, match="other parameters"):
        RunGroup(str(tmp_path / "o.zarr"), "r", params={"a": 2}, identity={})
    assert RunGroup(str(tmp_path / "o.zarr"), "r", params={"a": 2}, identity={},
                    overwrite=True).done_stages == []


def test_validate_passes_good_data():
    check_values(open_dataset(np.random.default_rng(0).normal(size=(30, 5))), min_samples=5,
             constant_rows=True)
