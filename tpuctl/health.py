"""The one health verdict of a cluster, shared by ``tpuctl status``, ``tpuctl run`` and ``tpuctl barrier``.

:func:`cluster_health` reads the status document a host's agent answers (``Op.STATUS``: every task's
state, heartbeat age and cause, the cluster's error) and decides:

========  ===========================================================================================
healthy   every task connected, heartbeating, and the cluster in no error
degraded  every task still in, but one is not registered (yet) or its heartbeat is late (older than
          half the heartbeat timeout), or this host re-forms as the next generation (restart policy
          rejoin, within the restart timeout): jobs may start, the verdict says which host to watch
failed    the cluster is in error, or a task failed or left (``tpuctl down`` on that host): barriers
          cannot pass, ``status`` and ``barrier`` exit 3, ``run`` refuses to start a job
========  ===========================================================================================

When the coordinator does not answer, the agent lists every host itself: the coordinator (task 0)
``unreachable`` (the failed host when the cluster is in error; while this host re-forms, the re-forming
says it), the rest ``unknown`` (no problem by itself: only the coordinator knew).

The words naming a task and what happened to it (:func:`left`, :data:`LEFT_CAUSE`) are the service's
too (its barrier verdicts), so the three commands say the same sentence. Pure: no clock, no I/O, the
standard library only (``tpuctl status`` runs it on the light path). Cost O(tasks).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported on the light path (a Record is tpuctl.records' at run time)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any
    from typing import NamedTuple as Record
else:
    from tpuctl.records import Record

HEALTHY = "healthy"
DEGRADED = "degraded"
FAILED = "failed"
VERDICTS = (HEALTHY, DEGRADED, FAILED)

LEFT = "left the cluster"
LEFT_CAUSE = "it disconnected (tpuctl down, or its agent stopped)"
"""Why a task in state ``disconnected`` is gone: it said goodbye (the service records no more)."""
LEFT_CAUSE_MANY = "they disconnected (tpuctl down, or their agents stopped)"
LATE_FRACTION = 0.5
"""A heartbeat older than this fraction of the heartbeat timeout is late (the host is degraded)."""
LISTED = 10
"""Problems named in one line of a message; ``status --format json`` lists them all."""


def task_name(task: object, address: object) -> str:
    """``task 2 (10.0.0.4)``: how every message names a task (as the coordination service does)."""
    return f"task {task} ({address})"


def left(names: Sequence[str], total: int | None = None) -> str:
    """``task 1 (10.0.0.3) left the cluster: it disconnected (...)``, for one task or several."""
    total = len(names) if total is None else total
    more = total - len(names)
    who = ", ".join(names) + (f", ... and {more:,} more" if more > 0 else "")
    return f"{who} {LEFT}: {LEFT_CAUSE if total == 1 else LEFT_CAUSE_MANY}"


class Problem(Record):
    """One reason the cluster is not healthy: a task (None: the cluster as a whole) and what is wrong."""

    verdict: str
    task: int | None
    address: str
    state: str
    cause: str

    def __str__(self) -> str:
        if self.task is None:
            return self.cause
        name = task_name(self.task, self.address)
        if self.state == "disconnected":
            return left([name])
        return f"{name} {self.cause}" if self.verdict == DEGRADED else f"{name} failed: {self.cause}"

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "address": self.address or None, "state": self.state, "problem": str(self)}


class Health(Record):
    """The verdict and every problem behind it (failures first, in task order)."""

    verdict: str
    problems: tuple[Problem, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether a job may start: healthy or degraded."""
        return self.verdict != FAILED

    def describe(self, limit: int = LISTED) -> str:
        """``failed: task 1 (10.0.0.3) left the cluster: ...; task 2 ...``: the first ``limit`` problems."""
        if not self.problems:
            return self.verdict
        shown = "; ".join(str(p) for p in self.problems[:limit])
        more = len(self.problems) - limit
        return f"{self.verdict}: {shown}" + (f"; ... and {more:,} more (tpuctl status lists all)" if more > 0 else "")

    def headline(self, cluster: object) -> str:
        """``cluster 'pod-a' is not healthy: failed: task 1 (...) left the cluster: ...`` (status, run)."""
        if self.verdict == HEALTHY:
            return f"cluster {cluster!r} is healthy"
        if self.verdict == FAILED:
            return f"cluster {cluster!r} is not healthy: {self.describe()}"
        return f"cluster {cluster!r} is {self.describe()}"  # "is degraded: task 1 (...) ..."

    def verdict_line(self, cluster: object) -> str:
        """``cluster 'pod-a' is not healthy: failed (1 problem, under health above)``: ``tpuctl status``'s
        stderr after its text, which names every problem already (each cause is printed once)."""
        if self.verdict == HEALTHY:
            return f"cluster {cluster!r} is healthy"
        problems = f"{len(self.problems):,} problem{'' if len(self.problems) == 1 else 's'}"
        if self.verdict == FAILED:
            return f"cluster {cluster!r} is not healthy: {self.verdict} ({problems}, under health above)"
        return f"cluster {cluster!r} is {self.verdict} ({problems}, under health above)"

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "problems": [p.to_json() for p in self.problems]}


