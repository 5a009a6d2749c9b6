"""Python child processes forked from a warm one.

Every ``python -c``/``python -m dr_dask.cli`` child of a test pays about 3 s of CPU importing
NumPy, SciPy, scikit-learn, numba, dask and distributed before its command starts; the fault
tests start over a hundred of them. :class:`Popen` is :class:`subprocess.Popen` for such a child,
started instead by a zygote: one process per pytest process that imported all of that once,
holds no thread, and forks a child per request. The child then becomes what the command line
says, as the interpreter would have made it: its own pid (a test's SIGKILL and SIGSTOP reach the
command itself), the environment (read again by dask's config and distributed's logging), the
working directory, ``sys.argv`` and ``sys.path`` of ``-c`` or ``-m``, the three standard streams
of the call, and the exit status a real child has, traceback and signal included (the zygote
reaps it and passes its wait status on).

What the zygote cannot give is a process that has *not* imported those modules: a test of what
a command imports, or of a fresh process's first call (compiling into an empty kernel cache),
keeps :class:`subprocess.Popen`.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

#: What the children of tests import, imported once; a module that starts a thread on import
#: must not be here. Every module of these packages of ours is imported too (not the reports':
#: matplotlib reads its backend from the environment at import).
PRELOAD = ("numpy", "scipy.sparse.csgraph", "scipy.linalg", "sklearn.neighbors", "numba",
           "dask.array", "distributed", "zarr", "xarray", "fsspec", "s3fs", "click")
PRELOAD_PACKAGES = ("dr_dask.cli", "dr_dask.datasets", "dr_dask.graph", "dr_dask.io",
                    "dr_dask.jobs", "dr_dask.linalg", "dr_dask.methods", "dr_dask.runs",
                    "dr_dask.runtime", "dr_dask.stream")
#: Prefect's flows: an optional extra, which configures logging as it is imported (a command
#: never imports it, and then logs as configured, not as Prefect would have it).
PRELOAD_SKIP = ("dr_dask.jobs.flows",)

_HEADER = struct.Struct("!Q")


# ------------------------------------------------------------------------------ the test's side
class Popen(subprocess.Popen):
    """:class:`subprocess.Popen` of ``[sys.executable, "-c" | "-m", ...]``, forked by the zygote.

    Pipes, text mode, ``communicate``, ``wait``, ``poll``, ``kill`` and ``send_signal`` are
    Popen's own; only starting the child and reading its wait status go through the zygote."""

    def _execute_child(self, args: Any, executable: Any, preexec_fn: Any, close_fds: Any,
                       pass_fds: Any, cwd: Any, env: Any, startupinfo: Any, creationflags: Any,
                       shell: Any, p2cread: int, p2cwrite: int, c2pread: int, c2pwrite: int,
                       errread: int, errwrite: int, *rest: Any) -> None:
        args = [os.fsdecode(a) for a in args]
        _, gid, gids, uid, umask, start_new_session, process_group = rest
        if shell or preexec_fn or pass_fds or args[0] != sys.executable or \
                args[1:2] not in (["-c"], ["-m"]) or \
                (gid, gids, uid, process_group) != (None, None, None, -1) or umask != -1:
            raise ValueError(f"the zygote starts plain python -c or -m children, not {args}")
        fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1,
               errwrite if errwrite != -1 else 2]
        request = {"argv": args[1:], "cwd": os.fspath(cwd) if cwd else os.getcwd(),
                   "env": dict(os.environ if env is None else env),
                   "session": bool(start_new_session)}
        self._zygote = _zygote().connect()
        body = json.dumps(request).encode()
        socket.send_fds(self._zygote, [_HEADER.pack(len(body)) + body], fds)
        self._replies = b""
        self.pid = int(self._reply(block=True))
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _reply(self, block: bool) -> str | None:
        """The zygote's next line for this child (its pid, then its wait status), or None if
        it has not come (``block=False``)."""
        while b"\n" not in self._replies:
            self._zygote.setblocking(block)
            try:
                data = self._zygote.recv(64)
            except BlockingIOError:
                return None
            if not data:
                raise ChildProcessError("the zygote went away before the child's status")
            self._replies += data
        line, self._replies = self._replies.split(b"\n", 1)
        return line.decode()

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        status = self._reply(block=not wait_flags & os.WNOHANG)
        if status is None:
            return 0, 0
        self._zygote.close()
        return self.pid, int(status)

    def _internal_poll(self, *_: Any, **__: Any) -> int | None:
        if self.returncode is None:
            pid, status = self._try_wait(os.WNOHANG)
            if pid:
                self._handle_exitstatus(status)
        return self.returncode


