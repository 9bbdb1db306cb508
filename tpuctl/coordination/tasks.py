"""The registration table: every task's record, who has been silent longest, and the identity checks.

Pure: no grpc, no asyncio, no clock. The state machine (``state.py``) decides what a call does; this
table keeps the per-task facts it decides on: each task's registration (incarnation, credential, host)
and its liveness. Connected tasks without an open session are kept in the order of their last sign of
life (``Silences``), so finding the late ones visits only those; a task with an open session stream is
alive while it stays open (the transport's keepalive pings vouch for it), and when its last session
ends its silence counts from one keepalive window before.
"""

from __future__ import annotations

import dataclasses
import hmac
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from tpuctl.coordination.values import (
    Counters,
    Reason,
    Refused,
    Registration,
    TaskInfo,
    TaskRef,
    TaskState,
    TaskStatus,
    keepalive_interval,
    keepalive_window,
)
from tpuctl.messages import shown


@dataclass
class TaskRecord:
    """One task's row: its registration, its liveness, and whether it is reserved for a survivor."""

    info: TaskInfo
    state: TaskState = TaskState.WAITING
    incarnation: int = 0
    hostname: str = ""
    peer: str = ""
    last_heartbeat: float = 0.0
    cause: str = ""
    credential: bytes = b""
    fingerprint: str = ""
    retry_secret: bytes = b""
    reserved: bool = False
    """A survivor of the last generation: only its own process (incarnation and retry secret, or its
    credential) may register it into this one, keeping its credential, until it has been silent for the
    heartbeat timeout (then it is presumed dead too and anyone may take the task)."""
    stalled_at_heartbeat: float = 0.0
    """The service's stalled seconds (``CoordinationState.stalled``) when this task was last heard from."""
    sessions: set[int] = dataclasses.field(default_factory=set)
    """The open session streams of this task's current process, by the executor's ids (while one is open,
    the task is alive)."""
    session_ended_at: float | None = None
    """When its last session ended, while no heartbeat came since (for the failure's cause)."""


def observed_address(peer: str) -> str:
    """Where a call came from, as the coordinator's transport saw it: gRPC's ``ipv4:10.0.0.3:51234`` ->
    ``10.0.0.3:51234``, ``ipv6:[::1]:5000`` (or ``%5B::1%5D``) -> ``[::1]:5000``; another form as it is."""
    kind, sep, rest = peer.partition(":")
    if not sep or kind not in ("ipv4", "ipv6"):
        return peer or "an address not recorded"
    return rest.replace("%5B", "[").replace("%5D", "]")


def registered_by(task: TaskRecord) -> str:
    """Who holds ``task``'s registration, as far as it is known: the address the call came from (seen by the
    coordinator) and the host name the process gave (its own word: with auth none, anything that reaches
    the coordinator may register, calling itself anything), e.g. ``connected from 10.0.0.9:51234 (as the
    coordinator saw it), calling itself 'host-1' (unchecked), fingerprint 1a2b3c4d``."""
    return (
        f"connected from {observed_address(task.peer)} (as the coordinator saw it), calling itself "
        f"{shown(task.hostname or '?')} (unchecked), fingerprint {task.fingerprint}"
    )


def elsewhere(task: TaskRecord) -> str:
    """`` (its registration came from 10.0.0.9:51234, as the coordinator saw it, not from 10.0.0.3)`` when
    the spec gives the task an IP address and the registration came from another one; else nothing (the
    same address, both on loopback, or a host name: not told apart without DNS). What failed was the
    process at that address: its cause must not read as the spec's host's."""
    import ipaddress

    def address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        found = ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
        mapped = found.ipv4_mapped if isinstance(found, ipaddress.IPv6Address) else None
        return mapped or found

    try:
        expected = address(task.info.address)
        seen = address(observed_address(task.peer).rpartition(":")[0])
    except ValueError:
        return ""
    if seen == expected or (seen.is_loopback and expected.is_loopback):
        return ""
    return (
        f" (its registration came from {observed_address(task.peer)}, as the coordinator saw it, not from "
        f"{task.info.address})"
    )


