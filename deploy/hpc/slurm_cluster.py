"""A Dask cluster on SLURM (dask-jobqueue) that dr-dask jobs join through a scheduler file.

Run it where it may keep running (a login node that allows it, or a small long allocation)::

    python deploy/hpc/slurm_cluster.py --scheduler-file ~/dr-dask/scheduler.json \\
        --queue compute --account myproject --max-jobs 16

The scheduler runs in this process and writes its address to the scheduler file; each SLURM
job is one `dask worker` (the batch script dask-jobqueue renders, see --print-job-script),
started and stopped by the adaptive scaler as jobs submit work. Jobs then join with
``dr-dask --scheduler-file ~/dr-dask/scheduler.json run ...`` (see nightly.sbatch) or, from
Python, ``distributed.Client(scheduler_file=...)``. The scheduler file must be on a filesystem
the jobs see (home or a shared scratch), like the Zarr stores.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
from typing import Any

from dask_jobqueue import SLURMCluster

logger = logging.getLogger(__name__)


def make_cluster(scheduler_file: str, *, cores: int = 8, memory: str = "32GiB",
                 processes: int = 4, walltime: str = "04:00:00", **job_kwargs: Any) -> SLURMCluster:
    """A SLURMCluster whose scheduler writes ``scheduler_file``; no worker job submitted yet.

    Parameters
    ----------
    scheduler_file : str
        Path of the JSON file clients join through.
    cores, memory, processes, walltime
        Per SLURM job: cores and memory requested, worker processes it runs (dr_dask's tasks
        are BLAS-bound: about one process per 2 cores), and its time limit.
    **job_kwargs
        Anything else SLURMCluster takes (queue, account, job_extra_directives, ...).
    """
    os.makedirs(os.path.dirname(os.path.abspath(scheduler_file)), exist_ok=True)
    return SLURMCluster(
        cores=cores, memory=memory, processes=processes, walltime=walltime,
        # spill and numba caches on node-local disk, not the shared filesystem
        local_directory="$TMPDIR",
        scheduler_options={"scheduler_file": scheduler_file, "dashboard_address": ":8787"},
        **job_kwargs,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheduler-file", required=True)
    parser.add_argument("--queue", default=None, help="SLURM partition")
    parser.add_argument("--account", default=None, help="SLURM account")
    parser.add_argument("--cores", type=int, default=8)
    parser.add_argument("--memory", default="32GiB")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--walltime", default="04:00:00")
    parser.add_argument("--min-jobs", type=int, default=0)
    parser.add_argument("--max-jobs", type=int, default=8)
    parser.add_argument("--print-job-script", action="store_true",
                        help="print the worker batch script and exit")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # scancel sends SIGTERM, Ctrl-C SIGINT: blocked in every thread (the mask is inherited by the
    # threads the cluster starts) and taken by sigwait below, so that either one closes the
    # cluster and removes the scheduler file instead of killing the process (exit 143) and
    # leaving a file that points the next job at a dead scheduler
    stop = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    cluster = make_cluster(args.scheduler_file, cores=args.cores, memory=args.memory,
                           processes=args.processes, walltime=args.walltime, queue=args.queue,
                           account=args.account)
    if args.print_job_script:
        print(cluster.job_script())
        cluster.close()
        return
    cluster.adapt(minimum_jobs=args.min_jobs, maximum_jobs=args.max_jobs)
    logger.info("scheduler %s; dashboard %s; scheduler file %s", cluster.scheduler_address,
                cluster.dashboard_link, args.scheduler_file)
    try:
        received = signal.sigwait(stop)  # until scancel / Ctrl-C
        logger.info("%s: closing the cluster", signal.Signals(received).name)
    finally:
        cluster.close()
        with contextlib.suppress(FileNotFoundError):  # the scheduler may have removed it
            os.remove(args.scheduler_file)


if __name__ == "__main__":
    main()
