"""Shared fixtures: one real multi-process LocalCluster for the whole test session.

Tests that start or use a cluster are marked ``@pytest.mark.cluster``, so that
``pytest -m "not cluster"`` starts none. Two guards keep that true: collection fails on a test
that takes a cluster fixture without the marker, and an unmarked test that starts a dask
cluster in this process (a ``LocalCluster``, e.g. through a CLI command without
``--scheduler threads``) fails.
"""

from __future__ import annotations

import contextlib
import gc
import logging

import dask
import numpy as np
import psutil
import pytest

from dr_dask.runtime.resources import tree_rss

#: Fixtures that start a cluster.
CLUSTER_FIXTURES = {"cluster_client"}


def pytest_configure(config):
    # The workers of the clusters a test process starts fork from a server that imported
    # distributed, NumPy and pandas once (as distributed's own test suite does), instead of
    # each importing them: 2-3 s of CPU a worker, and a killed worker back in well under a
    # second. They are still processes of their own, started clean (our modules are imported
    # by what a task unpickles); the clusters of `dr-dask` processes and the remote clusters'
    # workers start as users' do (spawned).
    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
    if (getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput")
            and not config.option.collectonly):
        # Once, in xdist's controller, before the test processes start: numba's cache gets
        # the kernels of the common fits (the README's set-up step does the same), so that the
        # test processes and the clusters' workers read them instead of each compiling them
        # (on a clean clone they otherwise compile them side by side)
        from dr_dask.jobs.quickstart import warm_kernels

        warm_kernels()


def pytest_collection_finish(session):
    # What collection built and imported (the test items, our modules, NumPy, SciPy,
    # scikit-learn, dask, distributed: some 400,000 objects) lives for the whole session: out
    # of the collector's way, so that the full collections the benchmarks and the memory
    # figures make before each measurement, and the automatic ones, scan only what the tests
    # create (before, 0.2-0.4 s each, about 50 s of the suite's CPU)
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    unmarked = [item.nodeid for item in items
                if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ()))
                and item.get_closest_marker("cluster") is None]
    if unmarked:
        raise pytest.UsageError(
            "tests using a cluster fixture must be marked @pytest.mark.cluster: "
            + ", ".join(unmarked))


@pytest.fixture(autouse=True)
def _no_cluster_unless_marked(request, monkeypatch):
    """Fail an unmarked test that starts a dask cluster (SpecCluster: LocalCluster and kin)."""
    if request.node.get_closest_marker("cluster") is not None:
        yield
        return
    from distributed.deploy.spec import SpecCluster

    started: list[str] = []
    original = SpecCluster.__init__

    def guarded(self, *args, **kwargs):
        started.append(type(self).__name__)
        original(self, *args, **kwargs)

    monkeypatch.setattr(SpecCluster, "__init__", guarded)
    yield
    if started:
        pytest.fail(f"{request.node.nodeid} started a {started[0]} but is not marked "
                    "@pytest.mark.cluster", pytrace=False)


def noisy_curve(T: int, N: int, seed: int = 0) -> np.ndarray:
    """A 1-D curve in N dimensions under isotropic noise (the sinusoidal dataset's shape)."""
    rng = np.random.RandomState(seed)
    z = rng.uniform(-6, 6, (T, 1))
    return np.sin(z @ rng.uniform(-1, 1, (1, N)) + rng.uniform(-np.pi, np.pi, N)) \
        + 0.1 * rng.normal(size=(T, N))


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


# ------------------------------------------------------------------------- S3 (moto server)
#: A credential the tests look for in everything a run writes: it must never appear.
S3_SECRET = "s3cr3t-dr-dask-never-print-me"


from dr_dask.bench.io import free_port  # noqa: E402  (re-exported for the tests)


def wait_port(port: int, timeout: float = 30) -> None:
    """Until a server listens on 127.0.0.1:``port`` (a subprocess started it)."""
    import socket
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


@pytest.fixture(scope="session")
def moto_endpoint():
    """A real S3 protocol server (moto in server mode) on 127.0.0.1, for the whole session."""
    from moto import backends
    from moto.server import ThreadedMotoServer

    # moto's server lists its package's directories on every request to find the service:
    # the same list every time (about 20 s of the suite's CPU), so listed once
    modules = tuple(backends.list_of_moto_modules())
    listing, backends.list_of_moto_modules = backends.list_of_moto_modules, lambda: modules
    # werkzeug logs every request at INFO (through pytest's capture): only its warnings
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()
    backends.list_of_moto_modules = listing


