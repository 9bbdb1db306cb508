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
  as tasks are kept in the order of their last heartbeat). A task with an open session stream
  (``session_opened``) is not silent: the transport's keepalive pings vouch for it, at no
  cost here. When its last session ends (``session_closed``) its silence counts from the keepalive
  window before (``keepalive_window``: when the pings last vouched for it at the latest), so a host that
  froze or was cut off is declared failed within the heartbeat timeout of its last sign of life, as a
  heartbeating one is. The first failure (or a task's own error
  report) puts the cluster in error for good: every wait fails at once, naming the failed task.
* Barriers and gathers (``rendezvous.py``): counted per name and task; a timeout is not a cluster error,
  and a failed instance is over for every task (each one's next call joins a later instance).
* Key-value (``kv.py``): values are bytes; a blocking get waits for the key up to the caller's timeout.
  Writes are charged to the writing task, under per-task and total quotas (``KvLimits``).
* Generations (``generations.py``, ``ServiceConfig.restart``): under policy fail (the default) the first
  failure is final, as above; under policy rejoin it ends the formed generation, while restarts are
  left, and the next one starts forming at once. Everything task-scoped is per generation.
* Reclaiming a task: a registration that brings the credential of the task's live registration
  (``Registration.previous_credential``, kept in the host's state dir) is that host's new process: the
  old registration fails at once ("restarted") instead of a heartbeat timeout later, under either policy.
* Identity: a new registration keeps the credential the executor generated for it (``Registration.
  credential``) and answers it in ``Membership.task``; every task-scoped call must carry it (compared in
  constant time, ``hmac.compare_digest``), else it is refused ``NOT_PERMITTED``. Nothing this state
  answers contains another task's credential or incarnation (status has a fingerprint), and no refusal
  echoes them.

* Members and standby (``planning.py``, ``ServiceConfig.roster``): a generation is whole roster slices by
  position (its plan; generation 1's is the identity). A registrant outside the plan is *standby*
  (``Membership.standby``): connected and heartbeating, but its failure only takes it out of standby, and
  its task-scoped calls other than heartbeats, error polls, registration and leaving are refused
  (``STANDBY``). Registration, barriers and gathers count members only, by rank (the rendezvous runs in
  rank space; messages name task ids). When a formed generation ends by member failures, the next plan
  puts the lowest-numbered ready standby roster slice in each lost position, drops the rest under policy
  elastic (down to ``min_slices``) or keeps them (waits), and keeps every lost position unless the
  surviving members are a majority of the generation's. An elastic generation short of slices ends to
  grow when a roster slice outside it is complete (every host standing by).

Cost: every call is O(1) or O(its answer); only ``status`` lists every task, and starting a generation
visits every task once; planning the next one is O(roster slices). ``counters`` counts the work.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Sequence

from tpuctl.coordination.figures import BarrierWaits, HostFigures, host_figures
from tpuctl.coordination.generations import Generations
from tpuctl.coordination.kv import KeyValueStore
from tpuctl.coordination.plan import Plan
from tpuctl.coordination.planning import Placement, plan_grown, plan_next
from tpuctl.coordination.rendezvous import Rendezvous
from tpuctl.coordination.tasks import TaskRecord, TaskTable, elsewhere, observed_address, registered_by
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
    Moved,
    Pending,
    Reason,
    Refused,
    Registration,
    RegistrationProgress,
    RendezvousKind,
    RendezvousProgress,
    ServiceConfig,
    StandbySlice,
    TaskFailure,
    TaskInfo,
    TaskRef,
    TaskState,
    Verdict,
    WaitKey,
    Wakeup,
    check_name,
    check_timeout,
    clip,
    fingerprint,
    kv_key,
    sample_text,
)
from tpuctl.durations import format_duration
from tpuctl.errors import InputError
from tpuctl.messages import count, shown

_NO_WAKEUP = Wakeup()


def _random_credential() -> bytes:
    import secrets

    return secrets.token_bytes(CREDENTIAL_BYTES)


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
        """Every task of the cluster, by id (one shared tuple): the roster, spares included."""
        self.roster = config.roster
        self.placement = Placement(self.roster.identity(), self.roster, self.tasks)
        """The current generation's plan, indexed (members by rank, a task id's rank)."""
        self._connected = array("i", [0]) * self.roster.roster_slices
        """Connected hosts of each roster slice in the current generation."""
        self._ready: set[int] = set()
        """Roster slices outside the current plan whose every host is connected: ready standby slices."""
        self._held = ""
        """Why the majority rule kept the lost positions of the generation before (for the restart timeout)."""
        self._previous: Placement | None = None
        """The plan of the last generation that formed before the current one (None: none known), the one the
        majority rule counts against: this service's own, or what the registrants of a fresh service brought
        (``Registration.previous_plan``)."""
        self._previous_generation = 0
        self._settle_at: float | None = None
        """A fresh service that learnt the previous plan: when its members not registered by then count as
        lost, and the first generation is planned from the previous one (``_settle``)."""
        self._table = TaskTable(self.tasks, self.counters, heartbeat_timeout=config.heartbeat_timeout)
        self.generations = Generations(
            config.first_generation, config.restart, service_incarnation=service_incarnation,
            coordinator_task=config.coordinator_task,
        )  # fmt: skip
        self._formed = False
        """Every task registered into the current generation (from then on a failure ends it)."""
        self._restart_deadline: float | None = None
        """When the current generation must have formed (restarts only; generation 1 has the register timeout)."""
        self._register_deadline: float | None = None
        self._unregistered = Missing(self.placement.member_count)
        """Members not registered yet, by rank."""
        self._registration_verdict: Verdict | None = None
        self.keepalive_window = self._table.keepalive_window
        """How long before a session's end its task was last vouched for at the latest."""
        self._disconnected: set[int] = set()
        """Members that left (policy fail), by rank."""
        self._failure: ClusterFailure | None = None
        self._told: set[int] = set()
        """Tasks with nothing left to hear about the cluster's error: answered it (a refused registration,
        a registration wait, an error poll), failed themselves, or gone (disconnected)."""
        self._woken: set[WaitKey] = set()
        self._wake_everyone = False
        self.failed_since: float | None = None
        """When the first of the hosts whose failures ended the latest generation (or the cluster) was last
        known alive (``now``'s clock; None: the end was no host's failure); ``failed_seen``: the same for
        each of the first ``SAMPLE`` of them, by task id. For the goodput ledger; O(failures) once per end."""
        self.failed_seen: dict[int, float] = {}
        self.barrier_waits = BarrierWaits()
        """The job's barriers and gathers as they pass or fail, all generations (for metrics)."""
        self._rendezvous = Rendezvous(
            self.placement.members, self.counters, self._woken, generation=self.generation, waits=self.barrier_waits
        )
        self._took_part: set[int] = set()
        """Tasks that called a barrier or gather of the current generation (its core-ID merge, at least)."""
        self._kv = KeyValueStore(self.counters, config.kv_limits)
        self._lost = frozenset(config.lost)
        """Tasks lost with the old coordinator (a successor's service), until a generation forms."""
        if config.previous_plan is not None or config.lost:
            self._plan_first(config.previous_plan or self.roster.identity())

    def _plan_first(self, previous: Plan) -> None:
        """A successor's first generation: the lost coordinator's generation's plan without the lost hosts'
        positions where policy elastic allows dropping them (no standby slice is known ready yet: none has
        registered). O(positions), once."""
        placement = Placement(previous, self.roster, self.tasks)
        lost: dict[int, int] = {}
        for task_id in self._lost:
            rank = placement.rank_of(task_id)
            if rank is not None:
                lost[rank // placement.per] = lost.get(rank // placement.per, 0) + 1
        plan = previous
        if lost and self.config.restart.rejoin:
            plan = plan_next(placement, lost, [], self.config.restart, generation=self.generation).plan
        self.placement = Placement(plan, self.roster, self.tasks)
        self._unregistered = Missing(self.placement.member_count)
        self._restart_at(self.generation)

    def _replace_lost_if_ready(self, now: float) -> None:
        """A successor's generation still forming, a lost host's position still empty, and a standby slice
        now ready (every host registered): the generation gives way to the next, with that slice in the
        lost one's place (the hosts registered so far register again, as after any end). O(1) unless it
        re-plans (then O(positions + ready))."""
        policy = self.config.restart
        if not (self._lost and self._ready and not self._formed and policy.rejoin):
            return
        if self.generations.restarts >= policy.max_restarts:
            return
        per = self.placement.per
        lost: dict[int, int] = {}
        for task_id in self._lost:
            rank = self.placement.rank_of(task_id)
            if rank is not None and rank in self._unregistered:
                lost[rank // per] = lost.get(rank // per, 0) + 1
        if not lost:
            return
        ready = sorted(self._ready)
        self.counters.touched += len(self.placement) + len(ready)
        following = plan_next(self.placement, lost, ready, policy, generation=self.generation + 1)
        if following.plan == self.placement.plan:
            return
        end = self.generations.end((), shutdown=False, next=following.note)
        assert end.rejoin
        self._start_generation(self.generation + 1, now, following.plan)
        self._wake_everyone = True
        self._woken.add(ERRORS)

    @property
    def failure(self) -> ClusterFailure | None:
        return self._failure

    @property
    def registration_complete(self) -> bool:
        """Every member of the current generation has registered."""
        return not self._unregistered

    @property
    def plan(self) -> Plan:
        """The current generation's plan."""
        return self.placement.plan

    @property
    def member_count(self) -> int:
        """Members of the current generation (what registration, barriers and gathers count)."""
        return self.placement.member_count

    @property
    def generation(self) -> int:
        """The current generation: 1, then one more after every restart."""
        return self.generations.current

    @property
    def formed(self) -> bool:
        """Every task registered into the current generation and it has not failed."""
        return self._formed and self._failure is None

    def live_task(self, caller: TaskRef) -> TaskInfo:
        """The caller's task, when the caller is its live process and a member of the current generation;
        refused otherwise, naming why (another generation, failed, disconnected, standing by). O(1)."""
        return self._member(caller)[0].info

    def is_live(self, task_id: int) -> bool:
        """Task ``task_id`` is a connected member of the current generation (not waiting, failed, gone or
        standing by). O(1)."""
        return (
            0 <= task_id < len(self._table)
            and self._table.records[task_id].state is TaskState.CONNECTED
            and self.placement.rank_of(task_id) is not None
        )

    @property
    def kv_version(self) -> int:
        """Changes on every key-value write (a listing's encoded answer is good until then)."""
        return self._kv.version

    def take_wakeup(self) -> Wakeup:
        """The wait keys whose outcome may have changed since the last call."""
        if not self._woken and not self._wake_everyone:
            return _NO_WAKEUP  # the common case, after almost every call: nothing to build
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
        self._check_shape(registration)
        if registration.incarnation == 0:
            raise Refused(Reason.INVALID, "incarnation 0 is reserved; a registration needs a random non-zero one")
        if not MIN_RETRY_SECRET <= len(registration.retry_secret) <= MAX_RETRY_SECRET:
            raise Refused(
                Reason.INVALID,
                f"a registration needs a retry secret of {MIN_RETRY_SECRET} to {MAX_RETRY_SECRET} random bytes "
                f"(it brought {len(registration.retry_secret)})",
                hint="run the same tpuctl version on every host",
            )
        ours = registration.generation == self.generation and (
            self._table.same_process(task, registration) or self._table.proves(task, registration.previous_credential)
        )  # a host of this service registering again into the generation it formed with (dropped while it formed)
        if (
            self._first_forming()
            and not ours
            and self.generation <= registration.generation <= self.config.restart.max_restarts + 1
        ):
            # A host remembers a generation this new service has not reached (task 0 lost its state dir, or
            # was stopped and the others stayed): continue above it, so no host's generation goes back.
            # Bounded by the last generation the restart limit allows (a larger one is no cluster's: it
            # would make the first failure final).
            self._continue_above(registration.generation, now)
        if registration.previous_plan is not None and self.generations.first > 1 and self._first_forming():
            self._learn_previous(registration.generation, registration.previous_plan, now)
        if task.state is TaskState.CONNECTED:
            same = self._table.same_process(task, registration)
            if same and not self._left(registration):
                self._table.heard_from(task, now)  # an RPC retry of our own registration: proof of life too
                return self._membership(task)
            if not same and not self._table.proves(task, registration.previous_credential):
                where = observed_address(task.peer).rpartition(":")[0] or observed_address(task.peer)
                stranger = (
                    "; with auth none any process that reaches the coordinator may take a task id: set "
                    "auth.token_file in the spec"
                    if self.config.token is None
                    else ""
                )
                raise Refused(
                    Reason.TASK_TAKEN,
                    f"task {task.info.task_id} is already registered by another live process, {registered_by(task)}",
                    hint=f"is `tpuctl init` for task {task.info.task_id} already running at {where}? If not, "
                    f"something else took the task id{stranger}; else check this host's task id",
                )
            if same:  # the process gave the generation up: it lost a coordinator that froze or was cut off
                cause = (
                    f"left generation {self.generation}: it lost contact with the coordinator, "
                    f"{self.tasks[self.config.coordinator_task]}, "
                    "and registered again"
                )
            else:  # the host's new process, holding its predecessor's credential: the old registration is dead
                cause = f"restarted: a new process on {clip(registration.hostname, 255)} replaced its registration"
            self._fail([(task, cause)], now=now)
        if self._failure is not None:
            self._told.add(task.info.task_id)
            raise Refused(
                Reason.CLUSTER_FAILED, f"cannot join: the cluster is in error: {self._failure}", failure=self._failure
            )
        if self._registration_closed(now):
            raise self._registration_timeout().refused()
        self._check_restart_deadline(now)
        keep = False
        if task.reserved:
            keep = self._table.same_process(task, registration) or self._table.proves(task, registration.previous_credential)
            if not keep and not self._release([task], now):
                left = self.config.heartbeat_timeout - self._table.silence(task, now)
                raise Refused(
                    Reason.TASK_TAKEN,
                    f"task {task.info.task_id} is held for the process that registered it in generation "
                    f"{self.generation - 1} ({registered_by(task)}) "
                    f"until it re-registers, or for {left:.1f} s more (silent for the heartbeat timeout, "
                    f"{self.config.heartbeat_timeout:g} s, it is presumed dead)",
                    hint=f"that process re-registers by itself; if it is dead (its VM replaced, its state dir lost), "
                    f"retry `tpuctl init` for task {task.info.task_id} after {left:.1f} s",
                )
        task.reserved = False
        self._table.reserved.pop(task.info.task_id)
        self._set_state(task, TaskState.CONNECTED)
        if task.incarnation != registration.incarnation:
            task.sessions.clear()  # another process's sessions do not vouch for this one
        task.incarnation = registration.incarnation
        task.hostname = clip(registration.hostname, 255)
        task.peer = clip(registration.peer, 255)
        task.retry_secret = registration.retry_secret
        task.cause = ""
        if not keep:
            task.credential = registration.credential or self._new_credential()
            task.fingerprint = fingerprint(task.credential)
        self._table.heard_from(task, now)
        self._told.discard(task.info.task_id)
        rank = self.placement.rank_of(task.info.task_id)
        formed = False
        if rank is not None:
            self._disconnected.discard(rank)
            if self._unregistered.discard(rank) and not self._unregistered:
                self._formed = formed = True
                self._lost = frozenset()  # every member is back: the lost coordinator's host is history
                self._restart_deadline = self._settle_at = None
                self._held = ""
                self._woken.add(REGISTRATION)
        if self._register_deadline is None:
            # A restarted coordinator's cluster re-forms within the restart timeout, a new one registers
            # within the register timeout.
            first = self.generations.first == 1
            self._register_deadline = now + (self.config.register_timeout if first else self.config.restart.timeout)
            if not first and self._restart_deadline is None and self._unregistered:
                self._restart_deadline = self._register_deadline  # it fails as a restart does, naming who is missing
        membership = self._membership(task)
        if formed or rank is None:
            generation = self.generation
            self._grow_if_ready(now)  # a slice became ready standby, or the generation formed short of one
            if rank is None and self.generation == generation:
                self._replace_lost_if_ready(now)  # a successor's generation waits for a lost host's slice
            if rank is None and self.generation != generation:
                # This registration completed its slice and the generation grew (or gave way, the slice in a
                # lost host's place): the host registers into the generation it caused at once (its place is
                # held for its process), instead of being answered with the one that just ended (its session
                # would be refused as of an ended generation).
                return self.register(registration, now=now)
        return membership

    def registration_waiting(self, caller: TaskRef, *, now: float) -> float | None:
        """Seconds until registration closes while tasks are missing; None once all registered.
        Raises once it closed with tasks missing, or the cluster failed. O(1)."""
        self._live(caller)
        if self._failure is not None:
            self._told.add(caller.task_id)
            raise Refused(
                Reason.CLUSTER_FAILED, f"cluster failed during registration: {self._failure}", failure=self._failure
            )
        if not self._unregistered:
            return None
        if self._restart_deadline is not None:
            self._check_restart_deadline(now)
            return self._restart_deadline - now
        assert self._register_deadline is not None  # set by the caller's own registration
        if now >= self._register_deadline:
            raise self._registration_timeout().refused()
        return self._register_deadline - now

    def registration_progress(self, caller: TaskRef, *, now: float) -> RegistrationProgress:
        """How far registration is (the first ``SAMPLE`` missing hosts); raises like
        ``registration_waiting``. O(sample)."""
        left = self.registration_waiting(caller, now=now)
        members = self.placement.members
        total = len(members)
        missing = len(self._unregistered)
        sample = tuple(members[i] for i in self._unregistered.first(SAMPLE))
        self.counters.touched += len(sample) + 1
        return RegistrationProgress(total - missing, total, sample, left or 0.0, missing)

    def heartbeat(self, caller: TaskRef, *, now: float, service_incarnation: int = 0) -> int:
        """Record proof of life; returns the service incarnation. ``service_incarnation``, when given, is
        the one the caller registered with: another one means this coordinator is a restarted one."""
        if service_incarnation and service_incarnation != self.service_incarnation:
            raise Refused(
                Reason.OLD_GENERATION,
                f"the coordinator restarted (service incarnation {self.service_incarnation}, task "
                f"{caller.task_id} registered with {service_incarnation}); this host's registration is gone",
                hint="restart `tpuctl init` on every host",
            )
        task = self._live(caller)
        silence = self._table.silence(task, now)
        if silence > self.config.heartbeat_timeout:
            # Late by its own account: decide now rather than depend on when ``expire`` last ran.
            cause = self._table.silence_cause(task, now)
            self._fail([(task, cause)], now=now)
            if task.state is TaskState.WAITING:  # the generation was forming: only missing again
                raise self._dropped(task, cause)
            raise Refused(Reason.CLUSTER_FAILED, f"{task.info} was declared failed: {cause}")
        self._table.heard_from(task, now)
        return self.service_incarnation

    def session_opened(self, caller: TaskRef, session: int, *, now: float) -> None:
        """``caller``'s session stream ``session`` (the executor's id for it) is open and has proved it is
        the caller's (a registration or a heartbeat on it): until it ends, the task is alive. O(1)."""
        self._table.session_opened(self._live(caller), session, now=now)

    def session_closed(self, caller: TaskRef, session: int, *, now: float) -> None:
        """Session ``session`` of ``caller`` ended (the host closed it, its connection broke, or its
        keepalive pings went unanswered). When it was the task's last, the task's silence counts from one
        keepalive window ago: the last moment its pings vouched for it at the latest. O(1)."""
        self._table.session_closed(caller, session, now=now)

    def expire(self, *, now: float) -> tuple[TaskFailure, ...]:
        """Declare failed every connected task silent for longer than the heartbeat timeout, not counting
        the time the service itself was stalled since it last heard from the task (``service_stalled``).
        O(1 + late tasks): tasks are ordered by their last heartbeat (and so by their silence: stalls
        only accumulate)."""
        self._settle(now)
        self._check_restart_deadline(now, refuse=False)
        self._release(self._table.late(self._table.reserved, now), now)
        late = self._table.late(self._table.by_heartbeat, now)
        return self._fail([(task, self._table.silence_cause(task, now)) for task in late], now=now)

    def service_stalled(self, seconds: float) -> None:
        """The executor could not run for ``seconds`` (its own backlog: a wave of calls it was still
        working through). Heartbeats that waited in that backlog are not the tasks' fault: their silence
        is measured without it. O(1)."""
        self._table.service_stalled(seconds)

    def report_error(
        self, caller: TaskRef, cause: str, *, now: float, shutdown: bool = False
    ) -> tuple[TaskFailure, ...]:
        """The caller's own fatal error; with ``shutdown``, a deliberate shutdown of the whole cluster (the
        cluster's error then says so in ``ClusterFailure.shutdown``, which hosts test instead of the text)."""
        task, _ = self._member(caller)
        if shutdown:
            return self._fail(
                [(task, f"shut the cluster down: {clip(cause) or 'no reason given'}")], shutdown=True, now=now
            )
        return self._fail([(task, f"reported an error: {clip(cause) or 'no cause given'}")], now=now)

    def coordinator_stalled(self, seconds: float, *, now: float) -> tuple[TaskFailure, ...]:
        """This service could not run for ``seconds``, at least the heartbeat timeout (its host frozen or
        starved): silent that long, it may have been judged lost by some hosts and not by others (those
        whose last heartbeat was confirmed just before), and those hosts are off finding a successor. Under
        policy rejoin, a formed generation ends with the coordinator's own failure, as a host silent that
        long would be: every host hears it now, naming the coordinator, and the next generation forms with
        the same plan (no slice was lost). Nothing under policy fail (the hosts judge for themselves),
        while a generation forms, or once the cluster is in error. Returns the failure, if any."""
        if not self.config.restart.rejoin or not self._formed or self._failure is not None:
            return ()
        own = self._table.records[self.config.coordinator_task]
        if own.state is not TaskState.CONNECTED:
            return ()
        cause = (
            f"could not run for {seconds:.1f} s as the coordinator (its host frozen or starved), longer than "
            f"the heartbeat timeout ({self.config.heartbeat_timeout:g} s): hosts may have judged it lost"
        )
        failures = self._fail([(own, cause)], now=now, keep_plan=True)
        self.failed_since = now - seconds
        return failures

    def step_down(self, moved: Moved, cause: str) -> ClusterFailure | None:
        """This service's host steps down for another candidate's service (``moved``: a successor took over
        while this host was frozen or cut off past the heartbeat timeout). The cluster's error says where
        the cluster went, with this host's ``cause`` as its one failure: pushed to every host now, the answer
        to every call from then on, so no host waits for this service to stop answering. No restart is
        counted (the other service counts its own). None, and nothing done, once the cluster is in error."""
        if self._failure is not None:
            return None
        own = self._table.records[self.config.coordinator_task].info
        self._failure = ClusterFailure(
            (TaskFailure(own, clip(cause)),), generation=self.generation, rejoin=True, moved=moved
        )
        self._told.add(own.task_id)
        self._wake_everyone = True
        self._woken.add(ERRORS)
        return self._failure

    def disconnect(self, caller: TaskRef, *, now: float) -> None:
        """Leave gracefully. Barriers still waiting for this task fail at once (they can no longer pass)."""
        task = self._task(caller.task_id)
        if caller.generation != self.generation and self.generations.ended(caller.generation) is not None:
            return  # leaving a generation that already ended
        if task.state in (TaskState.DISCONNECTED, TaskState.FAILED) and self._table.holds(task, caller):
            return  # a retry, or a failed task leaving: its failure stands
        self._live(caller)
        rank = self.placement.rank_of(task.info.task_id)
        if (self.config.restart.rejoin or rank is None) and self._failure is None:
            # Under policy rejoin a host that leaves ends a formed generation (the rest re-form without
            # waiting for a barrier to time out); while forming, it is only missing again. A standby host
            # leaving only stops standing by.
            self._fail([(task, "left the cluster (its agent disconnected: `tpuctl down`, or a signal)")], now=now)
            return
        self._set_state(task, TaskState.DISCONNECTED)
        self._table.by_heartbeat.pop(task.info.task_id)
        self._told.add(task.info.task_id)
        if rank is not None:
            self._disconnected.add(rank)
            self._rendezvous.task_left(rank, now=now)

    def poll_error(self, caller: TaskRef, *, now: float) -> ClusterFailure | None:
        """The cluster's error, if any (the same object every time). A task declared failed may still
        poll: that is how it learns."""
        if caller.generation != self.generation:
            ended = self.generations.ended(caller.generation)
            if ended is not None:
                return ended  # what ended it: public, like status
            raise self.generations.other(caller)
        task = self._task(caller.task_id)
        if task.state is not TaskState.FAILED:
            self._live(caller)
        elif task.incarnation != caller.incarnation:
            raise self._table.stale(task, caller)
        elif not self._table.holds(task, caller):
            raise self._table.not_permitted(task)
        if self._failure is not None:
            self._told.add(task.info.task_id)
        return self._failure

    def untold(self) -> tuple[int, int]:
        """(registered, not registered) tasks that have not heard the cluster's error yet ((0, 0) without
        one): neither answered it (a refused registration, a registration wait, an error poll) nor failed
        nor left. A task 0 whose init fails keeps its service up until none is left (bounded), so no peer
        finds the port closed. O(tasks)."""
        if self._failure is None:
            return 0, 0
        self.counters.touched += len(self._table)
        registered = sum(1 for t in self._table.records if t.state is TaskState.CONNECTED and t.info.task_id not in self._told)
        left = len(self._table) - len(self._told) - registered
        return registered, left

    # --- barriers and gathers ----------------------------------------------------------------------

    def barrier_arrive(self, caller: TaskRef, name: str, timeout: float, *, now: float, request_id: int = 0) -> BarrierId:
        """Count the caller's next call to ``name``; ``timeout`` 0 means the configured default;
        ``request_id`` (not 0: its session's) names the call for ``call_outcome``."""
        return self._arrive("barrier", caller, name, timeout, None, now, request_id)

    def rendezvous_outcome(self, barrier: BarrierId, *, now: float) -> int | Gathered | Pending:
        """A barrier's instance number once it passed, a gather's values once all published (the same
        object for every caller); raises once it timed out or cannot pass."""
        self.generations.check_barrier(barrier)
        return self._rendezvous.outcome(barrier, failure=self._failure, now=now)

    def barrier_outcome(self, barrier: BarrierId, *, now: float) -> int | Pending:
        """The instance number once it passed; raises once it timed out or cannot pass."""
        outcome = self.rendezvous_outcome(barrier, now=now)
        assert not isinstance(outcome, Gathered)
        return outcome

    def gather_arrive(
        self, caller: TaskRef, name: str, value: bytes, timeout: float, *, now: float, request_id: int = 0
    ) -> BarrierId:
        """Publish the caller's value to its next call of gather ``name`` (a barrier carrying values)."""
        return self._arrive("gather", caller, name, timeout, value, now, request_id)

    def gather_outcome(self, gather: BarrierId, *, now: float) -> Gathered | Pending:
        """Every task's value once all published (the same object for every caller); raises like a barrier."""
        outcome = self.rendezvous_outcome(gather, now=now)
        assert not isinstance(outcome, int)
        return outcome

    def withdraw(self, caller: TaskRef, barrier: BarrierId, *, now: float) -> int | Gathered | RendezvousProgress:
        """Take back the caller's arrival at ``barrier`` (it gave up: its timeout, an interrupt, its session
        ended): the outcome if the instance was decided first (a pass wins; a failure raises), else where
        it stood, the caller's arrival no longer counted (``Rendezvous.withdraw``). Only the process that
        registered the task may; a task that left since (``disconnect``) fails the instance, as one that
        had not arrived does."""
        self.generations.check_barrier(barrier)
        task = self._task(caller.task_id)
        if task.incarnation != caller.incarnation:
            raise self._table.stale(task, caller)
        if not self._table.holds(task, caller):
            raise self._table.not_permitted(task)
        rank = self.placement.rank_of(task.info.task_id)
        if rank is None:
            raise self._standby(task)
        left = task.info if rank in self._disconnected else None
        return self._rendezvous.withdraw(barrier, rank, failure=self._failure, left=left, now=now)

    def call_outcome(
        self, caller: TaskRef, name: str, request_id: int, *, kind: RendezvousKind = "barrier", now: float
    ) -> int | Gathered | Pending | None:
        """What became of the caller's arrival sent with ``request_id`` on its session (the stream broke
        before the answer came): None if it no longer counts, else its instance's outcome (a failure
        raises). Request ids are per session, and a session is one registration: the caller's
        incarnation with the id names one call. O(1)."""
        _, rank = self._member(caller)
        return self._rendezvous.call_outcome(
            kind, rank, name, (caller.incarnation, request_id) if request_id else None,
            failure=self._failure, now=now,
        )  # fmt: skip

    def rendezvous_progress(
        self, caller: TaskRef, name: str, *, kind: RendezvousKind = "barrier", now: float
    ) -> RendezvousProgress | None:
        """Where the caller's latest call to barrier (or gather) ``name`` stands. O(sample)."""
        _, rank = self._member(caller)
        return self._rendezvous.progress(kind, rank, name, now=now)

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
        owner = None if caller is None else self._member(caller)[0].info.task_id
        self._kv.set(key, value, allow_overwrite=allow_overwrite, owner=owner)
        self._woken.add(kv_key(key))

    def kv_get(
        self, key: str, *, started: float, timeout: float, now: float, generation: int = 0
    ) -> bytes | Pending:
        """The key's value, or Pending until ``started + timeout``; then it raises, naming the key.
        ``generation`` (0: the current one): the key-value store is per generation, and a get of a
        generation that ended is refused."""
        check_timeout("key-value", timeout)
        self.generations.check_kv(generation)
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

    def kv_dir(self, prefix: str, *, generation: int = 0) -> list[tuple[str, bytes]]:
        """Every entry whose key starts with ``prefix`` (a plain string prefix), sorted by key. O(answer)."""
        self.generations.check_kv(generation)
        if len(prefix) > 1024:
            check_name("key prefix", prefix)
        return self._kv.dir(prefix)

    # --- status ------------------------------------------------------------------------------------

    def host_figures(self, *, now: float) -> HostFigures:
        """Hosts by state, their heartbeat ages and the slowest few: O(tasks), for metrics."""
        return host_figures(self._table.records, now)

    def status_fingerprint(self, task_id: int) -> str:
        """The fingerprint of ``task_id``'s registration (what status shows; "" if none)."""
        return self._table.records[task_id].fingerprint if 0 <= task_id < len(self._table) else ""

    def status(self, *, now: float) -> ClusterStatus:
        """Every task, the open barriers and the recently failed ones: the one O(tasks) answer."""
        tasks = self._table.status(now, self.placement.rank_of)
        barriers = self._rendezvous.open_instances(now=now)  # decides those past their deadline first
        roster, placement = self.roster, self.placement
        spares = tuple(
            StandbySlice(s, s * roster.per_slice, roster.per_slice, self._connected[s], roster.is_spare(s * roster.per_slice))
            for s in range(roster.roster_slices)
            if not placement.is_member_slice(s)
        )
        self.counters.touched += roster.roster_slices
        return ClusterStatus(
            self.config.cluster,
            self.service_incarnation,
            tasks,
            self._failure,
            barriers=barriers,
            failed_barriers=self._rendezvous.recent_failures(now=now),
            generation=self.generation,
            forming=bool(self._unregistered) and self._failure is None,
            ended=self.generations.history(),
            plan=self.plan,
            spares=spares,
        )

    # --- internals ---------------------------------------------------------------------------------

    def _arrive(
        self, kind: RendezvousKind, caller: TaskRef, name: str, timeout: float, value: bytes | None, now: float,
        request_id: int,
    ) -> BarrierId:  # fmt: skip
        _, rank = self._member(caller)
        self._took_part.add(caller.task_id)
        return self._rendezvous.arrive(
            kind,
            rank,
            name,
            timeout,
            value,
            default_timeout=self.config.barrier_timeout,
            disconnected=self._disconnected,
            failure=self._failure,
            now=now,
            caller=(caller.incarnation, request_id) if request_id else None,
        )

    def _task(self, task_id: int) -> TaskRecord:
        if not 0 <= task_id < len(self._table):
            raise Refused(
                Reason.UNKNOWN_TASK,
                f"unknown task id {task_id}: cluster {shown(self.config.cluster)} has tasks "
                f"0..{len(self._table) - 1}",
                hint="check this host's task id against the cluster spec's host list",
            )
        return self._table.records[task_id]

    def _live(self, caller: TaskRef) -> TaskRecord:
        """The caller's record if it is the connected process of its task; refuses otherwise."""
        task = self._task(caller.task_id)
        if caller.generation != self.generation:
            raise self.generations.other(caller)
        if task.state is TaskState.WAITING:
            if task.cause and task.incarnation == caller.incarnation and self._table.holds(task, caller):
                raise self._dropped(task, task.cause)  # this generation's registrant, failed while it formed
            raise Refused(Reason.NOT_CONNECTED, f"{task.info} has not registered", hint="register first")
        if task.incarnation != caller.incarnation:
            raise self._table.stale(task, caller)
        if not self._table.holds(task, caller):
            raise self._table.not_permitted(task)
        if task.state is TaskState.FAILED:
            raise Refused(Reason.CLUSTER_FAILED, f"{task.info} was declared failed: {task.cause}", failure=self._failure)
        if task.state is TaskState.DISCONNECTED:
            raise Refused(Reason.NOT_CONNECTED, f"{task.info} has disconnected")
        return task

    def _member(self, caller: TaskRef) -> tuple[TaskRecord, int]:
        """The caller's record and rank if it is the connected process of a member; refuses otherwise."""
        task = self._live(caller)
        rank = self.placement.rank_of(task.info.task_id)
        if rank is None:
            raise self._standby(task)
        return task, rank

    def _standby(self, task: TaskRecord) -> Refused:
        what = "a spare" if self.roster.is_spare(task.info.task_id) else "standing by (its slice is not in the generation)"
        return Refused(
            Reason.STANDBY,
            f"{task.info} is {what} in generation {self.generation} ({self.plan.describe()}): only the "
            "generation's members may call barriers, gathers, key-value writes and error reports",
            hint="a standby host's agent waits until a generation takes it; run the job on the members",
        )

    def _check_shape(self, registration: Registration) -> None:
        """Refuse a registration whose slice is not shaped like the cluster's, or that claims to be a spare
        while the spec says otherwise, naming what differs."""
        roster, task_id = self.roster, registration.task_id
        if registration.spare and not roster.is_spare(task_id):
            spares = (
                f"tasks {roster.active}..{roster.size - 1}" if roster.spares else "none (the spec names no spares)"
            )
            raise Refused(
                Reason.INVALID,
                f"task {task_id} registered as a spare (`tpuctl init --spare`), but it is one of the cluster's "
                f"hosts (tasks 0..{roster.active - 1}); the spec's spares: {spares}",
                hint="drop --spare on this host, or check its task id",
            )
        mine, cluster = registration.slice_shape, self.config.slice_shape
        if mine is None or cluster is None:
            return
        differences = mine.differences(cluster)
        if differences:
            raise Refused(
                Reason.SHAPE_MISMATCH,
                f"{self.tasks[task_id]}: its slice is not shaped like the cluster's: " + "; ".join(differences),
                hint="a host (a spare above all) must be on a slice like the cluster's: same accelerator type, "
                "topology and hosts per slice; check the host's TPU or the spec's tpu section",
            )

    def _set_state(self, task: TaskRecord, state: TaskState) -> None:
        """Change ``task``'s state, keeping its roster slice's count of connected hosts (and the ready
        standby slices) current. O(1)."""
        was = task.state
        task.state = state
        if (was is TaskState.CONNECTED) == (state is TaskState.CONNECTED):
            return
        roster_slice = task.info.task_id // self.roster.per_slice
        self._connected[roster_slice] += 1 if state is TaskState.CONNECTED else -1
        if self.placement.is_member_slice(roster_slice):
            return
        if self._connected[roster_slice] == self.roster.per_slice:
            self._ready.add(roster_slice)
        else:
            self._ready.discard(roster_slice)

    def _dropped(self, task: TaskRecord, cause: str) -> Refused:
        return Refused(
            Reason.NOT_CONNECTED,
            f"{task.info} was dropped from generation {self.generation} while it formed: {cause}",
            hint="its agent registers again by itself",
        )

    def _membership(self, task: TaskRecord) -> Membership:
        return Membership(
            task=TaskRef(task.info.task_id, task.incarnation, task.credential, self.generation),
            service_incarnation=self.service_incarnation,
            tasks=self.tasks,
            heartbeat_timeout=self.config.heartbeat_timeout,
            barrier_timeout=self.config.barrier_timeout,
            num_tasks=len(self.tasks),
            plan=self.plan,
            standby=self.placement.rank_of(task.info.task_id) is None,
        )

    def _registration_closed(self, now: float) -> bool:
        if self.generations.any_ended or self.generations.first > 1:
            return False  # after a restart the restart deadline rules (``_check_restart_deadline``)
        deadline = self._register_deadline
        return deadline is not None and now >= deadline and bool(self._unregistered)

    def _registration_timeout(self) -> Verdict:
        # Registrations are refused from the deadline on, so the tasks missing now are those missing then:
        # the verdict is built once.
        if self._registration_verdict is None:
            missing = len(self._unregistered)
            members = self.placement.members
            sample = [members[i] for i in self._unregistered.first(SAMPLE)]
            self.counters.touched += len(sample) + 1
            total = len(members)
            self._registration_verdict = Verdict(
                Reason.TIMED_OUT,
                f"registration timed out after {self.config.register_timeout:.1f} s: {count(total - missing)} "
                f"of {count(total)} hosts registered; missing: {sample_text(sample, missing)}",
                hint="start `tpuctl init` on the missing hosts and check they reach the coordinator, or raise "
                f"coordinator.register_timeout in the cluster spec (now {format_duration(self.config.register_timeout)})",
            )
        return self._registration_verdict

    def hung(self, tasks: Sequence[int], cause: str, *, final: bool, now: float) -> tuple[TaskFailure, ...]:
        """The watchdog found the cluster hung (``on_hang`` restart or fail): ``tasks`` (the hosts behind;
        none: every connected host) fail with ``cause``, which ends the generation (re-formed under policy
        rejoin unless ``final``) or the cluster. Nothing happens once the cluster is in error."""
        if self._failure is not None:
            return ()
        records = self._table.records
        chosen = [records[t] for t in tasks if 0 <= t < len(records)] or list(records)
        live = [r for r in chosen if r.state is TaskState.CONNECTED and self.placement.rank_of(r.info.task_id) is not None]
        return self._fail([(r, f"hung: {clip(cause)}") for r in live], now=now, final=final)

    def take_last_arrivals(self) -> list[tuple[int, float]]:
        """The last arrival of each barrier passed since asked (task id, seconds behind the one before)."""
        taken = list(self._rendezvous.last_arrivals)
        self._rendezvous.last_arrivals.clear()
        return taken

    def _fail(
        self,
        failed: Iterable[tuple[TaskRecord, str]],
        *,
        now: float,
        shutdown: bool = False,
        final: bool = False,
        keep_plan: bool = False,
    ) -> tuple[TaskFailure, ...]:
        """Mark tasks failed; the first batch ends the generation (a restart) or the cluster (final).
        ``keep_plan``: no host was lost (the coordinator's own stall): the next generation has the same
        plan, no slice dropped or replaced. Returns the new failures."""
        failures = []
        seen = []
        standby = []
        lost: dict[int, int] = {}
        """Positions that lost members, and how many each."""
        per = self.roster.per_slice
        for task, cause in failed:
            cause += elsewhere(task)
            self._set_state(task, TaskState.FAILED)
            task.cause = cause
            self._told.add(task.info.task_id)
            self._table.by_heartbeat.pop(task.info.task_id)
            rank = self.placement.rank_of(task.info.task_id)
            if rank is None:  # standing by: it only stops standing by
                standby.append(TaskFailure(task.info, cause))
                continue
            seen.append((task.info.task_id, self._table.last_seen(task, now)))
            if not keep_plan:
                lost[rank // per] = lost.get(rank // per, 0) + 1
            failures.append(TaskFailure(task.info, cause))
        if not failures:
            return tuple(standby)
        if self._failure is None:
            policy = self.config.restart
            if policy.rejoin and not shutdown and not self._formed:
                # Still forming: the failed registrants are only missing again (their slots are free).
                for gone in failures:
                    self._missing_again(self._table.records[gone.task.task_id])
                return tuple(failures + standby)
            following = None
            if policy.rejoin and not shutdown and not final:
                ready = sorted(self._ready)
                self.counters.touched += len(self.placement) + len(ready)
                following = plan_next(self.placement, lost, ready, policy, generation=self.generation + 1)
            end = self.generations.end(
                failures, shutdown=shutdown, final=final, next=following.note if following is not None else ""
            )
            self.failed_since = None if shutdown else min(t for _, t in seen)
            self.failed_seen = dict(seen[:SAMPLE])
            if end.rejoin:
                assert following is not None
                self._previous, self._previous_generation = self.placement, self.generation
                self._start_generation(self.generation + 1, now, following.plan)
                self._held = following.held
            else:
                self._failure = end
        self._wake_everyone = True
        self._woken.add(ERRORS)
        return tuple(failures + standby)

    def _grow_if_ready(self, now: float) -> None:
        """Under policy elastic, end a formed generation that is short of slices when a roster slice outside
        it is ready (every host standing by), while restarts are left: the next one grows. O(1) unless it
        ends the generation (then O(roster slices))."""
        policy = self.config.restart
        if not (
            policy.elastic
            and self._ready
            and self.formed
            and len(self.placement) < self.roster.num_slices
            and self.generations.restarts < policy.max_restarts
        ):
            return
        ready = sorted(self._ready)
        self.counters.touched += len(self.placement) + len(ready)
        grown = plan_grown(self.placement, ready, generation=self.generation + 1)
        end = self.generations.end((), shutdown=False, next=grown.note)
        assert end.rejoin
        self.failed_since, self.failed_seen = None, {}
        self._previous, self._previous_generation = self.placement, self.generation
        self._start_generation(self.generation + 1, now, grown.plan)
        self._wake_everyone = True
        self._woken.add(ERRORS)

    # --- generations -------------------------------------------------------------------------------

    def _left(self, registration: Registration) -> bool:
        """A live task's own process registers again naming the current generation as the one it was in,
        after it took part in that generation's barriers (its core-ID merge at least): it gave the
        generation up (under rejoin, an agent that lost its coordinator re-forms), while this service,
        frozen or cut off meanwhile, saw nobody late; taken back, it would redo a merge the others have
        finished. Before that it has done nothing the generation must redo: it is a retry (so is one of a
        registration into the generation, which names the generation before, or none)."""
        return (
            self.config.restart.rejoin
            and registration.generation == self.generation
            and registration.task_id in self._took_part
        )

    def _first_forming(self) -> bool:
        """This service's first generation is still forming (nothing of it can have passed yet)."""
        return not self.generations.any_ended and not self._formed and self._failure is None

    def _continue_above(self, remembered: int, now: float) -> None:
        """Start over at ``remembered + 1``: the hosts registered so far hold their places and register again
        (their calls of the generation that gave way are refused, naming it). O(tasks), once."""
        if self._register_deadline is not None:  # someone registered: they register again
            self.generations.gave_way = (self.generation, remembered)
            self._start_generation(remembered + 1, now, self.plan)
            self._register_deadline = None  # set again by this registration: the restart timeout rules now
            self._wake_everyone = True  # their parked waits are refused at once
        else:
            self._restart_at(remembered + 1)
        self.generations.first = remembered + 1

    def _restart_at(self, generation: int) -> None:
        self.generations.current = generation
        self._rendezvous = Rendezvous(
            self.placement.members, self.counters, self._woken, generation=generation, waits=self.barrier_waits
        )
        self._took_part = set()

    def _start_generation(self, generation: int, now: float, plan: Plan) -> None:
        """Generation ``generation`` starts forming with ``plan``: every member must register into it (every
        other host may, standing by). O(tasks), once."""
        self._table.new_generation()
        self.placement = Placement(plan, self.roster, self.tasks)
        self._connected = array("i", [0]) * self.roster.roster_slices  # every task is waiting again
        self._ready = set()
        self.counters.touched += self.roster.roster_slices
        self._disconnected.clear()
        self._unregistered = Missing(self.placement.member_count)
        self._formed = False
        self._restart_deadline = now + self.config.restart.timeout
        self._registration_verdict = None
        self._restart_at(generation)
        self._kv = KeyValueStore(self.counters, self.config.kv_limits, version=self._kv.version + 1)

    def _learn_previous(self, generation: int, plan: Plan, now: float) -> None:
        """A registrant of this fresh service's first generation (still forming) brought the plan of the
        generation it was in. The registrants of the one right before this service's first generation know
        the plan the majority rule counts against: the first of them sets it; if nobody has registered yet,
        the first generation takes that plan (its members must come back), and ``heartbeat_timeout`` later
        the hosts still missing count as lost (``_settle``). O(roster slices), once per generation learnt."""
        if generation != self.generation - 1 or generation <= self._previous_generation:
            return
        roster = self.roster
        try:
            if len(plan) > roster.num_slices:
                raise InputError(f"{len(plan)} slices, more than the spec's {roster.num_slices}")
            previous = Placement(plan, roster, self.tasks)
        except InputError as exc:
            raise Refused(
                Reason.INVALID,
                f"the plan of generation {generation} this host brought ({plan.describe()}) does not fit this "
                f"cluster's roster: {exc.message}",
                hint="run the same tpuctl version and cluster spec on every host",
            ) from exc
        self._previous, self._previous_generation = previous, generation
        self.counters.touched += roster.roster_slices
        if not any(self._connected) and plan != self.plan:
            self.placement = previous
            self._unregistered = Missing(previous.member_count)
            self._ready = set()
            self._restart_at(self.generation)
        if self._settle_at is None:
            self._settle_at = now + self.config.heartbeat_timeout

    def _settle(self, now: float) -> None:
        """A fresh service's first generation has not formed ``heartbeat_timeout`` after it learnt the
        previous plan: its previous members still missing count as lost, as a silent member would, and the
        generation is planned from the previous one (``plan_next``: a spare slice in a lost one's place,
        slices dropped under policy elastic) under the majority rule. When that plan differs, this
        generation gives way to the next one, which the registrants join as survivors do; else it waits
        (for the restart timeout). O(roster slices), once."""
        at, previous = self._settle_at, self._previous
        if at is None or now < at or previous is None or self._formed or self._failure is not None:
            return
        self._settle_at = None
        roster, per, connected = self.roster, self.roster.per_slice, self._connected
        lost = {p: per - connected[s] for p, s in enumerate(previous.slice_at) if connected[s] < per}
        ready = [s for s in range(roster.roster_slices) if not previous.is_member_slice(s) and connected[s] == per]
        self.counters.touched += roster.roster_slices
        policy = self.config.restart
        following = plan_next(
            previous, lost, ready, policy, generation=self.generation + 1, after=self._previous_generation
        )
        self._held = following.held
        if following.plan == self.plan or following.held or self.generations.restarts >= policy.max_restarts:
            return
        records = self._table.records
        missing = [t for s in previous.slice_at for t in roster.tasks_of(s) if records[t].state is not TaskState.CONNECTED]
        cause = (
            f"not heard from within the heartbeat timeout ({self.config.heartbeat_timeout:g} s) after task "
            f"{self.config.coordinator_task} started the coordination service at generation {self.generations.first}"
        )
        failures = [TaskFailure(self.tasks[t], cause) for t in missing]
        end = self.generations.end(failures, shutdown=False, next=following.note)
        self.failed_since, self.failed_seen = None, {}
        self._start_generation(self.generation + 1, now, following.plan)
        self._wake_everyone = True
        self._woken.add(ERRORS)
        assert end.rejoin

    def _minority(self) -> str:
        """When the hosts registered into the current generation are not a majority of the previous
        generation's members, why it cannot form (empty otherwise). O(positions)."""
        previous = self._previous
        if previous is None:
            return ""
        heard = sum(self._connected[s] for s in previous.slice_at)
        members = previous.member_count
        if 2 * heard > members:
            return ""
        return (
            f"this coordinator heard from only {heard} of generation {self._previous_generation}'s {members} "
            "hosts, not a majority: a generation forms only with more than half of the previous one's hosts, "
            f"so a network partition leaves at most one side able to go on"
        )

    def _missing_again(self, task: TaskRecord) -> None:
        self._set_state(task, TaskState.WAITING)
        task.reserved = False
        self._table.reserved.pop(task.info.task_id)
        rank = self.placement.rank_of(task.info.task_id)
        assert rank is not None  # only members are missing
        self._unregistered.add(rank)

    def _release(self, tasks: list[TaskRecord], now: float) -> bool:
        """Free the places of reserved survivors silent for longer than the heartbeat timeout: they died
        too (several VMs preempted within seconds), and a new process without their credential (a replaced
        VM) may take their task. Their death joins what ended the last generation. True when all were."""
        limit = self.config.heartbeat_timeout
        released = [t for t in tasks if self._table.silence(t, now) > limit]
        for task in released:
            task.reserved = False
            self._table.reserved.pop(task.info.task_id)
            task.cause = f"{self._table.silence_cause(task, now)}, while generation {self.generation} formed"
        self.generations.also_ended([TaskFailure(task.info, task.cause) for task in released])
        return len(released) == len(tasks)

    def _check_restart_deadline(self, now: float, *, refuse: bool = True) -> None:
        """A generation after a restart that has not formed in time fails the cluster for good."""
        deadline = self._restart_deadline
        if deadline is None or now < deadline or self._failure is not None or not self._unregistered:
            return
        missing = len(self._unregistered)
        members = self.placement.members
        sample = [self._table.records[members[i].task_id] for i in self._unregistered.first(SAMPLE)]
        self.counters.touched += len(sample) + 1
        cause = (
            f"did not rejoin generation {self.generation} within the restart timeout "
            f"({self.config.restart.timeout:g} s)"
        )
        held = self._held or self._minority()
        if held:
            cause += f"; {held} (a network partition?)"
        for task in sample:
            task.cause = cause
        self._failure = ClusterFailure(
            tuple(TaskFailure(t.info, cause) for t in sample), missing, generation=self.generation,
            earlier=self.generations.earlier(),
        )  # fmt: skip
        self._restart_deadline = None
        self.failed_since, self.failed_seen = None, {}
        self._wake_everyone = True
        self._woken.add(ERRORS)
        if refuse:
            raise Refused(Reason.CLUSTER_FAILED, f"the cluster failed: {self._failure}", failure=self._failure)
