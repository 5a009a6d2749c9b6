"""Sphinx configuration of the dr_dask documentation site.

    pip install -e ".[docs]" && sphinx-build -W -b html docs/site build/docs

The API pages come from the numpydoc docstrings (autodoc + autosummary), the command line
from the click commands themselves (sphinx-click), the examples from examples/.
"""

from importlib.metadata import version as _version
from pathlib import Path

project = "dr_dask"
author = "dr_dask developers"
release = _version("dr-dask")
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "sphinx_click",
]
autosummary_generate = True
# the Prefect flows are an optional extra whose pins conflict with the docs' (.ci/run)
autodoc_mock_imports = ["prefect"]
# the metadata-routing setters scikit-learn generates are not ours to document
autodoc_default_options = {"members": True, "inherited-members": False,
                           "exclude-members": "set_fit_request,set_transform_request"}
# numpydoc lists the documented parameters and attributes; members have their own pages
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
# every "Returns"/"Parameters" type is prose, not a cross-reference target
numpydoc_xref_param_type = False
exclude_patterns = ["generated/*.examples"]
html_theme = "alabaster"
html_title = "dr_dask"

# every example is on the examples page (a new one must be added to examples.rst)
_here = Path(__file__).parent
_listed = (_here / "examples.rst").read_text()
_missing = [p.name for p in sorted((_here / "../../examples").glob("*.py"))
            if p.name not in _listed]
if _missing:
    raise RuntimeError(f"examples missing from docs/site/examples.rst: {_missing}")