@pytest.fixture(scope="session", autouse=True)
def _one_botocore_loader():
    """One botocore data loader for every botocore session of a test process. A session
    parses botocore's endpoints, S3 model and rules (3.6 MB of JSON) for its first client,
    and each fresh s3fs filesystem makes a new session: after every bucket's cleared instance
    cache, the S3 module's tests parsed them hundreds of times (13 s of its 51 s of CPU). The
    clients of one session already share the parsed files, read-only; here every session
    does."""
    import functools

    import botocore.session

    create = botocore.session.create_loader
    botocore.session.create_loader = functools.lru_cache(maxsize=None)(create)
    yield
    botocore.session.create_loader = create


def _bucket(moto_endpoint: str, monkeypatch):
    """A fresh bucket on the moto server, AWS_* (incl. AWS_ENDPOINT_URL) set through
    ``monkeypatch`` for its scope and its subprocesses."""
    import uuid

    import boto3
    import s3fs

    env = {"AWS_ACCESS_KEY_ID": "testing-key-id", "AWS_SECRET_ACCESS_KEY": S3_SECRET,
           "AWS_ENDPOINT_URL": moto_endpoint, "AWS_DEFAULT_REGION": "us-east-1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    s3fs.S3FileSystem.clear_instance_cache()  # cached instances hold the previous settings
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=bucket)
    yield bucket
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def s3_bucket(moto_endpoint, monkeypatch, request):
    """A fresh bucket; AWS_* (incl. AWS_ENDPOINT_URL) set for this test and its subprocesses."""
    yield from _bucket(moto_endpoint, monkeypatch)


@pytest.fixture(scope="module")
def s3_module_bucket(moto_endpoint):
    """:func:`s3_bucket` for a whole module (one clean run shared by its tests)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield from _bucket(moto_endpoint, monkeypatch)


@pytest.fixture
def dr_config():
    """``dr_config({"knn.cells-leaf-size": 64})`` sets dr_dask's tuning knobs (dask config
    ``dr_dask.*``) until the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda values: stack.enter_context(
            dask.config.set({f"dr_dask.{k}": v for k, v in values.items()}))


# ---------------------------------------------------------------------------- TLS material
def _cert(subject: str, key, issuer: str, issuer_key, ca: bool):
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def tls_files(directory) -> dict[str, str]:
    """A private CA and a certificate it signed for localhost / 127.0.0.1, as PEM files in
    ``directory``: paths by ``ca_file``, ``cert``, ``key``."""
    import pathlib

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    d = pathlib.Path(directory)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _cert("dr-dask test CA", ca_key, "dr-dask test CA", ca_key, ca=True)
    cert = _cert("dr-dask", key, "dr-dask test CA", ca_key, ca=False)
    paths = {"ca_file": d / "ca.pem", "cert": d / "cert.pem", "key": d / "key.pem"}
    paths["ca_file"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return {k: str(v) for k, v in paths.items()}


# ------------------------------------------------------------------------- peak memory
def idle_rss_gb() -> float:
    """This process tree's resident memory now (GB), after a collection: the floor of a peak
    that a run in this process (and its cluster's workers) measures next."""
    gc.collect()
    return tree_rss() / 1e9


def plausible_peak(peak_gb: float, idle_gb: float) -> bool:
    """Whether ``peak_gb`` can be the peak RSS of this process tree during a run that started
    at ``idle_gb``: at least that (less a fifth, for memory handed back since), at most the
    machine's memory. A peak of another process, in bytes, or never sampled fails."""
    return 0.8 * idle_gb <= peak_gb <= psutil.virtual_memory().total / 1e9


# The fixtures scikit-learn's own test files take (test_isomap_sklearn.py, from scikit-learn's
# conftest.py): both dtypes always (float32 in must give float32 out), its default seed.
@pytest.fixture(params=[np.float32, np.float64])
def global_dtype(request):
    return request.param


@pytest.fixture
def global_random_seed():
    return 42
