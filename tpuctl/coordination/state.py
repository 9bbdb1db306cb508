"""The coordination service's state machine: membership, failure detection, barriers, gathers, key-value.

Pure: no grpc, no asyncio, no clock. Every method takes ``now`` (monotonic seconds by the service's
clock, never decreasing) and returns a value, a ``Pending`` (ask again when woken, or at its deadline),
or raises ``Refused``. The executor (``service.py``) parks pending calls and, after every call into the
state, wakes the wait keys ``take_wakeup`` names.

Semantics, and where they differ from TSL (the coordination service TensorFlow and JAX use):

* Registration: the first registration starts the clock; ``register_timeout`` later, registration closes
  if a task is still missing, and every waiter (and every later registrant) is told how many tasks and
  the first few, with their addresses. A second live process claiming a registered task is refused (TSL
  kills the job). Waiters are woken once, when the last task registers, not on every registration.
* Heartbeats: a connected task silent for longer than ``heartbeat_timeout`` is declared failed
  (``expire``, which the executor calls a few times a second; it visits only the tasks that are late,
  as tasks are kept in the order of their last heartbeat). The first failure (or a task's own error
  report) puts the cluster in error for good: every wait fails at once, naming the failed task.
* Barriers and gathers (``rendezvous.py``): counted per name and task; a timeout is not a cluster error.
* Key-value (``kv.py``): values are bytes; a blocking get waits for the key up to the caller's timeout.
  Writes are charged to the writing task, under per-task and total quotas (``KvLimits``).
* Identity: a new registration keeps the credential the executor generated for it (``Registration.
  credential``) and answers it in ``Membership.task``; every task-scoped call must carry it (compared in
  constant time, ``hmac.compare_digest``), else it is refused ``NOT_PERMITTED``. Nothing this state
  answers contains another task's credential or incarnation (status has a fingerprint), and no refusal
  echoes them.

Cost: every call is O(1) or O(its answer); only ``status`` lists every task. ``counters`` counts the work.
"""

from __future__ import annotations

import hmac
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tpuctl.coordination.kv import KeyValueStore
from tpuctl.coordination.rendezvous import Rendezvous
from tpuctl.coordination.taskset import Missing
from tpuctl.coordination.values import (
    CREDENTIAL_BYTES,
    ERRORS,
    MAX_RETRY_SECRET,
    MIN_RETRY_SECRET,
    PROTOCOL_VERSION,
    REGISTRATION,
    SAMPLE,
    BarrierId,
    ClusterFailure,
    ClusterStatus,
    Counters,
    Gathered,
    Membership,
    OpenBarrier,
    Pending,
    Reason,
    Refused,
    Registration,
    RegistrationProgress,
    RendezvousKind,
    RendezvousProgress,
    ServiceConfig,
    TaskFailure,
    TaskInfo,
    TaskRef,
    TaskSpec,
    TaskState,
    TaskStatus,
    Verdict,
    WaitKey,
    Wakeup,
    barrier_key,
    check_name,
    check_timeout,
    clip,
    count,
    fingerprint,
    kv_key,
    sample_text,
    shown,
)

__all__ = [
    "ERRORS",
    "PROTOCOL_VERSION",
    "REGISTRATION",
    "BarrierId",
    "ClusterFailure",
    "ClusterStatus",
    "CoordinationState",
    "Counters",
    "Gathered",
    "Membership",
    "OpenBarrier",
    "Pending",
    "Reason",
    "Refused",
    "Registration",
    "RegistrationProgress",
    "RendezvousProgress",
    "ServiceConfig",
    "TaskFailure",
    "TaskInfo",
    "TaskRef",
    "TaskSpec",
    "TaskState",
    "TaskStatus",
    "WaitKey",
    "Wakeup",
    "barrier_key",
    "kv_key",
]


def _random_credential() -> bytes:
    import secrets

    return secrets.token_bytes(CREDENTIAL_BYTES)


@dataclass
class _Task:
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


