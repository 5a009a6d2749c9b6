"""The zygote's children are what the fault tests take them for: a real process per command,
with the call's environment, directory, arguments, streams, exit status and signals."""

import json
import os
import signal
import subprocess
import sys
import time

import _spawn
import pytest

_ECHO = ("import json, os, sys, dask; print(json.dumps({'argv': sys.argv, 'cwd': os.getcwd(), "
         "'env': os.environ.get('SPAWN_TEST'), 'path0': sys.path[0], 'pid': os.getpid(), "
         "'stdin': sys.stdin.read(), 'dask': dask.config.get('spawn-test', None), "
         "'main': __name__})); print('to stderr', file=sys.stderr); sys.exit(3)")


def test_child_has_the_calls_environment_directory_argv_streams_and_exit_code(tmp_path):
    env = dict(os.environ, SPAWN_TEST="x", DASK_SPAWN_TEST="from-env")
    res = _spawn.run([sys.executable, "-c", _ECHO, "a", "b"], input="in", text=True,
                     capture_output=True, cwd=tmp_path, env=env, timeout=60)
    got = json.loads(res.stdout)
    assert res.returncode == 3
    assert res.stderr == "to stderr\n"
    assert got["argv"] == ["-c", "a", "b"] and got["main"] == "__main__"
    assert got["cwd"] == str(tmp_path) and got["path0"] == ""
    assert got["env"] == "x" and got["dask"] == "from-env"  # dask read the child's environment
    assert got["stdin"] == "in" and got["pid"] not in (os.getpid(), _spawn._zygote().proc.pid)


def test_an_uncaught_exception_and_a_module_run_end_as_the_interpreter_ends_them():
    res = _spawn.run([sys.executable, "-c", "raise KeyError('k')"], capture_output=True,
                     text=True, timeout=60)
    assert res.returncode == 1 and "KeyError: 'k'" in res.stderr
    assert "Traceback" in res.stderr
    res = _spawn.run([sys.executable, "-m", "dr_dask.cli", "--version"], capture_output=True,
                     text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip()


def test_signals_reach_the_child_and_its_status_says_so():
    proc = _spawn.Popen([sys.executable, "-c", "import time; print('up', flush=True); "
                         "time.sleep(60)"], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"up\n"
    proc.send_signal(signal.SIGSTOP)
    with open(f"/proc/{proc.pid}/stat") as f:
        deadline = time.time() + 10
        while f.read().split(")")[1].split()[0] != "T" and time.time() < deadline:
            f.seek(0)
            time.sleep(0.01)
    assert proc.poll() is None
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    proc.stdout.close()


def test_a_wait_with_a_timeout_times_out_while_the_child_runs():
    proc = _spawn.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    proc.kill()
    assert proc.wait(timeout=30) == -signal.SIGKILL
