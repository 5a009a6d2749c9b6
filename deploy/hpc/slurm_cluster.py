"""A Dask cluster on SLURM (dask-jobqueue) that dr-dask jobs join through a scheduler file.

Run it where it may keep running (a login node that allows it, or a small long allocation)::

    python deploy/hpc/slurm_cluster.py --scheduler-file ~/dr-dask/scheduler.json \\
        --queue compute --account myproject --max-jobs 16 [--interface ib0] \\
        [--local-directory '/local/$USER'] [--walltime 04:00:00]

The scheduler runs in this process and writes its address to the scheduler file; each SLURM
job is one `dask worker` (the batch script dask-jobqueue renders, see --print-job-script),
started and stopped by the adaptive scaler as jobs submit work; each worker retires before its
job's wall time (``--lifetime``, staggered) and is replaced, so a job longer than the wall time
(the weekly refit) keeps its cluster. Jobs then join with
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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dask_jobqueue import SLURMCluster

logger = logging.getLogger(__name__)


#: Where workers spill, on the node's local disk: SLURM's per-job $TMPDIR where the site sets
#: one, else /tmp (a bare $TMPDIR would expand to nothing and swallow the option's value).
LOCAL_DIRECTORY = "${TMPDIR:-/tmp}"


def walltime_seconds(walltime: str) -> int:
    """SLURM's time formats (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
    ``D-HH:MM:SS``) in seconds."""
    days, _, clock = walltime.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:  # with days, the clock starts at hours
        hours, minutes, seconds = ([*parts, 0, 0])[:3]
    else:
        hours, minutes, seconds = {1: [0, parts[0], 0], 2: [0, *parts], 3: parts}[len(parts)]
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def lifetime(walltime: str) -> tuple[int, int]:
    """(lifetime, stagger) in seconds for the workers of jobs that may run ``walltime``.

    A worker past its ``--lifetime`` retires gracefully (its results move to other workers,
    the adaptive scaler submits a replacement job), so a computation outlives the workers' wall
    time, as the weekly refit (25 h) does workers of 4 h. It must retire before SLURM kills the
    job: the margin (15 minutes, a fifth of a shorter wall time) holds the stagger, which
    spreads the retirements of workers started together (dask draws within +/- it), and
    leaves two thirds of it for the retirement itself.
    """
    total = walltime_seconds(walltime)
    margin = min(15 * 60, total // 5)
    return total - margin, margin // 3


def make_cluster(scheduler_file: str, *, cores: int = 8, memory: str = "32GiB",
                 processes: int = 4, walltime: str = "04:00:00",
                 local_directory: str = LOCAL_DIRECTORY, interface: str | None = None,
                 scheduler_interface: str | None = None, **job_kwargs: Any) -> SLURMCluster:
    """A SLURMCluster whose scheduler writes ``scheduler_file``; no worker job submitted yet.

    Parameters
    ----------
    scheduler_file : str
        Path of the JSON file clients join through.
    cores, memory, processes, walltime
        Per SLURM job: cores and memory requested, worker processes it runs (dr_dask's tasks
        are BLAS-bound: about one process per 2 cores), and its time limit; its workers retire
        before it (:func:`lifetime`).
    local_directory : str
        The workers' spill and scratch directory, on the node's local disk (expanded by the
        job's shell: ``$TMPDIR``, ``/local/$USER``, ...), never the shared filesystem.
    interface : str, optional
        The network interface the workers listen on (``ib0`` for InfiniBand, ...); default:
        the address of the node's hostname. The scheduler uses it too unless
        ``scheduler_interface`` names another (the login node's).
    **job_kwargs
        Anything else SLURMCluster takes (queue, account, job_extra_directives, ...).
    """
    os.makedirs(os.path.dirname(os.path.abspath(scheduler_file)), exist_ok=True)
    life, stagger = lifetime(walltime)
    scheduler_options: dict[str, Any] = {"scheduler_file": scheduler_file,
                                         "dashboard_address": ":8787"}
    if scheduler_interface:
        scheduler_options["interface"] = scheduler_interface
    # imported here, after main() has blocked SIGINT and SIGTERM: loading it loads numpy, whose
    # BLAS starts its threads then, and a thread started before the mask would take the signal
    # (SIGTERM's default action kills the process before the cluster is closed)
    from dask_jobqueue import SLURMCluster

    return SLURMCluster(
        cores=cores, memory=memory, processes=processes, walltime=walltime,
        local_directory=local_directory, interface=interface,
        worker_extra_args=["--lifetime", f"{life}s", "--lifetime-stagger", f"{stagger}s"],
        scheduler_options=scheduler_options,
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
    parser.add_argument("--walltime", default="04:00:00",
                        help="each worker job's time limit; its workers retire before it")
    parser.add_argument("--local-directory", default=LOCAL_DIRECTORY,
                        help="the workers' spill directory on node-local disk (default: "
                        "%(default)s, expanded on the node)")
    parser.add_argument("--interface", default=None,
                        help="network interface of the workers (and of the scheduler, unless "
                        "--scheduler-interface), e.g. ib0")
    parser.add_argument("--scheduler-interface", default=None,
                        help="network interface of the scheduler, where it differs")
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
                           processes=args.processes, walltime=args.walltime,
                           local_directory=args.local_directory, interface=args.interface,
                           scheduler_interface=args.scheduler_interface, queue=args.queue,
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
