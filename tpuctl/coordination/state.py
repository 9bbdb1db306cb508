"""The coordination service's state machine: membership, failure detection, barriers, key-value.

Pure: no grpc, no asyncio, no clock. Every method takes ``now`` (monotonic seconds by the service's
clock) and returns a value, a ``Pending`` (ask again when woken, or at its deadline), or raises
``Refused``. The executor (``service.py``) parks pending calls and, after every call into the state,
wakes the wait keys ``take_wakeup`` names.

Semantics, and where they differ from TSL (the coordination service TensorFlow and JAX use):

* Registration: the first registration starts the clock; ``register_timeout`` later, registration closes
  if a task is still missing, and every waiter (and every later registrant) is told which tasks, with
  their addresses. A second live process claiming a registered task is refused (TSL kills the job).
* Heartbeats: a connected task silent for longer than ``heartbeat_timeout`` is declared failed
  (``expire``, which the executor calls a few times a second). The first failure (or a task's own error
  report) puts the cluster in error for good: every wait fails at once, naming the failed task.
* Barriers: the service counts calls per (name, task): a task's k-th call to "step" joins instance k,
  which passes when every task of the cluster has made its k-th call. An instance's deadline is its first
  arrival plus that arrival's timeout; when it passes, every waiter (and later arrival) is told every
  missing task. A barrier timeout is not a cluster error. Cost: O(1) per arrival, O(tasks) per timeout;
  a decided instance keeps O(1) memory.
* Key-value: values are bytes; a blocking get waits for the key up to the caller's timeout.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tpuctl.errors import InputError

PROTOCOL_VERSION = 1
"""Bumped when a change to ``coordination.proto`` would be misread by an older peer."""


# --- configuration -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskSpec:
    """One task (host) of the cluster; its id is its position in ``ServiceConfig.tasks``."""

    address: str
    """How the cluster spec names the host (e.g. "10.0.0.3"); used in messages."""


@dataclass(frozen=True)
class ServiceConfig:
    cluster: str
    tasks: tuple[TaskSpec, ...]
    heartbeat_timeout: float = 10.0
    """Seconds a connected task may stay silent before it is declared failed."""
    register_timeout: float = 300.0
    """Seconds from the first registration until every task must have registered."""
    barrier_timeout: float = 300.0
    """Used when a barrier call asks for the default (timeout 0)."""
    token: str | None = field(default=None, repr=False)
    """When set, every call must carry it (``auth.py``); kept out of repr so logs never show it."""

    def __post_init__(self) -> None:
        problems = []
        if not self.cluster:
            problems.append("cluster name is empty")
        if not self.tasks:
            problems.append("the cluster has no tasks")
        for name in ("heartbeat_timeout", "register_timeout", "barrier_timeout"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                problems.append(f"{name} must be a positive number of seconds, got {value!r}")
        if problems:
            raise InputError("coordination service config: " + "; ".join(problems))


# --- values ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskInfo:
    task_id: int
    address: str

    def __str__(self) -> str:
        return f"task {self.task_id} ({self.address})"


@dataclass(frozen=True)
class TaskRef:
    """Who is calling: a task id and the incarnation (random per process, never 0) it registered with."""

    task_id: int
    incarnation: int


@dataclass(frozen=True)
class Registration:
    protocol_version: int
    cluster: str
    task_id: int
    incarnation: int
    hostname: str
    peer: str
    """The gRPC peer of the call, e.g. "ipv4:10.0.0.3:51234"."""


@dataclass(frozen=True)
class Membership:
    """What a task learns when it registers."""

    task: TaskRef
    service_incarnation: int
    tasks: tuple[TaskInfo, ...]
    heartbeat_timeout: float
    barrier_timeout: float


@dataclass(frozen=True)
class RegistrationProgress:
    registered: int
    total: int
    missing: tuple[TaskInfo, ...]
    seconds_left: float
    """Until registration closes."""

    @property
    def complete(self) -> bool:
        return not self.missing

    def describe(self) -> str:
        if self.complete:
            return f"all {self.total} hosts registered"
        return f"waiting for {len(self.missing)} of {self.total} hosts: {_task_list(self.missing)}"


@dataclass(frozen=True)
class TaskFailure:
    task: TaskInfo
    cause: str


@dataclass(frozen=True)
class ClusterFailure:
    """The cluster is in error: the tasks declared failed first (usually one)."""

    failures: tuple[TaskFailure, ...]

    def __str__(self) -> str:
        if len(self.failures) == 1:
            (failure,) = self.failures
            return f"{failure.task} failed: {failure.cause}"
        parts = "; ".join(f"{f.task}: {f.cause}" for f in self.failures)
        return f"{len(self.failures)} tasks failed: {parts}"


class TaskState(enum.Enum):
    WAITING = "waiting"
    CONNECTED = "connected"
    FAILED = "failed"
    DISCONNECTED = "disconnected"


@dataclass(frozen=True)
class TaskStatus:
    task: TaskInfo
    state: TaskState
    incarnation: int
    """0 while waiting."""
    hostname: str
    peer: str
    seconds_since_heartbeat: float | None
    """By the service's clock; None while waiting."""
    cause: str
    """Why the task failed; empty unless FAILED."""


