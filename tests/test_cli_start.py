"""``dr-dask --help``, a command's ``--help`` and a mistyped option answer without loading
scikit-learn or dask.array: every ``dr-dask`` subprocess (the fault tests start dozens, a
workflow one per step) would otherwise pay for them before reading its arguments. Run in a
fresh interpreter, since this test process has long imported both."""

from __future__ import annotations

import json
import subprocess
import sys

#: What a command that does not fit must not load (each a large import).
HEAVY = ("sklearn", "dask.array", "distributed", "scipy", "xarray", "matplotlib")

#: The commands, in one fresh interpreter one after the other (modules loaded by one stay
#: loaded for the next, so each is checked by what it adds).
COMMANDS = [
    ("--help",), ("embed", "ikd", "--help"), ("embed", "isomap", "--help"),
    ("compare", "--help"), ("run", "--help"), ("job", "incremental", "--help"),
    ("stream", "run", "--help"), ("embed", "ikd", "--no-such-option"),
]

_PROBE = """
import json, sys
exec(sys.argv[2])
from dr_dask.cli import main
for args in json.loads(sys.argv[1]):
    try:
        main(args, prog_name="dr-dask")
    except SystemExit as exc:
        code = exc.code
    print(json.dumps({"args": args, "code": code,
                      "loaded": [m for m in %r if m in sys.modules]}))
"""


def _probe(commands: list[tuple[str, ...]], prelude: str = "") -> list[dict]:
    out = subprocess.run([sys.executable, "-c", _PROBE % (HEAVY,), json.dumps(commands), prelude],
                         capture_output=True, text=True, timeout=120, check=False)
    got = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"args"')]
    assert [tuple(g["args"]) for g in got] == commands, out.stderr[-2000:]
    return got


def test_a_command_that_does_not_fit_loads_no_heavy_module():
    got = _probe(COMMANDS)
    for g in got:
        assert g["code"] == (2 if "--no-such-option" in g["args"] else 0), g
        assert g["loaded"] == [], g


def test_the_probe_sees_a_heavy_import():
    """The check can fail: a module loaded before the command is seen."""
    (got,) = _probe([("--help",)], prelude="import sklearn, dask.array")
    assert {"sklearn", "dask.array"} <= set(got["loaded"])
