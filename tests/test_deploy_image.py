"""deploy/: the image (pinned from this environment, non-root, dask entrypoints), the compose
file (against the compose-spec JSON schema; Docker cannot run on the test machines), and the
SLURM example (a real dask-jobqueue cluster that clients join through its scheduler file)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import signal
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


def _daskjob_container(job: str) -> dict:
    with open(os.path.join(DEPLOY, "kubernetes", f"daskjob-{job}.yaml")) as fh:
        return yaml.safe_load(fh)["spec"]["job"]["spec"]["containers"][0]


# ------------------------------------------------------------------------------ the image
def test_constraints_pin_the_tested_environment():
    make = _load_module(os.path.join(DEPLOY, "make_constraints.py"), "make_constraints")
    with open(os.path.join(DEPLOY, "constraints.txt")) as fh:
        current = fh.read()
    assert current == make.render(make.pins()), (
        "deploy/constraints.txt is stale: run `python deploy/make_constraints.py`")
    for name in ("dask", "distributed", "zarr", "numpy", "numba", "kr8s"):
        assert re.search(rf"^{name}==\d", current, re.MULTILINE), name


def _stages() -> dict[str, list[tuple[str, str]]]:
    """The Dockerfile's instructions by stage (FROM ... AS NAME)."""
    stages: dict[str, list[tuple[str, str]]] = {}
    for op, args in _dockerfile():
        if op == "FROM":
            name = args.split()[-1]
            stages[name] = [(op, args)]
        else:
            stages[name].append((op, args))
    return stages


def test_dockerfile_installs_pinned_as_non_root_with_dask_entrypoints():
    make = _load_module(os.path.join(DEPLOY, "make_constraints.py"), "make_constraints")
    stages = _stages()
    assert list(stages) == ["base", "prefect", "dask"]  # the last one is the default target
    base = stages["base"][0][1].split()[0]
    # the tested Python, at a pinned patch version
    assert re.fullmatch(rf"python:{sys.version_info.major}\.{sys.version_info.minor}\.\d+-slim-\w+",
                        base), base
    for name, constraints, extras in [("dask", "constraints.txt", make.IMAGE_EXTRAS),
                                      ("prefect", "constraints-prefect.txt",
                                       make.PREFECT_EXTRAS)]:
        steps = stages[name]
        assert steps[0][1] == "base AS " + name
        (install,) = [args for op, args in steps if op == "RUN" and "pip install" in args]
        assert f"-c {constraints}" in install and f'".[{",".join(extras)}]"' in install
        assert make.FILES[constraints] == (make.EXTRAS if name == "dask" else extras)
        (user,) = [args for op, args in steps if op == "USER"]
        assert user.split(":")[0] == "10001"  # the runAsUser of deploy/kubernetes
    assert "dashboard" in make.IMAGE_EXTRAS  # bokeh: the dashboard on 8787 is served
    assert "kubernetes" not in make.PREFECT_EXTRAS  # kr8s's pins conflict with prefect's
    (cmd,) = [json.loads(args) for op, args in stages["dask"] if op == "CMD"]
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


def test_compose_health_checks_dependencies_and_the_same_jobs():
    services = _compose()["services"]
    assert {"scheduler", "worker", "nightly", "weekly"} == set(services)
    for name in ("scheduler", "worker"):
        service = services[name]
        port = next(a for a in service["command"] if a.startswith(":")).lstrip(":")
        assert f"localhost:{port}/health" in " ".join(service["healthcheck"]["test"]), name
    assert services["scheduler"]["command"][:2] == ["dask", "scheduler"]
    assert services["worker"]["command"][:3] == ["dask", "worker", "tcp://scheduler:8786"]
    assert services["worker"]["depends_on"]["scheduler"]["condition"] == "service_healthy"
    for name in ("nightly", "weekly"):  # the jobs the Kubernetes DaskJobs run, with their params
        job, pod = services[name], _daskjob_container(name)
        assert job["depends_on"]["worker"]["condition"] == "service_healthy"
        assert job["environment"]["DASK_SCHEDULER_ADDRESS"] == "tcp://scheduler:8786"
        assert job["command"] == pod["args"]
        params = {k: v for k, v in job["environment"].items() if k.startswith("DR_DASK_PARAM_")}
        assert params == {e["name"]: e["value"] for e in pod["env"]
                          if e["name"].startswith("DR_DASK_PARAM_")}


