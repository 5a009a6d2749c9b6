"""Submit a DaskJob, wait for it, and exit with its job runner's exit code.

A CronJob's pod runs this (the dr-dask image ships ``kr8s``, the Kubernetes client
dask-kubernetes itself uses) under the ServiceAccount of rbac.yaml, whose Role it needs exactly:
DaskJobs ``create``, ``get``, ``list``, ``delete``; pods ``get``. It

1. works in its own namespace: ``--namespace``, else ``$DR_DASK_NAMESPACE``, else the
   ServiceAccount's ``namespace`` file (kr8s 0.20 falls back to ``default`` instead: it is
   given the namespace explicitly);
2. reads its own pod (``$POD_NAME``, from the downward API): its image, which every container
   of the DaskJob then runs (so kustomize's ``images:`` pins the jobs' image too), and the Job
   that owns the pod, which becomes the DaskJob's owner (Kubernetes deletes the DaskJob, its
   cluster and runner pod with the Job, as the CronJob's history limits expire it);
3. removes the DaskJobs that earlier runs of the same template left: finished ones beyond the
   newest ``--keep`` (their runner pods keep the logs), and unfinished ones, which under the
   CronJob's ``concurrencyPolicy: Forbid`` can only be orphans of a killed submitter;
4. creates the DaskJob (the template's name plus the UTC time) and reads its status every
   ``--poll`` seconds; on SIGTERM or SIGINT (a deleted Job, its ``activeDeadlineSeconds``) or
   at ``--deadline`` it deletes the DaskJob (the operator then removes its cluster) and exits 1;
5. exits with the workflow's code: 0 done, 2 bad input or configuration (the CronJob's
   ``podFailurePolicy`` fails the Job without a retry), 1 anything else (retried). A request
   the API server refuses (401, 403, 404 namespace, 422 invalid) is a configuration error: 2.

    python submit_daskjob.py daskjob-nightly.yaml [--poll SECONDS] [--deadline SECONDS]
"""

from __future__ import annotations

import argparse
import copy
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import kr8s
import yaml
from kr8s.objects import Pod, new_class

DaskJob = new_class("DaskJob", version="kubernetes.dask.org/v1", namespaced=True)

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
#: Marks the DaskJobs this script created; the template's name tells its runs apart.
MANAGED_BY = {"app.kubernetes.io/managed-by": "dr-dask-submitter"}
TEMPLATE_LABEL = "dr-dask/template"
FINISHED = ("Successful", "Failed")
EXIT_OK, EXIT_TRANSIENT, EXIT_BAD_INPUT = 0, 1, 2
#: API answers that no retry can fix: unauthenticated, forbidden (RBAC), no such namespace,
#: an invalid object.
CONFIG_ERRORS = (401, 403, 404, 422)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def namespace_of(explicit: str | None, service_account: str) -> str:
    """The namespace to work in: ``explicit``, else ``$DR_DASK_NAMESPACE``, else the
    ServiceAccount's."""
    name = explicit or os.environ.get("DR_DASK_NAMESPACE")
    if name:
        return name
    try:
        with open(os.path.join(service_account, "namespace")) as fh:
            return fh.read().strip()
    except FileNotFoundError:
        raise SystemExit(f"error: no namespace: pass --namespace or $DR_DASK_NAMESPACE, or run "
                         f"in a pod with a ServiceAccount ({service_account}/namespace)") from None


def dated(spec: dict, when: time.struct_time) -> dict:
    """The DaskJob ``spec`` renamed for one run, its scheduler Service selecting its cluster."""
    job = copy.deepcopy(spec)
    template = job["metadata"]["name"]
    name = template + time.strftime("-%Y%m%d-%H%M%S", when)
    job["metadata"]["name"] = name
    job["metadata"].setdefault("labels", {}).update({**MANAGED_BY, TEMPLATE_LABEL: template})
    # the operator names the job's cluster after the job: the scheduler Service must select it
    service = job["spec"]["cluster"]["spec"]["scheduler"]["service"]
    service.setdefault("selector", {})["dask.org/cluster-name"] = name
    return job


def _pod_specs(job: dict) -> Iterator[dict]:
    cluster = job["spec"]["cluster"]["spec"]
    yield job["spec"]["job"]["spec"]
    yield cluster["scheduler"]["spec"]
    yield cluster["worker"]["spec"]


def adopt(job: dict, pod: dict, container: str) -> dict:
    """``job`` running the image of ``container`` of ``pod`` (this submitter's pod), owned by
    the Job that owns ``pod``."""
    job = copy.deepcopy(job)
    (image,) = [c["image"] for c in pod["spec"]["containers"] if c["name"] == container]
    for spec in _pod_specs(job):
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            c["image"] = image
    owners = [{key: ref[key] for key in ("apiVersion", "kind", "name", "uid")}
              for ref in pod["metadata"].get("ownerReferences", []) if ref["kind"] == "Job"]
    if owners:  # blockOwnerDeletion is left unset: it would need update on jobs/finalizers
        job["metadata"]["ownerReferences"] = owners
    return job