class Silences:
    """Task ids by their last sign of life, oldest first, so ``expire`` visits only the late ones: those
    heard from at the moment they were added (registrations, unary heartbeats), and those whose session
    ended, which were last vouched for one keepalive window before, the same window for all. Each part is
    in order; a task is in at most one. O(1) per change."""

    __slots__ = ("ended", "heard")

    def __init__(self, ids: Iterable[int] = ()) -> None:
        self.heard: OrderedDict[int, None] = OrderedDict((i, None) for i in ids)
        self.ended: OrderedDict[int, None] = OrderedDict()

    def heard_now(self, task_id: int) -> None:
        self.ended.pop(task_id, None)
        self.heard[task_id] = None
        self.heard.move_to_end(task_id)

    def session_ended(self, task_id: int) -> None:
        self.heard.pop(task_id, None)
        self.ended[task_id] = None
        self.ended.move_to_end(task_id)

    def pop(self, task_id: int) -> None:
        self.heard.pop(task_id, None)
        self.ended.pop(task_id, None)

    def parts(self) -> tuple[OrderedDict[int, None], OrderedDict[int, None]]:
        return self.heard, self.ended

    def __iter__(self) -> Iterator[int]:
        yield from self.heard
        yield from self.ended


class TaskTable:
    """Every task's record, by id, and the connected and reserved tasks in the order of their silence."""

    def __init__(self, infos: tuple[TaskInfo, ...], counters: Counters, *, heartbeat_timeout: float) -> None:
        self.records = [TaskRecord(info) for info in infos]
        self.counters = counters
        self.heartbeat_timeout = heartbeat_timeout
        self.by_heartbeat = Silences()
        """Connected tasks without an open session, least recently heard from first."""
        self.reserved = Silences()
        """Reserved survivors not re-registered yet and without an open session, least recently heard
        from first (``expire`` releases them)."""
        self.keepalive_window = keepalive_window(keepalive_interval(heartbeat_timeout))
        """How long before a session's end its task was last vouched for at the latest."""
        self.stalled = 0.0
        """Seconds the service itself could not run (``service_stalled``): not counted as a task's silence."""

    def __len__(self) -> int:
        return len(self.records)

    def heard_from(self, task: TaskRecord, now: float) -> None:
        """A sign of life from ``task`` (a registration, a unary heartbeat): its silence starts again."""
        task.last_heartbeat = now
        task.stalled_at_heartbeat = self.stalled
        task.session_ended_at = None
        if not task.sessions:  # an open session vouches for it: not among the silent ones
            self.by_heartbeat.heard_now(task.info.task_id)
        self.counters.touched += 1

    def session_opened(self, task: TaskRecord, session: int, *, now: float) -> None:
        """``task``'s session stream ``session`` is open and proved whose it is: until it ends, the task is
        alive, and it is not among the silent ones. O(1)."""
        task.sessions.add(session)
        task.session_ended_at = None
        task.last_heartbeat = now
        task.stalled_at_heartbeat = self.stalled
        self.by_heartbeat.pop(task.info.task_id)
        self.counters.touched += 1

    def session_closed(self, caller: TaskRef, session: int, *, now: float) -> None:
        """Session ``session`` of ``caller`` ended (the host closed it, its connection broke, or its
        keepalive pings went unanswered). When it was the task's last, the task's silence counts from one
        keepalive window ago: the last moment its pings vouched for it at the latest. O(1)."""
        task = self.records[caller.task_id] if 0 <= caller.task_id < len(self.records) else None
        if task is None or session not in task.sessions or task.incarnation != caller.incarnation:
            return  # not a session that vouched (refused, or of a process that no longer holds the task)
        task.sessions.discard(session)
        if task.sessions:
            return
        self.counters.touched += 1
        task.last_heartbeat = now - self.keepalive_window
        task.stalled_at_heartbeat = self.stalled
        task.session_ended_at = now
        if task.state is TaskState.CONNECTED:
            self.by_heartbeat.session_ended(task.info.task_id)
        elif task.state is TaskState.WAITING and task.reserved:
            self.reserved.session_ended(task.info.task_id)

    def service_stalled(self, seconds: float) -> None:
        """The executor could not run for ``seconds`` (its own backlog: a wave of calls it was still
        working through). Heartbeats that waited in that backlog are not the tasks' fault: their silence
        is measured without it. O(1)."""
        if seconds > 0:
            self.stalled += seconds

    def silence(self, task: TaskRecord, now: float) -> float:
        """How long ``task`` has been silent, not counting the service's own stalls since; an open session
        vouches for it (0)."""
        if task.sessions:
            return 0.0
        return now - task.last_heartbeat - (self.stalled - task.stalled_at_heartbeat)

    def last_seen(self, task: TaskRecord, now: float) -> float:
        """When ``task`` was last known alive: ``now`` while a session vouches for it, else when its last
        session ended (a killed process's connection closes at once; a frozen or cut-off one's when its
        pings went unanswered), else its last heartbeat."""
        if task.sessions:
            return now
        return task.session_ended_at if task.session_ended_at is not None else task.last_heartbeat

    def silence_cause(self, task: TaskRecord, now: float) -> str:
        """Why ``task`` is declared failed for its silence: how long, and how its session ended."""
        silence = now - task.last_heartbeat
        if task.session_ended_at is not None:
            ended = now - task.session_ended_at
            cause = (
                f"no heartbeat for {silence:.1f} s: its session ended {ended:.1f} s ago (connection closed or "
                f"keepalive pings unanswered) and it did not reconnect (timeout {self.heartbeat_timeout:g} s"
            )
        else:
            cause = f"no heartbeat for {silence:.1f} s (timeout {self.heartbeat_timeout:g} s"
        stalled = self.stalled - task.stalled_at_heartbeat
        if stalled >= 0.05:
            cause += f"; {stalled:.1f} s of it the coordinator itself was busy, not counted"
        return cause + ")"

    def late(self, silences: Silences, now: float) -> list[TaskRecord]:
        """The tasks of ``silences`` silent for longer than the heartbeat timeout. O(1 + late tasks): each
        part is in the order of the last sign of life (and so of silence: stalls only accumulate)."""
        late = []
        for part in silences.parts():
            for task_id in part:
                task = self.records[task_id]
                self.counters.touched += 1
                if self.silence(task, now) <= self.heartbeat_timeout:
                    break
                late.append(task)
        return late

    def new_generation(self) -> None:
        """Every task must register again: the connected ones are reserved for their own processes, and
        keep their order of silence. O(tasks)."""
        self.counters.touched += len(self.records)
        for task in self.records:
            task.reserved = task.state is TaskState.CONNECTED  # survivors keep their place
            task.state = TaskState.WAITING
            task.cause = ""  # why it failed ended the last generation: history there, not this one's
        reserved = Silences(i for i in self.by_heartbeat.heard if self.records[i].reserved)
        for i in self.by_heartbeat.ended:
            if self.records[i].reserved:
                reserved.session_ended(i)
        self.reserved = reserved
        self.by_heartbeat = Silences()

    def status(self, now: float, rank_of: Callable[[int], int | None] = lambda task_id: task_id) -> tuple[TaskStatus, ...]:
        """Every task's row as status shows it. O(tasks). A task with an open session has sent no heartbeat
        since (the keepalive pings are its heartbeat, answered in gRPC's transport, which says nothing of
        them but closing the connection when one goes unanswered): its age is the most the last answered
        ping can be old, one keepalive window. ``rank_of``: each task's rank in the current generation (None:
        not a member; then its role is ``standby`` while connected, else ``out``)."""
        self.counters.touched += len(self.records)
        ranks = [rank_of(t.info.task_id) for t in self.records]
        return tuple(
            TaskStatus(
                task=t.info,
                state=t.state,
                incarnation=t.incarnation,
                hostname=t.hostname,
                peer=t.peer,
                seconds_since_heartbeat=None
                if t.state is TaskState.WAITING
                else self.keepalive_window
                if t.sessions
                else now - t.last_heartbeat,
                cause=t.cause,
                fingerprint=t.fingerprint,
                session_open=bool(t.sessions),
                role="member" if rank is not None else "standby" if t.state is TaskState.CONNECTED else "out",
                rank=rank,
            )
            for t, rank in zip(self.records, ranks, strict=True)
        )

    # --- identity: constant-time comparisons, refusals that never show the task's secrets ---------------

    @staticmethod
    def holds(task: TaskRecord, caller: TaskRef) -> bool:
        """The caller carries the task's credential (constant time: no timing oracle)."""
        return bool(task.credential) and hmac.compare_digest(caller.credential, task.credential)

    @staticmethod
    def proves(task: TaskRecord, credential: bytes) -> bool:
        """``credential`` is the task's (a new process of the same host, or a survivor being itself)."""
        return bool(task.credential) and bool(credential) and hmac.compare_digest(credential, task.credential)

    @staticmethod
    def same_process(task: TaskRecord, registration: Registration) -> bool:
        """``registration`` is a retry of the task's own (its incarnation and retry secret)."""
        return task.incarnation == registration.incarnation and hmac.compare_digest(
            task.retry_secret, registration.retry_secret
        )

    @staticmethod
    def stale(task: TaskRecord, caller: TaskRef) -> Refused:
        # The caller's own incarnation only: the task's is what a registration retry proves, never shown.
        return Refused(
            Reason.STALE_INCARNATION,
            f"{task.info}: incarnation {caller.incarnation} is stale; the task is registered by another "
            f"process ({registered_by(task)})",
            hint="another process registered for this task since; stop this one",
        )

    @staticmethod
    def not_permitted(task: TaskRecord) -> Refused:
        return Refused(
            Reason.NOT_PERMITTED,
            f"{task.info}: the call does not carry the credential of the task's registration",
            hint="only the process that registered a task may act for it: use the TaskRef its register() returned",
        )
