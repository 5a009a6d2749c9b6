"""Submit a DaskJob, watch it, and exit with a code that says whether a retry can help.

A CronJob's pod runs this (the dr-dask image ships ``kr8s``, the Kubernetes client
dask-kubernetes itself uses, and ``dr_dask``, whose table of exit codes it follows:
:mod:`dr_dask.runtime.exits`) under the ServiceAccount of rbac.yaml, whose Role it needs
exactly: DaskJobs ``create``, ``get``, ``list``, ``delete``; pods ``get``, ``list``,
``watch``; events ``list``. It

1. works in its own namespace: ``--namespace``, else ``$DR_DASK_NAMESPACE``, else the
   ServiceAccount's ``namespace`` file (kr8s 0.20 falls back to ``default`` instead: it is
   given the namespace explicitly);
2. reads its own pod (``$POD_NAME``, from the downward API): its image, which every container
   of the DaskJob then runs at the digest this pod runs (so kustomize's ``images:`` pins the
   jobs' image too, and a tag pushed again does not split a run between two images), and the Job
   that owns the pod, which becomes the DaskJob's owner (Kubernetes deletes the DaskJob, its
   cluster and runner pod with the Job, as the CronJob's history limits expire it);
3. removes the DaskJobs that earlier runs of the same template left: finished ones beyond the
   newest ``--keep`` (their runner pods keep the logs), and unfinished ones, which under the
   CronJob's ``concurrencyPolicy: Forbid`` can only be orphans of a killed submitter;
4. creates the DaskJob (the template's name plus the UTC time); a quota that refuses it is
   retried with exponential backoff for up to ``--wait`` seconds;
5. every ``--poll`` seconds reads the DaskJob's status, its cluster's pods (by the operator's
   ``dask.org/cluster-name`` label) and the namespace's warning events about them, and logs each
   problem once, in one line, as it appears: a pod that cannot be scheduled, an image that
   cannot be pulled, a container killed at its memory limit, a preempted or evicted pod, a
   quota that refuses the operator's pods; and it watches the cluster's pods all along, so
   that a container killed at its memory limit is remembered even when the operator deletes
   the pods between two polls (a worker killed just before the job fails);
6. exits (deleting a DaskJob that has not finished, whose cluster the operator then removes):

   - 0: the workflow succeeded;
   - 2, at once, when only a change of configuration can help: an image that does not exist
     (or may not be pulled), the Dask operator's CRD missing, a spec the API server refuses, a
     quota smaller than one DaskJob, the job runner killed at its memory limit, or a failed job
     whose workers were, the job runner evicted past its own disk limits (the message names
     the limit and the setting to raise), the workflow's own exit 2 (bad input), a request
     the API server refuses while watching (403: RBAC; the DaskJob is deleted first). The
     CronJob's ``podFailurePolicy`` fails the Job: no retry;
   - 1 when a retry may help: the job runner preempted or evicted, a pod still unschedulable
     (a worker only while no other worker runs: the job goes on with those it has),
     an image still not pulled (a registry that does not answer), a quota still exceeded or
     a DaskJob the operator has not acted on after ``--wait`` seconds, the workflow's exit 1,
     SIGTERM or SIGINT (a deleted Job, its ``activeDeadlineSeconds``), ``--deadline``, the
     API server unreachable. The CronJob retries it (``backoffLimit``).

   A failed workflow's last line names its runner pod and the ``kubectl logs`` command that
   shows the workflow's own log (the pod is kept with its DaskJob).

    python submit_daskjob.py daskjob-nightly.yaml [--poll SECONDS] [--wait SECONDS]
                             [--deadline SECONDS]

``--poll`` and ``--wait`` default to ``$DR_DASK_SUBMIT_POLL`` (else 30) and
``$DR_DASK_SUBMIT_WAIT`` (else 900).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import httpx
import kr8s
import yaml
from kr8s.objects import Event, Pod, new_class

from dr_dask.runtime.exits import EXIT_BAD_INPUT, EXIT_OK, EXIT_TRANSIENT, classed

DaskJob = new_class("DaskJob", version="kubernetes.dask.org/v1", namespaced=True)

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
#: Marks the DaskJobs this script created; the template's name tells its runs apart.
MANAGED_BY = {"app.kubernetes.io/managed-by": "dr-dask-submitter"}
TEMPLATE_LABEL = "dr-dask/template"
CLUSTER_LABEL = "dask.org/cluster-name"  # the operator's label on the job's pods
FINISHED = ("Successful", "Failed")
#: API answers that no retry can fix: unauthenticated, forbidden (RBAC), no such namespace,
#: an invalid object.
CONFIG_ERRORS = (401, 403, 404, 422)
#: The longest pause between two attempts to create a DaskJob a quota refuses.
MAX_BACKOFF = 300.0
OPERATOR = ("the Dask Kubernetes operator is not installed in this cluster (no DaskJob "
            "resource kubernetes.dask.org/v1 daskjobs: its CRDs are missing): install it, with "
            "its CRDs, from its Helm chart dask-kubernetes-operator")
#: What a registry or the container runtime says when an image does not exist or may not be
#: pulled (containerd, CRI-O, Docker); anything else (a timeout, a refused connection) may pass.
IMAGE_MISSING = re.compile(r"not found|manifest unknown|name unknown|does not exist|"
                           r"pull access denied|unauthorized|authentication required|"
                           r"forbidden|denied", re.IGNORECASE)
#: Waiting reasons that only a change of the spec (or a missing Secret or ConfigMap) can fix.
CONFIG_WAITING = ("InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError")
#: What the kubelet says when it evicts a pod past its own ephemeral-storage limit or an
#: emptyDir's sizeLimit (a node short of disk says "The node was low on resource").
OVER_DISK_LIMIT = re.compile(r"exceeds the (total )?limit|exceeded its local ephemeral storage "
                             r"limit")
#: Where each of the DaskJob's containers is set in its template, by the operator's component.
SETTINGS = {"job-runner": "spec.job.spec", "scheduler": "spec.cluster.spec.scheduler.spec",
            "worker": "spec.cluster.spec.worker.spec"}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Stop(Exception):
    """The submitter ends with ``code``; ``message`` is its last line."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message


