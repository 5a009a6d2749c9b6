"""deploy/: the image (pinned from this environment, non-root, dask entrypoints), the compose
file (against the compose-spec JSON schema; Docker cannot run on the test machines), and the
SLURM example (a real dask-jobqueue cluster that clients join through its scheduler file)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys

import jsonschema
import pytest
import yaml

ROOT = os.path.join(os.path.dirname(__file__), "..")
DEPLOY = os.path.join(ROOT, "deploy")


def _load_module(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    with open(os.path.join(DEPLOY, "Dockerfile")) as fh:
        text = re.sub(r"\\\n(\s*#.*\n)*", " ", fh.read())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1])
            for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _compose() -> dict:
    with open(os.path.join(DEPLOY, "docker-compose.yml")) as fh:
        return yaml.safe_load(fh)


def _daskjob_args() -> list[str]:
    with open(os.path.join(DEPLOY, "kubernetes", "daskjob-nightly.yaml")) as fh:
        job = yaml.safe_load(fh)
    return job["spec"]["job"]["spec"]["containers"][0]["args"]


# ------------------------------------------------------------------------------ the image
def test_constraints_pin_the_tested_environment():
    make = _load_module(os.path.join(DEPLOY, "make_constraints.py"), "make_constraints")
    with open(os.path.join(DEPLOY, "constraints.txt")) as fh:
        current = fh.read()
    assert current == make.render(make.pins()), (
        "deploy/constraints.txt is stale: run `python deploy/make_constraints.py`")
    for name in ("dask", "distributed", "zarr", "numpy", "numba", "kr8s"):
        assert re.search(rf"^{name}==\d", current, re.MULTILINE), name


def test_dockerfile_installs_pinned_as_non_root_with_dask_entrypoints():
    make = _load_module(os.path.join(DEPLOY, "make_constraints.py"), "make_constraints")
    steps = _dockerfile()
    (base,) = [args for op, args in steps if op == "FROM"]
    # the tested Python, at a pinned patch version
    assert re.fullmatch(rf"python:{sys.version_info.major}\.{sys.version_info.minor}\.\d+-slim-\w+",
                        base), base
    installs = [args for op, args in steps if op == "RUN" and "pip install" in args]
    assert installs and all("-c constraints.txt" in cmd for cmd in installs)
    assert any(f'".[{",".join(make.EXTRAS)}]"' in cmd for cmd in installs)
    copies = [args.split() for op, args in steps if op == "COPY"]
    assert ["workflows", "./workflows"] in copies  # beside WORKDIR /opt/dr_dask
    (user,) = [args for op, args in steps if op == "USER"]
    assert user.split(":")[0] == "10001"  # the runAsUser of deploy/kubernetes
    (cmd,) = [json.loads(args) for op, args in steps if op == "CMD"]
    assert cmd[:2] == ["dask", "scheduler"]


def test_no_legacy_dask_scripts_and_the_entrypoints_exist():
    for dirpath, _, files in os.walk(DEPLOY):
        for name in files:
            with open(os.path.join(dirpath, name), errors="replace") as fh:
                text = fh.read()
            # as a command word (a Service named dr-dask-scheduler is fine)
            assert not re.search(r"(^|[\s\[\"'])dask-(scheduler|worker)\b", text), (
                name, "legacy script")
    bindir = os.path.dirname(sys.executable)
    for sub in ("scheduler", "worker"):
        out = subprocess.run([os.path.join(bindir, "dask"), sub, "--help"], capture_output=True,
                             text=True, timeout=120, check=False)
        assert out.returncode == 0 and "--dashboard-address" in out.stdout, out.stderr


# ---------------------------------------------------------------------------- compose
@pytest.fixture(scope="module")
def compose_schema() -> dict:
    with open(os.path.join(os.path.dirname(__file__), "schemas", "compose-spec.json")) as fh:
        return json.load(fh)


def _validate_compose(doc: dict, schema: dict) -> None:
    # the schema names draft 2019-09 by a URL jsonschema does not know
    jsonschema.Draft201909Validator(schema).validate(doc)


def test_compose_file_is_valid_against_the_compose_spec(compose_schema):
    doc = _compose()
    _validate_compose(doc, compose_schema)
    broken = yaml.safe_load(yaml.safe_dump(doc))
    broken["services"]["scheduler"]["healthcheck"]["intervall"] = "10s"
    with pytest.raises(jsonschema.ValidationError, match="intervall"):
        _validate_compose(broken, compose_schema)


def test_compose_health_checks_dependencies_and_the_same_job():
    services = _compose()["services"]
    assert {"scheduler", "worker", "job"} <= set(services)
    for name in ("scheduler", "worker"):
        service = services[name]
        port = next(a for a in service["command"] if a.startswith(":")).lstrip(":")
        assert f"localhost:{port}/health" in " ".join(service["healthcheck"]["test"]), name
    assert services["scheduler"]["command"][:2] == ["dask", "scheduler"]
    assert services["worker"]["command"][:3] == ["dask", "worker", "tcp://scheduler:8786"]
    assert services["worker"]["depends_on"]["scheduler"]["condition"] == "service_healthy"
    job = services["job"]
    assert job["depends_on"]["worker"]["condition"] == "service_healthy"
    assert job["environment"]["DASK_SCHEDULER_ADDRESS"] == "tcp://scheduler:8786"
    assert job["command"] == _daskjob_args()  # the job the Kubernetes DaskJob runs


def test_compose_services_are_hardened_and_hold_no_credentials():
    for name, service in _compose()["services"].items():
        assert service["user"].split(":")[0] == "10001", name
        assert service["read_only"] is True and service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name
        for key, value in (service.get("environment") or {}).items():
            if any(s in key for s in ("SECRET", "KEY", "TOKEN", "PASSWORD")):
                assert re.fullmatch(r"\$\{\w+(:-)?\}", value), (name, key)


# -------------------------------------------------------------------------------- HPC
@pytest.mark.cluster
def test_slurm_example_writes_a_scheduler_file_clients_join(tmp_path):
    from distributed import Client

    example = _load_module(os.path.join(DEPLOY, "hpc", "slurm_cluster.py"), "slurm_cluster")
    scheduler_file = tmp_path / "shared" / "scheduler.json"
    cluster = example.make_cluster(str(scheduler_file), cores=2, memory="4GiB", processes=1,
                                   queue="debug")
    try:
        script = cluster.job_script()
        assert "#SBATCH -p debug" in script and "#SBATCH --mem=4G" in script
        worker_cmd = next(line for line in script.splitlines() if "dask_worker" in line)
        assert cluster.scheduler_address in worker_cmd
        # the command SLURM would start on each node exists in this distributed
        module = shlex.split(worker_cmd)[2]
        assert importlib.util.find_spec(module) is not None, module
        info = json.loads(scheduler_file.read_text())
        assert info["address"] == cluster.scheduler_address
        with Client(scheduler_file=str(scheduler_file), timeout="10s") as client:
            assert client.scheduler.address == cluster.scheduler_address
    finally:
        cluster.close()


def test_nightly_sbatch_joins_through_the_scheduler_file():
    with open(os.path.join(DEPLOY, "hpc", "nightly.sbatch")) as fh:
        text = fh.read()
    assert re.search(r"dr-dask --scheduler-file \"\$SCHEDULER_FILE\"", text)
    assert "workflows/nightly-ikd.toml" in text
    bash = subprocess.run(["bash", "-n", os.path.join(DEPLOY, "hpc", "nightly.sbatch")],
                          capture_output=True, text=True, check=False)
    assert bash.returncode == 0, bash.stderr