def test_compose_publishes_on_loopback_and_spills_to_disk():
    services = _compose()["services"]
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
    worker = services["worker"]
    spill = worker["command"][worker["command"].index("--local-directory") + 1]
    mounts = [v for v in worker["volumes"] if isinstance(v, dict)]
    assert [m["type"] for m in mounts if m["target"] == spill] == ["volume"]  # not a tmpfs
    assert not any(spill.startswith(t) for t in worker.get("tmpfs", []))


def test_the_image_owns_the_workers_spill_directory_to_its_user():
    """Docker creates a volume's missing mount point owned by root (a worker running as 10001
    then fails with PermissionError spilling) and copies an existing one's owner: the image
    makes the compose workers' --local-directory, owned by the user every service runs as."""
    worker = _compose()["services"]["worker"]
    spill = worker["command"][worker["command"].index("--local-directory") + 1]
    user = worker["user"]
    stages = _stages()
    made = chowned = False
    for op, args in stages["base"] + stages["dask"][1:]:  # the compose image: dask, from base
        if op != "RUN":
            continue
        for step in re.split(r"\s*&&\s*", args):
            words = shlex.split(step)
            if words[:1] == ["mkdir"] and spill in words:
                made = True
            if words[:1] == ["chown"] and spill in words:
                owner = next(w for w in words[1:] if not w.startswith("-"))
                chowned = made and owner == user
    assert made, f"the image does not create {spill}"
    assert chowned, f"{spill} is not owned by {user}"
    (image_user,) = [args for op, args in stages["dask"] if op == "USER"]
    assert image_user == user


def test_dockerignore_sends_only_what_the_image_needs():
    with open(os.path.join(ROOT, ".dockerignore")) as fh:
        rules = [line.strip() for line in fh if line.strip() and not line.startswith("#")]
    assert rules[0] == "*"  # everything is excluded, then the image's inputs are let back in
    copied = {args.split()[0] for op, args in _dockerfile() if op == "COPY"}
    copied = {c for path in copied for c in path.split() if not c.startswith("--")}
    for path in copied:
        assert f"!{path.rstrip('/')}" in [r.rstrip("/") for r in rules], path


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
                                   queue="debug", walltime="01:00:00", interface="lo")
    try:
        script = cluster.job_script()
        assert "#SBATCH -p debug" in script and "#SBATCH --mem=4G" in script
        assert "#SBATCH -t 01:00:00" in script
        worker_cmd = next(line for line in script.splitlines() if "dask_worker" in line)
        assert cluster.scheduler_address in worker_cmd
        # the worker retires before SLURM's wall time kills it, staggered
        args = shlex.split(worker_cmd)
        life = int(args[args.index("--lifetime") + 1].rstrip("s"))
        stagger = int(args[args.index("--lifetime-stagger") + 1].rstrip("s"))
        assert stagger > 0 and life + stagger < 3600, (life, stagger)
        assert args[args.index("--interface") + 1] == "lo"
        # the local directory, as the node's shell expands it: $TMPDIR, else /tmp
        for tmpdir, expected in [(None, "/tmp"), ("/local/job42", "/local/job42")]:
            env = {k: v for k, v in os.environ.items() if k != "TMPDIR"}
            env.update({"TMPDIR": tmpdir} if tmpdir else {})
            words = subprocess.run(["bash", "-c", f"printf '%s\\n' {worker_cmd}"], env=env,
                                   capture_output=True, text=True, check=True).stdout.split("\n")
            assert words[words.index("--local-directory") + 1] == expected, worker_cmd
        # the command SLURM would start on each node exists in this distributed
        module = shlex.split(worker_cmd)[2]
        assert importlib.util.find_spec(module) is not None, module
        info = json.loads(scheduler_file.read_text())
        assert info["address"] == cluster.scheduler_address
        with Client(scheduler_file=str(scheduler_file), timeout="10s") as client:
            assert client.scheduler.address == cluster.scheduler_address
    finally:
        cluster.close()


@pytest.mark.parametrize(("walltime", "seconds"), [
    ("04:00:00", 4 * 3600), ("1-01:00:00", 25 * 3600), ("30", 1800), ("45:30", 2730),
    ("2-12", 60 * 3600), ("1-06:30", 30 * 3600 + 1800)])