class Problem(NamedTuple):
    """One thing wrong with a DaskJob's cluster, in one line, and what it does to the exit
    code: ``code`` ends the watch at once (or, with ``lasting``, once the problem has lasted
    ``--wait`` seconds); a ``code`` of None is only reported."""

    key: str
    message: str
    code: int | None = None
    lasting: bool = False


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
    service.setdefault("selector", {})[CLUSTER_LABEL] = name
    return job


def _pod_specs(job: dict) -> Iterator[dict]:
    cluster = job["spec"]["cluster"]["spec"]
    yield job["spec"]["job"]["spec"]
    yield cluster["scheduler"]["spec"]
    yield cluster["worker"]["spec"]


def pinned(image: str, image_id: str | None) -> str:
    """``image`` at the digest of ``image_id`` (a container status's: ``REPO@sha256:...``,
    ``docker-pullable://REPO@sha256:...``), unless it names one already or ``image_id`` has
    none (an image loaded into the node, not pulled: ``sha256:...``)."""
    if "@" in image or not image_id or "@sha256:" not in image_id:
        return image
    digest = image_id.rsplit("@", 1)[1]
    tag = image.rfind(":")
    repository = image[:tag] if tag > image.rfind("/") else image  # not a registry's port
    return f"{repository}@{digest}"


