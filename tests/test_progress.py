"""Progress bars where the user is: tested by where the process really runs (a pipe, a
terminal, a Jupyter kernel), never by pretending to be one."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import termios

import pytest

from dr_dask import IKD, LSDR, GPIsomap, Isomap, LandmarkIsomap

#: A fit with bars on, after printing where bars go.
FIT = (
    "import dask, numpy as np\n"
    "from dr_dask import IKD\nfrom dr_dask.runtime import progress\n"
    "print('OUTPUT', progress.output(), flush=True)\n"
    "X = np.random.default_rng(0).normal(size=(400, 12))\n"
    "{setup}"
    "IKD(n_components=2, random_state=0, tile_size=100, progress=True{client}).fit(X)\n"
    "print('DONE', flush=True)\n"
)


#: The MIME type of a Jupyter widget's display.
WIDGET = "application/vnd.jupyter.widget-view+json"


def _code(cluster: bool = False) -> str:
    if cluster:
        return FIT.format(setup="from distributed import Client, LocalCluster\n"
                                "client = Client(LocalCluster(n_workers=1, threads_per_worker=1,"
                                " dashboard_address=None))\n",
                          client=", client=client")
    return FIT.format(setup="dask.config.set(scheduler='threads')\n", client="")


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def test_every_estimator_has_progress():
    for est in (IKD(), Isomap(), LandmarkIsomap(), GPIsomap(), LSDR()):
        assert est.get_params()["progress"] is False
        with pytest.raises(ValueError, match="'progress' parameter"):
            est.set_params(progress="yes").fit([[0.0, 1.0]] * 10)


def test_a_pipe_gets_no_bar():
    res = subprocess.run([sys.executable, "-c", _code()], capture_output=True, text=True,
                         env=_env(), timeout=300)
    assert res.returncode == 0, res.stderr
    assert "OUTPUT None" in res.stdout and "DONE" in res.stdout
    assert "%|" not in res.stderr and "\r" not in res.stderr  # no bar, no escape codes


def _on_a_terminal(code: str) -> str:
    """Run ``code`` with stderr on a pseudo-terminal; return stdout and the terminal's text."""
    master, slave = os.openpty()
    # a terminal has a size (a fresh pseudo-terminal has 0 columns: a bar of no width)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=slave, env=_env())
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    out, _ = proc.communicate(timeout=300)
    os.close(master)
    assert proc.returncode == 0, b"".join(chunks).decode(errors="replace")
    return out.decode() + b"".join(chunks).decode(errors="replace")


def _closed_bars(text: str) -> list[str]:
    """The final state of every bar drawn (tqdm redraws a bar after ``\r`` and ends it with a
    newline)."""
    lines = (line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n"))
    return [line for line in lines if "%|" in line]


def test_a_terminal_gets_a_text_bar_on_stderr():
    text = _on_a_terminal(_code())
    assert "OUTPUT terminal" in text and "DONE" in text
    # one bar for the fit, run to the end, on stderr, naming the estimator and its stages
    bars = _closed_bars(text)
    assert len(bars) == 1, bars
    assert bars[0].startswith("dr-dask IKD: ") and "100%" in bars[0], bars
    assert "dr-dask IKD: tiles" in text or "dr-dask IKD: eigen" in text, text[-2000:]


@pytest.mark.cluster
def test_a_terminal_on_a_cluster_gets_the_fits_bar():
    text = _on_a_terminal(_code(cluster=True))
    assert "OUTPUT terminal" in text and "DONE" in text
    # the same one bar for the fit, fed by the futures the fit gathers from the cluster
    bars = _closed_bars(text)
    assert len(bars) == 1 and bars[0].startswith("dr-dask IKD: ") and "100%" in bars[0], bars


def test_a_jupyter_kernel_gets_a_widget():
    """A real IPython kernel (jupyter_client talking to ipykernel): the bar is tqdm's
    notebook widget, displayed through the kernel's display protocol."""
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (the test extra has it)")
    pytest.importorskip("ipywidgets", reason="ipywidgets is not installed (the test extra has it)")
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", env=_env())
    try:
        msg_id = kc.execute(_code())
        stdout, mimes, error, widgets = "", set(), None, []
        while True:
            msg = kc.get_iopub_msg(timeout=300)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream" and content["name"] == "stdout":
                stdout += content["text"]
            elif kind in ("display_data", "update_display_data"):
                mimes |= set(content["data"])
                if kind == "display_data" and WIDGET in content["data"]:
                    widgets.append(content["data"][WIDGET]["model_id"])
            elif kind == "error":
                error = "\n".join(content["traceback"])
            elif kind == "status" and content["execution_state"] == "idle":
                break
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert error is None, error
    assert "OUTPUT notebook" in stdout and "DONE" in stdout
    assert WIDGET in mimes
    assert len(widgets) == 1, widgets  # one bar for the whole fit
