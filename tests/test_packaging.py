"""What the built package ships: every module of the tree (pyproject.toml lists the packages),
the shipped workflows and the configuration defaults, and its type hints marked for users' type
checkers (PEP 561)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_wheel_ships_py_typed(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--wheel-dir", str(tmp_path), ROOT],
                   check=True, timeout=300, cwd=tmp_path)
    (wheel,) = tmp_path.glob("dr_dask-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "dr_dask/py.typed" in names
    tree = {str(p.relative_to(ROOT)) for p in pathlib.Path(ROOT, "dr_dask").rglob("*.py")}
    assert tree and tree <= set(names), sorted(tree - set(names))
    workflows = {f"dr_dask/workflows/{p.name}" for p in pathlib.Path(ROOT, "workflows").iterdir()
                 if p.suffix in (".toml", ".py")}
    assert "dr_dask/workflows/nightly-gp-isomap.toml" in workflows <= set(names)
    assert "dr_dask/runtime/dr_dask.yaml" in names
