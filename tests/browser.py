"""A real headless browser for tests: Debian's chromium driven over the DevTools protocol
(tornado's websocket client, already a distributed dependency).

:func:`load` opens a page and returns its console errors and uncaught exceptions (from the
protocol's Runtime and Log domains: their levels are reliable, unlike chromium's stderr log,
which prints every console message at INFO), the value of a JavaScript expression evaluated
once the page has settled, and a PNG screenshot.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_chromium() -> str | None:
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


@dataclass
class Page:
    errors: list[str] = field(default_factory=list)
    value: object = None
    screenshot: bytes = b""


async def _session(ws_url: str, url: str, expression: str, settle: float,
                   size: tuple[int, int]) -> Page:
    from tornado.websocket import websocket_connect

    conn = await websocket_connect(ws_url, max_message_size=1 << 28)
    page = Page()
    ids = iter(range(1, 1 << 30))
    pending: dict[int, asyncio.Future] = {}
    loaded = asyncio.Event()

    async def reader():
        while True:
            msg = await conn.read_message()
            if msg is None:
                return
            m = json.loads(msg)
            if "id" in m and m["id"] in pending:
                pending.pop(m["id"]).set_result(m)
            method, p = m.get("method"), m.get("params", {})
            if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                page.errors.append(" ".join(str(a.get("value", a.get("description", "")))
                                            for a in p.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                page.errors.append(d.get("exception", {}).get("description", d.get("text")))
            elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
                page.errors.append(p["entry"]["text"])
            elif method == "Page.loadEventFired":
                loaded.set()

    async def call(method, session=None, **params):
        i = next(ids)
        fut = asyncio.get_running_loop().create_future()
        pending[i] = fut
        msg = {"id": i, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        await conn.write_message(json.dumps(msg))
        res = await asyncio.wait_for(fut, 60)
        if "error" in res:
            raise RuntimeError(f"{method}: {res['error']}")
        return res.get("result", {})

    task = asyncio.ensure_future(reader())
    target = (await call("Target.createTarget", url="about:blank"))["targetId"]
    sid = (await call("Target.attachToTarget", targetId=target, flatten=True))["sessionId"]
    for domain in ("Runtime", "Log", "Page"):
        await call(f"{domain}.enable", sid)
    await call("Emulation.setDeviceMetricsOverride", sid, width=size[0], height=size[1],
               deviceScaleFactor=1, mobile=False)
    await call("Page.navigate", sid, url=url)
    await asyncio.wait_for(loaded.wait(), 60)
    await asyncio.sleep(settle)  # Bokeh builds its views after the load event
    res = await call("Runtime.evaluate", sid, expression=expression, returnByValue=True)
    page.value = res.get("result", {}).get("value")
    shot = await call("Page.captureScreenshot", sid, format="png")
    page.screenshot = base64.b64decode(shot["data"])
    task.cancel()
    conn.close()
    return page


def load(url: str, expression: str = "null", *, settle: float = 3.0,
         size: tuple[int, int] = (1400, 1600)) -> Page:
    """Open ``url`` in headless chromium and return its errors, ``expression``'s value and a
    screenshot."""
    exe = find_chromium()
    if exe is None:
        raise RuntimeError("chromium not found")
    # chromium's helper processes may still write to the profile for a moment after the
    # browser is gone: the whole process group is stopped, and a straggler's file left behind
    # in the temporary profile does not fail the test
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        try:
            ws_url, deadline = None, time.monotonic() + 60
            while ws_url is None and time.monotonic() < deadline:
                line = proc.stderr.readline()
                if not line and proc.poll() is not None:
                    break
                m = re.search(r"DevTools listening on (ws://\S+)", line)
                ws_url = m.group(1) if m else None
            if ws_url is None:
                raise RuntimeError("chromium did not start its DevTools endpoint")
            return asyncio.run(_session(ws_url, url, expression, settle, size))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