def adopt(job: dict, pod: dict, container: str) -> dict:
    """``job`` running the image of ``container`` of ``pod`` (this submitter's pod), at the
    digest that pod runs (a tag pushed again meanwhile changes nothing), owned by the Job that
    owns ``pod``."""
    job = copy.deepcopy(job)
    (image,) = [c["image"] for c in pod["spec"]["containers"] if c["name"] == container]
    image_id = next((s.get("imageID") for s in pod.get("status", {}).get("containerStatuses", [])
                     if s.get("name") == container), None)
    if pinned(image, image_id) != image:
        log(f"running image {pinned(image, image_id)} (the digest of this pod's {image})")
        image = pinned(image, image_id)
    for spec in _pod_specs(job):
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            c["image"] = image
    owners = [{key: ref[key] for key in ("apiVersion", "kind", "name", "uid")}
              for ref in pod["metadata"].get("ownerReferences", []) if ref["kind"] == "Job"]
    if owners:  # blockOwnerDeletion is left unset: it would need update on jobs/finalizers
        job["metadata"]["ownerReferences"] = owners
    return job


# ---------------------------------------------------------------------------- diagnosis
def _quantity(text: str) -> float:
    """A Kubernetes quantity (``8Gi``, ``500m``, ``3``) as a number."""
    units = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", text.strip())
    if match is None or match[2] not in units:
        raise ValueError(text)
    return float(match[1]) * units[match[2]]


def quota_never_fits(message: str) -> bool:
    """Whether an "exceeded quota" message asks for more than the quota's hard limit (no
    amount of waiting frees that much)."""
    match = re.search(r"requested: (\S+), used: \S+, limited: (\S+)", message)
    if match is None:
        return False
    requested, limited = ({k: v for k, _, v in (kv.partition("=") for kv in part.split(","))}
                          for part in match.groups())
    try:
        return any(_quantity(v) > _quantity(limited[k]) for k, v in requested.items()
                   if k in limited)
    except ValueError:
        return False


def _memory_limit(pod: dict, container: str) -> str:
    for c in pod.get("spec", {}).get("containers", []):
        if c["name"] == container:
            return c.get("resources", {}).get("limits", {}).get("memory", "(no limit)")
    return "(unknown)"


def _image_problem(key: str, what: str, reason: str, detail: str) -> Problem:
    """An image that cannot be pulled: for good (2) when the registry says it does not exist or
    may not be pulled, else (a registry that does not answer) for as long as ``--wait``."""
    missing = bool(IMAGE_MISSING.search(detail))
    return Problem(key, f"{what} cannot be pulled ({reason}): {detail}" + (
        "; push it, or pin an image that exists in kustomization.yaml's images:"
        if missing else ""), EXIT_BAD_INPUT if missing else EXIT_TRANSIENT, lasting=not missing)


