"""Every estimator documents every parameter as numpydoc asks (``name : type, default=value``,
the default the constructor has, and what it does), says what to see also, and its Examples
run (they are doctests, on small data)."""

from __future__ import annotations

import doctest
import inspect

import dask
import pytest
from numpydoc.docscrape import ClassDoc

from dr_dask import IKD, LSDR, GPIsomap, Isomap, LandmarkIsomap
from dr_dask.methods import gp_isomap, ikd, isomap, lsdr

ESTIMATORS = [IKD, Isomap, LandmarkIsomap, LSDR, GPIsomap]


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_every_parameter_is_documented_with_its_type_and_default(cls):
    doc = ClassDoc(cls)
    documented = {p.name: p for p in doc["Parameters"]}
    signature = inspect.signature(cls.__init__).parameters
    params = cls().get_params(deep=False)
    assert list(documented) == [p for p in signature if p != "self"]  # in the same order
    for name, value in params.items():
        assert signature[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        kind, _, default = documented[name].type.partition(", default=")
        assert kind and default, f"{name}: {documented[name].type!r} has no type or default"
        # the documented default is the constructor's (a literal, or arithmetic like 1 - 1e-5)
        assert eval(default, {}) == value, f"{name}: documented {default}, actually {value!r}"
        assert " ".join(documented[name].desc).strip(), f"{name} has no description"
    assert doc["See Also"] and doc["Examples"]


@pytest.mark.parametrize("module", [ikd, isomap, lsdr, gp_isomap], ids=lambda m: m.__name__)
def test_the_examples_run(module):
    with dask.config.set(scheduler="threads"):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
