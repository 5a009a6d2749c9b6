"""A stand-in of the Kubernetes API server on 127.0.0.1, for the DaskJob submitter's tests.

No API server can be installed on the test machines, so this one serves what the submitter
calls, over HTTPS, with the rules a real one applies to a ServiceAccount:

- a bearer token is required (401 otherwise);
- the ServiceAccount's Role (rbac.yaml, parsed) is enforced per API group, resource and verb
  (get, list, watch, create, delete, patch, update), and only in the namespace of its
  RoleBinding: anything else is a 403 with the API server's Status body. Subresources are
  resources of their own, as in RBAC: ``pods/log``, ``pods/exec`` and ``pods/status`` need a
  rule that names them (a rule for ``pods`` does not grant them);
- objects are namespaced; names are unique (409); created DaskJobs are validated against the
  Dask operator's CRD schema (422); deleting an object deletes what it owns (garbage
  collection by ownerReferences, at once);
- list honours equality label selectors; get of an absent object is a 404; ``/version`` is
  public (kr8s reads it first);
- a watch (``?watch=true``, its own verb for RBAC) streams the objects that match as
  ``ADDED`` events, then every change after it as it happens (``ADDED``, ``MODIFIED``,
  ``DELETED``, in order, each with its ``resourceVersion``), one JSON line each, until
  ``timeoutSeconds`` or the server stops.

It also plays the Dask operator for each created DaskJob: status ``ClusterCreated`` with a
runner pod ``<name>-runner``, a scheduler and a worker pod (labelled as the operator labels
them, owned by the DaskJob), ``Running``, then, when :attr:`KubeAPI.exit_code` is not None, the
runner container terminated with that code, the DaskJob ``Successful`` (0) or ``Failed`` and
the cluster's pods deleted (as the operator's runner-pod handlers do).

And it plays what goes wrong on a real platform (set before the DaskJob is created):

- :attr:`KubeAPI.fault` (one of :data:`FAULTS`) for what the kubelet and the scheduler report
  in the pods' status and as events: pods that cannot be scheduled, images that cannot be
  pulled (missing, or a registry that times out), the runner or a worker killed at its memory
  limit (a worker also just as the job fails: killed, the runner's exit and the cluster's
  deletion in one step, so that no poll ever sees the kill, only a watch), the runner
  preempted or evicted (for the node's sake, or past its own disk limit),
  or no operator acting on DaskJobs (its CRDs
  installed, its pod down);
- :attr:`KubeAPI.crds` False: the operator's CRDs are not installed (404 on ``daskjobs``);
- :attr:`KubeAPI.quota`: the next that many DaskJob creates are refused by a ResourceQuota
  (403 ``exceeded quota``, :attr:`KubeAPI.quota_message`).
"""

from __future__ import annotations

import copy
import json
import ssl
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

_VERBS = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}
OPERATOR_GROUP = "kubernetes.dask.org"
#: What :attr:`KubeAPI.fault` can play (see :meth:`KubeAPI._break`).
FAULTS = ("unschedulable", "image-missing", "image-slow", "oom", "worker-oom",
          "worker-oom-at-end", "preempted", "evicted", "evicted-disk", "no-operator")
UNSCHEDULABLE = ("0/3 nodes are available: 3 Insufficient memory. preemption: 0/3 nodes are "
                 "available: 3 No preemption victims found for incoming pod.")
IMAGE_MISSING = ('rpc error: code = NotFound desc = failed to pull and unpack image "{image}": '
                 'failed to resolve reference "{image}": {image}: not found')
IMAGE_SLOW = ('rpc error: code = Unknown desc = failed to pull and unpack image "{image}": '
              'failed to copy: httpReadSeeker: failed open: failed to do request: dial tcp '
              '10.0.0.9:443: i/o timeout')


