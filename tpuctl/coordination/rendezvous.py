"""Barriers and gathers: counted rendezvous of every member of the cluster's generation.

Hosts are counted by *index*: their rank in the generation (``tasks`` is the members in rank order; a
member's ``TaskInfo`` keeps its task id, so every message names hosts by task id). The state translates
a caller's task id to its rank at its edge; a gather's values are by rank; ``last_arrivals`` and the
open instances' arrivals are by task id.

Pure: no grpc, no asyncio, no clock. Calls are counted per (kind, name, task) and instances are numbered
per series (kind, name): a task's call joins the instance after the one its previous call joined, so in a
loop the k-th calls of every task meet at instance k, which passes when every task has arrived. A gather is
a barrier whose arrivals carry a value: once it passes, every caller gets the same ``Gathered`` (all values
by task id), assembled once. An instance's deadline is its first arrival plus that arrival's timeout;
when it passes, every waiter is told how many hosts are missing and the first few.

An instance that failed (timed out, or a host left while it waited) is over for every task, not only for
those that were in it: each task's next call joins a later one. The series keeps a floor, one above its
latest failed instance, and a call joins ``max(its previous instance + 1, floor)``; an instance past its
deadline is decided before anyone joins it, so a late arrival opens (or joins) the next one instead of
hearing an old timeout that names itself. So the next round in which every task calls the name passes,
whatever failed before (a shell script's retry meets the late host's first call), and passed instances
count as before. While a host is gone (it left: ``disconnected``) a call that would open an instance is
refused at once, naming it, and is not counted: no instance can pass without it, and once it registers
again the next round passes.

A call that gives up before its instance is decided (its own timeout ran out, it was interrupted, its
caller or its session went away) withdraws its arrival (``withdraw``): the instance waits for that host
again, as if the call had never been made, so it cannot pass with a host that is not there; a gather
forgets the value, and the task's next call joins the same instance again (a retry meets the others
there). The service is the one place that orders a withdrawal and the arrival that passes the
instance: whichever comes first wins. A pass wins for good (the withdrawing call is answered that it
passed, as every host is), a failure too (it hears the failure); only an open instance takes the
arrival back. An instance left with no arrival is dropped: the next call opens it afresh, with its own
deadline. The deadline stays the first arrival's otherwise (as TSL's coordination service: a later
arrival's shorter timeout does not shorten it for everyone): a host that will not wait as long
withdraws when its own timeout runs out, and the others wait, for it, until theirs. So every host whose
call counts in an instance hears the same outcome, and a host that withdrew hears that it did. A host whose
session broke before its answer came asks what became of its call (``call_outcome``, by the caller's
token given at ``arrive``): its instance's outcome while it still counts, else None.

Cost: O(1) per arrival and per withdrawal (the missing set is a linked list, ``taskset.Missing``; the
floor is per series, so
a failure touches no task; an arrival that finds instances past their deadline decides each, once),
O(hosts) once per instance (creating it, assembling a gather), O(sample) per failure and progress answer.
Passed instances are dropped once a later instance of the same name passes (every task has read them by
then). The last ``RECENT_FAILURES_KEPT`` failures are kept for ``tpuctl status``, each with a sample of
who was missing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from tpuctl.coordination.figures import BarrierWaits
from tpuctl.coordination.taskset import Missing
from tpuctl.coordination.values import (
    MAX_GATHER_TABLE,
    MAX_GATHER_VALUE,
    RECENT_FAILURES_KEPT,
    SAMPLE,
    BarrierId,
    ClusterFailure,
    Counters,
    FailedBarrier,
    Gathered,
    OpenBarrier,
    Pending,
    Reason,
    Refused,
    RendezvousKind,
    RendezvousProgress,
    TaskInfo,
    Verdict,
    WaitKey,
    barrier_key,
    check_name,
    check_timeout,
    sample_text,
)
from tpuctl.health import LEFT, LEFT_CAUSE, LEFT_CAUSE_MANY
from tpuctl.messages import count, shown

_ARRIVED = {"barrier": "arrived", "gather": "published"}
RESERVED_PREFIX = "tpuctl/"  # tpuctl's own barriers (init's last one): not the job's pace
LAST_ARRIVALS_KEPT = 64


@dataclass
class _Instance:
    deadline: float
    timeout: float
    missing: Missing | None
    """Who has not arrived; None once decided."""
    values: list[bytes] | None = None
    """A gather's values by task id until it passes (b"" for a task not arrived yet)."""
    passed: bool = False
    verdict: Verdict | None = None
    gathered: Gathered | None = None
    last_arrival: float | None = None
    """When the latest arrival came (the lag of the last one behind it is a straggler's sign)."""
    after_failure: bool = False
    """The series' first instance after a failed one: its last arrival is likely a host that retried
    on time, not a straggler, so the watchdog does not hear of it."""

    @property
    def decided(self) -> bool:
        return self.passed or self.verdict is not None