def run(args: list[str], *, input: Any = None, timeout: float | None = None,
        check: bool = False, **kw: Any) -> subprocess.CompletedProcess:
    """:func:`subprocess.run` through :class:`Popen`."""
    if input is not None:
        kw["stdin"] = subprocess.PIPE
    if kw.pop("capture_output", False):
        kw["stdout"] = kw["stderr"] = subprocess.PIPE
    with Popen(args, **kw) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


class _Zygote:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="dr-dask-zygote-")
        self.address = str(Path(self.dir) / "socket")
        # one BLAS thread: no thread may exist at a fork, and the children of these tests
        # run with one (their dask threads are the parallelism)
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
            p for p in (str(Path(__file__).parent), os.getcwd(), os.environ.get("PYTHONPATH"))
            if p))
        self.proc = subprocess.Popen([sys.executable, "-m", "_spawn", self.address],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        ready = self.proc.stdout.readline()
        if ready != b"ready\n":
            raise RuntimeError(f"the zygote did not start: {ready!r}")
        atexit.register(self.close)

    def connect(self) -> socket.socket:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.address)
        return conn

    def close(self) -> None:
        self.proc.stdin.close()  # the zygote ends at the end of its stdin
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


_started: list[_Zygote] = []
_lock = threading.Lock()


def _zygote() -> _Zygote:
    with _lock:
        if not _started:
            _started.append(_Zygote())
        return _started[0]


# ------------------------------------------------------------------------------ the zygote's side
def _serve(address: str) -> tuple[dict, list[int]]:
    """Fork a child per request until stdin ends (then exit); return only in a child, with its
    request and standard streams."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    children: dict[int, socket.socket] = {}
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [], 0.02)
        if sys.stdin in readable:
            sys.exit(0)
        if listener in readable:
            conn, _ = listener.accept()
            request, fds = _receive(conn)
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                for other in children.values():
                    other.close()
                return request, fds
            for fd in fds:
                os.close(fd)
            conn.sendall(f"{pid}\n".encode())
            children[pid] = conn
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid)
            with contextlib.suppress(OSError):  # the test let go of its Popen unwaited
                conn.sendall(f"{status}\n".encode())
            conn.close()


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    while len(data) < _HEADER.size or len(data) < _HEADER.size + _HEADER.unpack_from(data)[0]:
        more = conn.recv(1 << 16)
        if not more:
            raise EOFError("a request ended early")
        data += more
    return json.loads(data[_HEADER.size:]), fds


def _become(request: dict, fds: list[int], base_path: list[str]) -> None:
    """Turn this fork into the requested ``python -c CODE ARGS`` or ``python -m MODULE ARGS``
    and run it; what it raises ends the process as it would end the interpreter."""
    import runpy
    import types

    if request["session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    os.chdir(request["cwd"])
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    if env.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(line_buffering=True)
    # sys.path as the interpreter builds it: the working directory, PYTHONPATH, then the rest
    sys.path[:] = ["", *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p),
                   *base_path]
    tempfile.tempdir = None
    _read_environment_again()
    mode, what, *args = request["argv"]
    if mode == "-c":
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        sys.argv = ["-c", *args]
        exec(compile(what, "<string>", "exec"), main.__dict__)
    else:
        sys.argv = ["-m", *args]
        runpy._run_module_as_main(what, alter_argv=True)  # what `python -m` calls


def _read_environment_again() -> None:
    """What the preloaded modules read from the environment at import, read from the child's."""
    import dask
    import numba.core.config
    import numpy as np
    from distributed.config import initialize_logging

    dask.config.refresh()
    initialize_logging(dask.config.config)
    numba.core.config.reload_config()
    np.random.seed()  # a fork copies NumPy's global generator; a new process seeds its own


def _main(address: str) -> None:
    import importlib
    import logging
    import pkgutil

    # the interpreter's own part of sys.path: past the directory of -m and PYTHONPATH
    pythonpath = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    base_path = [p for p in sys.path[1:] if p not in pythonpath]
    for name in PRELOAD:
        importlib.import_module(name)
    for name in PRELOAD_PACKAGES:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            if not module.name.endswith(".__main__") and module.name not in PRELOAD_SKIP:
                importlib.import_module(module.name)
    if logging.getLogger().handlers:
        raise RuntimeError("a preloaded module configured logging: a child would log as it "
                           "does, not as its command sets up")
    tasks = os.listdir("/proc/self/task")
    if threading.active_count() != 1 or len(tasks) != 1:
        raise RuntimeError(f"a preloaded module started a thread ({len(tasks)} in all): "
                           "a fork would copy its locks held")
    # what the preloaded modules hold is never collected, so a child's collections (and its
    # exit) need not walk it: walking it would copy every page of it into the child
    gc.freeze()
    request, fds = _serve(address)
    _become(request, fds, base_path)


if __name__ == "__main__":
    _main(sys.argv[1])
