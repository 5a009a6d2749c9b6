"""The exit codes of dr-dask: one table, from which every command (:mod:`dr_dask.cli`), the
workflow runner (:mod:`dr_dask.jobs.workflow`), the Kubernetes submitter
(``deploy/kubernetes/submit_daskjob.py``) and the docs (``docs/workflows.md``, the commands'
``--help``) take theirs.

A code is a class: what a retry can do. 0 done; 2 only a change by the user can help (bad
input, parameter or configuration, a location that cannot be written, a full disk, a result
changed since it was written), so a scheduler never retries it; 1 a retry may help (transient:
the cluster, the store, a lease held by another run) or a bug (the message says "internal
error"). A full disk is a 2: the message names the location and its free bytes, and no retry
frees them (``docs/decisions.md`` EXIT-DISK).
"""

from __future__ import annotations

#: Done, including "nothing to do".
EXIT_OK = 0
#: Transient or internal: a retry (later) may help.
EXIT_TRANSIENT = 1
#: Bad input or configuration: the message names what to change; never retried.
EXIT_BAD_INPUT = 2

#: code -> (what it means, what a scheduler does with it). The one table.
TABLE: dict[int, tuple[str, str]] = {
    EXIT_OK: ("done, including \"nothing to do\"", "nothing"),
    EXIT_BAD_INPUT: (
        "bad input or configuration, named in the one error line: an option, parameter, "
        "input, model or workflow file, storage option or --tls file; an output or report "
        "location that cannot be written (permissions, a read-only filesystem, /proc) or a "
        "full disk (its location and free bytes); a result changed since it was written (the "
        "chunk); a lease object no run wrote; workers out of memory (the fix)",
        "fix what the line names; do not retry"),
    EXIT_TRANSIENT: (
        "transient: the cluster was lost (the stage a rerun resumes from) or did not answer, "
        "no worker joined within --wait-for-workers, another run holds the lease, the store "
        "was unreachable, timed out, throttled or failed (5xx); or an internal error (a bug: "
        "rerun with -v for the traceback)",
        "retry later: a rerun resumes from the completed work"),
}


def retried(code: int | None) -> bool:
    """Whether a scheduler retries an attempt that ended with ``code`` (None: it was stopped
    at its timeout): anything but done and bad input."""
    return code not in (EXIT_OK, EXIT_BAD_INPUT)


def classed(code: int | None) -> int:
    """``code`` as one of the three classes (a signal, a crash, a timeout: transient)."""
    return code if code in (EXIT_OK, EXIT_BAD_INPUT) else EXIT_TRANSIENT


def help_text() -> str:
    """The table as the epilog of ``--help`` (click keeps a ``\\b`` paragraph as written)."""
    import textwrap

    lines = ["\b", "Exit codes:"]
    for code in (EXIT_OK, EXIT_TRANSIENT, EXIT_BAD_INPUT):
        meaning, _ = TABLE[code]
        wrapped = textwrap.wrap(meaning, 84)
        lines.append(f"  {code}  {wrapped[0]}")
        lines.extend(f"     {line}" for line in wrapped[1:])
    return "\n".join(lines)


def markdown_table() -> str:
    """The table as Markdown (``docs/workflows.md`` holds it verbatim; a test compares)."""
    rows = ["| exit code | meaning | what a scheduler should do |", "|---|---|---|"]
    rows += [f"| {code} | {TABLE[code][0]} | {TABLE[code][1]} |"
             for code in (EXIT_OK, EXIT_BAD_INPUT, EXIT_TRANSIENT)]
    return "\n".join(rows)
