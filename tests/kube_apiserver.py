"""A stand-in of the Kubernetes API server on 127.0.0.1, for the DaskJob submitter's tests.

No API server can be installed on the test machines, so this one serves what the submitter
calls, over HTTPS, with the rules a real one applies to a ServiceAccount:

- a bearer token is required (401 otherwise);
- the ServiceAccount's Role (rbac.yaml, parsed) is enforced per API group, resource and verb
  (get, list, watch, create, delete, patch, update), and only in the namespace of its
  RoleBinding: anything else is a 403 with the API server's Status body;
- objects are namespaced; names are unique (409); created DaskJobs are validated against the
  Dask operator's CRD schema (422); deleting an object deletes what it owns (garbage
  collection by ownerReferences, at once);
- list honours equality label selectors; get of an absent object is a 404; ``/version`` is
  public (kr8s reads it first).

It also plays the Dask operator for each created DaskJob: status ``ClusterCreated`` with a
runner pod ``<name>-runner`` (owned by the DaskJob), ``Running``, then, when
:attr:`KubeAPI.exit_code` is not None, the runner container terminated with that code and the
DaskJob ``Successful`` (0) or ``Failed`` (as the operator's runner-pod handlers do).
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

_VERBS = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}


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
        self.lock = threading.RLock()

    # ------------------------------------------------------------------------ objects
    def put(self, group: str, resource: str, obj: dict) -> dict:
        """Store ``obj`` (as a create would), filling uid, namespace and creationTimestamp."""
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", self.namespace)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp",
                        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        with self.lock:
            self.objects.setdefault((group, resource, meta["namespace"]), {})[meta["name"]] = obj
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
            uid = obj["metadata"]["uid"]
            for (g, r, ns), objs in list(self.objects.items()):  # garbage collection
                for child, o in list(objs.items()):
                    refs = o["metadata"].get("ownerReferences", [])
                    if ns == namespace and any(ref.get("uid") == uid for ref in refs):
                        self.delete(g, r, ns, child)
        return obj

    # ------------------------------------------------------------------------ operator
    def _operate(self, name: str, namespace: str, code: int | None) -> None:
        """What the Dask operator does with a DaskJob, until it ends or is deleted."""
        group = "kubernetes.dask.org"

        def status(**fields: Any) -> bool:
            with self.lock:
                job = self.get(group, "daskjobs", name, namespace)
                if job is not None:
                    job.setdefault("status", {}).update(fields)
                return job is not None

        time.sleep(self.step)
        runner = f"{name}-runner"
        with self.lock:
            job = self.get(group, "daskjobs", name, namespace)
            if job is None:
                return
            self.put("", "pods", {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": runner, "namespace": namespace,
                             "labels": {"dask.org/component": "job-runner",
                                        "dask.org/cluster-name": name},
                             "ownerReferences": [{
                                 "apiVersion": "kubernetes.dask.org/v1", "kind": "DaskJob",
                                 "name": name, "uid": job["metadata"]["uid"]}]},
                "spec": job["spec"]["job"]["spec"],
                "status": {"phase": "Pending"}})
            status(jobStatus="ClusterCreated", clusterName=name, jobRunnerPodName=runner)
        time.sleep(self.step)
        if not status(jobStatus="Running"):
            return
        if code is None:
            return
        time.sleep(self.step)
        with self.lock:
            pod = self.get("", "pods", runner, namespace)
            if pod is None:
                return
            container = pod["spec"]["containers"][0]["name"]
            pod["status"] = {
                "phase": "Succeeded" if code == 0 else "Failed",
                "containerStatuses": [{"name": container, "state": {
                    "terminated": {"exitCode": code, "reason": "Completed" if code == 0
                                   else "Error"}}}]}
            status(jobStatus="Successful" if code == 0 else "Failed")

    # ------------------------------------------------------------------------ HTTP
    def handle(self, method: str, path: str, query: dict, body: bytes,
               auth: str | None) -> tuple[int, dict]:
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
        if verb == "get":
            obj = self.get(group, resource, name, namespace)
            if obj is None:
                return 404, _status(404, "NotFound", f'{resource} "{name}" not found')
            return 200, obj
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
            if resource == "daskjobs" and self.validate is not None:
                try:
                    self.validate(obj)
                except Exception as exc:  # noqa: BLE001  (any schema error is a 422)
                    return 422, _status(422, "Invalid", str(exc))
            self.put(group, resource, obj)
            if resource == "daskjobs":
                threading.Thread(target=self._operate, daemon=True,
                                 args=(obj["metadata"]["name"], namespace,
                                       self.exit_code)).start()
            return 201, obj
        if verb == "delete":
            if self.delete(group, resource, namespace, name) is None:
                return 404, _status(404, "NotFound", f'{resource} "{name}" not found')
            return 200, _status(200, "", "deleted", status="Success")
        return 405, _status(405, "MethodNotAllowed", f"{verb} is not served by this stand-in")


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
            data = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
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
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]