class CoordinationState:
    """Everything the coordination service knows. Not thread-safe: one executor drives it."""

    def __init__(
        self,
        config: ServiceConfig,
        *,
        service_incarnation: int,
        new_credential: Callable[[], bytes] | None = None,
    ) -> None:
        """``new_credential``: the secret of a registration that brings none (the executor generates one
        per registration at its edge; default: ``CREDENTIAL_BYTES`` from ``secrets``)."""
        self.config = config
        self._new_credential = new_credential or _random_credential
        self.service_incarnation = service_incarnation
        self.counters = Counters()
        self.tasks = tuple(TaskInfo(i, spec.address) for i, spec in enumerate(config.tasks))
        """Every task of the cluster, by id (one shared tuple)."""
        self._tasks = [_Task(info) for info in self.tasks]
        self._register_deadline: float | None = None
        self._unregistered = Missing(len(self._tasks))
        self._registration_verdict: Verdict | None = None
        self._by_heartbeat: OrderedDict[int, None] = OrderedDict()
        """Connected tasks, least recently heard from first."""
        self._disconnected: set[int] = set()
        self._failure: ClusterFailure | None = None
        self._told: set[int] = set()
        """Tasks with nothing left to hear about the cluster's error: answered it (a refused registration,
        a registration wait, an error poll), failed themselves, or gone (disconnected)."""
        self._woken: set[WaitKey] = set()
        self._wake_everyone = False
        self._rendezvous = Rendezvous(self.tasks, self.counters, self._woken)
        self._kv = KeyValueStore(self.counters, config.kv_limits)

    @property
    def failure(self) -> ClusterFailure | None:
        return self._failure

    @property
    def kv_version(self) -> int:
        """Changes on every key-value write (a listing's encoded answer is good until then)."""
        return self._kv.version

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
                f"cluster name mismatch: the registering host is in cluster {shown(registration.cluster)}, "
                f"this coordinator serves cluster {shown(self.config.cluster)}",
                hint="every host must use the same cluster spec; check the coordinator address and port",
            )
        task = self._task(registration.task_id)
        if registration.incarnation == 0:
            raise Refused(Reason.INVALID, "incarnation 0 is reserved; a registration needs a random non-zero one")
        if not MIN_RETRY_SECRET <= len(registration.retry_secret) <= MAX_RETRY_SECRET:
            raise Refused(
                Reason.INVALID,
                f"a registration needs a retry secret of {MIN_RETRY_SECRET} to {MAX_RETRY_SECRET} random bytes "
                f"(it brought {len(registration.retry_secret)})",
                hint="run the same tpuctl version on every host",
            )
        if task.state is TaskState.CONNECTED:
            if task.incarnation != registration.incarnation or not hmac.compare_digest(
                task.retry_secret, registration.retry_secret
            ):
                raise Refused(
                    Reason.TASK_TAKEN,
                    f"task {task.info.task_id} is already registered by another live process (registered "
                    f"from {task.hostname} at {task.peer}, fingerprint {task.fingerprint})",
                    hint=f"is `tpuctl init` already running for task {task.info.task_id} on {task.hostname}? "
                    f"Check this host's task id",
                )
            self._heard_from(task, now)  # an RPC retry of our own registration: proof of life too
            return self._membership(task)
        if self._failure is not None:
            self._told.add(task.info.task_id)
            raise Refused(Reason.CLUSTER_FAILED, f"cannot join: the cluster is in error: {self._failure}")
        if self._registration_closed(now):
            raise self._registration_timeout().refused()
        task.state = TaskState.CONNECTED
        task.incarnation = registration.incarnation
        task.hostname = clip(registration.hostname, 255)
        task.peer = clip(registration.peer, 255)
        task.retry_secret = registration.retry_secret
        task.credential = registration.credential or self._new_credential()
        task.fingerprint = fingerprint(task.credential)
        self._heard_from(task, now)
        self._disconnected.discard(task.info.task_id)
        self._told.discard(task.info.task_id)
        if self._unregistered.discard(task.info.task_id) and not self._unregistered:
            self._woken.add(REGISTRATION)
        if self._register_deadline is None:
            self._register_deadline = now + self.config.register_timeout
        return self._membership(task)

    def registration_waiting(self, caller: TaskRef, *, now: float) -> float | None:
        """Seconds until registration closes while tasks are missing; None once all registered.
        Raises once it closed with tasks missing, or the cluster failed. O(1)."""
        self._live(caller)
        if self._failure is not None:
            self._told.add(caller.task_id)
            raise Refused(Reason.CLUSTER_FAILED, f"cluster failed during registration: {self._failure}")
        if not self._unregistered:
            return None
        assert self._register_deadline is not None  # set by the caller's own registration
        if now >= self._register_deadline:
            raise self._registration_timeout().refused()
        return self._register_deadline - now

    def registration_progress(self, caller: TaskRef, *, now: float) -> RegistrationProgress:
        """How far registration is (the first ``SAMPLE`` missing hosts); raises like
        ``registration_waiting``. O(sample)."""
        left = self.registration_waiting(caller, now=now)
        total = len(self._tasks)
        missing = len(self._unregistered)
        sample = tuple(self.tasks[i] for i in self._unregistered.first(SAMPLE))
        self.counters.touched += len(sample) + 1
        return RegistrationProgress(total - missing, total, sample, left or 0.0, missing)

    def heartbeat(self, caller: TaskRef, *, now: float, service_incarnation: int = 0) -> int:
        """Record proof of life; returns the service incarnation. ``service_incarnation``, when given, is
        the one the caller registered with: another one means this coordinator is a restarted one."""
        if service_incarnation and service_incarnation != self.service_incarnation:
            raise Refused(
                Reason.STALE_INCARNATION,
                f"the coordinator restarted (service incarnation {self.service_incarnation}, task "
                f"{caller.task_id} registered with {service_incarnation}); this host's registration is gone",
                hint="restart `tpuctl init` on every host",
            )
        task = self._live(caller)
        silence = now - task.last_heartbeat
        if silence > self.config.heartbeat_timeout:
            # Late by its own account: decide now rather than depend on when ``expire`` last ran.
            self._fail([(task, self._silence_cause(silence))])
            raise Refused(Reason.CLUSTER_FAILED, f"{task.info} was declared failed: {task.cause}")
        self._heard_from(task, now)
        return self.service_incarnation

    def expire(self, *, now: float) -> tuple[TaskFailure, ...]:
        """Declare failed every connected task silent for longer than the heartbeat timeout.
        O(1 + late tasks): tasks are ordered by their last heartbeat."""
        late = []
        limit = self.config.heartbeat_timeout
        for task_id in self._by_heartbeat:
            task = self._tasks[task_id]
            self.counters.touched += 1
            if now - task.last_heartbeat <= limit:
                break
            late.append((task, self._silence_cause(now - task.last_heartbeat)))
        return self._fail(late)

    def report_error(
        self, caller: TaskRef, cause: str, *, now: float, shutdown: bool = False
    ) -> tuple[TaskFailure, ...]:
        """The caller's own fatal error; with ``shutdown``, a deliberate shutdown of the whole cluster (the
        cluster's error then says so in ``ClusterFailure.shutdown``, which hosts test instead of the text)."""
        task = self._live(caller)
        if shutdown:
            return self._fail([(task, f"shut the cluster down: {clip(cause) or 'no reason given'}")], shutdown=True)
        return self._fail([(task, f"reported an error: {clip(cause) or 'no cause given'}")])

    def disconnect(self, caller: TaskRef, *, now: float) -> None:
        """Leave gracefully. Barriers still waiting for this task fail at once (they can no longer pass)."""
        task = self._task(caller.task_id)
        if task.state in (TaskState.DISCONNECTED, TaskState.FAILED) and self._holds(task, caller):
            return  # a retry, or a failed task leaving: its failure stands
        self._live(caller)
        task.state = TaskState.DISCONNECTED
        self._by_heartbeat.pop(task.info.task_id, None)
        self._disconnected.add(task.info.task_id)
        self._told.add(task.info.task_id)
        self._rendezvous.task_left(task.info, now=now)

    def poll_error(self, caller: TaskRef, *, now: float) -> ClusterFailure | None:
        """The cluster's error, if any (the same object every time). A task declared failed may still
        poll: that is how it learns."""
        task = self._task(caller.task_id)
        if task.state is not TaskState.FAILED:
            self._live(caller)
        elif task.incarnation != caller.incarnation:
            raise self._stale(task, caller)
        elif not self._holds(task, caller):
            raise self._not_permitted(task)
        if self._failure is not None:
            self._told.add(task.info.task_id)
        return self._failure

    def untold(self) -> int:
        """How many tasks have not heard the cluster's error yet (0 without one): neither answered it (a
        refused registration, a registration wait, an error poll) nor failed nor disconnected. A host whose
        init failed keeps its service up until this is 0 (bounded), so no peer finds the port closed. O(1)."""
        return 0 if self._failure is None else len(self._tasks) - len(self._told)

    # --- barriers and gathers ----------------------------------------------------------------------

    def barrier_arrive(self, caller: TaskRef, name: str, timeout: float, *, now: float) -> BarrierId:
        """Count the caller's next call to ``name``; ``timeout`` 0 means the configured default."""
        return self._arrive("barrier", caller, name, timeout, None, now)

    def barrier_outcome(self, barrier: BarrierId, *, now: float) -> int | Pending:
        """The instance number once it passed; raises once it timed out or cannot pass."""
        outcome = self._rendezvous.outcome(barrier, failure=self._failure, now=now)
        assert not isinstance(outcome, Gathered)
        return outcome

    def gather_arrive(self, caller: TaskRef, name: str, value: bytes, timeout: float, *, now: float) -> BarrierId:
        """Publish the caller's value to its next call of gather ``name`` (a barrier carrying values)."""
        return self._arrive("gather", caller, name, timeout, value, now)

    def gather_outcome(self, gather: BarrierId, *, now: float) -> Gathered | Pending:
        """Every task's value once all published (the same object for every caller); raises like a barrier."""
        outcome = self._rendezvous.outcome(gather, failure=self._failure, now=now)
        assert not isinstance(outcome, int)
        return outcome

    def rendezvous_progress(
        self, caller: TaskRef, name: str, *, kind: RendezvousKind = "barrier", now: float
    ) -> RendezvousProgress | None:
        """Where the caller's latest call to barrier (or gather) ``name`` stands. O(sample)."""
        self._live(caller)
        return self._rendezvous.progress(kind, caller.task_id, name, now=now)

    @property
    def gather_value_limit(self) -> int:
        """The most bytes one host may publish to a gather in this cluster."""
        return self._rendezvous.value_limit()

    # --- key-value ---------------------------------------------------------------------------------

    def kv_set(
        self, key: str, value: bytes, *, allow_overwrite: bool, now: float, caller: TaskRef | None = None
    ) -> None:
        """Set ``key``, charged to ``caller``'s quota (the executor always names one: a write is
        task-scoped; None is a write of the service's own, counted in the total only)."""
        owner = None if caller is None else self._live(caller).info.task_id
        self._kv.set(key, value, allow_overwrite=allow_overwrite, owner=owner)
        self._woken.add(kv_key(key))

    def kv_get(self, key: str, *, started: float, timeout: float, now: float) -> bytes | Pending:
        """The key's value, or Pending until ``started + timeout``; then it raises, naming the key."""
        check_timeout("key-value", timeout)
        value = self._kv.get(key)
        if value is not None:
            return value
        if self._failure is not None:
            raise Refused(
                Reason.CLUSTER_FAILED, f"waiting for key {shown(key)}: the cluster is in error: {self._failure}"
            )
        if now >= started + timeout:
            raise Refused(Reason.TIMED_OUT, f"key {shown(key)} was not set within {timeout:.1f} s")
        return Pending(started + timeout)

    def kv_dir(self, prefix: str) -> list[tuple[str, bytes]]:
        """Every entry whose key starts with ``prefix`` (a plain string prefix), sorted by key. O(answer)."""
        if len(prefix) > 1024:
            check_name("key prefix", prefix)
        return self._kv.dir(prefix)

    # --- status ------------------------------------------------------------------------------------

    def status_fingerprint(self, task_id: int) -> str:
        """The fingerprint of ``task_id``'s registration (what status shows; "" if none)."""
        return self._tasks[task_id].fingerprint if 0 <= task_id < len(self._tasks) else ""

    def status(self, *, now: float) -> ClusterStatus:
        """Every task, and the open barriers: the one O(tasks) answer."""
        self.counters.touched += len(self._tasks)
        tasks = tuple(
            TaskStatus(
                task=t.info,
                state=t.state,
                incarnation=t.incarnation,
                hostname=t.hostname,
                peer=t.peer,
                seconds_since_heartbeat=None if t.state is TaskState.WAITING else now - t.last_heartbeat,
                cause=t.cause,
                fingerprint=t.fingerprint,
            )
            for t in self._tasks
        )
        barriers = self._rendezvous.open_instances(now=now)
        return ClusterStatus(self.config.cluster, self.service_incarnation, tasks, self._failure, barriers=barriers)

    # --- internals ---------------------------------------------------------------------------------

    def _arrive(
        self, kind: RendezvousKind, caller: TaskRef, name: str, timeout: float, value: bytes | None, now: float
    ) -> BarrierId:
        self._live(caller)
        return self._rendezvous.arrive(
            kind,
            caller.task_id,
            name,
            timeout,
            value,
            default_timeout=self.config.barrier_timeout,
            disconnected=self._disconnected,
            failure=self._failure,
            now=now,
        )

    def _heard_from(self, task: _Task, now: float) -> None:
        task.last_heartbeat = now
        self._by_heartbeat[task.info.task_id] = None
        self._by_heartbeat.move_to_end(task.info.task_id)
        self.counters.touched += 1

    def _task(self, task_id: int) -> _Task:
        if not 0 <= task_id < len(self._tasks):
            raise Refused(
                Reason.UNKNOWN_TASK,
                f"unknown task id {task_id}: cluster {shown(self.config.cluster)} has tasks "
                f"0..{len(self._tasks) - 1}",
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
        if not self._holds(task, caller):
            raise self._not_permitted(task)
        if task.state is TaskState.FAILED:
            raise Refused(Reason.CLUSTER_FAILED, f"{task.info} was declared failed: {task.cause}")
        if task.state is TaskState.DISCONNECTED:
            raise Refused(Reason.NOT_CONNECTED, f"{task.info} has disconnected")
        return task

    @staticmethod
    def _holds(task: _Task, caller: TaskRef) -> bool:
        """The caller carries the task's credential (constant time: no timing oracle)."""
        return bool(task.credential) and hmac.compare_digest(caller.credential, task.credential)

    def _stale(self, task: _Task, caller: TaskRef) -> Refused:
        # The caller's own incarnation only: the task's is what a registration retry proves, never shown.
        return Refused(
            Reason.STALE_INCARNATION,
            f"{task.info}: incarnation {caller.incarnation} is stale; the task is registered by another "
            f"process (from {task.hostname} at {task.peer}, fingerprint {task.fingerprint})",
            hint="another process registered for this task since; stop this one",
        )

    def _not_permitted(self, task: _Task) -> Refused:
        return Refused(
            Reason.NOT_PERMITTED,
            f"{task.info}: the call does not carry the credential of the task's registration",
            hint="only the process that registered a task may act for it: use the TaskRef its register() returned",
        )

    def _membership(self, task: _Task) -> Membership:
        return Membership(
            task=TaskRef(task.info.task_id, task.incarnation, task.credential),
            service_incarnation=self.service_incarnation,
            tasks=self.tasks,
            heartbeat_timeout=self.config.heartbeat_timeout,
            barrier_timeout=self.config.barrier_timeout,
            num_tasks=len(self.tasks),
        )

    def _registration_closed(self, now: float) -> bool:
        deadline = self._register_deadline
        return deadline is not None and now >= deadline and bool(self._unregistered)

    def _registration_timeout(self) -> Verdict:
        # Registrations are refused from the deadline on, so the tasks missing now are those missing then:
        # the verdict is built once.
        if self._registration_verdict is None:
            missing = len(self._unregistered)
            sample = [self.tasks[i] for i in self._unregistered.first(SAMPLE)]
            self.counters.touched += len(sample) + 1
            total = len(self._tasks)
            self._registration_verdict = Verdict(
                Reason.TIMED_OUT,
                f"registration timed out after {self.config.register_timeout:.1f} s: {count(total - missing)} "
                f"of {count(total)} hosts registered; missing: {sample_text(sample, missing)}",
                hint="start `tpuctl init` on the missing hosts and check they reach the coordinator, "
                "or raise the register timeout",
            )
        return self._registration_verdict

    def _silence_cause(self, silence: float) -> str:
        return f"no heartbeat for {silence:.1f} s (timeout {self.config.heartbeat_timeout:g} s)"

    def _fail(self, failed: Iterable[tuple[_Task, str]], *, shutdown: bool = False) -> tuple[TaskFailure, ...]:
        """Mark tasks failed; the first batch becomes the cluster's error. Returns the new failures."""
        failures = []
        for task, cause in failed:
            task.state = TaskState.FAILED
            task.cause = cause
            self._told.add(task.info.task_id)
            self._by_heartbeat.pop(task.info.task_id, None)
            failures.append(TaskFailure(task.info, cause))
        if failures:
            if self._failure is None:
                self._failure = ClusterFailure(tuple(failures[:SAMPLE]), len(failures), shutdown=shutdown)
            self._wake_everyone = True
            self._woken.add(ERRORS)
        return tuple(failures)
