"""deploy/kubernetes/submit_daskjob.py, run as the CronJob runs it (a real process, its real
kr8s client, in-cluster credentials from a ServiceAccount directory), against a stand-in of the
Kubernetes API server on 127.0.0.1 that enforces rbac.yaml's Role (tests/kube_apiserver.py)."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import yaml
from conftest import tls_files
from kube_apiserver import KubeAPI, serve
from test_deploy import _submitter

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
    (account / "ca.crt").write_text(pathlib.Path(tls["ca_file"]).read_text())
    api.env = {**os.environ, "KUBERNETES_SERVICE_HOST": "127.0.0.1",
               "KUBERNETES_SERVICE_PORT": str(port), "POD_NAME": POD,
               "KUBECONFIG": str(tmp_path / "no-kubeconfig")}
    api.env.pop("DR_DASK_NAMESPACE", None)
    api.account = str(account)
    yield api
    api.closed = True  # open watches end
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
    # its own pod read by name; the job's pods listed by the operator's label; events listed;
    # no subresource (logs, exec) asked for
    assert {(r[0], r[2]) for r in kube.requests if r[1] == ""} == {
        ("get", "pods"), ("list", "pods"), ("watch", "pods"), ("list", "events")}
    assert f"daskjob {name}: " + ("Successful" if code == 0 else "Failed") in proc.stderr


def test_a_tag_runs_at_the_digest_the_submitters_pod_runs(kube):
    """kustomize pinned a tag: every pod of the run runs the bytes the submitter's pod pulled
    (its status's imageID), not whatever the tag names when the workers start."""
    pod = kube.get("", "pods", POD)
    digest = "sha256:" + "cd" * 32
    pod["spec"]["containers"][0]["image"] = "registry.example.com:5000/platform/dr-dask:0.1.0"
    pod["status"] = {"containerStatuses": [{
        "name": "submit", "imageID": f"registry.example.com:5000/platform/dr-dask@{digest}"}]}
    proc = subprocess.run(_command(kube), env=kube.env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    (name,) = kube.names(GROUP, "daskjobs")
    job = kube.get(GROUP, "daskjobs", name)
    images = {c["image"] for spec in (job["spec"]["job"]["spec"],
                                      job["spec"]["cluster"]["spec"]["scheduler"]["spec"],
                                      job["spec"]["cluster"]["spec"]["worker"]["spec"])
              for c in spec["containers"]}
    assert images == {f"registry.example.com:5000/platform/dr-dask@{digest}"}


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


# ------------------------------------------------------------------ what goes wrong
def _run(api: KubeAPI, *extra: str, manifest: str | None = None) -> subprocess.CompletedProcess:
    command = _command(api, "cronjob-nightly.yaml", *extra)
    if manifest is not None:
        command[command.index(os.path.join(K8S, "daskjob-nightly.yaml"))] = manifest
    return subprocess.run(command, env=api.env, capture_output=True, text=True, timeout=120,
                          check=False)


def _last_line(proc: subprocess.CompletedProcess) -> str:
    """The submitter's verdict: its last line, one line, no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), proc.stderr
    return last


def test_subresources_need_a_rule_of_their_own(kube):
    """RBAC treats pods/log, pods/exec and pods/status as resources of their own: the Role's
    rule for pods grants none of them."""
    import ssl

    import httpx

    port = kube.env["KUBERNETES_SERVICE_PORT"]
    base = f"https://127.0.0.1:{port}/api/v1/namespaces/{NAMESPACE}/pods/{POD}"
    with httpx.Client(verify=ssl.create_default_context(
            cafile=os.path.join(kube.account, "ca.crt")),
                      headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        assert client.get(base).status_code == 200
        for method, sub in [("GET", "log"), ("GET", "status"), ("POST", "exec")]:
            answer = client.request(method, f"{base}/{sub}")
            assert answer.status_code == 403, (sub, answer.text)
            assert f'resource "pods/{sub}"' in answer.json()["message"]
        kube.rules[("", "pods/log")] = {"get"}
        answer = client.get(f"{base}/log")
        assert answer.status_code == 200 and answer.text == "the container's log\n"
        assert client.get(f"{base}/status").status_code == 403  # still not granted


@pytest.mark.parametrize(("fault", "code", "expected"), [
    # from the kubelet's event: the pod's status says only "Back-off pulling image"
    ("image-missing", 2, ["pod dr-dask-nightly-", "-runner container job cannot be pulled "
                          f'(Failed): Failed to pull image "{IMAGE}": ', ": not found",
                          "kustomization.yaml's images:"]),
    ("oom", 2, ["job runner pod dr-dask-nightly-", "container job was killed at its memory "
                "limit 4Gi (OOMKilled, exit 137): raise spec.job.spec.containers[job]"
                ".resources.limits.memory (and requests) in daskjob-nightly.yaml"]),
    ("preempted", 1, ["job runner pod dr-dask-nightly-", "was stopped by Kubernetes "
                      "(PreemptionByScheduler): Kubernetes Scheduler preempted this pod"]),
    ("evicted", 1, ["was stopped by Kubernetes (Evicted): The node was low on resource: "
                    "memory"]),
    ("evicted-disk", 2, ["(Evicted): Pod ephemeral local storage usage exceeds the total limit "
                         "of containers 3Gi; raise spec.job.spec.containers[*].resources"
                         ".limits.ephemeral-storage and the sizeLimit of its emptyDir volumes "
                         "in daskjob-nightly.yaml"]),
])
def test_a_failure_of_the_pods_is_named_with_its_exit_class(kube, fault, code, expected):
    """A configuration error ends the watch at once with exit 2, even with a long --wait (a
    runner evicted past its own disk limit is one); a runner preempted or evicted for the
    node's sake with exit 1 (the CronJob retries)."""
    kube.exit_code, kube.fault = 1, fault
    start = time.monotonic()
    proc = _run(kube, "--wait", "600")
    assert proc.returncode == code, proc.stderr
    last = _last_line(proc)
    for part in expected:
        assert part in last, (part, last)
    assert time.monotonic() - start < 60  # not the --wait
    if fault == "image-missing":  # the stuck job is deleted: its cluster would hold nodes
        assert kube.names(GROUP, "daskjobs") == [], proc.stderr
    else:  # the runner ended: its job and pod (its log) are kept for inspection
        (name,) = kube.names(GROUP, "daskjobs")
        assert kube.get("", "pods", f"{name}-runner") is not None


@pytest.mark.parametrize(("fault", "expected"), [
    ("unschedulable", "cannot be scheduled: 0/3 nodes are available: 3 Insufficient memory"),
    ("image-slow", "cannot be pulled (ImagePullBackOff): Back-off pulling image"),
    ("no-operator", "has no status: the Dask operator has not acted on it"),
])
def test_a_capacity_problem_is_reported_at_once_and_exits_1_after_the_wait(kube, fault,
                                                                            expected):
    kube.exit_code, kube.fault = None, fault
    proc = _run(kube, "--wait", "1")
    assert proc.returncode == 1, proc.stderr
    last = _last_line(proc)
    assert expected in last and last.endswith("(for 1 s)"), last
    lines = proc.stderr.splitlines()
    first = next(i for i, line in enumerate(lines) if expected in line)
    assert not lines[first].startswith("error: ")  # said as it appeared, before giving up
    assert kube.names(GROUP, "daskjobs") == []


def _oom_exit_2(kube) -> str:
    """Run the submitter: exit 2, its last line naming the killed worker and the memory to
    raise. Returns that line."""
    proc = _run(kube)
    assert proc.returncode == 2, proc.stderr
    last = _last_line(proc)
    assert "worker pod dr-dask-nightly-" in last and "memory limit 8Gi (OOMKilled" in last
    assert "spec.cluster.spec.worker.spec.containers[worker].resources.limits.memory" in last
    return last


def test_a_worker_killed_at_its_memory_limit_makes_the_failed_job_exit_2(kube):
    """The operator deletes the workers when the job fails: the kill is seen while it runs,
    and the job's exit 1 becomes 2 (a retry at the same memory fails the same way)."""
    kube.exit_code, kube.fault = 1, "worker-oom"
    last = _oom_exit_2(kube)
    assert "--memory-limit" in last


def test_a_worker_killed_just_before_the_job_fails_is_remembered(kube):
    """The worker's kill, the workflow's exit 1 and the operator's deletion of the cluster in
    one step of the stand-in: no poll ever sees the kill (with polls alone, exit 1 and a retry
    at the same memory); the watch of the pods does: exit 2 naming the memory to raise."""
    kube.exit_code, kube.fault = 1, "worker-oom-at-end"
    last = _oom_exit_2(kube)
    (name,) = kube.names(GROUP, "daskjobs")
    assert f"kubectl logs -n {NAMESPACE} {name}-runner" in last
    # the pods were gone at every poll: only the watch could have seen the kill
    assert not any(n.startswith(f"{name}-default-worker") for n in kube.names("", "pods"))
    assert ("watch", "", "pods", NAMESPACE, None, 200) in kube.requests


@pytest.mark.parametrize("code", [1, 2])
def test_a_failed_workflow_points_to_its_log(kube, code):
    kube.exit_code = code
    proc = _run(kube)
    assert proc.returncode == code, proc.stderr
    last = _last_line(proc)
    (name,) = kube.names(GROUP, "daskjobs")
    assert f"container job exited {code}" in last
    assert f"kubectl logs -n {NAMESPACE} {name}-runner" in last
    assert kube.get("", "pods", f"{name}-runner") is not None  # the log it points to is kept


def test_a_403_while_watching_deletes_the_job(kube):
    """RBAC that lets the job be created but not its events be read: exit 2 (fix the Role),
    and the DaskJob is deleted (its cluster would otherwise run unwatched)."""
    kube.exit_code = None  # runs until stopped
    kube.rules[("", "events")] = set()
    proc = _run(kube)
    assert proc.returncode == 2, proc.stderr
    last = _last_line(proc)
    assert "403" in last and 'cannot list resource "events"' in last
    assert len([r for r in kube.requests if r[:3] == ("delete", GROUP, "daskjobs")
                and r[5] == 200]) == 1
    assert kube.names(GROUP, "daskjobs") == [], proc.stderr
    assert "deleting daskjob" in proc.stderr


def test_the_operator_not_installed_is_exit_2_naming_it(kube):
    kube.crds = False
    proc = _run(kube)
    assert proc.returncode == 2, proc.stderr
    last = _last_line(proc)
    assert "Dask Kubernetes operator is not installed" in last
    assert "dask-kubernetes-operator" in last and "404" in last


def test_an_invalid_daskjob_is_exit_2(kube, tmp_path):
    (template,) = _yaml("daskjob-nightly.yaml")
    template["spec"]["cluster"]["spec"]["worker"]["replicas"] = "two"
    manifest = tmp_path / "daskjob-nightly.yaml"
    manifest.write_text(yaml.safe_dump(template))
    proc = _run(kube, manifest=str(manifest))
    assert proc.returncode == 2, proc.stderr
    last = _last_line(proc)
    assert "(422)" in last and "spec.cluster.spec.worker.replicas" in last
    assert "'two' is not of type 'integer'" in last


#: kr8s answers a 403 by reading the token again and repeating the request, three times
KR8S_TRIES = 4


@pytest.mark.parametrize(("calls", "limited", "code"), [(2, 2, 0), (1000, 2, 1), (1, 0, 2)])
def test_a_quota_is_retried_with_backoff_for_the_wait(kube, calls, limited, code):
    """Refused twice, then created (exit 0); refused for longer than --wait (exit 1); a quota
    smaller than one job (exit 2, no retry)."""
    kube.quota = calls * KR8S_TRIES
    kube.quota_message = kube.quota_message.replace("limited: count/daskjobs.kubernetes.dask"
                                                    ".org=2", f"limited: count/daskjobs"
                                                    f".kubernetes.dask.org={limited}")
    proc = _run(kube, "--wait", "1")
    assert proc.returncode == code, proc.stderr
    creates = [r for r in kube.requests if r[0] == "create"]
    if code == 0:
        assert [r[5] for r in creates] == [403] * 2 * KR8S_TRIES + [201], proc.stderr
        refused = [line for line in proc.stderr.splitlines() if "exceeded quota" in line]
        assert [line.rsplit(" ", 2)[-2] for line in refused] == ["0.1", "0.2"], refused
    elif code == 1:
        assert "quota still exceeded after" in _last_line(proc)
        # backoff 0.1, 0.2, 0.4 s: four calls within the second, not a spin
        assert 3 * KR8S_TRIES <= len(creates) <= 5 * KR8S_TRIES, proc.stderr
    else:
        assert len(creates) == KR8S_TRIES and "smaller than one job" in _last_line(proc)


def test_an_image_is_pinned_only_to_a_digest_it_was_pulled_at():
    pinned = _submitter().pinned
    digest = "sha256:" + "cd" * 32
    assert pinned("dr-dask:0.1.0", f"docker-pullable://dr-dask@{digest}") == f"dr-dask@{digest}"
    assert pinned("host:5000/dr-dask", f"host:5000/dr-dask@{digest}") == (
        f"host:5000/dr-dask@{digest}")
    assert pinned(IMAGE, f"other@{digest}") == IMAGE  # already pinned
    assert pinned("dr-dask:0.1.0", digest) == "dr-dask:0.1.0"  # loaded into the node, not pulled
    assert pinned("dr-dask:0.1.0", None) == "dr-dask:0.1.0"


def test_warning_events_about_the_jobs_objects_are_classed():
    """Events name what the pods' status cannot: a quota refusing the operator's worker pods
    (transient, unless the quota is smaller than one pod), anything else reported only."""
    submit = _submitter()
    job = "dr-dask-nightly-20261123-020007"

    def event(name, reason, message, type_="Warning"):
        return {"involvedObject": {"kind": "ReplicaSet", "name": name}, "type": type_,
                "reason": reason, "message": message}

    quota = ('pods "{0}-default-worker-1-x" is forbidden: exceeded quota: compute, requested: '
             "limits.memory=8Gi, used: limits.memory=60Gi, limited: limits.memory={1}")
    found = submit.diagnose([], [
        event(f"{job}-default-worker-1", "FailedCreate", quota.format(job, "64Gi")),
        event(f"{job}-scheduler-2", "FailedCreate", quota.format(job, "4Gi")),
        event(f"{job}-default-worker-1", "FailedMount", "MountVolume.SetUp failed"),
        event(f"{job}-default-worker-1", "Scheduled", "assigned", type_="Normal"),
        event("dr-dask-nightly-20261122-020007-runner", "FailedCreate", quota.format(job, "1")),
    ], job, "daskjob-nightly.yaml")
    assert {k: (p.code, p.lasting) for k, p in found.items()} == {
        f"{job}-default-worker-1/quota": (1, True),
        f"{job}-scheduler-2/quota": (2, False),
        f"{job}-default-worker-1/event/FailedMount": (None, False)}
    assert "raise it or lower the request" in found[f"{job}-scheduler-2/quota"].message


def test_a_worker_that_cannot_start_while_others_run_only_slows_the_job():
    """Without room for one more worker the job goes on with those it has: reported, never
    the end of the run; with no worker running at all it is a capacity problem (exit 1 after
    --wait)."""
    submit = _submitter()
    job = "dr-dask-nightly-20261123-020007"

    def worker(name, phase):
        status = {"phase": phase}
        if phase == "Pending":
            status["conditions"] = [{"type": "PodScheduled", "status": "False",
                                     "reason": "Unschedulable", "message": "Insufficient cpu"}]
        return {"metadata": {"name": f"{job}-default-worker-{name}", "labels": {
            "dask.org/component": "worker", "dask.org/cluster-name": job}}, "status": status}

    stuck = f"{job}-default-worker-b/unschedulable"
    alone = submit.diagnose([worker("b", "Pending")], [], job, "daskjob-nightly.yaml")
    assert (alone[stuck].code, alone[stuck].lasting) == (1, True)
    found = submit.diagnose([worker("a", "Running"), worker("b", "Pending")], [], job,
                            "daskjob-nightly.yaml")
    assert (found[stuck].code, found[stuck].lasting) == (None, False)
    assert found[stuck].message.endswith("(the job goes on with the workers it has)")


@pytest.mark.parametrize(("status", "code", "words"), [
    ({"phase": "Pending", "containerStatuses": [{"name": "job", "state": {"waiting": {
        "reason": "CreateContainerConfigError",
        "message": 'secret "dr-dask-object-store" not found'}}}]},
     2, "container job: CreateContainerConfigError: secret"),
    ({"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": '0/3 nodes are available: persistentvolumeclaim "dr-dask-data" not found.'}]},
     2, 'cannot be scheduled: 0/3 nodes are available: persistentvolumeclaim "dr-dask-data"'),
    ({"phase": "Running", "containerStatuses": [{
        "name": "job", "restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]},
     None, "keeps exiting (CrashLoopBackOff, 4 restarts; last exit 1, Error)"),
])
def test_what_only_a_change_can_fix_is_told_from_what_may_pass(status, code, words):
    """A missing Secret or volume claim is exit 2 at once; a restarting container is
    reported."""
    pod = {"metadata": {"name": "p", "labels": {"dask.org/component": "job-runner"}},
           "spec": {"containers": [{"name": "job"}]}, "status": status}
    (problem,) = _submitter().pod_problems(pod, "daskjob-nightly.yaml")
    assert (problem.code, problem.lasting) == (code, False) and words in problem.message
