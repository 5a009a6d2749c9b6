"""The README is the front door: its set-up commands are the ones CI runs, every page and
picture it points to exists, and it stays a short page (measurements live in
docs/benchmarks.md, each with its date, command and machine)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

SET_UP = "pip install -e . && dr-dask quickstart"
TESTS = 'pip install -c deploy/constraints.txt -e ".[test]" && python -m pytest -q -n 2'


def test_the_set_up_commands_are_the_ones_ci_runs() -> None:
    lines = README.splitlines()
    assert SET_UP in lines and TESTS in lines
    assert TESTS in (ROOT / ".ci" / "run").read_text().splitlines()


def test_every_linked_file_exists() -> None:
    targets = re.findall(r"\]\(([^)#]+)\)", README)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert "docs/images/swiss_roll.png" in local and "docs/benchmarks.md" in local
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_short_and_undated() -> None:
    lines = README.splitlines()
    dated = [line for line in lines if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert len(lines) <= 150, f"README has {len(lines)} lines: move detail to docs/"
    assert not dated, f"dated lines belong in docs/benchmarks.md: {dated}"