def pod_problems(pod: dict, template: str) -> Iterator[Problem]:
    """What is wrong with one of the job's pods, from its status."""
    name = pod["metadata"]["name"]
    component = pod["metadata"].get("labels", {}).get("dask.org/component", "")
    runner = component == "job-runner"
    role = {"job-runner": "job runner"}.get(component, component) or "pod"
    status = pod.get("status", {})
    conditions = {c.get("type"): c for c in status.get("conditions", [])}
    disruption = conditions.get("DisruptionTarget", {})
    setting = SETTINGS.get(component, "spec")
    if status.get("reason") in ("Preempted", "Evicted") or disruption.get("status") == "True":
        why = status.get("reason") or disruption.get("reason", "DisruptionTarget")
        detail = status.get("message") or disruption.get("message", "")
        # past its own disk limits (not a node short of disk): the same run would be again
        own = bool(OVER_DISK_LIMIT.search(detail))
        yield Problem(f"{name}/disrupted", f"{role} pod {name} was stopped by Kubernetes "
                      f"({why}): {detail}".rstrip(":. ") + (
                          f"; raise {setting}.containers[*].resources.limits.ephemeral-storage "
                          f"and the sizeLimit of its emptyDir volumes in {template}"
                          if own else ""),
                      (EXIT_BAD_INPUT if own else EXIT_TRANSIENT) if runner else None)
    scheduled = conditions.get("PodScheduled", {})
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        detail = scheduled.get("message", "")
        missing = "persistentvolumeclaim" in detail and "not found" in detail
        yield Problem(f"{name}/unschedulable",
                      f"{role} pod {name} cannot be scheduled: {detail}",
                      EXIT_BAD_INPUT if missing else EXIT_TRANSIENT, lasting=not missing)
    for cs in status.get("initContainerStatuses", []) + status.get("containerStatuses", []):
        where = f"{role} pod {name} container {cs['name']}"
        waiting = cs.get("state", {}).get("waiting") or {}
        reason, detail = waiting.get("reason"), waiting.get("message", "")
        if reason in ("ErrImagePull", "ImagePullBackOff"):
            yield _image_problem(f"{name}/{cs['name']}/image",
                                 f"{where}: image {cs.get('image', '?')}", reason, detail)
        elif reason in CONFIG_WAITING:
            yield Problem(f"{name}/{cs['name']}/config", f"{where}: {reason}: {detail}",
                          EXIT_BAD_INPUT)
        elif reason == "CrashLoopBackOff":
            last = cs.get("lastState", {}).get("terminated") or {}
            yield Problem(f"{name}/{cs['name']}/restarts",
                          f"{where} keeps exiting (CrashLoopBackOff, {cs.get('restartCount', 0)}"
                          f" restarts; last exit {last.get('exitCode', '?')}, "
                          f"{last.get('reason', '?')}): see its log")
        for state in (cs.get("state", {}), cs.get("lastState", {})):
            killed = state.get("terminated") or {}
            if killed.get("reason") == "OOMKilled":
                limit = _memory_limit(pod, cs["name"])
                advice = (f"raise {setting}.containers[{cs['name']}].resources.limits.memory "
                          f"(and requests) in {template}")
                if component == "worker":
                    advice += ", and dask worker --memory-limit below it"
                yield Problem(f"{name}/{cs['name']}/oom",
                              f"{where} was killed at its memory limit {limit} (OOMKilled, "
                              f"exit {killed.get('exitCode', 137)}): {advice}",
                              EXIT_BAD_INPUT if runner else None)
                break


def event_problems(events: list[dict], job: str) -> Iterator[Problem]:
    """The warnings Kubernetes and the operator recorded about ``job`` and its cluster's
    objects (named after the job): quotas refusing pods, failed scheduling, the rest reported."""
    for event in events:
        obj = event.get("involvedObject", {})
        name = obj.get("name", "")
        if event.get("type") == "Normal" or not (name == job or name.startswith(job + "-")):
            continue
        reason, detail = event.get("reason", ""), event.get("message", "")
        what = f"{obj.get('kind', 'object').lower()} {name}"
        if "exceeded quota" in detail:
            never = quota_never_fits(detail)
            yield Problem(f"{name}/quota", f"{what}: {reason}: {detail}"
                          + ("; the quota is smaller than the request: raise it or lower the "
                             "request" if never else ""),
                          EXIT_BAD_INPUT if never else EXIT_TRANSIENT, lasting=not never)
        elif reason == "FailedScheduling":
            yield Problem(f"{name}/unschedulable", f"{what} cannot be scheduled: {detail}",
                          EXIT_TRANSIENT, lasting=True)
        elif reason == "Failed" and detail.startswith("Failed to pull image"):
            # the registry's answer: the pod's status soon says only "Back-off pulling image"
            field = re.search(r"ontainers\{(.+)\}", obj.get("fieldPath", ""))
            container = field[1] if field else "?"
            yield _image_problem(f"{name}/{container}/image",
                                 f"{what} container {container}", reason, detail)
        else:
            yield Problem(f"{name}/event/{reason}", f"{what}: {reason}: {detail}")


