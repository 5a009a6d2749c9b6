"""The guards in conftest.py: ``-m "not cluster"`` must start no dask cluster."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()
MARKERS = '[pytest]\nmarkers =\n    cluster: a cluster\n'


def test_unmarked_test_that_starts_a_cluster_fails(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makeini(MARKERS)
    pytester.makepyfile(test_inner="""
import pytest
from distributed import LocalCluster


def test_unmarked():
    with LocalCluster(n_workers=0, processes=False, dashboard_address=None):
        pass


@pytest.mark.cluster
def test_marked():
    with LocalCluster(n_workers=0, processes=False, dashboard_address=None):
        pass


def test_no_cluster():
    assert True
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "not cluster")
    # the unmarked test ran (the guard lets it finish) and errors at teardown: the run fails
    result.assert_outcomes(passed=2, errors=1, deselected=1)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*test_unmarked started a LocalCluster but is not marked*"])


def test_cluster_fixture_without_marker_is_a_collection_error(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makeini(MARKERS)
    pytester.makepyfile(test_inner="""
def test_uses_cluster(cluster_client):
    pass
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*must be marked @pytest.mark.cluster*test_uses_cluster*"])
