"""Shared fixtures: one real multi-process LocalCluster for the whole test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cluster_client():
    """A 2-worker, multi-process LocalCluster (separate processes: no shared memory, no globals)."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
        memory_limit="4GB",
    )
    client = Client(cluster, set_as_default=False)
    yield client
    client.close()
    cluster.close()
