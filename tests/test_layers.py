"""The package's layer map (docs/DEVELOPING.md) as a rule: a module imports only from its own
layer or the ones below it. Read from the source (every import, those inside functions too),
so an import that runs up a layer fails here before it tangles the package."""

from __future__ import annotations

import ast
import pathlib

import pytest

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


def module_name(path: pathlib.Path, package: pathlib.Path = PACKAGE) -> str:
    parts = list(path.relative_to(package).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def lazy_names(package: pathlib.Path = PACKAGE) -> dict[str, str]:
    """The package's lazy public names (``dr_dask.IKD``): name -> module under ``dr_dask.``,
    read from the ``_PUBLIC`` table of its ``__init__.py``."""
    for node in ast.walk(ast.parse((package / "__init__.py").read_text())):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "_PUBLIC" for t in node.targets):
            table = ast.literal_eval(node.value)
            return {k: v.removeprefix("dr_dask.") for k, v in table.items()}
    return {}


def _under_package(dotted: list[str], lazy: dict[str, str]) -> str:
    """The module that ``dr_dask.<dotted>`` names ("" for the package itself)."""
    if not dotted:
        return ""
    if dotted[0] in lazy:
        return lazy[dotted[0]]
    if dotted[0] in {*sum(LAYERS, ())}:
        return ".".join(dotted)
    return ""  # a name of the package itself (__version__)


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None for anything but names and attributes."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def imported(tree: ast.AST, module: str, lazy: dict[str, str] | None = None) -> set[str]:
    """The dr_dask modules ``tree`` imports, as names under ``dr_dask.`` ("" for the package),
    in every form: ``from dr_dask.x import``, ``from dr_dask import X`` (a subpackage or one
    of the lazy public names), ``import dr_dask[.x] [as y]`` and the attributes read through
    that name (``dr_dask.methods.ikd.IKD``, ``dr_dask.IKD``), and
    ``importlib.import_module("dr_dask.x")`` / ``__import__("dr_dask.x")``."""
    lazy = lazy_names() if lazy is None else lazy
    found: set[str] = set()
    aliases: dict[str, list[str]] = {}  # a local name bound to dr_dask[.x] -> its path under it
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "dr_dask":
                found.update(_under_package([a.name], lazy) for a in node.names)
            elif node.module.startswith("dr_dask."):
                found.add(node.module.removeprefix("dr_dask."))
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"dr_dask.{module}: relative import (use dr_dask.… paths)")
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] != "dr_dask":
                    continue
                found.add(_under_package(parts[1:], lazy))
                # `import dr_dask.x` binds dr_dask; `import dr_dask.x as y` binds y to dr_dask.x
                aliases[a.asname or "dr_dask"] = parts[1:] if a.asname else []
        elif isinstance(node, ast.Call) and node.args \
                and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) \
                and (_dotted(node.func) or [""])[-1] in {"import_module", "__import__"}:
            parts = node.args[0].value.split(".")
            if parts[0] == "dr_dask":
                found.add(_under_package(parts[1:], lazy))
    # attributes read through a name bound to the package, each chain once (its longest)
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            dotted = _dotted(node)
            if dotted and dotted[0] in aliases:
                found.add(_under_package([*aliases[dotted[0]], *dotted[1:]], lazy))
    return found


def upward_imports(path: pathlib.Path, package: pathlib.Path = PACKAGE) -> list[str]:
    module = module_name(path, package)
    own = layer_of(module)
    found = imported(ast.parse(path.read_text()), module, lazy_names(package))
    return [f"dr_dask.{module} (layer {own}) imports dr_dask.{m} (layer {layer_of(m)})"
            for m in sorted(found) if layer_of(m) > own]


def violations(package: pathlib.Path = PACKAGE) -> list[str]:
    """Every import of the package at ``package`` that runs up a layer."""
    modules = sorted(p for p in package.rglob("*.py") if module_name(p, package))
    return [line for path in modules for line in upward_imports(path, package)]


def test_no_import_runs_up_a_layer():
    assert len(list(PACKAGE.rglob("*.py"))) > 50  # the walk finds the package
    assert violations() == []


#: One upward import (a storage module reaching an estimator) in each form the rule reads.
PLANTED = {
    "from dr_dask.x import": "def f():\n    from dr_dask.methods.ikd import IKD\n",
    "from dr_dask import lazy name": "from dr_dask import IKD\n",
    "from dr_dask import subpackage": "from dr_dask import methods\n",
    "import dr_dask, attribute": "import dr_dask\n\ndef f():\n    return dr_dask.methods.ikd.IKD\n",
    "import dr_dask, lazy attribute": "import dr_dask\n\nX = dr_dask.IKD\n",
    "import dr_dask.x as y": "import dr_dask.methods.ikd as m\n",
    "importlib.import_module": "import importlib\n\n"
                               "m = importlib.import_module('dr_dask.methods.ikd')\n",
    "import_module, bare": "from importlib import import_module\n\n"
                           "m = import_module('dr_dask.methods')\n",
    "__import__": "m = __import__('dr_dask.methods.ikd')\n",
}


def _plant(root: pathlib.Path, source: str) -> pathlib.Path:
    """A synthetic package: its ``__init__`` with the real lazy names, a storage module holding
    ``source`` and an estimator module."""
    package = root / "dr_dask"
    for sub in ("io", "methods"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text((PACKAGE / "__init__.py").read_text())
    (package / "methods" / "ikd.py").write_text("from dr_dask.io.storage import Location\n")
    (package / "io" / "storage.py").write_text(source)
    return package


@pytest.mark.parametrize("form", PLANTED)
def test_the_rule_catches_an_upward_import_in_every_form(form, tmp_path):
    """The check itself can fail: each form, planted in a storage module, is caught."""
    (line,) = violations(_plant(tmp_path, PLANTED[form]))
    assert line.startswith("dr_dask.io.storage (layer 1) imports dr_dask.methods")


def test_the_rule_passes_imports_that_run_down(tmp_path):
    """The same forms reaching down (or the package's version) are no violation."""
    source = ("import importlib\nimport dr_dask\nfrom dr_dask import __version__, open_dataset\n"
              "from dr_dask import runtime\nv = dr_dask.__version__\n"
              "c = dr_dask.runtime.config\nimportlib.import_module('dr_dask.runtime.blas')\n")
    assert violations(_plant(tmp_path, source)) == []
