"""Orphans of a job under ``tpuctl run``: the processes it leaves behind, reaped by ``tpuctl run``.

On Linux ``tpuctl run`` always makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``,
:func:`become_subreaper`), so processes the job leaves behind (double forks, ``cmd &`` in a job script that
exits) are re-parented to it rather than to the container's PID 1, and it reaps them
(:func:`reap_orphans`) once a second while the job runs and once more when it ends; as PID 1 of a
container it is their reaper anyway. Only exited children other than the job are reaped (peeked at with
``waitid(WNOWAIT)`` first, or, while the job's own zombie is the first child the kernel reports, reaped one
by one from ``/proc/self/task/*/children``), so the job's exit status stays with the thread that waits for
it. ``tpuctl run`` starts no other children of its own.
"""

from __future__ import annotations

import contextlib
import os
import sys

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux >= 3.4): orphaned descendants are re-parented to it.

    False where the call is not available (not Linux, no libc, refused); tpuctl works on without it.
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes  # only here: the rest of tpuctl run does without it

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):  # pragma: no cover - no prctl in this process's libraries
        return False


def reap_orphans(job_pid: int) -> list[int]:
    """Reap every exited child of this process except ``job_pid``; the pids reaped.

    Each exited child is looked at with ``waitid(P_ALL, WNOWAIT)`` (which leaves it waitable) and reaped by
    its pid only when it is not the job, so a thread blocked in ``waitpid(job_pid)`` still gets the job's
    status. ``waitid`` reports the first waitable child in the kernel's list, which is the job (the oldest
    child) once it has exited: from then until its thread reaps it, every exited orphan behind it is
    reaped by its pid instead, from the list of this process's children (:func:`children`).
    """
    waitid = getattr(os, "waitid", None)
    nowait = getattr(os, "WNOWAIT", None)
    if waitid is None or nowait is None:  # pragma: no cover - not Linux/BSD
        return []
    reaped: list[int] = []
    while True:
        try:
            found = waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | nowait)
        except ChildProcessError:
            return reaped  # no children at all
        except InterruptedError:  # pragma: no cover - PEP 475 retries
            continue
        if found is None or found.si_pid == 0:
            return reaped
        if found.si_pid == job_pid:  # the job's zombie hides the rest: reap them one by one
            return reaped + [pid for pid in children() if pid != job_pid and _reap_exited(pid)]
        if _reap_exited(found.si_pid):
            reaped.append(found.si_pid)


def children() -> list[int]:
    """This process's children, from ``/proc/self/task/*/children`` (Linux 3.5+; each thread lists the
    children it forked or adopted); empty where the files do not exist."""
    pids: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.scandir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"{task.path}/children") as listing:  # OSError: a thread ended
                pids += [int(p) for p in listing.read().split()]
    return pids


def _reap_exited(pid: int) -> bool:
    """Reap ``pid`` if it has exited; False while it runs (or when it is not our child)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == pid