class Rendezvous:
    """Every barrier and gather instance of one cluster."""

    def __init__(
        self,
        tasks: Sequence[TaskInfo],
        counters: Counters,
        woken: set[WaitKey],
        *,
        generation: int = 1,
        waits: BarrierWaits | None = None,
    ) -> None:
        """``generation``: the cluster generation these instances belong to (every one a new ``Rendezvous``);
        ``waits``: where the job's instances (not tpuctl's own) are counted as they pass or fail, for metrics."""
        self._generation = generation
        self._waits = waits
        self._tasks = tasks
        self._counters = counters
        self._woken = woken
        self._calls: dict[tuple[RendezvousKind, str, int], int] = {}
        """The instance each task's latest call to a series joined."""
        self._callers: dict[tuple[RendezvousKind, str, int], object] = {}
        """Who made each task's latest counted call, when it said (its session and request id): a host
        whose session broke before the answer came asks what became of that call (``call_outcome``)."""
        self._instances: dict[BarrierId, _Instance] = {}
        self._open: set[BarrierId] = set()
        self._dropped_below: dict[tuple[RendezvousKind, str], int] = {}
        """Instances below this number that passed were dropped (failed ones are kept)."""
        self._next_floor: dict[tuple[RendezvousKind, str], int] = {}
        """The lowest instance a call may join: one above the series' latest failed instance."""
        self._failures: deque[tuple[float, FailedBarrier]] = deque(maxlen=RECENT_FAILURES_KEPT)
        """The last failed instances, each with when it failed (its ``seconds_ago`` is set when asked)."""
        self.last_arrivals: deque[tuple[int, float]] = deque(maxlen=LAST_ARRIVALS_KEPT)
        """Each passed barrier's last arrival (task id, seconds after the arrival before it), for the
        watchdog (a host last at most barriers, by a margin, drags the cluster); taken by the service."""

    def value_limit(self) -> int:
        return min(MAX_GATHER_VALUE, MAX_GATHER_TABLE // len(self._tasks))

    def arrive(
        self,
        kind: RendezvousKind,
        task_id: int,
        name: str,
        timeout: float,
        value: bytes | None,
        *,
        default_timeout: float,
        disconnected: Collection[int],
        failure: ClusterFailure | None,
        now: float,
        caller: object = None,
    ) -> BarrierId:
        """Count the caller's next call to ``name``; ``timeout`` 0 means ``default_timeout``; ``caller``
        (hashable, optional) names the call for ``call_outcome``."""
        check_name(f"{kind} name", name)
        check_timeout(kind, timeout)
        if value is not None and len(value) > self.value_limit():
            raise Refused(
                Reason.INVALID,
                f"gather {shown(name)}: this host's value is {count(len(value))} bytes; at most "
                f"{count(self.value_limit())} bytes per host in a cluster of {count(len(self._tasks))} hosts",
                hint="publish less: every host receives every host's value",
            )
        if failure is not None:
            raise Refused(Reason.CLUSTER_FAILED, f"{kind} {shown(name)} refused: the cluster is in error: {failure}")
        series, calls = (kind, name), (kind, name, task_id)
        number = max(self._calls.get(calls, 0) + 1, self._next_floor.get(series, 1))
        barrier, instance = self._joinable(kind, name, number, now)
        if instance is None:
            if disconnected:
                # No instance can pass while a host is gone; opening one per call would only keep verdicts.
                gone = sorted(disconnected)
                raise self._disconnected_verdict(barrier, gone[:SAMPLE], len(gone)).refused()
            timeout = timeout or default_timeout
            n = len(self._tasks)
            floor = self._next_floor.get(series, 1)
            instance = _Instance(now + timeout, timeout, Missing(n), after_failure=floor > 1 and barrier.instance == floor)
            self._instances[barrier] = instance
            if kind == "gather":
                instance.values = [b""] * n
            self._counters.touched += n
            self._open.add(barrier)
        self._calls[calls] = barrier.instance
        if caller is None:
            self._callers.pop(calls, None)
        else:
            self._callers[calls] = caller
        assert instance.missing is not None
        if instance.missing.discard(task_id) and instance.values is not None and value is not None:
            instance.values[task_id] = value
        previous, instance.last_arrival = instance.last_arrival, now
        if not instance.missing:
            self._pass(barrier, instance)
            if self._waits is not None and not name.startswith(RESERVED_PREFIX):
                self._waits.passed(kind, now - (instance.deadline - instance.timeout))  # since the first arrival
            if (
                kind == "barrier" and previous is not None and not instance.after_failure
                and not name.startswith(RESERVED_PREFIX)
            ):  # fmt: skip
                self.last_arrivals.append((self._tasks[task_id].task_id, now - previous))
        return barrier

    def outcome(self, barrier: BarrierId, *, failure: ClusterFailure | None, now: float) -> int | Gathered | Pending:
        """The instance number (a barrier) or every value (a gather) once it passed; raises once it
        timed out or cannot pass."""
        instance = self._instances.get(barrier)
        if instance is None:
            if barrier.instance < self._dropped_below.get((barrier.kind, barrier.name), 0):
                return barrier.instance  # passed, and dropped since (only barriers are asked that late)
            raise Refused(Reason.INVALID, f"{barrier} does not exist")
        if instance.passed:
            return instance.gathered if instance.gathered is not None else barrier.instance
        if instance.verdict is not None:
            raise instance.verdict.refused()
        if failure is not None:
            raise Refused(Reason.CLUSTER_FAILED, f"{barrier} failed: {failure}")
        verdict = self._time_out_if_late(barrier, instance, now)
        if verdict is not None:
            raise verdict.refused()
        return Pending(instance.deadline)

    def call_outcome(
        self, kind: RendezvousKind, task_id: int, name: str, caller: object, *, failure: ClusterFailure | None,
        now: float,
    ) -> int | Gathered | Pending | None:  # fmt: skip
        """What became of the call ``caller`` named (``arrive``), whose answer its host did not get (its
        session broke): None when it does not count (withdrawn with its session, or never counted: its
        host's next call joins the instance where the others wait), else its instance's ``outcome`` (a
        pass; still open; a failure raises). O(1)."""
        calls = (kind, name, task_id)
        if caller is None or self._callers.get(calls) != caller:
            return None
        return self.outcome(BarrierId(name, self._calls[calls], kind, self._generation), failure=failure, now=now)

    def withdraw(
        self, barrier: BarrierId, task_id: int, *, failure: ClusterFailure | None, left: TaskInfo | None = None,
        now: float,
    ) -> int | Gathered | RendezvousProgress:  # fmt: skip
        """Take back ``task_id``'s arrival at ``barrier``: its caller gave up. An instance already decided
        keeps its outcome and answers as ``outcome`` does (a pass wins over the withdrawal: the instance
        number or the values; a failure raises); an open one waits for the task again, forgets its
        gather value, and the task's next call joins it again; with ``left`` (the task, which left the
        cluster since it arrived) it cannot pass and fails as ``task_left`` fails those it had not
        reached. Returns where the instance stood then: the hosts arrived (this one included) and a
        sample of the others still missing. O(sample)."""
        instance = self._instances.get(barrier)
        if instance is None or instance.decided or failure is not None:
            decided = self.outcome(barrier, failure=failure, now=now)  # passed, or raises
            assert not isinstance(decided, Pending)
            return decided
        if (verdict := self._time_out_if_late(barrier, instance, now)) is not None:
            raise verdict.refused()
        missing = instance.missing
        assert missing is not None
        total = len(self._tasks)
        sample = sorted(missing.first(SAMPLE))
        self._counters.touched += len(sample) + 1
        found = RendezvousProgress(
            barrier.kind,
            barrier.name,
            barrier.instance,
            total - len(missing),
            total,
            tuple(self._tasks[i] for i in sample if i != task_id),
            max(0.0, instance.deadline - now),
        )
        if not missing.put_back(task_id):
            return found  # not counted in it (never arrived): nothing to take back
        if instance.values is not None:
            instance.values[task_id] = b""
        calls = (barrier.kind, barrier.name, task_id)
        if self._calls.get(calls) == barrier.instance:
            self._callers.pop(calls, None)
            if barrier.instance > 1:
                self._calls[calls] = barrier.instance - 1  # its next call joins this instance again
            else:
                del self._calls[calls]
        if left is not None:
            verdict = self._disconnected_verdict(barrier, [left], 1)
            self._decide(barrier, instance, verdict, self._missing(instance), reason="host left", at=now)
            raise verdict.refused()
        if len(missing) == total:  # nobody left in it: as if it had never been opened
            del self._instances[barrier]
            self._open.discard(barrier)
        return found

    def progress(self, kind: RendezvousKind, task_id: int, name: str, *, now: float) -> RendezvousProgress | None:
        """Where the task's latest call to ``name`` stands; None if it never called. O(sample)."""
        check_name(f"{kind} name", name)
        number = self._calls.get((kind, name, task_id))
        if number is None:
            return None
        barrier = BarrierId(name, number, kind, self._generation)
        instance = self._instances.get(barrier)
        total = len(self._tasks)
        if instance is None or instance.decided or self._time_out_if_late(barrier, instance, now) is not None:
            return RendezvousProgress(kind, name, number, total, total, (), 0.0, done=True)
        assert instance.missing is not None
        sample = sorted(instance.missing.first(SAMPLE))  # a host that withdrew comes first: listed in id order
        self._counters.touched += len(sample) + 1
        return RendezvousProgress(
            kind,
            name,
            number,
            total - len(instance.missing),
            total,
            tuple(self._tasks[i] for i in sample),
            max(0.0, instance.deadline - now),
        )

    def task_left(self, rank: int, *, now: float) -> None:
        """The member of rank ``rank`` disconnected: the open instances still waiting for it cannot pass."""
        task = self._tasks[rank]
        for barrier in list(self._open):
            instance = self._instances[barrier]
            self._counters.touched += 1
            if self._time_out_if_late(barrier, instance, now) is None:
                assert instance.missing is not None
                if rank in instance.missing:
                    verdict = self._disconnected_verdict(barrier, [task], 1)
                    self._decide(barrier, instance, verdict, self._missing(instance), reason="host left", at=now)

    def open_instances(self, *, now: float) -> tuple[OpenBarrier, ...]:
        """Open instances with at least one arrival, by kind, name and number (one past its deadline is
        decided first, and is a failure then). O(hosts) each."""
        found = []
        for barrier in sorted(self._open, key=lambda b: (b.kind, b.name, b.instance)):
            instance = self._instances[barrier]
            if self._time_out_if_late(barrier, instance, now) is not None:
                continue
            missing = instance.missing
            if instance.decided or missing is None or len(missing) == len(self._tasks):
                continue
            absent = set(missing)
            arrived = tuple(self._tasks[i].task_id for i in range(len(self._tasks)) if i not in absent)
            self._counters.touched += len(self._tasks)
            found.append(
                OpenBarrier(barrier.name, barrier.instance, arrived, max(0.0, instance.deadline - now), barrier.kind)
            )
        return tuple(found)

    def recent_failures(self, *, now: float) -> tuple[FailedBarrier, ...]:
        """The last ``RECENT_FAILURES_KEPT`` failed instances, oldest first. O(kept * sample)."""
        self._counters.touched += len(self._failures)
        ordered = sorted(self._failures, key=lambda failure: failure[0])
        return tuple(replace(failed, seconds_ago=max(0.0, now - at)) for at, failed in ordered)

    # --- internals ---------------------------------------------------------------------------------

    def _joinable(
        self, kind: RendezvousKind, name: str, number: int, now: float
    ) -> tuple[BarrierId, _Instance | None]:
        """The instance a call numbered at least ``number`` joins: ``number`` itself while it is open, else
        (it failed, or its deadline passed: decided here) the first after the series' floor. Returns the
        open instance, or None for one to open. Each step past the first decides an instance that was
        open, once in its life, so arrivals cost O(1) amortized."""
        floor = self._next_floor
        for _ in range(len(self._instances) + 1):  # each step moves past an existing instance
            barrier = BarrierId(name, number, kind, self._generation)
            instance = self._instances.get(barrier)
            if instance is None:
                return barrier, None
            if not instance.decided and self._time_out_if_late(barrier, instance, now) is None:
                return barrier, instance
            # A decided instance this task never joined has failed (a pass needs every task): move on.
            number = max(number + 1, floor.get((kind, name), 1))
        raise AssertionError(f"no joinable instance of {kind} {name!r} from #{number}")  # unreachable

    def _pass(self, barrier: BarrierId, instance: _Instance) -> None:
        instance.passed = True
        if instance.values is not None:
            instance.gathered = Gathered(barrier.instance, tuple(instance.values))
            self._counters.touched += len(instance.values)
        instance.missing = None
        instance.values = None
        self._open.discard(barrier)
        self._woken.add(barrier_key(barrier))
        # Every task has made its call to this instance, so it has read every earlier one: drop those
        # that passed (failed ones stay: they are rare and keep their verdict).
        series = (barrier.kind, barrier.name)
        for number in range(self._dropped_below.get(series, 1), barrier.instance):
            earlier = BarrierId(barrier.name, number, barrier.kind, barrier.generation)
            if (old := self._instances.get(earlier)) is not None and old.passed:
                del self._instances[earlier]
        self._dropped_below[series] = barrier.instance

    def _missing(self, instance: _Instance) -> tuple[tuple[TaskInfo, ...], int]:
        """The first ``SAMPLE`` hosts an open instance waits for, and how many it waits for. O(sample)."""
        assert instance.missing is not None
        sample = tuple(self._tasks[i] for i in sorted(instance.missing.first(SAMPLE)))
        self._counters.touched += len(sample) + 1
        return sample, len(instance.missing)

    def _decide(
        self, barrier: BarrierId, instance: _Instance, verdict: Verdict, missing: tuple[tuple[TaskInfo, ...], int],
        *, reason: str, at: float,
    ) -> None:  # fmt: skip
        """Fail an open instance whose ``missing`` hosts (a sample, a count) did not come: every waiter hears
        ``verdict``, and every task's next call to the series joins a later instance (the floor: O(1),
        whatever the cluster size)."""
        sample, absent = missing
        arrived = len(self._tasks) - absent
        failed = FailedBarrier(barrier.name, barrier.instance, barrier.kind, reason, verdict.message, 0.0, arrived, sample, absent)
        self._failures.append((at, failed))
        series = (barrier.kind, barrier.name)
        self._next_floor[series] = max(self._next_floor.get(series, 1), barrier.instance + 1)
        if self._waits is not None and not barrier.name.startswith(RESERVED_PREFIX):
            self._waits.decided_failed(barrier.kind)
        instance.verdict = verdict
        instance.missing = None
        instance.values = None
        self._open.discard(barrier)
        self._woken.add(barrier_key(barrier))

    def _time_out_if_late(self, barrier: BarrierId, instance: _Instance, now: float) -> Verdict | None:
        """Decide an open instance whose deadline has passed; its verdict if it did."""
        if now < instance.deadline or instance.decided:
            return None
        sample, missing = self._missing(instance)
        total = len(self._tasks)
        verdict = Verdict(
            Reason.TIMED_OUT,
            f"{barrier} timed out after {instance.timeout:.1f} s: {count(total - missing)} of {count(total)} "
            f"hosts {_ARRIVED[barrier.kind]}; missing: {sample_text(sample, missing)}",
            hint=f"the missing hosts did not reach this {barrier.kind} in time (their logs say why); a retry is "
            f"safe: every host's next call to {shown(barrier.name)} joins a new round",
        )
        self._decide(barrier, instance, verdict, (sample, missing), reason="timed out", at=instance.deadline)
        return verdict

    def _disconnected_verdict(self, barrier: BarrierId, gone: Sequence[int | TaskInfo], total: int) -> Verdict:
        sample = [g if isinstance(g, TaskInfo) else self._tasks[g] for g in gone]
        cause = LEFT_CAUSE if total == 1 else LEFT_CAUSE_MANY
        return Verdict(Reason.CLUSTER_FAILED, f"{barrier} cannot pass: {sample_text(sample, total)} {LEFT}: {cause}")