class KubeAPI:
    """The stand-in's state and rules (see the module docstring).

    Parameters
    ----------
    role : dict
        The Role manifest the token is bound to.
    namespace : str
        The namespace of the RoleBinding (and of the ServiceAccount).
    token : str
    validate : callable, optional
        Called with each created DaskJob; raises to refuse it (422).
    """

    def __init__(self, role: dict, namespace: str, token: str, validate: Any = None,
                 step: float = 0.2):
        self.rules = {(group, resource): set(rule["verbs"]) for rule in role["rules"]
                      for group in rule["apiGroups"] for resource in rule["resources"]}
        self.namespace, self.token, self.validate, self.step = namespace, token, validate, step
        self.subject = f"system:serviceaccount:{namespace}:dr-dask-submitter"
        self.objects: dict[tuple[str, str, str], dict[str, dict]] = {}
        #: every request: (verb, group, resource, namespace, name, HTTP status)
        self.requests: list[tuple[str, str, str, str, str | None, int]] = []
        #: the runner container's exit code for DaskJobs created from now on (None: never ends)
        self.exit_code: int | None = 0
        #: what goes wrong with DaskJobs created from now on (one of FAULTS, None: nothing)
        self.fault: str | None = None
        #: whether the Dask operator's CRDs are installed
        self.crds = True
        #: how many of the next DaskJob creates a ResourceQuota refuses
        self.quota = 0
        self.quota_message = ("exceeded quota: dr-dask-jobs, requested: "
                              "count/daskjobs.kubernetes.dask.org=1, used: "
                              "count/daskjobs.kubernetes.dask.org=2, limited: "
                              "count/daskjobs.kubernetes.dask.org=2")
        self.lock = threading.RLock()
        #: every change, in order: (group, resource, namespace, type, the object then)
        self.changes: list[tuple[str, str, str, str, dict]] = []
        self.changed = threading.Condition(self.lock)
        self.version = 0
        #: set when the server stops: open watches end
        self.closed = False

    def _record(self, group: str, resource: str, kind: str, obj: dict) -> None:
        """One change of ``obj`` for the watches (a new ``resourceVersion``)."""
        with self.changed:
            self.version += 1
            obj["metadata"]["resourceVersion"] = str(self.version)
            self.changes.append((group, resource, obj["metadata"]["namespace"], kind,
                                 copy.deepcopy(obj)))
            self.changed.notify_all()

    def touch(self, group: str, resource: str, obj: dict) -> None:
        """``obj`` was changed in place (its status): a ``MODIFIED`` event."""
        self._record(group, resource, "MODIFIED", obj)

    # ------------------------------------------------------------------------ objects
    def put(self, group: str, resource: str, obj: dict) -> dict:
        """Store ``obj`` (as a create would), filling uid, namespace and creationTimestamp."""
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", self.namespace)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp",
                        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        with self.lock:
            objs = self.objects.setdefault((group, resource, meta["namespace"]), {})
            kind = "MODIFIED" if meta["name"] in objs else "ADDED"
            objs[meta["name"]] = obj
            self._record(group, resource, kind, obj)
        return obj

    def get(self, group: str, resource: str, name: str, namespace: str | None = None):
        with self.lock:
            return self.objects.get((group, resource, namespace or self.namespace), {}).get(name)

    def names(self, group: str, resource: str, namespace: str | None = None) -> list[str]:
        with self.lock:
            return sorted(self.objects.get((group, resource, namespace or self.namespace), {}))

    def delete(self, group: str, resource: str, namespace: str, name: str) -> dict | None:
        with self.lock:
            obj = self.objects.get((group, resource, namespace), {}).pop(name, None)
            if obj is None:
                return None
            self._record(group, resource, "DELETED", obj)
            uid = obj["metadata"]["uid"]
            for (g, r, ns), objs in list(self.objects.items()):  # garbage collection
                for child, o in list(objs.items()):
                    refs = o["metadata"].get("ownerReferences", [])
                    if ns == namespace and any(ref.get("uid") == uid for ref in refs):
                        self.delete(g, r, ns, child)
        return obj

    # ------------------------------------------------------------------------ operator
    def _pod(self, job: dict, name: str, component: str, spec: dict) -> dict:
        meta = job["metadata"]
        return self.put("", "pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": meta["namespace"],
                         "labels": {"dask.org/component": component,
                                    "dask.org/cluster-name": meta["name"]},
                         "ownerReferences": [{
                             "apiVersion": f"{OPERATOR_GROUP}/v1", "kind": "DaskJob",
                             "name": meta["name"], "uid": meta["uid"]}]},
            "spec": copy.deepcopy(spec), "status": {"phase": "Pending"}})

    def event(self, pod: dict, reason: str, message: str, kind: str = "Pod",
              field: str | None = None) -> None:
        """Record a Warning event about ``pod`` (as the scheduler or the kubelet would; the
        kubelet names the container in ``fieldPath``)."""
        meta = pod["metadata"]
        about = {"kind": kind, "name": meta["name"], "namespace": meta["namespace"],
                 "uid": meta["uid"], **({"fieldPath": field} if field else {})}
        self.put("", "events", {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}",
                         "namespace": meta["namespace"]},
            "involvedObject": about,
            "type": "Warning", "reason": reason, "message": message, "count": 1})

    def _break(self, fault: str, runner: dict, worker: dict) -> None:
        """Play ``fault`` on the job's pods before they run."""
        if fault == "unschedulable":
            for pod in (runner, worker):
                pod["status"]["conditions"] = [{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": UNSCHEDULABLE}]
                self.touch("", "pods", pod)
                self.event(pod, "FailedScheduling", UNSCHEDULABLE)
        elif fault in ("image-missing", "image-slow"):
            # the registry's answer is in the kubelet's event; after the first attempt the
            # status says only that it backs off
            for pod in (runner, worker):
                (container,) = pod["spec"]["containers"]
                image = container["image"]
                message = (IMAGE_MISSING if fault == "image-missing" else IMAGE_SLOW).format(
                    image=image)
                pod["status"]["containerStatuses"] = [{
                    "name": container["name"], "image": image, "ready": False,
                    "restartCount": 0, "state": {"waiting": {
                        "reason": "ImagePullBackOff",
                        "message": f'Back-off pulling image "{image}"'}}}]
                self.touch("", "pods", pod)
                self.event(pod, "Failed", f'Failed to pull image "{image}": {message}',
                           field=f"spec.containers{{{container['name']}}}")

    def _end(self, runner: dict, code: int, fault: str | None) -> None:
        """The runner's container ends with ``code``, as ``fault`` says."""
        (container,) = runner["spec"]["containers"]
        terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
        status: dict[str, Any] = {"phase": "Succeeded" if code == 0 else "Failed"}
        if fault == "oom":
            terminated = {"exitCode": 137, "reason": "OOMKilled"}
            status["phase"] = "Failed"
        elif fault in ("preempted", "evicted"):
            terminated = {"exitCode": 143, "reason": "Error"}
            status["phase"] = "Failed"
            status["conditions"] = [{
                "type": "DisruptionTarget", "status": "True",
                "reason": "PreemptionByScheduler" if fault == "preempted"
                else "TerminationByKubelet",
                "message": "Kubernetes Scheduler preempted this pod to make room for a "
                "higher-priority pod" if fault == "preempted" else
                "The node was low on resource: memory."}]
            if fault == "evicted":
                status["reason"] = "Evicted"
                status["message"] = ("The node was low on resource: memory. Threshold "
                                     "quantity: 100Mi, available: 42Mi.")
        elif fault == "evicted-disk":  # past its own limit: the kubelet evicts, no condition
            terminated = {"exitCode": 137, "reason": "Error"}
            limit = container["resources"]["limits"]["ephemeral-storage"]
            status.update(phase="Failed", reason="Evicted", message=(
                f"Pod ephemeral local storage usage exceeds the total limit of containers "
                f"{limit}."))
        status["containerStatuses"] = [{"name": container["name"], "ready": False,
                                        "restartCount": 0,
                                        "state": {"terminated": terminated}}]
        runner["status"] = status
        self.touch("", "pods", runner)

    def _operate(self, name: str, namespace: str, code: int | None,
                 fault: str | None) -> None:
        """What the Dask operator (and the kubelet, with ``fault``) does with a DaskJob, until
        it ends or is deleted."""

        def status(**fields: Any) -> bool:
            with self.lock:
                job = self.get(OPERATOR_GROUP, "daskjobs", name, namespace)
                if job is not None:
                    job.setdefault("status", {}).update(fields)
                return job is not None

        if fault == "no-operator":
            return
        time.sleep(self.step)
        with self.lock:
            job = self.get(OPERATOR_GROUP, "daskjobs", name, namespace)
            if job is None:
                return
            cluster = job["spec"]["cluster"]["spec"]
            runner = self._pod(job, f"{name}-runner", "job-runner", job["spec"]["job"]["spec"])
            scheduler = self._pod(job, f"{name}-scheduler-5d8f7b9c4-x2x7q", "scheduler",
                                  cluster["scheduler"]["spec"])
            worker = self._pod(job, f"{name}-default-worker-0f3c9a1e2b-8kq4z", "worker",
                               cluster["worker"]["spec"])
            status(jobStatus="ClusterCreated", clusterName=name,
                   jobRunnerPodName=runner["metadata"]["name"])
            if fault is not None:
                self._break(fault, runner, worker)
        if fault in ("unschedulable", "image-missing", "image-slow"):
            return  # stuck: until deleted
        time.sleep(self.step)
        with self.lock:
            for pod in (runner, scheduler, worker):
                pod["status"]["phase"] = "Running"
            if fault == "worker-oom":  # killed and restarted by its Deployment
                (container,) = worker["spec"]["containers"]
                worker["status"]["containerStatuses"] = [{
                    "name": container["name"], "ready": True, "restartCount": 1,
                    "state": {"running": {}},
                    "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]
            for pod in (runner, scheduler, worker):
                self.touch("", "pods", pod)
            if not status(jobStatus="Running"):
                return
        if code is None:
            return
        time.sleep(self.step)
        with self.lock:
            if self.get("", "pods", runner["metadata"]["name"], namespace) is None:
                return
            if fault == "worker-oom-at-end":
                # the worker killed, the workflow failing for it and the operator deleting the
                # cluster, all in one step: between two polls
                (container,) = worker["spec"]["containers"]
                worker["status"]["containerStatuses"] = [{
                    "name": container["name"], "ready": False, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]
                self.touch("", "pods", worker)
                self._end(runner, code, fault)
                for pod in (scheduler, worker):
                    self.delete("", "pods", namespace, pod["metadata"]["name"])
                status(jobStatus="Failed")
                return
            self._end(runner, code, fault)
            failed = runner["status"]["phase"] == "Failed"
        time.sleep(self.step)  # the kubelet reports the runner's end; the operator then acts
        with self.lock:
            # the operator deletes the cluster (its scheduler and workers) when the job ends
            for pod in (scheduler, worker):
                self.delete("", "pods", namespace, pod["metadata"]["name"])
            status(jobStatus="Failed" if failed else "Successful")

    # ------------------------------------------------------------------------ HTTP
    def handle(self, method: str, path: str, query: dict, body: bytes,
               auth: str | None) -> tuple[int, Any]:
        parts = [p for p in path.split("/") if p]
        if parts == ["version"] and method == "GET":  # public to every client, as in a cluster
            return 200, {"major": "1", "minor": "29", "gitVersion": "v1.29.0"}
        if parts[:2] == ["api", "v1"]:
            group, rest = "", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, rest = parts[1], parts[3:]
        else:
            return 404, _status(404, "NotFound", f"the server could not find {path}")
        if len(rest) < 3 or rest[0] != "namespaces":
            return 404, _status(404, "NotFound", f"not served by this stand-in: {path}")
        namespace, resource, name = rest[1], rest[2], (rest[3] if len(rest) > 3 else None)
        if len(rest) > 4:  # a subresource: a resource of its own for RBAC (pods/log, ...)
            resource = f"{resource}/{rest[4]}"
        verb = _VERBS.get(method) or ("get" if name else
                                      "watch" if query.get("watch") == ["true"] else "list")
        code, answer = self._answer(verb, group, resource, namespace, name, query, body, auth)
        with self.lock:
            self.requests.append((verb, group, resource, namespace, name, code))
        return code, answer

    def _answer(self, verb, group, resource, namespace, name, query, body, auth):
        if auth != f"Bearer {self.token}":
            return 401, _status(401, "Unauthorized", "Unauthorized")
        allowed = namespace == self.namespace and verb in self.rules.get((group, resource), ())
        if not allowed:
            what = f"{resource}.{group}" if group else resource
            return 403, _status(403, "Forbidden", (
                f'{what} is forbidden: User "{self.subject}" cannot {verb} resource '
                f'"{resource}" in API group "{group}" in the namespace "{namespace}"'))
        if group == OPERATOR_GROUP and not self.crds:
            return 404, _status(404, "NotFound", "the server could not find the requested "
                                "resource")
        if "/" in resource:
            return self._subresource(verb, group, resource, namespace, name)
        if verb == "get":
            obj = self.get(group, resource, name, namespace)
            if obj is None:
                return 404, _status(404, "NotFound", f'{resource} "{name}" not found')
            return 200, obj
        if verb == "watch":
            return 200, self._watch(group, resource, namespace, query)
        if verb == "list":
            wanted = dict(kv.split("=", 1) for kv in
                          (query.get("labelSelector", [""])[0].split(",")) if kv)
            with self.lock:
                items = [o for o in self.objects.get((group, resource, namespace), {}).values()
                         if all(o["metadata"].get("labels", {}).get(k) == v
                                for k, v in wanted.items())]
            return 200, {"kind": "List", "apiVersion": "v1",
                         "metadata": {"resourceVersion": "1"}, "items": items}
        if verb == "create":
            obj = json.loads(body)
            obj.setdefault("metadata", {})["namespace"] = namespace
            if self.get(group, resource, obj["metadata"]["name"], namespace) is not None:
                return 409, _status(409, "AlreadyExists", f'{resource} already exists')
            if resource == "daskjobs" and self.quota > 0:
                self.quota -= 1
                return 403, _status(403, "Forbidden", (
                    f'daskjobs.{group} "{obj["metadata"]["name"]}" is forbidden: '
                    f"{self.quota_message}"))
            if resource == "daskjobs" and self.validate is not None:
                try:
                    self.validate(obj)
                except Exception as exc:  # noqa: BLE001  (any schema error is a 422)
                    # one line, as the API server words it: the field, then what is wrong
                    field = ".".join(map(str, getattr(exc, "absolute_path", [])))
                    detail = getattr(exc, "message", str(exc))
                    return 422, _status(422, "Invalid", (
                        f'DaskJob.{group} "{obj["metadata"]["name"]}" is invalid: '
                        f"{field}: Invalid value: {detail}"))
            self.put(group, resource, obj)
            if resource == "daskjobs":
                threading.Thread(target=self._operate, daemon=True,
                                 args=(obj["metadata"]["name"], namespace,
                                       self.exit_code, self.fault)).start()
            return 201, obj
        if verb == "delete":
            if self.delete(group, resource, namespace, name) is None:
                return 404, _status(404, "NotFound", f'{resource} "{name}" not found')
            return 200, _status(200, "", "deleted", status="Success")
        return 405, _status(405, "MethodNotAllowed", f"{verb} is not served by this stand-in")

    def _watch(self, group: str, resource: str, namespace: str, query: dict):
        """The event lines of a watch: what matches now (``ADDED``), then each change."""
        wanted = dict(kv.split("=", 1) for kv in
                      (query.get("labelSelector", [""])[0].split(",")) if kv)
        timeout = float(query.get("timeoutSeconds", ["3600"])[0])

        def matches(obj: dict) -> bool:
            return all(obj["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())

        def lines():
            end = time.monotonic() + timeout
            with self.lock:
                start = len(self.changes)
                now = [copy.deepcopy(o) for o in
                       self.objects.get((group, resource, namespace), {}).values() if matches(o)]
            for obj in now:
                yield json.dumps({"type": "ADDED", "object": obj}) + "\n"
            seen = start
            while not self.closed and time.monotonic() < end:
                with self.changed:
                    if seen == len(self.changes):
                        self.changed.wait(0.2)
                    new, seen = self.changes[seen:], len(self.changes)
                for g, r, ns, kind, obj in new:
                    if (g, r, ns) == (group, resource, namespace) and matches(obj):
                        yield json.dumps({"type": kind, "object": obj}) + "\n"

        return lines()

    def _subresource(self, verb, group, resource, namespace, name):
        """A pod's ``log``, ``status`` or ``exec``, once RBAC let the request through."""
        obj = self.get(group, resource.split("/")[0], name, namespace)
        if obj is None:
            return 404, _status(404, "NotFound", f'{resource.split("/")[0]} "{name}" not found')
        if resource == "pods/status" and verb == "get":
            return 200, obj
        if resource == "pods/log" and verb == "get":
            return 200, "the container's log\n"
        if resource == "pods/exec":  # a real server wants an upgrade to a streaming protocol
            return 400, _status(400, "BadRequest", "Upgrade request required")
        return 405, _status(405, "MethodNotAllowed", f"{verb} {resource} is not served")


def _status(code: int, reason: str, message: str, status: str = "Failure") -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": status,
            "message": message, "reason": reason, "code": code}


def serve(api: KubeAPI, certfile: str, keyfile: str) -> tuple[ThreadingHTTPServer, int]:
    """Serve ``api`` over HTTPS on 127.0.0.1 (a free port) in a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def _do(self) -> None:
            url = urlparse(self.path)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            code, answer = api.handle(self.command, url.path, parse_qs(url.query), body,
                                      self.headers.get("Authorization"))
            if not isinstance(answer, (str, dict)):  # a watch: lines as they happen
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    for line in answer:
                        self.wfile.write(line.encode())
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                    pass  # the client went away
                self.close_connection = True
                return
            text = isinstance(answer, str)  # a pod's log is plain text
            data = (answer if text else json.dumps(answer)).encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if text else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _do

        def log_message(self, *args: Any) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certfile, keyfile)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    # a short poll interval: shutdown() waits for it, once per test
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    return server, server.server_address[1]