def diagnose(pods: list[dict], events: list[dict], job: str, template: str) -> dict[str, Problem]:
    """Every problem of ``job``'s pods and events, by key; where both speak of the same thing,
    what the pod's status says, unless the event knows it for a configuration error (the
    registry's "not found" behind a status's "Back-off pulling image")."""
    found = {p.key: p for p in event_problems(events, job)}
    for pod in pods:
        for problem in pod_problems(pod, template):
            event = found.get(problem.key)
            if event is None or event.code != EXIT_BAD_INPUT:
                found[problem.key] = problem
    # a worker that cannot start (no room, a slow pull) while others run only slows the job
    components = {p["metadata"]["name"]: p["metadata"].get("labels", {}).get(
        "dask.org/component") for p in pods}
    if any(components[p["metadata"]["name"]] == "worker"
           and p.get("status", {}).get("phase") == "Running" for p in pods):
        for key, problem in found.items():
            subject = key.split("/")[0]
            if problem.lasting and (components.get(subject) == "worker" or
                                    subject.startswith(f"{job}-default-worker-")):
                found[key] = problem._replace(
                    message=problem.message + " (the job goes on with the workers it has)",
                    code=None, lasting=False)
    return found


def runner_exit_code(pods: list[dict], name: str | None) -> tuple[int, str]:
    """The job runner container's exit code, from its pod's status, in its class (0, 2, or 1
    for anything else or unknown), and what it was."""
    pod = next((p for p in pods if p["metadata"]["name"] == name), None)
    if pod is None:
        return EXIT_TRANSIENT, f"runner pod {name} is gone: its exit code is unknown"
    for status in pod.get("status", {}).get("containerStatuses", []):
        terminated = status.get("state", {}).get("terminated")
        if terminated is not None:
            code = int(terminated.get("exitCode", 1))
            return classed(code), f"runner pod {name}: container {status.get('name')} exited {code}"
    return EXIT_TRANSIENT, f"runner pod {name}: no container has ended"


def log_pointer(namespace: str, runner: str | None) -> str:
    """Where the workflow's own log is: the runner pod and the command that shows it."""
    return (f"the workflow's log: kubectl logs -n {namespace} {runner} (runner pod {runner}, "
            "kept with its daskjob)")


class PodWatch(threading.Thread):
    """Every state of ``job``'s pods as the API server streams it (a watch): the memory kills
    among them are kept, also those of pods the operator deletes before the next poll."""

    def __init__(self, api, job, template: str):
        super().__init__(daemon=True, name="pod-watch")
        self.api, self.job, self.template = api, job, template
        self.lock = threading.Lock()
        self.oom: list[Problem] = []
        #: set once the watch has streamed the runner's end (or stopped)
        self.runner_ended = threading.Event()

    def run(self) -> None:
        try:
            for _, pod in self.api.watch("pods", namespace=self.job.namespace,
                                         label_selector={CLUSTER_LABEL: self.job.name}):
                self.seen(pod.raw)
        except Exception as exc:  # noqa: BLE001  (the polls go on without it)
            log(f"watching the pods of daskjob {self.job.name} stopped "
                f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); polling only")
        finally:
            self.runner_ended.set()

    def seen(self, pod: dict) -> None:
        component = pod["metadata"].get("labels", {}).get("dask.org/component")
        for problem in pod_problems(pod, self.template):
            if problem.key.endswith("/oom"):
                with self.lock:
                    if problem not in self.oom:
                        self.oom.append(problem)
        ended = any((cs.get("state") or {}).get("terminated")
                    for cs in pod.get("status", {}).get("containerStatuses", []))
        if component == "job-runner" and ended:
            self.runner_ended.set()

    def kills(self) -> list[Problem]:
        with self.lock:
            return list(self.oom)


# ------------------------------------------------------------------------------ actions
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
        _delete(job)


def _delete(job) -> None:
    with contextlib.suppress(kr8s.NotFoundError):  # gone already
        job.delete(propagation_policy="Background")


def _message(exc: kr8s.ServerError) -> str:
    """The API server's message, on one line."""
    status: dict = exc.status if isinstance(exc.status, dict) else {}
    return " ".join(str(status.get("message") or exc).split())


