"""`dr-dask run WORKFLOW.toml`: strict validation, parameters, retries, timeouts, exit codes."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import _spawn
import numpy as np
import psutil
import pytest
import zarr
from click.testing import CliRunner

from dr_dask.cli import main
from dr_dask.jobs.workflow import Step, WorkflowError, load, run_step

WORKFLOWS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "workflows",
                                           "*.toml")))
#: Every shipped workflow, at a size the test suite can afford (a new workflow needs an entry);
#: ``{root}`` is the test's job directory.
SMALL = {
    "demo-ikd.toml": {"T": "150", "N": "30", "dtype": "float64"},
    "nightly-gp-isomap.toml": {"source": "{root}/landing.zarr:X", "n_batch": "300", "n_s": "40",
                               "chunk_size": "100"},
    "weekly-refit.toml": {"source": "{root}/landing.zarr:X", "eval_rows": "150",
                          "tci_candidates": "4"},
}


def _landing(root: str) -> None:
    """The store the scheduled jobs read: swiss-roll patches, as rows land in it."""
    from dr_dask.datasets.swiss_roll import shift_scenario

    sc = shift_scenario(100, random_state=3)
    zarr.open_group(f"{root}/landing.zarr", mode="w").create_array(
        "X", data=np.vstack([sc.batch, sc.stream]), chunks=(100, 3))


#: Data a workflow reads but does not make, written before it runs.
SETUP = {"nightly-gp-isomap.toml": _landing, "weekly-refit.toml": _landing}


def _workflow(tmp_path, body: str, header: str = '[job]\nname = "test-job"\n') -> str:
    path = tmp_path / "job.toml"
    path.write_text(body + "\n" + header)  # the body first: it may set top-level keys
    return str(path)


def _rejected(res, *needles: str) -> None:
    """Exit 2 with a message naming what is wrong, and no traceback."""
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit) and "Traceback" not in res.output, res.output
    for needle in needles:
        assert needle in res.output, (needle, res.output)


def test_shipped_workflows_are_all_tested():
    assert WORKFLOWS and {os.path.basename(p) for p in WORKFLOWS} == set(SMALL)


@pytest.mark.parametrize("path", WORKFLOWS, ids=os.path.basename)
def test_shipped_workflow_passes_check(path):
    res = CliRunner().invoke(main, ["run", path, "--check"])
    assert res.exit_code == 0 and res.output.rstrip().endswith("ok"), res.output


@pytest.mark.cluster
@pytest.mark.parametrize("path", WORKFLOWS, ids=os.path.basename)
def test_shipped_workflow_runs_end_to_end(path, tmp_path, cluster_client):
    root = str(tmp_path / "job")
    name = os.path.basename(path)
    params = {"root": root, **{k: v.format(root=root) for k, v in SMALL[name].items()}}
    if name in SETUP:
        SETUP[name](root)
    argv = ["--scheduler", cluster_client.scheduler.address, "run", path]
    for key, value in params.items():
        argv += ["--param", f"{key}={value}"]
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == 0, res.output
    assert "done" in res.output
    outputs = set(os.listdir(tmp_path / "job"))
    assert outputs, res.output


@pytest.mark.cluster
def test_workflow_runs_steps_on_a_remote_scheduler(tmp_path, cluster_client):
    data, runs = tmp_path / "d.zarr", tmp_path / "r.zarr"
    wf = _workflow(tmp_path, f"""
[params]
T = 300

[[steps]]
name = "generate"
args = ["datasets", "make", "sinusoidal", "--out", "{data}", "-T", "${{T}}", "-N", 40,
        "--if-missing"]

[[steps]]
name = "embed"
args = ["embed", "ikd", "--input", "{data}:X", "--out", "{runs}", "-n", "1", "--name", "nightly"]
""")
    address = cluster_client.scheduler.address

    def transitions():
        # cumulative task transitions of the session cluster's scheduler: the difference is
        # this run's work (task_prefixes would count every earlier test's tasks too)
        return cluster_client.run_on_scheduler(
            lambda dask_scheduler: dask_scheduler.transition_counter)

    before_run = transitions()
    res = CliRunner().invoke(main, ["--scheduler", address, "run", wf])
    assert res.exit_code == 0, res.output
    run = zarr.open_group(runs, mode="r")["nightly"]
    assert run.attrs["complete"] and run["embedding"].shape == (300, 1)
    # the scheduler's workers did the work: this run's steps sent it tasks
    assert transitions() > before_run
    # a rerun of the finished job is a no-op that succeeds (resumable, idempotent steps)
    before = run["embedding"][...]
    res = CliRunner().invoke(main, ["--scheduler", address, "run", wf])
    assert res.exit_code == 0 and "nothing to do" in res.output, res.output
    assert (zarr.open_group(runs, mode="r")["nightly"]["embedding"][...] == before).all()


def test_failing_step_stops_the_job_with_its_reason(tmp_path):
    wf = _workflow(tmp_path, f"""
