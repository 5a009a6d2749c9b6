"""What the built package ships: its type hints are marked for users' type checkers (PEP 561)."""

from __future__ import annotations

import os
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
    assert "dr_dask/report/plot.py" in names and "dr_dask/report/html.py" in names