def create(job, wait: float, poll: float, stop: threading.Event) -> None:
    """Create ``job``; while a quota refuses it, retry with exponential backoff (from ``poll``
    seconds, doubling up to MAX_BACKOFF) for ``wait`` seconds."""
    start, delay = time.monotonic(), poll
    while True:
        try:
            job.create()
            return
        except kr8s.ServerError as exc:
            message = _message(exc)
            if "exceeded quota" not in message:
                raise
            if quota_never_fits(message):
                raise Stop(EXIT_BAD_INPUT, f"daskjob {job.name}: {message}; the quota is "
                           "smaller than one job: raise it") from None
            waited = time.monotonic() - start
            if waited + delay > wait:
                raise Stop(EXIT_TRANSIENT, f"daskjob {job.name}: quota still exceeded after "
                           f"{waited:.0f} s: {message}") from None
            log(f"daskjob {job.name} refused: {message}; retrying in {delay:g} s")
            if stop.wait(delay):
                raise Stop(EXIT_TRANSIENT, "terminated while waiting for quota") from None
            delay = min(2 * delay, MAX_BACKOFF)


class Watch:
    """What has been reported about one DaskJob, and since when each problem lasts."""

    def __init__(self, wait: float):
        self.wait = wait
        self.since: dict[str, float] = {}
        self.said: dict[str, str] = {}
        #: memory kills of the cluster's pods seen during the run (the operator deletes the
        #: cluster's pods when the job fails: they are kept here)
        self.oom: list[Problem] = []

    def update(self, found: dict[str, Problem], now: float) -> Problem | None:
        """Log what is new; the problem that ends the watch, if any."""
        for key, problem in found.items():
            self.since.setdefault(key, now)
            if self.said.get(key) != problem.message:
                log(problem.message)
                self.said[key] = problem.message
            if key.endswith("/oom") and problem not in self.oom:
                self.oom.append(problem)
        for key in set(self.since) - set(found):  # resolved (scheduled, pulled, ...)
            del self.since[key]
        final = [p for p in found.values() if p.code is not None and
                 (not p.lasting or now - self.since[p.key] >= self.wait)]
        # a configuration error (2) outranks a transient one (1)
        return max(final, key=lambda p: p.code or 0) if final else None


def _raw(objects: Iterable) -> list[dict]:
    return [o if isinstance(o, dict) else o.raw for o in objects]


def watch(api, job, template: str, poll: float, wait: float, deadline: float,
          stop: threading.Event) -> int:
    """Watch ``job`` until it finishes (its code), a problem ends the watch, ``stop`` is set or
    ``deadline`` (monotonic) passes; an unfinished job is then deleted."""
    status, seen, polls = None, Watch(wait), 0
    pods_watch = PodWatch(api, job, template)
    pods_watch.start()
    while True:
        remaining = deadline - time.monotonic()
        if stop.wait(max(0.0, min(poll, remaining))) or remaining <= 0:
            why = "terminated" if stop.is_set() else "deadline reached"
            log(f"{why}: deleting daskjob {job.name}")
            _delete(job)
            return EXIT_TRANSIENT
        job.refresh()
        new = job.raw.get("status", {}).get("jobStatus")
        if new != status:
            log(f"daskjob {job.name}: {new}")
            status = new
        pods = _raw(Pod.list(api=api, namespace=job.namespace,
                             label_selector={CLUSTER_LABEL: job.name}))
        events = _raw(Event.list(api=api, namespace=job.namespace))
        found = diagnose(pods, events, job.name, template)
        polls += 1
        if status is None and polls > 1:  # the operator sets a status within a second
            found["operator"] = Problem("operator", (
                f"daskjob {job.name} has no status: the Dask operator has not acted on it (is "
                "it running, and watching this namespace?)"), EXIT_TRANSIENT, lasting=True)
        final = seen.update(found, time.monotonic())
        if status == "Successful":
            return EXIT_OK
        runner = job.raw.get("status", {}).get("jobRunnerPodName")
        if final is not None:
            # a runner that ended (killed, evicted) keeps its log: the operator removes the
            # cluster and marks the job; anything else would hold its pods (and nodes) forever
            ended = any(p["metadata"]["name"] == runner and p.get("status", {}).get("phase")
                        in ("Succeeded", "Failed") for p in pods)
            if status not in FINISHED and not ended:
                log(f"deleting daskjob {job.name}")
                _delete(job)
            raise Stop(final.code or EXIT_TRANSIENT,
                       final.message + (f" (for {wait:g} s)" if final.lasting else ""))
        if status == "Failed":
            code, ended = runner_exit_code(pods, runner)
            log(ended)
            # the watch streams the runner's end after any kill before it: wait for it to
            # get there (bounded: a watch that lags or stopped leaves the polls' view)
            pods_watch.runner_ended.wait(timeout=max(poll, 5.0))
            kills = seen.oom + [p for p in pods_watch.kills() if p not in seen.oom]
            pointer = log_pointer(job.namespace, runner)
            if code == EXIT_TRANSIENT and kills:  # the same memory would fail it again
                raise Stop(EXIT_BAD_INPUT, f"daskjob {job.name} failed after "
                           f"{kills[-1].message}; {pointer}")
            raise Stop(code, f"daskjob {job.name} failed: {ended}; {pointer}")


