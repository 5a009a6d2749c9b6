"""The API reference (docs/site/api.rst) lists every name a public module exports.

A public module's ``__all__`` is its promise to users; a name in it that the reference leaves
out is a function users can import but cannot look up. These tests read the autosummary
entries of api.rst (each under its ``currentmodule``) and fail naming every exported name that
is missing, so a new public function joins the reference in the same change.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import dr_dask

API_RST = Path(__file__).resolve().parents[1] / "docs" / "site" / "api.rst"
PACKAGE_DIR = Path(dr_dask.__file__).resolve().parent

#: The modules users import from: each defines ``__all__`` and the reference lists all of it.
PUBLIC = (
    "dr_dask",
    "dr_dask.metrics",
    "dr_dask.plot",
    "dr_dask.html_report",
    "dr_dask.runs",
    "dr_dask.stream",
    "dr_dask.jobs",
    "dr_dask.datasets",
    "dr_dask.graph",
    "dr_dask.flows",
)

#: The top level's other modules, and why their names are not the public API: the layers
#: below the applications are reached through the public modules above (docs/DEVELOPING.md).
INTERNAL = {
    "bench": "the benchmarks behind `dr-dask bench` (docs/benchmarks.md)",
    "cli": "the `dr-dask` command, documented by its click commands (docs/site/cli.rst)",
    "io": "the storage boundary; `open_dataset` is public at `dr_dask.open_dataset`",
    "linalg": "tiles, kernels and the eigensolver the estimators run",
    "methods": "the estimators' modules; the estimators are public at `dr_dask.<Name>`",
    "report": "where `dr_dask.plot` and `dr_dask.html_report` live",
    "runtime": "configuration, clusters, progress bars, credentials",
}

#: Optional extras whose absence leaves a public module unimportable here; its ``__all__`` is
#: then read from the source (it is a list of string literals there).
OPTIONAL = {"prefect"}


def exported(module: str) -> list[str]:
    """The module's ``__all__``, imported, or parsed from its source when an optional extra
    it imports is not installed."""
    try:
        names = importlib.import_module(module).__all__
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in OPTIONAL:
            raise
        parts = module.split(".")[1:]
        path = PACKAGE_DIR.joinpath(*parts)
        source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        tree = ast.parse(source.read_text())
        names = next(ast.literal_eval(node.value) for node in tree.body
                     if isinstance(node, ast.Assign)
                     and any(getattr(t, "id", None) == "__all__" for t in node.targets))
    # dunders (__version__) are module metadata, not API pages
    return [n for n in names if not (n.startswith("__") and n.endswith("__"))]


def referenced(text: str) -> set[str]:
    """Every fully qualified name the autosummary blocks of an .rst text list."""
    names: set[str] = set()
    current = ""
    in_block = False
    for line in text.splitlines():
        if m := re.match(r"\.\. currentmodule:: (\S+)", line):
            current, in_block = m.group(1), False
        elif line.startswith(".. autosummary::"):
            in_block = True
        elif in_block and line.strip() and not line.startswith(" "):
            in_block = False
        elif in_block and (m := re.match(r"\s+([A-Za-z_][\w.]*)\s*$", line)):
            names.add(f"{current}.{m.group(1)}" if current else m.group(1))
    return names


def test_every_exported_name_is_in_the_reference() -> None:
    listed = referenced(API_RST.read_text())
    missing = [f"{module}.{name}" for module in PUBLIC for name in exported(module)
               if f"{module}.{name}" not in listed]
    assert not missing, (
        f"public names missing from docs/site/api.rst (add them to an autosummary block under "
        f"their module's currentmodule): {missing}")


def test_every_top_level_module_is_public_or_internal() -> None:
    # a new module beside the others must be classified, else its names would escape the check
    top = {m.name for m in pkgutil.iter_modules([str(PACKAGE_DIR)]) if not m.name.startswith("_")}
    public = {m.split(".")[1] for m in PUBLIC if "." in m}
    assert top - public - set(INTERNAL) == set(), "classify these modules in PUBLIC or INTERNAL"
    assert public <= top and set(INTERNAL) <= top, "a listed module no longer exists"


def test_the_reader_catches_a_missing_name() -> None:
    # the parser above is what the first test trusts: a name outside any block is not listed,
    # and a block's names take the currentmodule that precedes them
    text = (".. currentmodule:: dr_dask.graph\n\n.. autosummary::\n   :toctree: generated\n\n"
            "   kneighbors\n   GeodesicRows\n\nProse that mentions shortest_paths.\n\n"
            ".. currentmodule:: dr_dask\n\n.. autosummary::\n\n   IKD\n")
    assert referenced(text) == {"dr_dask.graph.kneighbors", "dr_dask.graph.GeodesicRows",
                                "dr_dask.IKD"}


@pytest.mark.parametrize("module", PUBLIC)
def test_public_module_defines_all(module: str) -> None:
    assert exported(module), f"{module} exports nothing: define its __all__"