def test_slurm_workers_retire_before_their_wall_time(walltime, seconds):
    example = _load_module(os.path.join(DEPLOY, "hpc", "slurm_cluster.py"), "slurm_cluster")
    assert example.walltime_seconds(walltime) == seconds
    life, stagger = example.lifetime(walltime)
    margin = seconds - (life + stagger)  # the latest a worker retires, before SLURM's kill
    assert stagger > 0 and min(seconds / 10, 600) <= margin < seconds / 5, (life, stagger)


@pytest.mark.cluster
def test_slurm_cluster_options_reach_the_workers(tmp_path):
    """The command's --local-directory, --interface and --walltime, in the worker script it
    prints (its scheduler starts on the loopback interface, and stops)."""
    out = subprocess.run(
        [sys.executable, os.path.join(DEPLOY, "hpc", "slurm_cluster.py"), "--scheduler-file",
         str(tmp_path / "scheduler.json"), "--print-job-script", "--interface", "lo",
         "--local-directory", "/local/$USER/dask", "--walltime", "2-00:00:00"],
        capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    worker_cmd = next(line for line in out.stdout.splitlines() if "dask_worker" in line)
    args = shlex.split(worker_cmd)
    assert args[args.index("--local-directory") + 1] == "/local/$USER/dask"
    assert args[args.index("--interface") + 1] == "lo"
    assert args[args.index("--lifetime") + 1] == f"{48 * 3600 - 900}s"
    assert args[args.index("--lifetime-stagger") + 1] == "300s"


@pytest.mark.parametrize(("job", "workflow"), [("nightly", "nightly-gp-isomap"),
                                           ("weekly", "weekly-refit")])
def test_sbatch_joins_through_the_scheduler_file(job, workflow):
    path = os.path.join(DEPLOY, "hpc", f"{job}.sbatch")
    with open(path) as fh:
        text = fh.read()
    assert re.search(rf"dr-dask --scheduler-file \"\$SCHEDULER_FILE\" run {workflow}$", text,
                     re.MULTILINE)
    bash = subprocess.run(["bash", "-n", path], capture_output=True, text=True, check=False)
    assert bash.returncode == 0, bash.stderr
    # the parameters it exports are the workflow's
    from dr_dask.jobs.workflow import load

    params = re.findall(r"^export DR_DASK_PARAM_(\w+)=", text, re.MULTILINE)
    assert params and {p.lower() for p in params} <= set(load(workflow).params)


@pytest.mark.cluster
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_slurm_cluster_closes_and_removes_its_scheduler_file_on_a_signal(tmp_path, sig):
    """scancel sends SIGTERM (Ctrl-C SIGINT): the scheduler closes and its file goes, so the
    next job cannot join a dead scheduler."""
    import socket
    import time

    scheduler_file = tmp_path / "scheduler.json"
    proc = subprocess.Popen([sys.executable, os.path.join(DEPLOY, "hpc", "slurm_cluster.py"),
                             "--scheduler-file", str(scheduler_file), "--queue", "debug",
                             "--max-jobs", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        end = time.monotonic() + 120
        while not (scheduler_file.exists() and scheduler_file.read_text()):
            assert proc.poll() is None and time.monotonic() < end, proc.communicate()
            time.sleep(0.1)
        address = json.loads(scheduler_file.read_text())["address"]
        host, port = address.rsplit("/", 1)[-1].rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=5).close()  # it is serving
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert f"{sig.name}: closing the cluster" in err
    assert not scheduler_file.exists()
    with pytest.raises(ConnectionRefusedError):  # nothing listens there any more
        socket.create_connection((host, int(port)), timeout=5).close()


def test_the_package_build_ships_the_workflows(tmp_path):
    """`dr-dask run nightly-gp-isomap` from an installed wheel or image: setuptools' build of
    the package (what a wheel holds) contains the workflow files, found by their names."""
    build = subprocess.run(
        [sys.executable, "-c", "import setuptools; setuptools.setup()", "-q",
         "egg_info", "--egg-base", str(tmp_path), "build_py", "--build-lib", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stderr
    found = subprocess.run(
        [sys.executable, "-c",
         "from dr_dask.jobs.workflow import shipped; print(sorted(shipped()))"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True,
        text=True, timeout=300, check=False)
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == ["['demo-ikd',", "'nightly-gp-isomap',", "'weekly-refit']"]
    assert (tmp_path / "dr_dask" / "workflows" / "nightly-gp-isomap.toml").is_file()