[[steps]]
args = ["embed", "ikd", "--input", "{tmp_path}/missing.zarr:X", "--out", "{tmp_path}/o.zarr",
        "-n", "2"]

[[steps]]
name = "never"
args = ["datasets", "make", "gp", "--out", "{tmp_path}/never.zarr"]
""")
    res = CliRunner().invoke(main, ["--scheduler", "threads", "run", wf])
    assert res.exit_code == 2, res.output  # bad input: exit 2, so a scheduler does not retry
    assert "does not exist" in res.output and "step-1" in res.output
    assert not (tmp_path / "never.zarr").exists()


@pytest.mark.parametrize(("body", "needles"), [
    ("[[steps]]\nname = 'x'\n", ["step 1 ('x')", "missing 'args'"]),
    ("steps = 'oops'\n", ["needs [[steps]]", "a string"]),
    ("schedule = '0 2 * * *'\n[[steps]]\nargs = ['datasets', 'list']\n",
     ["unknown top-level key 'schedule'", "job, params, steps, tls"]),
    ("[[steps]]\nnme = 'gen'\nargs = ['datasets', 'list']\n",
     ["step 1 ('step-1'): unknown key 'nme'", "args, name, retries, retry_delay, timeout"]),
    ("[[steps]]\nname = 'gen'\nretries = 'two'\nargs = ['datasets', 'list']\n",
     ["step 1 ('gen')", "'retries' must be an integer >= 0, not a string"]),
    ("[[steps]]\nname = 'gen'\ntimeout = '5 minutes'\nargs = ['datasets', 'list']\n",
     ["step 1 ('gen')", "'timeout'", "not a duration"]),
    ("[[steps]]\nname = 'gen'\nargs = ['datasets', 'make', true]\n",
     ["step 1 ('gen')", "args[2] must be a string or number, not a boolean"]),
    ("[[steps]]\nname = 'gen'\nargs = ['datasets', 'make', 'gp', '--out', '${root}/d.zarr']\n",
     ["step 1 ('gen'), args[4]", "unknown parameter 'root'"]),
    ("[[steps]]\nname = 'gen'\nargs = ['datsets', 'list']\n",
     ["step 'gen'", "unknown command 'datsets'", "datasets"]),
    ("[[steps]]\nname = 'gen'\n"
     "args = ['datasets', 'make', 'gp', '--out', 'd.zarr', '-T', 'many']\n",
     ["step 'gen' (dr-dask datasets make)", "'many' is not a valid integer"]),
    ("[[steps]]\nname = 'e'\nargs = ['embed', 'ikd', '--inptu', 'd.zarr:X']\n",
     ["step 'e' (dr-dask embed ikd)", "--inptu"]),
    ("[params]\naws_secret_access_key = ''\n[[steps]]\nargs = ['datasets', 'list']\n",
     ["'aws_secret_access_key' looks like a credential", "in the environment"]),
    ("[[steps]]\nname = 'e'\nargs = ['--scheduler', 'x', 'datasets', 'list']\n",
     ["step 'e'", "global options"]),
    ("[[steps]]\nargs = ['datasets', 'list']\n[[steps]]\nargs = ['run', 'x.toml']\n",
     ["step 'step-2'", "cannot run a workflow"]),
])
def test_invalid_workflow_is_rejected_before_anything_runs(tmp_path, body, needles):
    # a valid first step proves that nothing runs when a later part of the file is wrong
    out = tmp_path / "first.zarr"
    wf = _workflow(tmp_path, body.replace("'datasets', 'list'",
                                          f"'datasets', 'make', 'gp', '--out', '{out}'"))
    for argv in (["run", wf, "--check"], ["--scheduler", "threads", "run", wf]):
        _rejected(CliRunner().invoke(main, argv), *needles)
    assert not out.exists()


def test_not_toml_and_missing_file_are_clear_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[job\n")
    _rejected(CliRunner().invoke(main, ["run", str(bad), "--check"]), "is not valid TOML")
    _rejected(CliRunner().invoke(main, ["run", str(tmp_path / "nope.toml")]), "cannot read")


def test_params_defaults_environment_and_command_line(tmp_path, monkeypatch):
    wf = _workflow(tmp_path, """
