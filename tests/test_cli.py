"""The command line's contract with scripts: help everywhere, checked numbers, exit codes, and
stdout that holds only results."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import click
import numpy as np
import pytest
from click.testing import CliRunner

from dr_dask.cli import main


def _commands(cmd: click.Command, path: tuple[str, ...] = ("dr-dask",)):
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_every_command_and_option_has_help():
    missing = [(" ".join(path), "command") for path, cmd in _commands(main) if not cmd.help]
    missing += [(" ".join(path), "/".join(p.opts)) for path, cmd in _commands(main)
                for p in cmd.params if isinstance(p, click.Option) and not p.help]
    assert not missing, f"no help text: {missing}"


def test_every_numeric_option_has_a_range():
    unchecked = [(" ".join(path), "/".join(p.opts)) for path, cmd in _commands(main)
                 for p in cmd.params
                 if isinstance(p, click.Option) and p.type in (click.INT, click.FLOAT)]
    assert not unchecked, f"numeric options without a range: {unchecked}"


@pytest.fixture
def npy(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.random.default_rng(0).normal(size=(60, 6)))
    return str(path)


@pytest.mark.parametrize(("args", "option", "valid"), [
    (["embed", "ikd", "-n", "2", "--tile-size", "0"], "--tile-size", "x>=1"),
    (["embed", "ikd", "-n", "2", "--tile-size", "-5"], "--tile-size", "x>=1"),
    (["embed", "ikd", "-n", "0"], "--n-components", "x>=1"),
    (["embed", "ikd", "-n", "2", "--seed", "-1"], "--seed", "0<=x<=4294967295"),
    (["embed", "ikd", "-n", "2", "--gamma", "3"], "--gamma", "0<x<=2"),
    (["embed", "isomap", "-k", "0"], "--n-neighbors", "x>=1"),
    (["embed", "isomap", "--radius", "-1"], "--radius", "x>0"),
])
def test_numeric_options_are_range_checked(tmp_path, npy, args, option, valid):
    out = tmp_path / "out.zarr"
    res = CliRunner().invoke(main, ["--scheduler", "threads", *args, "--input", npy,
                                    "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert option in res.output and valid in res.output, res.output
    assert "Traceback" not in res.output and not out.exists()


def test_workers_must_be_positive(tmp_path, npy):
    res = CliRunner().invoke(main, ["--workers", "-1", "embed", "ikd", "-n", "2", "--input", npy,
                                    "--out", str(tmp_path / "o.zarr")])
    assert res.exit_code == 2 and "--workers" in res.output and "x>=1" in res.output
    from dr_dask.runtime.cluster import local_cluster_kwargs

    with pytest.raises(ValueError, match="n_workers must be a positive integer, got -1"):
        local_cluster_kwargs(-1)  # the API refuses it too, instead of a hanging cluster


def test_help_documents_exit_codes():
    res = CliRunner().invoke(main, ["--help"])
    assert res.exit_code == 0
    assert "Exit codes" in res.output
    for line in ("0  done", "1  transient", "2  bad input or configuration"):
        assert line in res.output


def test_user_error_exits_2_without_traceback(tmp_path):
    res = CliRunner().invoke(main, ["--scheduler", "threads", "embed", "ikd", "-n", "2",
                                    "--input", str(tmp_path / "absent.npy"),
                                    "--out", str(tmp_path / "o.zarr")])
    assert res.exit_code == 2 and res.output.startswith("error:"), res.output
    assert "Traceback" not in res.output


def test_a_held_lease_exits_1_without_traceback(tmp_path, npy):
    """Another live run holding the run's lease is transient: exit 1, a clear message, no
    traceback, and nothing marked complete."""
    from dr_dask.io.storage import location
    from dr_dask.runs.group import open_run
    from dr_dask.runs.lease import Lease

    out = tmp_path / "o.zarr"
    with Lease(location(str(out)).child("held", "lease.json")):
        res = CliRunner().invoke(main, ["--scheduler", "threads", "embed", "ikd", "-n", "2",
                                        "--input", npy, "--out", str(out), "--name", "held"])
    assert res.exit_code == 1, res.output
    assert res.output.startswith("error: another run of this job") and "retry later" in res.output
    assert "internal error" not in res.output and "Traceback" not in res.output
    group = open_run(str(out), "held")  # created before the lease was asked for, never run
    assert not group.attrs.get("complete", False) and "embedding" not in group


def test_internal_error_exits_1(tmp_path, npy, monkeypatch):
    """A bug (here: the eigensolver raising a ZeroDivisionError) exits 1 with a one-line
    message; -v adds the traceback."""
    from dr_dask.methods import ikd_core

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(ikd_core, "top_eigh", broken)
    args = ["embed", "ikd", "-n", "2", "--input", npy]
    res = CliRunner().invoke(main, ["--scheduler", "threads", *args,
                                    "--out", str(tmp_path / "a.zarr")])
    assert res.exit_code == 1, res.output
    assert "internal error: ZeroDivisionError: a bug" in res.output
    assert "Traceback" not in res.output
    res = CliRunner().invoke(main, ["-v", "--scheduler", "threads", *args,
                                    "--out", str(tmp_path / "b.zarr")])
    assert res.exit_code == 1 and "Traceback" in res.output


@pytest.mark.cluster
def test_progress_goes_to_stderr_on_a_terminal_only(cluster_client, capsys, monkeypatch):
    import dask.array as da

    from dr_dask.runtime.cluster import compute

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    x = da.ones((200, 10), chunks=(20, 10))
    compute(x.sum(), client=cluster_client, progress=True)  # stderr is not a terminal here
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    (total,) = compute(x.sum(), client=cluster_client, progress=True)
    assert total == 2000
    assert "100%" in terminal.getvalue()
    assert capsys.readouterr().out == ""  # nothing on stdout


@pytest.mark.cluster
def test_stdout_is_json_and_distributed_is_quiet(tmp_path, npy):
    """On a LocalCluster with stdout and stderr redirected: stdout is exactly the JSON summary
    (no escape codes), stderr has no distributed INFO lines (the ~35 a LocalCluster logs)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("DASK_LOGGING__DISTRIBUTED", None)
    base = [sys.executable, "-m", "dr_dask.cli"]
    args = ["--workers", "1", "embed", "ikd", "-n", "2", "--input", npy]
    res = subprocess.run([*base, *args, "--out", str(tmp_path / "a.zarr")], env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["shape"] == [60, 2] and "\x1b" not in res.stdout
    assert "INFO" not in res.stderr and len(res.stderr.splitlines()) <= 3, res.stderr


# ------------------------------------------------------- rejected input leaves nothing behind
def _rejected_inputs():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 5))
    nan, inf = X.copy(), X.copy()
    nan[3, 2], inf[3, 2] = np.nan, np.inf
    return {
        "NaN": (nan, ["-n", "2"], "NaN or infinite values in 1 row"),
        "inf": (inf, ["-n", "2"], "NaN or infinite values in 1 row"),
        "one sample": (X[:1], ["-n", "2"], "1 sample"),
        "one feature": (X[:, :1], ["-n", "2"], "1 feature"),
        "constant rows": (np.ones((60, 5)), ["-n", "2"], "constant rows"),
    }


