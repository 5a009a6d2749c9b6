"""deploy/: Kubernetes manifests validated against the real schemas, the nightly job's command,
and the pod security every manifest must keep.

Core kinds are validated with ``kubernetes-validate`` (the Kubernetes OpenAPI schemas, strict:
unknown fields are errors); the Dask operator's kinds against the CRDs shipped inside the
``dask-kubernetes`` package, and the pod specs nested in them again as strict core PodSpecs.
"""

from __future__ import annotations

import copy
import glob
import os
import shlex

import jsonschema
import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from dr_dask.cli import main
from dr_dask.jobs.workflow import shipped

ROOT = os.path.join(os.path.dirname(__file__), "..")
K8S = os.path.join(ROOT, "deploy", "kubernetes")
#: The oldest Kubernetes we support (deploy/README.md: CronJob timeZone is GA from 1.27, Job
#: podFailurePolicy on by default from 1.26, the namespace name label from 1.22) and the newest.
K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
IMAGE = "dr-dask"  # the image name kustomization.yaml's images: pins


def _docs(path: str) -> list[dict]:
    # the CRDs are 9,000-line files: libyaml's loader when there is one
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path) as fh:
        return [d for d in yaml.load_all(fh, Loader=loader) if d]


def _manifests() -> list[tuple[str, dict]]:
    return [(os.path.basename(p), d) for p in sorted(glob.glob(os.path.join(K8S, "*.yaml")))
            if os.path.basename(p) != "kustomization.yaml" for d in _docs(p)]


MANIFESTS = _manifests()
BY_KIND = {}
for _name, _doc in MANIFESTS:
    BY_KIND.setdefault(_doc["kind"], []).append(_doc)


@pytest.fixture(scope="module")
def crd_schemas() -> dict[str, jsonschema.protocols.Validator]:
    """kind -> validator of the openAPIV3Schema of the Dask operator's CRDs (the installed
    package's); built once: jsonschema.validate would re-check the 9,000-line schema per call."""
    import dask_kubernetes

    pattern = os.path.join(os.path.dirname(dask_kubernetes.__file__), "operator", "deployment",
                           "helm", "dask-kubernetes-operator", "crds", "*.yaml")
    schemas = {}
    for path in glob.glob(pattern):
        crd = _docs(path)[0]
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        schema = version["schema"]["openAPIV3Schema"]
        schemas[crd["spec"]["names"]["kind"]] = jsonschema.Draft7Validator(schema)
    assert {"DaskCluster", "DaskJob", "DaskAutoscaler", "DaskWorkerGroup"} <= set(schemas)
    return schemas


def _pod_specs(doc: dict) -> list[tuple[str, dict]]:
    """Every PodSpec in a manifest, with where it is."""
    kind, spec = doc["kind"], doc.get("spec", {})
    if kind == "DaskCluster":
        return [("scheduler", spec["scheduler"]["spec"]), ("worker", spec["worker"]["spec"])]
    if kind == "DaskJob":
        cluster = spec["cluster"]["spec"]
        return [("job", spec["job"]["spec"]), ("scheduler", cluster["scheduler"]["spec"]),
                ("worker", cluster["worker"]["spec"])]
    if kind == "CronJob":
        return [("pod", spec["jobTemplate"]["spec"]["template"]["spec"])]
    return []