[params]
root = "out"
T = 100
noise = 0.1
verbose = false

[[steps]]
args = ["datasets", "make", "gp", "--out", "${root}/d.zarr", "-T", "${T}", "--noise", "${noise}"]
""")
    assert load(wf).steps[0].args[4:8] == ("out/d.zarr", "-T", "100", "--noise")
    monkeypatch.setenv("DR_DASK_PARAM_T", "250")
    monkeypatch.setenv("DR_DASK_PARAM_ROOT", "from-env")
    resolved = load(wf, {"root": "from-cli"})
    assert resolved.params == {"root": "from-cli", "T": 250, "noise": 0.1, "verbose": False}
    res = CliRunner().invoke(main, ["run", wf, "--check", "--param", "noise=0.5"])
    assert res.exit_code == 0 and "--out from-env/d.zarr -T 250 --noise 0.5" in res.output

    _rejected(CliRunner().invoke(main, ["run", wf, "--check", "--param", "TT=3"]),
              "unknown parameter 'TT'", "T, noise, root, verbose")
    _rejected(CliRunner().invoke(main, ["run", wf, "--check", "--param", "T=3.5"]),
              "parameter 'T' from --param: '3.5' is not an integer")
    _rejected(CliRunner().invoke(main, ["run", wf, "--check", "--param", "T"]),
              "expected NAME=VALUE")
    monkeypatch.setenv("DR_DASK_PARAM_VERBOSE", "maybe")
    with pytest.raises(WorkflowError, match=r"\$DR_DASK_PARAM_VERBOSE: 'maybe' is not a boolean"):
        load(wf)


def test_job_defaults_apply_to_steps_and_a_step_overrides_them(tmp_path):
    wf = load(_workflow(tmp_path, """
[[steps]]
name = "a"
args = ["datasets", "make", "gp", "--out", "a.zarr"]

[[steps]]
name = "b"
retries = 0
timeout = 90
args = ["datasets", "make", "gp", "--out", "b.zarr"]
""", header='[job]\nretries = 3\nretry_delay = "1m"\ntimeout = "2h"\n'))
    a, b = wf.steps
    assert (a.retries, a.retry_delay, a.timeout) == (3, 60.0, 7200.0)
    assert (b.retries, b.retry_delay, b.timeout) == (0, 60.0, 90.0)
    assert wf.name == "job"  # no [job] name: the file's name


# ------------------------------------------------------------ retries and timeouts, for real
def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_transient_failure_is_retried_and_bad_input_is_not(tmp_path):
    counter = tmp_path / "attempts"
    # fails with exit 1 (transient) on the first two attempts, succeeds on the third
    flaky = _python(f"import pathlib,sys; p=pathlib.Path({str(counter)!r}); "
                    "n=len(p.read_text()) if p.exists() else 0; p.write_text('x'*(n+1)); "
                    "sys.exit(1 if n < 2 else 0)")
    lines: list[str] = []
    assert run_step(Step("flaky", (), retries=2, retry_delay=0.01), flaky, lines.append).code == 0
    assert counter.read_text() == "xxx"
    assert any("retry 2 of 2" in line for line in lines)

    counter.unlink()
    assert run_step(Step("flaky", (), retries=1, retry_delay=0.01), flaky, lines.append).code == 1
    assert counter.read_text() == "xx"  # gave up after 1 + 1 attempts: exit 1, retry the job

    counter.unlink()
    bad = _python(f"import pathlib,sys; pathlib.Path({str(counter)!r}).write_text('x'); "
                  "sys.exit(2)")
    assert run_step(Step("bad", (), retries=3, retry_delay=0.01), bad, lines.append).code == 2
    assert counter.read_text() == "x"  # bad input is never retried


def test_timeout_stops_the_step_and_what_it_started(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    # the step starts a grandchild, then hangs: a timeout must stop both
    hang = _python("import subprocess,sys,time; "
                   "p=subprocess.Popen([sys.executable,'-c','import time; time.sleep(300)']); "
                   f"open({str(pidfile)!r},'w').write(str(p.pid)); time.sleep(300)")
    lines: list[str] = []
    start = time.monotonic()
    result = run_step(Step("hang", (), retries=1, retry_delay=0.01, timeout=1.5), hang,
                      lines.append)
    assert (result.code, result.attempts) == (1, 2) and time.monotonic() - start < 30
    assert any("timed out after 1.5s" in line and "after 2 attempts" in line for line in lines)
    grandchild = int(pidfile.read_text())
    for _ in range(50):  # reaped by init shortly after the kill
        if _gone(grandchild):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the step's child {grandchild} outlived the timeout")


def test_check_accepts_an_input_that_an_earlier_step_writes(tmp_path):
    wf = _workflow(tmp_path, f"""
