"""The package's layer map (docs/DEVELOPING.md) as a rule: a module imports only from its own
layer or the ones below it. Read from the source (every import, those inside functions too),
so an import that runs up a layer fails here before it tangles the package."""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "dr_dask"

#: Bottom to top. A module belongs to the first entry its dotted name starts with.
LAYERS: list[tuple[str, ...]] = [
    ("runtime",),
    ("io",),
    ("linalg",),
    ("graph",),
    ("methods", "metrics"),
    ("runs",),
    # applications, and the public paths kept for what moved into them
    ("report", "stream", "jobs", "datasets", "bench", "cli", "plot", "html_report", "flows"),
]


def layer_of(module: str) -> int:
    """The layer of ``dr_dask.<module>``; the package itself (``__version__``) is the bottom."""
    if module == "":
        return -1
    first = module.split(".")[0]
    for level, names in enumerate(LAYERS):
        if first in names:
            return level
    raise AssertionError(f"dr_dask.{module} is in no layer: add it to LAYERS and DEVELOPING.md")


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(tree: ast.AST, module: str) -> set[str]:
    """The dr_dask modules ``tree`` imports, as names under ``dr_dask.`` ("" for the package)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "dr_dask":
                found.update(a.name if a.name in {*sum(LAYERS, ())} else "" for a in node.names)
            elif node.module.startswith("dr_dask."):
                found.add(node.module.removeprefix("dr_dask."))
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"dr_dask.{module}: relative import (use dr_dask.… paths)")
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("dr_dask.") for a in node.names
                         if a.name.startswith("dr_dask."))
    return found


def upward_imports(path: pathlib.Path) -> list[str]:
    module = module_name(path)
    own = layer_of(module)
    return [f"dr_dask.{module} (layer {own}) imports dr_dask.{m} (layer {layer_of(m)})"
            for m in sorted(imported(ast.parse(path.read_text()), module)) if layer_of(m) > own]


def test_no_import_runs_up_a_layer():
    modules = sorted(p for p in PACKAGE.rglob("*.py") if module_name(p))
    assert len(modules) > 50  # the walk found the package
    assert [line for path in modules for line in upward_imports(path)] == []


def test_the_rule_catches_an_upward_import():
    """The check itself can fail: a storage module importing an estimator is caught."""
    tree = ast.parse("def f():\n    from dr_dask.methods.ikd import IKD\n")
    assert {layer_of(m) for m in imported(tree, "io.storage")} == {layer_of("methods.ikd")}
    assert layer_of("methods.ikd") > layer_of("io.storage")