@pytest.mark.parametrize("case", list(_rejected_inputs()))
def test_rejected_input_leaves_no_store_behind(tmp_path, case):
    """Five inputs the fit rejects after the run group was created: exit 2 naming what is wrong,
    and neither the run group nor the output store the command created is left."""
    import zarr

    X, args, message = _rejected_inputs()[case]
    zarr.save_array(str(tmp_path / "in.zarr"), X)
    out = tmp_path / "o.zarr"
    res = CliRunner().invoke(main, ["--scheduler", "threads", "embed", "ikd", *args, "--input",
                                    str(tmp_path / "in.zarr"), "--out", str(out)])
    assert res.exit_code == 2 and message in res.output, res.output
    assert not out.exists()
    # a store that held runs before keeps them
    good = np.random.default_rng(1).normal(size=(60, 5))
    zarr.save_array(str(tmp_path / "good.zarr"), good)
    assert CliRunner().invoke(main, ["--scheduler", "threads", "embed", "ikd", "-n", "2",
                                     "--input", str(tmp_path / "good.zarr"), "--out", str(out),
                                     "--name", "kept"]).exit_code == 0
    res = CliRunner().invoke(main, ["--scheduler", "threads", "embed", "ikd", *args, "--input",
                                    str(tmp_path / "in.zarr"), "--out", str(out)])
    assert res.exit_code == 2
    assert sorted(zarr.open_group(str(out), mode="r").group_keys()) == ["kept"]


def test_unwritable_output_is_a_user_error(tmp_path):
    import zarr

    zarr.save_array(str(tmp_path / "in.zarr"), np.random.default_rng(0).normal(size=(60, 5)))
    if os.geteuid() == 0:  # permissions do not stop root: sysfs refuses new files to anyone
        out = "/sys/dr-dask-out.zarr"
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        out = str(ro / "o.zarr")
    res = CliRunner().invoke(main, ["--scheduler", "threads", "embed", "ikd", "-n", "2",
                                    "--input", str(tmp_path / "in.zarr"), "--out", out])
    assert res.exit_code == 2, res.output
    assert f"cannot write {out}" in res.output and "Traceback" not in res.output