@dataclass(frozen=True)
class OpenBarrier:
    """A barrier instance some tasks reached and others not yet."""

    name: str
    instance: int
    arrived: tuple[int, ...]
    seconds_left: float

    def missing(self, tasks: Sequence[TaskInfo]) -> tuple[TaskInfo, ...]:
        return tuple(t for t in tasks if t.task_id not in self.arrived)


@dataclass(frozen=True)
class ClusterStatus:
    cluster: str
    service_incarnation: int
    tasks: tuple[TaskStatus, ...]
    failure: ClusterFailure | None
    protocol_version: int = PROTOCOL_VERSION
    barriers: tuple[OpenBarrier, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready document with stable keys; 64-bit incarnations as decimal strings (JSON readers
        such as JavaScript and jq lose precision above 2**53)."""
        return {
            "cluster": self.cluster,
            "service_incarnation": str(self.service_incarnation),
            "protocol_version": self.protocol_version,
            "tasks": [
                {
                    "task": t.task.task_id,
                    "address": t.task.address,
                    "state": t.state.value,
                    "incarnation": str(t.incarnation) if t.incarnation else None,
                    "hostname": t.hostname or None,
                    "peer": t.peer or None,
                    "heartbeat_age": t.seconds_since_heartbeat,
                    "cause": t.cause or None,
                }
                for t in self.tasks
            ],
            "error": None if self.failure is None else str(self.failure),
            "barriers": [
                {
                    "name": b.name,
                    "instance": b.instance,
                    "arrived": list(b.arrived),
                    "missing": [t.task_id for t in b.missing([s.task for s in self.tasks])],
                    "seconds_left": b.seconds_left,
                }
                for b in self.barriers
            ],
        }


@dataclass(frozen=True)
class BarrierId:
    name: str
    instance: int
    """1 for every task's first call to ``name``, 2 for the second, ..."""

    def __str__(self) -> str:
        return f"barrier {self.name!r} #{self.instance}"


@dataclass(frozen=True)
class Pending:
    """Not decided yet: ask again when the wait key is woken, or at ``deadline`` at the latest."""

    deadline: float


# --- refusals ----------------------------------------------------------------------------------------


class Reason(enum.Enum):
    """Why the service refused a call; ``convert`` maps each to one gRPC status code."""

    VERSION_MISMATCH = "version mismatch"
    WRONG_CLUSTER = "wrong cluster"
    UNKNOWN_TASK = "unknown task"
    INVALID = "invalid argument"
    TASK_TAKEN = "task taken"
    KEY_EXISTS = "key exists"
    NOT_CONNECTED = "not connected"
    STALE_INCARNATION = "stale incarnation"
    CLUSTER_FAILED = "cluster failed"
    TIMED_OUT = "timed out"


class Refused(Exception):
    """The service's "no" to one call. Not a user-facing error itself: the servicer sends it as a gRPC
    status, and the client turns that status into a ``TpuctlError``."""

    def __init__(self, reason: Reason, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.hint = hint


@dataclass(frozen=True)
class _Verdict:
    """A decided failure, kept so every later caller gets the same answer (a fresh exception each time:
    re-raising one instance would grow its traceback)."""

    reason: Reason
    message: str
    hint: str | None = None

    def refused(self) -> Refused:
        return Refused(self.reason, self.message, hint=self.hint)


# --- wake-ups ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WaitKey:
    """What a parked call waits on."""

    kind: Literal["registration", "errors", "barrier", "key"]
    name: str = ""
    instance: int = 0


REGISTRATION = WaitKey("registration")
ERRORS = WaitKey("errors")


def barrier_key(barrier: BarrierId) -> WaitKey:
    return WaitKey("barrier", barrier.name, barrier.instance)


def kv_key(key: str) -> WaitKey:
    return WaitKey("key", key)


@dataclass(frozen=True)
class Wakeup:
    """Which parked calls must look again: those on ``keys``, or all of them."""

    keys: frozenset[WaitKey] = frozenset()
    everyone: bool = False


# --- the state machine -------------------------------------------------------------------------------


@dataclass
class _Task:
    info: TaskInfo
    state: TaskState = TaskState.WAITING
    incarnation: int = 0
    hostname: str = ""
    peer: str = ""
    last_heartbeat: float = 0.0
    cause: str = ""


@dataclass
class _Instance:
    """One barrier instance. ``arrivals`` maps task id to arrival time until the instance is decided."""

    deadline: float
    timeout: float
    arrivals: dict[int, float] = field(default_factory=dict)
    passed: bool = False
    verdict: _Verdict | None = None

    @property
    def decided(self) -> bool:
        return self.passed or self.verdict is not None


class CoordinationState:
    """Everything the coordination service knows. Not thread-safe: one executor drives it."""

    def __init__(self, config: ServiceConfig, *, service_incarnation: int) -> None:
        self.config = config
        self.service_incarnation = service_incarnation
        self._tasks = [_Task(TaskInfo(i, spec.address)) for i, spec in enumerate(config.tasks)]
        self._register_deadline: float | None = None
        self._never_registered = set(range(len(self._tasks)))
        self._disconnected: set[int] = set()
        self._failure: ClusterFailure | None = None
        self._calls: dict[tuple[str, int], int] = {}
        self._instances: dict[BarrierId, _Instance] = {}
        self._open: set[BarrierId] = set()
        self._kv: dict[str, bytes] = {}
        self._woken: set[WaitKey] = set()
        self._wake_everyone = False

    @property
    def failure(self) -> ClusterFailure | None:
        return self._failure

    def take_wakeup(self) -> Wakeup:
        """The wait keys whose outcome may have changed since the last call."""
        wakeup = Wakeup(frozenset(self._woken), self._wake_everyone)
        self._woken.clear()
        self._wake_everyone = False
        return wakeup

    # --- membership --------------------------------------------------------------------------------

    def register(self, registration: Registration, *, now: float) -> Membership:
        if registration.protocol_version != PROTOCOL_VERSION:
            raise Refused(
                Reason.VERSION_MISMATCH,
                f"protocol version mismatch: the client speaks tpuctl coordination protocol "
                f"v{registration.protocol_version}, this coordinator speaks v{PROTOCOL_VERSION}",
                hint="run the same tpuctl version on every host",
            )
        if registration.cluster != self.config.cluster:
            raise Refused(
                Reason.WRONG_CLUSTER,
                f"cluster name mismatch: the registering host is in cluster {registration.cluster!r}, "
                f"this coordinator serves cluster {self.config.cluster!r}",
                hint="every host must use the same cluster spec; check the coordinator address and port",
            )
        task = self._task(registration.task_id)
        if registration.incarnation == 0:
            raise Refused(Reason.INVALID, "incarnation 0 is reserved; a registration needs a random non-zero one")
        if task.state is TaskState.CONNECTED:
            if task.incarnation != registration.incarnation:
                raise Refused(
                    Reason.TASK_TAKEN,
                    f"task {task.info.task_id} is already registered by another live process (incarnation "
                    f"{task.incarnation}, registered from {task.hostname} at {task.peer})",
                    hint=f"is `tpuctl init` already running for task {task.info.task_id} on {task.hostname}? "
                    f"Check this host's task id",
                )
            task.last_heartbeat = now  # an RPC retry of our own registration: proof of life too
            return self._membership(registration)
        if self._failure is not None:
            raise Refused(Reason.CLUSTER_FAILED, f"cannot join: the cluster is in error: {self._failure}")
        if self._registration_closed(now):
            raise self._registration_timeout().refused()
        task.state = TaskState.CONNECTED
        task.incarnation = registration.incarnation
        task.hostname = registration.hostname
        task.peer = registration.peer
        task.last_heartbeat = now
        self._never_registered.discard(task.info.task_id)
        self._disconnected.discard(task.info.task_id)
        if self._register_deadline is None:
            self._register_deadline = now + self.config.register_timeout
        self._woken.add(REGISTRATION)
        return self._membership(registration)

    def registration_progress(self, caller: TaskRef, *, now: float) -> RegistrationProgress:
        """How far registration is; raises once it closed with tasks missing, or the cluster failed."""
        self._live(caller)
        if self._failure is not None:
            raise Refused(Reason.CLUSTER_FAILED, f"cluster failed during registration: {self._failure}")
        missing = tuple(self._tasks[i].info for i in sorted(self._never_registered))
        assert self._register_deadline is not None  # set by the caller's own registration
        if missing and now >= self._register_deadline:
            raise self._registration_timeout().refused()
        total = len(self._tasks)
        return RegistrationProgress(total - len(missing), total, missing, self._register_deadline - now)

    def heartbeat(self, caller: TaskRef, *, now: float) -> int:
        """Record proof of life; returns the service incarnation (a change means the coordinator restarted)."""
        task = self._live(caller)
        silence = now - task.last_heartbeat
        if silence > self.config.heartbeat_timeout:
            # Late by its own account: decide now rather than depend on when ``expire`` last ran.
            self._fail([(task, self._silence_cause(silence))])
            raise Refused(Reason.CLUSTER_FAILED, f"{task.info} was declared failed: {task.cause}")
        task.last_heartbeat = now
        return self.service_incarnation

    def expire(self, *, now: float) -> tuple[TaskFailure, ...]:
        """Declare failed every connected task silent for longer than the heartbeat timeout."""
        late = [
            (task, self._silence_cause(now - task.last_heartbeat))
            for task in self._tasks
            if task.state is TaskState.CONNECTED and now - task.last_heartbeat > self.config.heartbeat_timeout
        ]
        return self._fail(late)

    def report_error(self, caller: TaskRef, cause: str, *, now: float) -> tuple[TaskFailure, ...]:
        task = self._live(caller)
        return self._fail([(task, f"reported an error: {cause or 'no cause given'}")])

    def disconnect(self, caller: TaskRef, *, now: float) -> None:
        """Leave gracefully. Barriers still waiting for this task fail at once (they can no longer pass)."""
        task = self._task(caller.task_id)
        if task.state in (TaskState.DISCONNECTED, TaskState.FAILED) and task.incarnation == caller.incarnation:
            return  # a retry, or a failed task leaving: its failure stands
        self._live(caller)
        task.state = TaskState.DISCONNECTED
        self._disconnected.add(task.info.task_id)
        for barrier in list(self._open):
            instance = self._instances[barrier]
            if self._time_out_if_late(barrier, instance, now) is None and task.info.task_id not in instance.arrivals:
                self._decide(barrier, instance, self._disconnected_verdict(barrier, [task.info]))
        self._wake_everyone = True

    def poll_error(self, caller: TaskRef, *, now: float) -> ClusterFailure | None:
        """The cluster's error, if any. A task declared failed may still poll: that is how it learns."""
        task = self._task(caller.task_id)
        if task.state is not TaskState.FAILED:
            self._live(caller)
        elif task.incarnation != caller.incarnation:
            raise self._stale(task, caller)
        return self._failure

    # --- barriers ----------------------------------------------------------------------------------

    def barrier_arrive(self, caller: TaskRef, name: str, timeout: float, *, now: float) -> BarrierId:
        """Count the caller's next call to ``name``; ``timeout`` 0 means the configured default."""
        self._live(caller)
        if not name:
            raise Refused(Reason.INVALID, "barrier name is empty")
        if not (math.isfinite(timeout) and timeout >= 0):
            raise Refused(Reason.INVALID, f"barrier timeout must be >= 0 seconds, got {timeout!r}")
        if self._failure is not None:
            raise Refused(Reason.CLUSTER_FAILED, f"barrier {name!r} refused: the cluster is in error: {self._failure}")
        count = self._calls.get((name, caller.task_id), 0) + 1
        self._calls[(name, caller.task_id)] = count
        barrier = BarrierId(name, count)
        instance = self._instances.get(barrier)
        if instance is None:
            timeout = timeout or self.config.barrier_timeout
            instance = self._instances[barrier] = _Instance(deadline=now + timeout, timeout=timeout)
            self._open.add(barrier)
            if self._disconnected:
                gone = [self._tasks[i].info for i in sorted(self._disconnected)]
                self._decide(barrier, instance, self._disconnected_verdict(barrier, gone))
        if instance.decided or self._time_out_if_late(barrier, instance, now) is not None:
            return barrier
        instance.arrivals[caller.task_id] = now
        if len(instance.arrivals) == len(self._tasks):
            instance.passed = True
            instance.arrivals.clear()
            self._open.discard(barrier)
            self._woken.add(barrier_key(barrier))
        return barrier

    def barrier_outcome(self, barrier: BarrierId, *, now: float) -> int | Pending:
        """The instance number once it passed; raises once it timed out or cannot pass."""
        instance = self._instances[barrier]
        if instance.passed:
            return barrier.instance
        if instance.verdict is not None:
            raise instance.verdict.refused()
        if self._failure is not None:
            raise Refused(Reason.CLUSTER_FAILED, f"{barrier} failed: {self._failure}")
        verdict = self._time_out_if_late(barrier, instance, now)
        if verdict is not None:
            raise verdict.refused()
        return Pending(instance.deadline)

    # --- key-value ---------------------------------------------------------------------------------

    def kv_set(self, key: str, value: bytes, *, allow_overwrite: bool, now: float) -> None:
        if not key:
            raise Refused(Reason.INVALID, "key is empty")
        if key in self._kv and not allow_overwrite:
            raise Refused(
                Reason.KEY_EXISTS, f"key {key!r} already exists", hint="allow overwriting if replacing it is intended"
            )
        self._kv[key] = value
        self._woken.add(kv_key(key))

    def kv_get(self, key: str, *, started: float, timeout: float, now: float) -> bytes | Pending:
        """The key's value, or Pending until ``started + timeout``; then it raises, naming the key."""
        if not key:
            raise Refused(Reason.INVALID, "key is empty")
        if not (math.isfinite(timeout) and timeout >= 0):
            raise Refused(Reason.INVALID, f"key-value timeout must be >= 0 seconds, got {timeout!r}")
        value = self._kv.get(key)
        if value is not None:
            return value
        if self._failure is not None:
            raise Refused(Reason.CLUSTER_FAILED, f"waiting for key {key!r}: the cluster is in error: {self._failure}")
        if now >= started + timeout:
            raise Refused(Reason.TIMED_OUT, f"key {key!r} was not set within {timeout:.1f} s")
        return Pending(started + timeout)

    def kv_dir(self, prefix: str) -> list[tuple[str, bytes]]:
        """Every entry whose key starts with ``prefix`` (a plain string prefix), sorted by key."""
        return sorted((key, value) for key, value in self._kv.items() if key.startswith(prefix))

    # --- status ------------------------------------------------------------------------------------

    def status(self, *, now: float) -> ClusterStatus:
        tasks = tuple(
            TaskStatus(
                task=t.info,
                state=t.state,
                incarnation=t.incarnation,
                hostname=t.hostname,
                peer=t.peer,
                seconds_since_heartbeat=None if t.state is TaskState.WAITING else now - t.last_heartbeat,
                cause=t.cause,
            )
            for t in self._tasks
        )
        barriers = tuple(
            OpenBarrier(b.name, b.instance, tuple(sorted(instance.arrivals)), max(0.0, instance.deadline - now))
            for b in sorted(self._open, key=lambda b: (b.name, b.instance))
            if not (instance := self._instances[b]).decided and instance.arrivals
        )
        return ClusterStatus(self.config.cluster, self.service_incarnation, tasks, self._failure, barriers=barriers)

    # --- internals ---------------------------------------------------------------------------------

    def _task(self, task_id: int) -> _Task:
        if not 0 <= task_id < len(self._tasks):
            raise Refused(
                Reason.UNKNOWN_TASK,
                f"unknown task id {task_id}: cluster {self.config.cluster!r} has tasks 0..{len(self._tasks) - 1}",
                hint="check this host's task id against the cluster spec's host list",
            )
        return self._tasks[task_id]

    def _live(self, caller: TaskRef) -> _Task:
        """The caller's record if it is the connected process of its task; refuses otherwise."""
        task = self._task(caller.task_id)
        if task.state is TaskState.WAITING:
            raise Refused(Reason.NOT_CONNECTED, f"{task.info} has not registered", hint="register first")
        if task.incarnation != caller.incarnation:
            raise self._stale(task, caller)
        if task.state is TaskState.FAILED:
            raise Refused(Reason.CLUSTER_FAILED, f"{task.info} was declared failed: {task.cause}")
        if task.state is TaskState.DISCONNECTED:
            raise Refused(Reason.NOT_CONNECTED, f"{task.info} has disconnected")
        return task

    def _stale(self, task: _Task, caller: TaskRef) -> Refused:
        return Refused(
            Reason.STALE_INCARNATION,
            f"{task.info}: incarnation {caller.incarnation} is stale; the task is registered by incarnation "
            f"{task.incarnation} (from {task.hostname} at {task.peer})",
            hint="another process registered for this task since; stop this one",
        )

    def _membership(self, registration: Registration) -> Membership:
        return Membership(
            task=TaskRef(registration.task_id, registration.incarnation),
            service_incarnation=self.service_incarnation,
            tasks=tuple(t.info for t in self._tasks),
            heartbeat_timeout=self.config.heartbeat_timeout,
            barrier_timeout=self.config.barrier_timeout,
        )

    def _registration_closed(self, now: float) -> bool:
        deadline = self._register_deadline
        return deadline is not None and now >= deadline and bool(self._never_registered)

    def _registration_timeout(self) -> _Verdict:
        # Registrations are refused from the deadline on, so the tasks missing now are those missing then.
        missing = [self._tasks[i].info for i in sorted(self._never_registered)]
        total = len(self._tasks)
        return _Verdict(
            Reason.TIMED_OUT,
            f"registration timed out after {self.config.register_timeout:.1f} s: {total - len(missing)} of "
            f"{total} hosts registered; missing: {_task_list(missing)}",
            hint="start `tpuctl init` on the missing hosts and check they reach the coordinator, "
            "or raise the register timeout",
        )

    def _silence_cause(self, silence: float) -> str:
        return f"no heartbeat for {silence:.1f} s (timeout {self.config.heartbeat_timeout:g} s)"

    def _fail(self, failed: Iterable[tuple[_Task, str]]) -> tuple[TaskFailure, ...]:
        """Mark tasks failed; the first batch becomes the cluster's error. Returns the new failures."""
        failures = []
        for task, cause in failed:
            task.state = TaskState.FAILED
            task.cause = cause
            failures.append(TaskFailure(task.info, cause))
        if failures:
            if self._failure is None:
                self._failure = ClusterFailure(tuple(failures))
            self._wake_everyone = True
        return tuple(failures)

    def _decide(self, barrier: BarrierId, instance: _Instance, verdict: _Verdict) -> None:
        instance.verdict = verdict
        instance.arrivals.clear()
        self._open.discard(barrier)

    def _time_out_if_late(self, barrier: BarrierId, instance: _Instance, now: float) -> _Verdict | None:
        """Decide an open instance whose deadline has passed; its verdict if it did."""
        if now < instance.deadline:
            return None
        arrived = len(instance.arrivals)
        missing = [t.info for t in self._tasks if t.info.task_id not in instance.arrivals]
        verdict = _Verdict(
            Reason.TIMED_OUT,
            f"{barrier} timed out after {instance.timeout:.1f} s: {arrived} of {len(self._tasks)} hosts arrived; "
            f"missing: {_task_list(missing)}",
            hint="the missing hosts did not reach this barrier in time; their logs say why",
        )
        self._decide(barrier, instance, verdict)
        return verdict

    def _disconnected_verdict(self, barrier: BarrierId, gone: list[TaskInfo]) -> _Verdict:
        verb = "has" if len(gone) == 1 else "have"
        return _Verdict(Reason.CLUSTER_FAILED, f"{barrier} cannot pass: {_task_list(gone)} {verb} disconnected")


def _task_list(tasks: Iterable[TaskInfo]) -> str:
    return ", ".join(str(t) for t in tasks)