def refused(exc: kr8s.ServerError) -> Stop:
    """The exit for a request the API server refused: 2 when no retry can fix it."""
    code = exc.response.status_code if exc.response is not None else None
    message = _message(exc)
    url = str(exc.response.request.url) if exc.response is not None else ""
    if code == 404 and "/daskjobs" in url and not message.startswith("namespaces "):
        return Stop(EXIT_BAD_INPUT, f"{OPERATOR} (404 from {url.split('?')[0]})")
    return Stop(EXIT_BAD_INPUT if code in CONFIG_ERRORS else EXIT_TRANSIENT,
                f"the Kubernetes API refused a request ({code}): {message}")


def _seconds(env: str, default: float) -> float:
    return float(os.environ.get(env) or default)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifest", help="DaskJob template (YAML)")
    parser.add_argument("--namespace", default=None,
                        help="default: $DR_DASK_NAMESPACE, else the ServiceAccount's namespace")
    parser.add_argument("--service-account", default=SERVICE_ACCOUNT,
                        help="the ServiceAccount's mounted directory (token, ca.crt, namespace)")
    parser.add_argument("--container", default="submit",
                        help="this pod's container whose image the DaskJob runs")
    parser.add_argument("--poll", type=float, default=_seconds("DR_DASK_SUBMIT_POLL", 30),
                        help="seconds between reads of the job's status, pods and events "
                        "(default $DR_DASK_SUBMIT_POLL, else 30)")
    parser.add_argument("--wait", type=float, default=_seconds("DR_DASK_SUBMIT_WAIT", 900),
                        help="seconds a pod may stay unschedulable, an image unpullable for a "
                        "transient reason, or a quota exceeded before exit 1 (default "
                        "$DR_DASK_SUBMIT_WAIT, else 900)")
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
    created = None
    try:
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
            create(job, args.wait, args.poll, stop)
            created = job
            log(f"created daskjob {job.name} in namespace {namespace}")
            return watch(api, job, os.path.basename(args.manifest), args.poll, args.wait,
                         deadline, stop)
        except kr8s.ServerError as exc:
            if created is not None:  # refused while watching: no job runs unwatched
                log(f"deleting daskjob {created.name}")
                with contextlib.suppress(Exception):
                    _delete(created)
            raise refused(exc) from None
        except (OSError, httpx.HTTPError, kr8s.NotFoundError) as exc:  # unreachable, gone
            raise Stop(EXIT_TRANSIENT, f"{type(exc).__name__}: {exc}") from None
    except Stop as stopped:
        log(f"error: {stopped.message}")
        return stopped.code


if __name__ == "__main__":
    sys.exit(main())
