"""deploy/kubernetes/submit_daskjob.py, run as the CronJob runs it (a real process, its real
kr8s client, in-cluster credentials from a ServiceAccount directory), against a stand-in of the
Kubernetes API server on 127.0.0.1 that enforces rbac.yaml's Role (tests/kube_apiserver.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from conftest import tls_files
from kube_apiserver import KubeAPI, serve

ROOT = os.path.join(os.path.dirname(__file__), "..")
K8S = os.path.join(ROOT, "deploy", "kubernetes")
NAMESPACE, TOKEN = "dr-dask", "a-service-account-token"
GROUP = "kubernetes.dask.org"
POD, JOB_UID = "dr-dask-nightly-29412345-x7k2p", "3f6c2a9e-0000-4000-8000-000000000001"
IMAGE = "registry.example.com/platform/dr-dask@sha256:" + "ab" * 32


def _yaml(name: str) -> list[dict]:
    with open(os.path.join(K8S, name)) as fh:
        return [d for d in yaml.safe_load_all(fh) if d]


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return tls_files(tmp_path_factory.mktemp("kube-tls"))


@pytest.fixture(scope="module")
def daskjob_schema():
    import glob

    import dask_kubernetes
    import jsonschema

    (path,) = glob.glob(os.path.join(os.path.dirname(dask_kubernetes.__file__), "operator",
                                     "deployment", "helm", "dask-kubernetes-operator", "crds",
                                     "daskjob.yaml"))
    with open(path) as fh:
        crd = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(version["schema"]["openAPIV3Schema"]).validate


@pytest.fixture
def kube(tls, daskjob_schema, tmp_path):
    """The stand-in API server with rbac.yaml's Role, the submitter's own pod (owned by its
    Job), and the ServiceAccount directory a pod of the CronJob would see."""
    (role,) = [d for d in _yaml("rbac.yaml") if d["kind"] == "Role"]
    api = KubeAPI(role, NAMESPACE, TOKEN, validate=daskjob_schema, step=0.2)
    server, port = serve(api, tls["cert"], tls["key"])
    api.put("", "pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": POD, "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                          "name": "dr-dask-nightly-29412345", "uid": JOB_UID,
                                          "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"containers": [{"name": "submit", "image": IMAGE}]}})
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(TOKEN)
    (account / "namespace").write_text(NAMESPACE)
    (account / "ca.crt").write_text(open(tls["ca_file"]).read())
    api.env = {**os.environ, "KUBERNETES_SERVICE_HOST": "127.0.0.1",
               "KUBERNETES_SERVICE_PORT": str(port), "POD_NAME": POD,
               "KUBECONFIG": str(tmp_path / "no-kubeconfig")}
    api.env.pop("DR_DASK_NAMESPACE", None)
    api.account = str(account)
    yield api
    server.shutdown()


def _command(api: KubeAPI, cron: str = "cronjob-nightly.yaml", *extra: str) -> list[str]:
    """The CronJob's command line, with the ConfigMap's files at their place in the repository."""
    (doc,) = _yaml(cron)
    (container,) = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    args = [a.replace("/etc/dr-dask", K8S) for a in container["args"]]
    assert args[0] == "python"
    return [sys.executable, *args[1:], "--service-account", api.account, "--poll", "0.1",
            *extra]


def _managed(api: KubeAPI, name: str, status: str | None, created: str) -> None:
    api.put(GROUP, "daskjobs", {
        "apiVersion": f"{GROUP}/v1", "kind": "DaskJob",
        "metadata": {"name": name, "creationTimestamp": created, "labels": {
            "app.kubernetes.io/managed-by": "dr-dask-submitter",
            "dr-dask/template": "dr-dask-nightly"}},
        "spec": {}, "status": {"jobStatus": status} if status else {}})


@pytest.mark.parametrize("code", [0, 1, 2])
def test_nightly_submitter_creates_its_daskjob_in_its_namespace_and_passes_the_exit_code(
        kube, code):
    kube.exit_code = code
    # what earlier nights left: four finished jobs, an orphan of a killed submitter, and a job
    # someone created by hand (not the submitter's: left alone)
    for day, status in [(1, "Successful"), (2, "Failed"), (3, "Successful"), (4, "Successful"),
                        (5, "Running")]:
        _managed(kube, f"dr-dask-nightly-2026110{day}-020000", status,
                 f"2026-11-0{day}T02:00:00Z")
    kube.put(GROUP, "daskjobs", {"apiVersion": f"{GROUP}/v1", "kind": "DaskJob",
                                 "metadata": {"name": "by-hand"}, "spec": {}})
    proc = subprocess.run(_command(kube), env=kube.env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == code, proc.stderr
    # everything happened in the ServiceAccount's namespace, and nothing was refused
    assert {r[3] for r in kube.requests} == {NAMESPACE}
    assert all(r[5] < 400 or (r[0], r[5]) == ("delete", 404) for r in kube.requests), (
        kube.requests)
    created = [r[4] for r in kube.requests if r[0] == "create"]
    (name,) = [n for n in kube.names(GROUP, "daskjobs") if n.startswith("dr-dask-nightly-2026")
               and n not in {f"dr-dask-nightly-2026110{d}-020000" for d in range(1, 6)}]
    assert created == [None] and name.startswith("dr-dask-nightly-")
    job = kube.get(GROUP, "daskjobs", name)
    # the image of the submitter's own pod, everywhere; the Job owns it
    images = {c["image"] for spec in (job["spec"]["job"]["spec"],
                                      job["spec"]["cluster"]["spec"]["scheduler"]["spec"],
                                      job["spec"]["cluster"]["spec"]["worker"]["spec"])
              for c in spec["containers"]}
    assert images == {IMAGE}
    assert job["metadata"]["ownerReferences"] == [{
        "apiVersion": "batch/v1", "kind": "Job", "name": "dr-dask-nightly-29412345",
        "uid": JOB_UID}]
    assert job["spec"]["job"]["spec"]["containers"][0]["args"] == [
        "dr-dask", "run", "nightly-gp-isomap"]
    # the orphan and the oldest finished job are gone; the newest three and the manual one stay
    assert kube.names(GROUP, "daskjobs") == sorted(
        ["by-hand", name] + [f"dr-dask-nightly-2026110{d}-020000" for d in (2, 3, 4)])
    # the exit code was read from the runner pod by name (get), never by listing pods
    pod_verbs = {r[0] for r in kube.requests if r[2] == "pods"}
    assert pod_verbs == {"get"}
    assert f"daskjob {name}: " + ("Successful" if code == 0 else "Failed") in proc.stderr


def test_weekly_submitter_runs_the_refit(kube):
    proc = subprocess.run(_command(kube, "cronjob-weekly.yaml"), env=kube.env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    (name,) = kube.names(GROUP, "daskjobs")
    assert name.startswith("dr-dask-weekly-")
    job = kube.get(GROUP, "daskjobs", name)
    assert job["spec"]["job"]["spec"]["containers"][0]["args"] == [
        "dr-dask", "run", "weekly-refit"]


def _wait_for(predicate, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_sigterm_deletes_the_daskjob_and_its_runner(kube):
    kube.exit_code = None  # the job runs until it is stopped
    proc = subprocess.Popen(_command(kube), env=kube.env, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: any(
            (j.get("status") or {}).get("jobStatus") == "Running"
            for j in (kube.get(GROUP, "daskjobs", n) or {} for n in kube.names(GROUP, "daskjobs"))))
        (name,) = kube.names(GROUP, "daskjobs")
        assert kube.get("", "pods", f"{name}-runner") is not None
        proc.send_signal(signal.SIGTERM)  # what the kubelet sends at activeDeadlineSeconds
        assert proc.wait(timeout=60) == 1
    finally:
        proc.kill()
        stderr = proc.stderr.read()
    assert kube.names(GROUP, "daskjobs") == [], stderr
    assert kube.get("", "pods", f"{name}-runner") is None  # collected with its DaskJob
    assert "terminated: deleting daskjob" in stderr


def test_deadline_deletes_the_daskjob(kube):
    kube.exit_code = None
    start = time.monotonic()
    proc = subprocess.run(_command(kube, "cronjob-nightly.yaml", "--deadline", "2"),
                          env=kube.env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 1, proc.stderr
    assert "deadline reached: deleting daskjob" in proc.stderr
    assert kube.names(GROUP, "daskjobs") == []
    assert time.monotonic() - start < 60


def test_a_role_without_the_grants_it_needs_is_exit_2(kube):
    """The stand-in enforces the Role: without `get` on pods (how the runner's exit code is
    read) the submitter cannot do its job, and says so with exit 2 (fix RBAC, do not retry)."""
    kube.rules[("", "pods")] = set()
    proc = subprocess.run(_command(kube), env=kube.env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "403" in proc.stderr and 'cannot get resource "pods"' in proc.stderr
    assert kube.names(GROUP, "daskjobs") == []


def test_another_namespace_is_refused(kube):
    """An explicit namespace other than the RoleBinding's is a 403 (exit 2): the submitter
    does not fall back to `default`, and the stand-in does not serve other namespaces."""
    proc = subprocess.run(_command(kube, "cronjob-nightly.yaml", "--namespace", "default"),
                          env=kube.env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 2, proc.stderr
    assert {r[3] for r in kube.requests} == {"default"}
    assert all(r[5] == 403 for r in kube.requests)