def test_kustomization_lists_every_manifest():
    kustomization = _docs(os.path.join(K8S, "kustomization.yaml"))[0]
    listed = set(kustomization["resources"])
    generated = {f for g in kustomization["configMapGenerator"] for f in g["files"]}
    on_disk = {os.path.basename(p) for p in glob.glob(os.path.join(K8S, "*"))} - {
        "kustomization.yaml"}
    assert listed | generated == on_disk and not listed & generated
    # the DaskJob is a template for the CronJob, never applied as a resource (it would run)
    assert all(d["kind"] != "DaskJob" for f in listed for d in _docs(os.path.join(K8S, f)))


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(("name", "doc"), [(n, d) for n, d in MANIFESTS
                                       if "kubernetes.dask.org" not in d["apiVersion"]],
                         ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_core_manifest_is_valid(name, doc, version):
    kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize(("name", "doc"), [(n, d) for n, d in MANIFESTS
                                       if "kubernetes.dask.org" in d["apiVersion"]],
                         ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_dask_operator_manifest_is_valid(name, doc, crd_schemas):
    assert doc["apiVersion"] == "kubernetes.dask.org/v1"
    crd_schemas[doc["kind"]].validate(doc)
    # the CRDs accept any field inside a pod spec: check those strictly as core PodSpecs
    for where, pod_spec in _pod_specs(doc):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": where}, "spec": pod_spec}
        kubernetes_validate.validate(pod, K8S_VERSIONS[0], strict=True)


def test_validation_catches_mistakes(crd_schemas):
    """The checks are real: a misspelt field, a missing one or a wrong type fails."""
    cron = BY_KIND["CronJob"][0]
    misspelt = {**cron, "spec": {**cron["spec"], "concurencyPolicy": "Forbid"}}
    with pytest.raises(kubernetes_validate.ValidationError, match="'concurencyPolicy' was unexp"):
        kubernetes_validate.validate(misspelt, K8S_VERSIONS[0], strict=True)
    job = BY_KIND["DaskJob"][0]
    broken = copy.deepcopy(job)
    del broken["spec"]["cluster"]
    with pytest.raises(jsonschema.ValidationError, match="'cluster' is a required property"):
        crd_schemas["DaskJob"].validate(broken)
    (scaler,) = BY_KIND["DaskAutoscaler"]
    broken = {**scaler, "spec": {**scaler["spec"], "maximum": "eight"}}
    with pytest.raises(jsonschema.ValidationError, match="'eight' is not of type 'integer'"):
        crd_schemas["DaskAutoscaler"].validate(broken)


def test_autoscaler_scales_the_shipped_cluster():
    (scaler,), clusters = BY_KIND["DaskAutoscaler"], BY_KIND["DaskCluster"]
    assert scaler["spec"]["cluster"] in {c["metadata"]["name"] for c in clusters}
    assert 1 <= scaler["spec"]["minimum"] < scaler["spec"]["maximum"]


@pytest.mark.parametrize("job", BY_KIND["DaskJob"], ids=lambda j: j["metadata"]["name"])
def test_daskjob_runs_a_shipped_workflow_that_passes_check(job):
    (container,) = job["spec"]["job"]["spec"]["containers"]
    args = container["args"]
    assert args[:2] == ["dr-dask", "run"] and args[2] in shipped()  # a real job, by name
    assert args[2] != "demo-ikd"  # the synthetic demo is an example, never deployed
    env = {e["name"]: e["value"] for e in container["env"]}
    params = {k: v for k, v in env.items() if k.startswith("DR_DASK_PARAM_")}
    assert params and set(env) - set(params) == {"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT",
                                                 "DASK_DR_DASK__CLUSTER__WAIT_FOR_WORKERS"}
    # the wait for a worker covers a node-pool scale-up (minutes), not the 60 s default
    from dask.utils import parse_timedelta

    assert parse_timedelta(env["DASK_DR_DASK__CLUSTER__WAIT_FOR_WORKERS"]) >= 600
    res = CliRunner(env=params).invoke(main, ["run", *args[2:], "--check"])
    assert res.exit_code == 0, (shlex.join(args), res.output)
    for key, value in params.items():  # every parameter is one the workflow has
        assert f"param {key[len('DR_DASK_PARAM_'):].lower()} = {value!r}" in res.output
    # its scheduler Service selects the job's own cluster (the operator names it after the job)
    selector = job["spec"]["cluster"]["spec"]["scheduler"]["service"]["selector"]
    assert selector["dask.org/cluster-name"] == job["metadata"]["name"]


def test_the_nightly_and_weekly_jobs_are_deployed():
    workflows = {j["metadata"]["name"]: j["spec"]["job"]["spec"]["containers"][0]["args"][2]
                 for j in BY_KIND["DaskJob"]}
    assert workflows == {"dr-dask-nightly": "nightly-gp-isomap",
                         "dr-dask-weekly": "weekly-refit"}
    crons = {c["metadata"]["name"]: c for c in BY_KIND["CronJob"]}
    assert set(crons) == set(workflows)
    assert crons["dr-dask-nightly"]["spec"]["schedule"] == "0 2 * * *"
    assert crons["dr-dask-weekly"]["spec"]["schedule"] == "0 3 * * 0"


@pytest.mark.parametrize("cron", BY_KIND["CronJob"], ids=lambda c: c["metadata"]["name"])
def test_cronjob_submits_its_daskjob_one_at_a_time(cron):
    spec = cron["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    job_spec = spec["jobTemplate"]["spec"]
    assert spec["startingDeadlineSeconds"] > 0 and job_spec["activeDeadlineSeconds"] > 0
    # the submitter's exit class decides: 2 (change something) fails the Job, 1 (a retry may
    # help) is counted against backoffLimit; its own pod disrupted (it then exits 1) is retried
    # without counting, so that rule comes before the one counting exit 1
    rules = job_spec["podFailurePolicy"]["rules"]
    actions = [(r["action"], r["onExitCodes"]["values"]) for r in rules if "onExitCodes" in r]
    assert actions == [("FailJob", [2]), ("Count", [1])]
    (disrupted,) = [i for i, r in enumerate(rules) if "onPodConditions" in r]
    assert rules[disrupted] == {"action": "Ignore", "onPodConditions": [
        {"type": "DisruptionTarget", "status": "True"}]}
    assert disrupted < [r["action"] for r in rules].index("Count")
    assert job_spec["backoffLimit"] >= 1
    pod = job_spec["template"]["spec"]
    (container,) = pod["containers"]
    assert {r["onExitCodes"]["containerName"] for r in rules if "onExitCodes" in r} == {
        container["name"]}
    mounted = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    (config,) = [n for n, v in volumes.items() if "configMap" in v]
    kustomization = _docs(os.path.join(K8S, "kustomization.yaml"))[0]
    (generator,) = kustomization["configMapGenerator"]
    assert volumes[config]["configMap"]["name"] == generator["name"]
    args = [a.replace(mounted[config] + "/", "") for a in container["args"]]
    component = cron["metadata"]["labels"]["app.kubernetes.io/component"]
    assert args[1:3] == ["submit_daskjob.py", f"daskjob-{component}.yaml"]
    assert set(args[1:3]) <= set(generator["files"])
    # the submitter deletes its DaskJob on its own deadline, before the Job's SIGTERM
    deadline = float(args[args.index("--deadline") + 1])
    assert 0 < deadline < job_spec["activeDeadlineSeconds"]
    assert pod["terminationGracePeriodSeconds"] >= 30  # time to delete it after SIGTERM
    (env,) = container["env"]
    assert env == {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    # its ServiceAccount may create DaskJobs (and nothing cluster-wide)
    (account,), (role,), (binding,) = BY_KIND["ServiceAccount"], BY_KIND["Role"], BY_KIND[
        "RoleBinding"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"]}]
    assert "ClusterRole" not in BY_KIND


def test_the_role_grants_what_the_submitter_calls_and_nothing_else():
    (role,) = BY_KIND["Role"]
    grants = {(g, r): sorted(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"]
              for r in rule["resources"]}
    assert grants == {("kubernetes.dask.org", "daskjobs"): ["create", "delete", "get", "list"],
                      ("", "pods"): ["get", "list", "watch"], ("", "events"): ["list"]}


def test_one_image_pinned_in_one_place():
    kustomization = _docs(os.path.join(K8S, "kustomization.yaml"))[0]
    (image,) = kustomization["images"]
    assert image["name"] == IMAGE and (image.get("newTag") or image.get("digest"))
    for name, doc in MANIFESTS:  # every container names the image; none pins a tag itself
        for where, pod in _pod_specs(doc):
            for c in pod["containers"]:
                assert c["image"] == IMAGE, (name, where, c["image"])


def test_spill_and_scratch_volumes_are_size_limited():
    for name, doc in MANIFESTS:
        for where, pod in _pod_specs(doc):
            for volume in pod.get("volumes", []):
                if "emptyDir" in volume:
                    assert volume["emptyDir"].get("sizeLimit"), (name, where, volume["name"])


def test_network_policy_admits_the_dask_ports_only_from_the_namespace():
    policies = {p["metadata"]["name"]: p["spec"] for p in BY_KIND["NetworkPolicy"]}
    scheduler = policies["dr-dask-scheduler"]
    assert scheduler["podSelector"] == {"matchLabels": {"dask.org/component": "scheduler"}}
    assert scheduler["policyTypes"] == ["Ingress"]
    (rule,) = scheduler["ingress"]
    assert sorted(p["port"] for p in rule["ports"]) == [8786, 8787]
    # this namespace's pods (an empty podSelector without a namespaceSelector) and the operator
    assert {"podSelector": {}} in rule["from"]
    others = [peer for peer in rule["from"] if peer != {"podSelector": {}}]
    assert others == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "dask-operator"}}}]
    workers = policies["dr-dask-workers"]
    assert workers["podSelector"] == {"matchLabels": {"dask.org/component": "worker"}}
    assert workers["ingress"] == [{"from": [{"podSelector": {}}]}]


def test_submitted_daskjob_is_dated_and_its_service_selects_its_cluster(crd_schemas):
    import time

    submit = _submitter()
    for template in BY_KIND["DaskJob"]:
        before = copy.deepcopy(template)
        job = submit.dated(template, time.strptime("2026-11-23 02:00:07", "%Y-%m-%d %H:%M:%S"))
        assert template == before  # the template is left alone
        name = template["metadata"]["name"] + "-20261123-020007"
        assert job["metadata"]["name"] == name
        selector = job["spec"]["cluster"]["spec"]["scheduler"]["service"]["selector"]
        assert selector == {"dask.org/cluster-name": name, "dask.org/component": "scheduler"}
        crd_schemas["DaskJob"].validate(job)
        assert len(name) + len("-default-worker-0123456789") <= 63  # pod labels


def _submitter():
    import importlib.util

    spec = importlib.util.spec_from_file_location("submit_daskjob",
                                                  os.path.join(K8S, "submit_daskjob.py"))
    submit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(submit)
    return submit


@pytest.mark.parametrize(("name", "doc"), [(n, d) for n, d in MANIFESTS if _pod_specs(d)],
                         ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_pods_run_as_non_root_with_credentials_from_a_secret(name, doc):
    (secret,) = BY_KIND["Secret"]
    assert not secret.get("data") and not any(secret.get("stringData", {}).values())
    for where, pod in _pod_specs(doc):
        ctx = pod["securityContext"]
        assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] > 0, (name, where)
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, (name, where)
            assert sc["readOnlyRootFilesystem"] is True, (name, where)
            assert sc["capabilities"]["drop"] == ["ALL"], (name, where)
            # a read-only root needs a writable /tmp (dask spill, numba and matplotlib caches)
            assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"]), (name, where)
            for env in c.get("env", []):
                assert "value" not in env or not any(
                    s in env["name"].upper() for s in ("SECRET", "PASSWORD", "TOKEN", "KEY")), env
            for source in c.get("envFrom", []):
                assert source["secretRef"]["name"] == secret["metadata"]["name"]
        if where != "pod":  # Dask pods never call the Kubernetes API
            assert pod["automountServiceAccountToken"] is False, (name, where)


def _quantity(text: str) -> float:
    units = {"Mi": 2**20, "Gi": 2**30}
    return float(text[:-2]) * units[text[-2:]]


def test_every_container_requests_and_limits_its_ephemeral_storage():
    """The scheduler places a pod where its disk fits (a spilling worker, its /tmp emptyDir's
    sizeLimit), and a container past its limit is evicted, never the node's disk filled."""
    for name, doc in MANIFESTS:
        for where, pod in _pod_specs(doc):
            caps = {v["name"]: _quantity(v["emptyDir"]["sizeLimit"])
                    for v in pod.get("volumes", []) if "emptyDir" in v}
            for c in pod["containers"]:
                scratch = sum(caps.get(m["name"], 0) for m in c["volumeMounts"])
                request = _quantity(c["resources"]["requests"]["ephemeral-storage"])
                limit = _quantity(c["resources"]["limits"]["ephemeral-storage"])
                assert scratch <= request < limit, (name, where, c["name"])


def _operator_pods(cluster: str) -> dict[str, dict]:
    """The pod templates the Dask operator builds for a cluster's scheduler and workers and a
    job's runner (its own code, from dask-kubernetes), by component."""
    from dask_kubernetes.operator.controller import controller

    pod = {"containers": [{"name": "c", "image": IMAGE}]}
    scheduler = controller.build_scheduler_deployment_spec(cluster, pod, {}, {})
    worker = controller.build_worker_deployment_spec("default", "dr-dask", cluster, "0f3c9a",
                                                     copy.deepcopy(pod), {}, {})
    runner = controller.build_job_pod_spec(cluster, cluster, "dr-dask", pod, {}, {})
    return {"scheduler": scheduler["spec"]["template"], "worker": worker["spec"]["template"],
            "job": runner}


def test_schedulers_are_never_drained_nor_preempted_and_workers_may_be():
    (budget,) = BY_KIND["PodDisruptionBudget"]
    assert budget["spec"]["maxUnavailable"] == 0
    selector = budget["spec"]["selector"]["matchLabels"]
    for cluster in ["dr-dask", "dr-dask-nightly-20261123-020007"]:
        pods = _operator_pods(cluster)
        for component, pod in pods.items():  # the labels the operator really gives its pods
            labels = pod["metadata"]["labels"]
            selected = all(labels.get(k) == v for k, v in selector.items())
            assert selected == (component == "scheduler"), (cluster, component)
    (priority,) = BY_KIND["PriorityClass"]
    assert priority["value"] > 0 and priority["globalDefault"] is False
    assert priority["preemptionPolicy"] == "Never"  # they wait for room, never take it
    for name, doc in MANIFESTS:
        for where, pod in _pod_specs(doc):
            expected = priority["metadata"]["name"] if where in ("scheduler", "job") else None
            assert pod.get("priorityClassName") == expected, (name, where)


@pytest.mark.parametrize(("name", "doc"), [(n, d) for n, d in MANIFESTS
                                       if d["kind"] in ("DaskJob", "DaskCluster")],
                         ids=lambda v: v if isinstance(v, str) else v["metadata"]["name"])
def test_schedulers_and_workers_are_probed_on_their_health_endpoint(name, doc):
    for where, pod in _pod_specs(doc):
        if where not in ("scheduler", "worker"):
            continue
        (c,) = pod["containers"]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        # the port dask serves /health on: its dashboard address
        served = int(c["args"][c["args"].index("--dashboard-address") + 1].lstrip(":"))
        for probe in ("readinessProbe", "livenessProbe"):
            check = c[probe]["httpGet"]
            assert check["path"] == "/health" and ports[check["port"]] == served, (where, probe)
        live = c["livenessProbe"]
        # a busy process answers late: a restart only after minutes without an answer
        assert live["periodSeconds"] * live["failureThreshold"] >= 120, where
        assert live["timeoutSeconds"] >= 5, where


@pytest.mark.parametrize("script", ["nightly.sbatch", "weekly.sbatch"])
def test_slurm_jobs_wait_for_a_queued_worker(script):
    """adapt(minimum_jobs=0) starts a worker job only when work arrives: the batch scripts
    wait for the queue (a default the site can override), not the 60 s default."""
    import re

    from dask.utils import parse_timedelta

    with open(os.path.join(os.path.dirname(__file__), "..", "deploy", "hpc", script)) as fh:
        text = fh.read()
    found = re.search(r"^export DASK_DR_DASK__CLUSTER__WAIT_FOR_WORKERS="
                      r"\$\{DASK_DR_DASK__CLUSTER__WAIT_FOR_WORKERS:-(\S+)\}$", text, re.M)
    assert found and parse_timedelta(found.group(1)) >= 1800