def runner_exit_code(api, job) -> int:
    """The job runner container's exit code, read from its pod (GET, as the Role grants): 0, 2
    or 1 (anything else, or unknown)."""
    name = job.raw.get("status", {}).get("jobRunnerPodName")
    if not name:
        return EXIT_TRANSIENT
    pod = Pod({"metadata": {"name": name, "namespace": job.namespace}}, api=api)
    try:
        pod.refresh()
    except kr8s.NotFoundError:
        log(f"runner pod {name} is gone: its exit code is unknown")
        return EXIT_TRANSIENT
    for status in pod.raw.get("status", {}).get("containerStatuses", []):
        terminated = status.get("state", {}).get("terminated")
        if terminated is not None:
            code = int(terminated.get("exitCode", 1))
            log(f"runner pod {name}: container {status.get('name')} exited {code}")
            return code if code in (EXIT_OK, EXIT_BAD_INPUT) else EXIT_TRANSIENT
    return EXIT_TRANSIENT


def clean_up(api, namespace: str, template: str, keep: int) -> None:
    """Delete what earlier runs of ``template`` left: finished DaskJobs beyond the newest
    ``keep``, and unfinished ones (orphans: the CronJob never runs two submitters at once)."""
    selector = {**MANAGED_BY, TEMPLATE_LABEL: template}
    jobs = sorted(DaskJob.list(api=api, namespace=namespace, label_selector=selector),
                  key=lambda j: j.metadata.get("creationTimestamp", ""), reverse=True)
    finished = [j for j in jobs if j.raw.get("status", {}).get("jobStatus") in FINISHED]
    orphans = [j for j in jobs if j not in finished]
    for job in orphans + finished[keep:]:
        why = "finished" if job in finished else "left running by an earlier submitter"
        log(f"deleting daskjob {job.name} ({why})")
        try:
            job.delete(propagation_policy="Background")
        except kr8s.NotFoundError:
            pass


def wait(api, job, poll: float, deadline: float, stop: threading.Event) -> int:
    """Poll ``job`` until it finishes (its code), ``stop`` is set or ``deadline`` (monotonic)
    passes (delete it, 1)."""
    status = None
    while True:
        remaining = deadline - time.monotonic()
        if stop.wait(max(0.0, min(poll, remaining))) or remaining <= 0:
            why = "terminated" if stop.is_set() else "deadline reached"
            log(f"{why}: deleting daskjob {job.name}")
            try:
                job.delete(propagation_policy="Background")
            except kr8s.NotFoundError:
                pass
            return EXIT_TRANSIENT
        job.refresh()
        new = job.raw.get("status", {}).get("jobStatus")
        if new != status:
            log(f"daskjob {job.name}: {new}")
            status = new
        if status == "Successful":
            return EXIT_OK
        if status == "Failed":
            return runner_exit_code(api, job)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifest", help="DaskJob template (YAML)")
    parser.add_argument("--namespace", default=None,
                        help="default: $DR_DASK_NAMESPACE, else the ServiceAccount's namespace")
    parser.add_argument("--service-account", default=SERVICE_ACCOUNT,
                        help="the ServiceAccount's mounted directory (token, ca.crt, namespace)")
    parser.add_argument("--container", default="submit",
                        help="this pod's container whose image the DaskJob runs")
    parser.add_argument("--poll", type=float, default=30.0, help="seconds between status reads")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds after which the DaskJob is deleted (exit 1); keep it "
                        "below the Job's activeDeadlineSeconds")
    parser.add_argument("--keep", type=int, default=3,
                        help="finished DaskJobs of this template kept for inspection")
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    deadline = time.monotonic() + (args.deadline if args.deadline else float("inf"))
    with open(args.manifest) as fh:
        template = yaml.safe_load(fh)
    namespace = namespace_of(args.namespace, args.service_account)
    try:
        api = kr8s.api(serviceaccount=args.service_account, namespace=namespace)
        spec = dated(template, time.gmtime())
        own = os.environ.get("POD_NAME")
        if own:
            pod = Pod({"metadata": {"name": own, "namespace": namespace}}, api=api)
            pod.refresh()
            spec = adopt(spec, pod.raw, args.container)
        clean_up(api, namespace, template["metadata"]["name"], args.keep)
        if stop.is_set():
            return EXIT_TRANSIENT
        job = DaskJob(spec, namespace=namespace, api=api)
        job.create()
        log(f"created daskjob {job.name} in namespace {namespace}")
        return wait(api, job, args.poll, deadline, stop)
    except kr8s.ServerError as exc:
        code = exc.response.status_code if exc.response is not None else None
        log(f"error: the Kubernetes API refused a request ({code}): {exc}")
        return EXIT_BAD_INPUT if code in CONFIG_ERRORS else EXIT_TRANSIENT
    except (OSError, httpx.HTTPError, kr8s.NotFoundError) as exc:  # unreachable, timed out, gone
        log(f"error: {type(exc).__name__}: {exc}")
        return EXIT_TRANSIENT


if __name__ == "__main__":
    sys.exit(main())