[[steps]]
args = ["stream", "report", "{tmp_path}/not-yet-written", "--window", "5"]
""")
    res = CliRunner().invoke(main, ["run", wf, "--check"])
    assert res.exit_code == 0, res.output
    # but a wrongly typed value of the same command is still caught
    bad = _workflow(tmp_path, f"""
[[steps]]
args = ["stream", "report", "{tmp_path}/not-yet-written", "--window", "five"]
""")
    _rejected(CliRunner().invoke(main, ["run", bad, "--check"]), "'five' is not a valid integer")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_terminated_runner_stops_its_running_step(tmp_path):
    pidfile = tmp_path / "step.pid"
    step = _python(f"import os,time; open({str(pidfile)!r},'w').write(str(os.getpid())); "
                   "time.sleep(300)")
    # the runner as `dr-dask run` sets it up: SIGTERM -> SystemExit(1)
    runner = subprocess.Popen(_python(
        "import signal,sys; from dr_dask.jobs.workflow import Step, run_step; "
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(1)); "
        f"run_step(Step('hang', ()), {step!r}, print)"))
    for _ in range(300):
        if pidfile.exists() and pidfile.read_text():
            break
        time.sleep(0.1)
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(timeout=30) == 1
    step_pid = int(pidfile.read_text())
    for _ in range(50):
        if _gone(step_pid):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the step {step_pid} outlived its terminated runner")


# ------------------------------------------------------------- what a calling script reads
def test_run_prints_only_its_json_summary_on_stdout(tmp_path):
    """A shipped workflow by name, as cron or a BashOperator runs it: stdout is one JSON
    document (the job's summary, each step's own result in it), the steps' logs go to stderr."""
    root = str(tmp_path / "job")
    _landing(root)
    argv = [sys.executable, "-m", "dr_dask.cli", "--scheduler", "threads", "run",
            "nightly-gp-isomap", "--param", f"root={root}",
            "--param", f"source={root}/landing.zarr:X",
            *[f"--param={k}={v}" for k, v in SMALL["nightly-gp-isomap.toml"].items()
              if k != "source"]]
    proc = _spawn.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)  # the whole of stdout
    assert (summary["workflow"], summary["status"], summary["exit_code"]) == (
        "nightly-gp-isomap", "done", 0)
    (step,) = summary["steps"]
    assert (step["name"], step["exit_code"], step["attempts"]) == ("incremental", 0, 1)
    assert step["result"]["status"] == "done"
    assert step["result"]["rows_mapped"] == 700  # every row landed
    # the step's output is in the log, not on stdout
    assert "[nightly-gp-isomap] incremental: dr-dask job incremental" in proc.stderr
    assert '"rows_mapped": 700' in proc.stderr

    # a failing job prints its summary too, with the code it exits with
    argv[argv.index(f"source={root}/landing.zarr:X")] = f"source={root}/missing.zarr:X"
    proc = _spawn.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["status"], summary["exit_code"]) == ("bad input", 2)
    assert summary["steps"][0]["exit_code"] == 2 and "missing.zarr" in proc.stderr


def test_unknown_workflow_name_lists_the_shipped_ones():
    _rejected(CliRunner().invoke(main, ["run", "nightly-gp-isomp", "--check"]),
              "no shipped workflow of that name", "nightly-gp-isomap", "weekly-refit")


def test_an_unreachable_scheduler_is_transient(tmp_path):
    """A scheduler that does not answer (yet: the operator starts it with the job's pod) is
    exit 1, retried by the CronJob, not exit 2; the summary says so on stdout."""
    import dask

    from dr_dask.bench.io import free_port

    with dask.config.set({"distributed.comm.timeouts.connect": "2s"}):
        res = CliRunner().invoke(main, ["--scheduler", f"tcp://127.0.0.1:{free_port()}", "run",
                                        "demo-ikd", "--param", f"root={tmp_path}"])
    assert res.exit_code == 1, res.output
    assert "cannot reach the Dask scheduler (retry later)" in res.stderr
    summary = json.loads(res.stdout)
    assert (summary["status"], summary["exit_code"]) == ("failed", 1)
    assert [s["status"] for s in summary["steps"]] == ["not run"] * 3