NOT_MEMBERS = ("standby", "out")
"""Roles of hosts outside the current generation (spares, left-out slices): their state is not the cluster's health."""


def cluster_health(status: Mapping[str, Any], heartbeat_timeout: float | None = None) -> Health:
    """The verdict on a status document (``tpuctl status --format json``'s keys ``tasks``, ``error``).

    ``heartbeat_timeout``: the cluster's, in seconds (else the document's ``heartbeat_timeout``; without
    either, a late heartbeat is not judged).
    """
    timeout = heartbeat_timeout if heartbeat_timeout is not None else status.get("heartbeat_timeout")
    failed: list[Problem] = []
    degraded: list[Problem] = []
    for entry in status.get("tasks") or ():
        if entry.get("role") in NOT_MEMBERS:
            continue  # a spare, or a host the generation left out: the status's spares section lists them
        task, address, state = entry.get("task"), str(entry.get("address") or "?"), str(entry.get("state"))
        if state == "failed":
            failed.append(Problem(FAILED, task, address, state, str(entry.get("cause") or "no cause given")))
        elif state == "disconnected":
            failed.append(Problem(FAILED, task, address, state, LEFT_CAUSE))
        elif state == "unreachable":  # the coordinator, as a host that cannot reach it lists it
            if status.get("error"):  # the cluster's error is that: named once, with its host
                failed.append(Problem(FAILED, task, address, state, str(entry.get("cause") or status["error"])))
        elif state == "unknown":
            pass  # only the coordinator knew, and it does not answer: the error (or re-forming) says why
        elif state == "waiting":
            degraded.append(Problem(DEGRADED, task, address, state, "has not registered (yet)"))
        elif state != "connected":
            degraded.append(Problem(DEGRADED, task, address, state, f"is {state}"))
        elif _late(entry.get("heartbeat_age"), timeout):
            age = float(entry["heartbeat_age"])
            cause = f"is late: last heartbeat {age:.1f} s ago (timeout {float(timeout):g} s)"  # type: ignore[arg-type]
            degraded.append(Problem(DEGRADED, task, address, state, cause))
    error = status.get("error")
    if error and not failed:  # the coordinator unreachable, a shutdown: no task row says it
        failed.append(Problem(FAILED, None, "", "error", str(error)))
    watchdog = status.get("watchdog")
    for verdict in (watchdog.get("verdicts") or ()) if type(watchdog) is dict else ():
        kind = str(verdict.get("kind"))
        if kind in ("hang", "straggler"):  # the job's progress says what heartbeats cannot: not whole
            state = "hung" if kind == "hang" else kind
            degraded.append(Problem(DEGRADED, None, "", state, f"watchdog: {verdict.get('message')}"))
    rejoining = status.get("rejoining")
    if rejoining and not failed:  # within the restart timeout: not failed, not whole either
        degraded.insert(0, Problem(DEGRADED, None, "", "re-forming", f"this host is re-forming: {rejoining}"))
    if failed:
        return Health(FAILED, (*failed, *degraded))
    if degraded:
        return Health(DEGRADED, tuple(degraded))
    return Health(HEALTHY)


def heartbeat_text(task: Mapping[str, Any]) -> str:
    """A task's HEARTBEAT cell: ``1.2s ago`` (its last heartbeat's measured age), ``<1.0s ago`` (its
    session is open: the coordinator's keepalive pings vouch for it, the last answered less than that
    long ago), ``-`` (none yet, or not known)."""
    age = task.get("heartbeat_age")
    if type(age) not in (int, float):
        return "-"
    return f"<{age:.1f}s ago" if task.get("session_open") else f"{age:.1f}s ago"


def _late(age: object, timeout: object) -> bool:
    numbers = (int, float)
    if not isinstance(age, numbers) or not isinstance(timeout, numbers) or isinstance(timeout, bool) or timeout <= 0:
        return False
    return float(age) > LATE_FRACTION * float(timeout)


__all__ = [
    "DEGRADED",
    "FAILED",
    "HEALTHY",
    "LEFT",
    "LEFT_CAUSE",
    "LEFT_CAUSE_MANY",
    "Health",
    "Problem",
    "cluster_health",
    "heartbeat_text",
    "left",
    "task_name",
]
