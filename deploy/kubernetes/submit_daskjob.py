"""Submit a DaskJob and wait for it; exit with its job runner's exit code.

The nightly CronJob's pod runs this with the dr-dask image (which ships ``kr8s``, the Kubernetes
client dask-kubernetes itself uses) and the ServiceAccount of rbac.yaml. Each run gets a name of
its own (the template's name plus the UTC time) so that finished DaskJobs stay inspectable. The
exit code is the workflow's: 0 done, 2 bad input or configuration (the CronJob's podFailurePolicy
does not retry it), 1 anything else.

    python submit_daskjob.py daskjob-nightly.yaml [--poll SECONDS]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import kr8s
import yaml
from kr8s.objects import Pod, new_class

DaskJob = new_class("DaskJob", version="kubernetes.dask.org/v1", namespaced=True)


def dated(spec: dict, when: time.struct_time) -> dict:
    """The DaskJob ``spec`` renamed for one run, its scheduler Service selecting its cluster."""
    job = copy.deepcopy(spec)
    name = job["metadata"]["name"] + time.strftime("-%Y%m%d-%H%M%S", when)
    job["metadata"]["name"] = name
    # the operator names the job's cluster after the job: the scheduler Service must select it
    service = job["spec"]["cluster"]["spec"]["scheduler"]["service"]
    service.setdefault("selector", {})["dask.org/cluster-name"] = name
    return job


def runner_exit_code(job) -> int:
    """The job runner container's exit code (1 when it is unknown)."""
    name = job.raw.get("status", {}).get("jobRunnerPodName")
    if not name:
        return 1
    try:
        pod = Pod.get(name, namespace=job.namespace)
    except kr8s.NotFoundError:
        return 1
    for status in pod.raw.get("status", {}).get("containerStatuses", []):
        terminated = status.get("state", {}).get("terminated") or {}
        if terminated.get("exitCode"):
            return int(terminated["exitCode"])
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifest", help="DaskJob manifest (YAML)")
    parser.add_argument("--poll", type=float, default=30.0, help="seconds between status reads")
    args = parser.parse_args()
    with open(args.manifest) as fh:
        spec = yaml.safe_load(fh)
    job = DaskJob(dated(spec, time.gmtime()))
    job.create()
    print(f"created daskjob {job.name}", flush=True)
    status = None
    while status not in ("Successful", "Failed"):
        time.sleep(args.poll)
        job.refresh()
        new = job.raw.get("status", {}).get("jobStatus")
        if new != status:
            print(f"daskjob {job.name}: {new}", flush=True)
            status = new
    return 0 if status == "Successful" else runner_exit_code(job)


if __name__ == "__main__":
    sys.exit(main())
