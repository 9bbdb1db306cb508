"""The coordination service's values, limits and refusals: what the state machine takes and returns.

Pure: no grpc, no asyncio, no clock. Every list of hosts a message may carry is a bounded *sample*
(``SAMPLE`` hosts, in task order) plus a count, so no answer, message or hint grows with the cluster;
``tpuctl status --json`` (``ClusterStatus``) is the one answer that lists every host.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tpuctl.coordination.plan import Plan, Roster, SliceShape
from tpuctl.errors import ClusterError, InputError
from tpuctl.goodput.ledger import GoodputSummary
from tpuctl.messages import count, shown
from tpuctl.preemption.notice import PreemptionView
from tpuctl.watchdog.judge import WatchdogView
from tpuctl.watchdog.settings import WatchdogSettings

PROTOCOL_VERSION = 17
"""The coordination protocol this tpuctl speaks (``coordination.proto``). The service refuses a
registration of another version, so every host must run the same tpuctl; bumped when a change to the
proto would be misread by an older peer."""


def keepalive_interval(heartbeat_timeout: float) -> float:
    """Seconds between the service's HTTP/2 pings on a host's connection, and how long it waits for the
    answer: a sixth of the heartbeat timeout, between 0.1 s and 60 s."""
    return min(60.0, max(0.1, heartbeat_timeout / 6))


def keepalive_window(ping_interval: float) -> float:
    """How long before gRPC closes a dead connection the peer last proved alive, for pings every
    ``ping_interval`` s each waited for as long: at most one interval until the next ping, one more for
    its answer."""
    return 2 * ping_interval

# --- limits ------------------------------------------------------------------------------------------

SAMPLE = 10
"""How many hosts a progress line, timeout message or failure names before "... and N more"."""
RECENT_FAILURES_KEPT = 16
"""How many failed barrier and gather instances the service keeps for ``tpuctl status`` (per generation)."""
MAX_NAME_CHARS = 1024
"""Longest barrier or gather name, and the longest key-value key; longer ones are refused."""
MAX_TEXT_CHARS = 1024
"""Longest free text the service keeps from a client (a reported cause, a hostname); longer is clipped."""
MAX_GATHER_VALUE = 64 * 1024
"""Longest value one host may publish to a gather ..."""
MAX_GATHER_TABLE = 32 * 1024 * 1024
"""... and the most a whole gather may hold: each value is at most this divided by the host count."""
MAX_GATHER_WIRE = MAX_GATHER_TABLE + 4 * 1024 * 1024
"""The most a gather's serialized table may inflate to on a client: the values plus their framing (at
most 4 bytes each, for up to a million hosts). A compressed table that would grow beyond is refused."""
CREDENTIAL_BYTES = 32
"""Length of a registration's credential (random, from ``secrets`` at the service's edge)."""
MIN_RETRY_SECRET = 16
MAX_RETRY_SECRET = 64
"""Bounds on a registration's retry secret (random bytes the client chose; tpuctl sends 32)."""
ALL_HOSTS_HINT = "`tpuctl status --json` lists all"


@dataclass(frozen=True)
class KvLimits:
    """The key-value store's quotas; a key's bytes count as much as its value's. Defaults:

    * a value at most 1 MiB;
    * per task at most 1,024 keys and 16 MiB (keys and values);
    * in all at most 65,536 keys and 64 MiB (about the memory one coordinator may spend on it).
    """

    max_value: int = 1024 * 1024
    task_keys: int = 1024
    task_bytes: int = 16 * 1024 * 1024
    total_keys: int = 65_536
    total_bytes: int = 64 * 1024 * 1024


# --- text ----------------------------------------------------------------------------------------------


def clip(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """``text`` cut to ``limit`` characters, with a marker saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{count(len(text) - limit)} more characters cut]"


def sample_text(sample: Sequence[object], total: int) -> str:
    """ "task 7 (10.0.0.9), task 8 (10.0.0.10), ... and 2,271 more; `tpuctl status --json` lists all"
    (the wording of ``tpuctl.messages.sample``, from a sample and a count rather than every item)."""
    listed = ", ".join(str(item) for item in sample)
    more = total - len(sample)
    if more <= 0:
        return listed
    return f"{listed}, ... and {count(more)} more; {ALL_HOSTS_HINT}"


# --- configuration -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskSpec:
    """One task (host) of the cluster; its id is its position in ``ServiceConfig.tasks``."""

    address: str
    """How the cluster spec names the host (e.g. "10.0.0.3"); used in messages."""


@dataclass(frozen=True)
class RestartPolicy:
    """The spec's ``restart`` section: what a task's failure does to the cluster.

    ``rejoin`` False (``policy: fail``): the cluster is in error for good. True
    (``policy: rejoin``): the failure ends the cluster's *generation* g, and generation g + 1 forms: every
    task registers again (survivors with the credential they hold, a failed host's new process afresh)
    within ``timeout`` seconds; at most ``max_restarts`` times, then the next failure is final."""

    rejoin: bool = False
    timeout: float = 600.0
    max_restarts: int = 3
    elastic: bool = False
    """``policy: elastic`` (implies ``rejoin``): a generation that lost a slice no spare replaces forms
    with the remaining slices, down to ``min_slices``, and grows back when a dropped slice is complete."""
    min_slices: int = 0
    """The fewest slices an elastic generation may have (0: the cluster's ``num_slices``: never shrink)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.timeout) and self.timeout > 0) or self.max_restarts < 0:
            raise InputError(f"restart policy: timeout {self.timeout!r} and max {self.max_restarts!r} must be positive")
        if self.min_slices < 0 or (self.min_slices and not self.elastic):
            raise InputError(f"restart policy: min_slices {self.min_slices!r} needs policy elastic and a count >= 1")
        if self.elastic:
            object.__setattr__(self, "rejoin", True)


@dataclass(frozen=True)
class ServiceConfig:
    """What the coordination service serves: one cluster, its tasks, its timeouts."""

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
    kv_limits: KvLimits = KvLimits()
    """The key-value store's quotas."""
    restart: RestartPolicy = RestartPolicy()
    """What a task's failure does: end the cluster (default), or end a generation and re-form."""
    watchdog: WatchdogSettings = field(default_factory=WatchdogSettings)
    """The spec's watchdog: hang timeout, what a hang does, straggler detection."""
    first_generation: int = 1
    """The generation this service starts at: above the last one when task 0's new process takes over
    after its predecessor died (from its state dir); ``first_generation - 1`` restarts count as used."""
    roster: Roster = field(default=None)  # type: ignore[assignment]
    """The spec's hosts then spares, in whole slices (``plan.py``); ``tasks`` lists all of them. Unset:
    ``Roster(active=len(tasks))``, one slice and no spares (every host is a member of every generation)."""
    slice_shape: SliceShape | None = None
    """The cluster's slices' shape: a registration that brings another one is refused (``SHAPE_MISMATCH``).
    None: not checked."""
    coordinator_task: int = 0
    """The task whose host runs this service: task 0, or a successor that took over after the coordinator's
    host was lost (``coordinator.successors``); messages name it."""
    previous_plan: Plan | None = None
    """A successor's service: the plan of the generation whose coordinator was lost (None: every slice of the
    spec); its first generation starts from it."""
    lost: tuple[int, ...] = ()
    """A successor's service: the tasks lost with the old coordinator (its host). Their positions are dropped
    at once under policy elastic (down to ``min_slices``); otherwise a ready standby slice takes their place
    as soon as there is one, before the generation forms (the generation gives way to the next)."""

    def __post_init__(self) -> None:
        problems = []
        if not self.cluster:
            problems.append("cluster name is empty")
        if not self.tasks:
            problems.append("the cluster has no tasks")
        elif self.roster is None:
            object.__setattr__(self, "roster", Roster(active=len(self.tasks)))
        elif self.roster.size != len(self.tasks):
            problems.append(
                f"the roster has {self.roster.size} hosts ({self.roster.active} and {self.roster.spares} spares), "
                f"the task list {len(self.tasks)}"
            )
        if self.roster is not None and self.restart.min_slices > self.roster.num_slices:
            problems.append(
                f"restart min_slices {self.restart.min_slices} is more than the cluster's {self.roster.num_slices} slices"
            )
        if self.first_generation < 1:
            problems.append(f"first_generation must be 1 or more, got {self.first_generation!r}")
        if not 0 <= self.coordinator_task < max(1, len(self.tasks)):
            problems.append(f"coordinator_task {self.coordinator_task!r} is not a task of the cluster")
        for name in ("heartbeat_timeout", "register_timeout", "barrier_timeout"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                problems.append(f"{name} must be a positive number of seconds, got {value!r}")
        if problems:
            raise InputError("coordination service config: " + "; ".join(problems))


# --- values ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskInfo:
    """A task of the cluster as the spec names it."""

    task_id: int
    address: str

    def __str__(self) -> str:
        return f"task {self.task_id} ({self.address})"


@dataclass(frozen=True)
class TaskRef:
    """Who is calling: a task id, the incarnation (random per process, never 0) it registered with, and
    the credential its registration returned (``Membership.task`` carries all three). A task-scoped call
    without the credential is refused; ``repr`` never shows it."""

    task_id: int
    incarnation: int
    credential: bytes = field(default=b"", repr=False)
    generation: int = 1
    """The generation the task registered into: a call of another generation is refused, naming both."""


@dataclass(frozen=True)
class Registration:
    protocol_version: int
    cluster: str
    task_id: int
    incarnation: int
    hostname: str
    peer: str
    """The gRPC peer of the call, e.g. "ipv4:10.0.0.3:51234"."""
    credential: bytes = field(default=b"", repr=False)
    """The secret this registration gets if it is new (generated at the service's edge, ``secrets``); a
    retry of a registration gets the first one's. Empty: refused."""
    retry_secret: bytes = field(default=b"", repr=False)
    """Random bytes the registering process chose: a retry of the registration must bring the same ones
    (so knowing a task's incarnation is not enough to get its credential)."""
    generation: int = 0
    """The last generation this host was part of (0: none): a survivor re-registering after its
    generation ended, or task 0's new process telling a fresh service where the cluster was."""
    previous_credential: bytes = field(default=b"", repr=False)
    """The credential of this host's previous registration (kept in its state dir): proves that the new
    process replaces that registration (the old one fails at once), or that a survivor is itself."""
    slice_shape: SliceShape | None = None
    """What the host's backend found about its own slice (None: not known, not checked)."""
    spare: bool = False
    """The host says it is one of the spec's spares (``tpuctl init --spare``): refused unless it is."""
    previous_plan: Plan | None = None
    """The plan of ``generation`` as this host learnt it (None: none): a service that starts fresh above
    that generation (a successor's) applies the majority rule against it. O(runs)."""


def fingerprint(credential: bytes) -> str:
    """8 hex digits that tell registrations apart; from a hash of the credential, so it reveals nothing."""
    import hashlib

    return hashlib.sha256(b"tpuctl fingerprint\0" + credential).hexdigest()[:8] if credential else ""


@dataclass(frozen=True)
class Membership:
    """What a task learns when it registers: its ``TaskRef`` for every later call, and the cluster's."""

    task: TaskRef
    service_incarnation: int
    """Random per coordinator start: a heartbeat answering another value means it restarted."""
    tasks: tuple[TaskInfo, ...]
    """Every task of the cluster; empty unless registration asked for it (``with_tasks``)."""
    heartbeat_timeout: float
    barrier_timeout: float
    """The service's default barrier timeout (a barrier call without one waits this long)."""
    num_tasks: int = 0
    """How many tasks the cluster has, spares included (always set by the service)."""
    plan: Plan | None = None
    """The generation's plan: which roster slices are its slices, by position (``plan.py``; the host's
    rank is ``plan.rank_of(task_id, roster)``). Always set by the service; None only in a value built
    by hand."""
    standby: bool = False
    """This host is not a member of the generation it registered into (a spare, a survivor of a replaced
    slice, a host of a dropped slice): it heartbeats and waits for a generation that needs it."""

    def __post_init__(self) -> None:
        if not self.num_tasks:
            object.__setattr__(self, "num_tasks", len(self.tasks))

    @property
    def generation(self) -> int:
        return self.task.generation


@dataclass(frozen=True)
class RegistrationProgress:
    """How far registration is: counts, and the first ``SAMPLE`` missing hosts."""

    registered: int
    total: int
    missing: tuple[TaskInfo, ...]
    """A sample: the first (lowest-id) missing hosts, at most ``SAMPLE``."""
    seconds_left: float
    """Until registration closes."""
    missing_count: int = -1
    """How many hosts are missing (-1: ``total - registered``)."""

    def __post_init__(self) -> None:
        if self.missing_count < 0:
            object.__setattr__(self, "missing_count", self.total - self.registered)

    @property
    def complete(self) -> bool:
        return self.missing_count == 0

    def describe(self) -> str:
        """ "waiting for 2,281 of 2,304 hosts: task 7 (10.0.0.9), ... and 2,271 more; ..."."""
        if self.complete:
            return f"all {count(self.total)} hosts registered"
        return (
            f"waiting for {count(self.missing_count)} of {count(self.total)} hosts: "
            f"{sample_text(self.missing, self.missing_count)}"
        )

    def describe_wait(self, waited: float) -> str:
        """As a barrier's wait reads: ``waiting 10 s for 1 of 4 hosts: task 3 (10.0.0.5) (registration times
        out in 290 s)``; ``waited`` is how long the caller has been waiting."""
        if self.complete:
            return self.describe()
        return (
            f"waiting {waited:.0f} s for {count(self.missing_count)} of {count(self.total)} hosts: "
            f"{sample_text(self.missing, self.missing_count)} (registration times out in {self.seconds_left:.0f} s)"
        )


@dataclass(frozen=True)
class RendezvousProgress:
    """Where the caller's latest call to a barrier (or gather) stands: counts and the first missing hosts."""

    kind: str
    """"barrier" or "gather"."""
    name: str
    instance: int
    arrived: int
    total: int
    missing: tuple[TaskInfo, ...]
    """A sample: the first (lowest-id) hosts that have not arrived, at most ``SAMPLE``."""
    seconds_left: float
    done: bool = False
    """The instance was decided (passed, timed out or failed): the caller's call has its answer."""

    @property
    def missing_count(self) -> int:
        return self.total - self.arrived

    def describe(self) -> str:
        """ "3 of 4 hosts arrived; missing: task 2 (10.0.0.4) (times out in 25 s)"."""
        if self.done:
            return f"{self.kind} {shown(self.name)} #{self.instance} is decided"
        return (
            f"{count(self.arrived)} of {count(self.total)} hosts arrived; missing: "
            f"{sample_text(self.missing, self.missing_count)} (times out in {self.seconds_left:.0f} s)"
        )


@dataclass(frozen=True)
class TaskFailure:
    task: TaskInfo
    cause: str


@dataclass(frozen=True)
class Moved:
    """The coordinator stepped down for another candidate's service (``ClusterFailure.moved``): task
    ``task``'s host serves the cluster, at generation ``generation``."""

    task: int
    generation: int


@dataclass(frozen=True)
class ClusterFailure:
    """The cluster is in error: the tasks declared failed first (usually one).

    ``failures`` is a sample (the first ``SAMPLE`` tasks of that batch); ``total`` counts them all."""

    failures: tuple[TaskFailure, ...]
    total: int = 0
    shutdown: bool = False
    """A deliberate shutdown of the whole cluster (``tpuctl down --all``), not a failure."""
    generation: int = 1
    """The generation these failures ended."""
    rejoin: bool = False
    """The cluster re-forms as generation ``generation + 1`` (restart policy rejoin, restarts left);
    False: the failure is final."""
    earlier: str = ""
    """What ended the earlier generations, and why this failure is final (empty in generation 1 of a
    cluster that never restarts); bounded text."""
    next: str = ""
    """With ``rejoin``: how the next generation forms when it is not simply the same hosts again, e.g.
    ``generation 4 forms with spare slice 3 (tasks 6, 7) in place of slice 1`` (bounded text). Alone,
    without failures: the generation ended to grow (a dropped slice is complete again)."""
    moved: Moved | None = None
    """The coordinator stepped down (its one failure says why): every host registers with ``moved.task``'s
    service, without waiting for this one to stop answering."""

    def __post_init__(self) -> None:
        if self.total < len(self.failures):
            object.__setattr__(self, "total", len(self.failures))

    def __str__(self) -> str:
        if self.shutdown and self.failures:  # not a failure: a host shut the cluster down on purpose
            text = f"{self.failures[0].task} {self.failures[0].cause}"
            if self.earlier:  # what ended the earlier generations: history, labelled as such
                return f"{text} (in generation {self.generation}; earlier: {self.earlier})"
            return f"{text} (in generation {self.generation})" if self.generation > 1 else text
        if self.moved is not None and self.failures:  # not a failure: the service moved
            return (f"{self.failures[0].task} {self.failures[0].cause}; generation {self.generation} is over: "
                    f"every host registers with task {self.moved.task}'s service")  # fmt: skip
        if not self.failures and self.next:  # not a failure: it ended to grow
            return f"generation {self.generation} is over: {self.next}"
        if self.total == 1 and len(self.failures) == 1:
            (failure,) = self.failures
            text = f"{failure.task} failed: {failure.cause}"
        else:
            listed = "; ".join(f"{f.task}: {f.cause}" for f in self.failures)
            more = self.total - len(self.failures)
            tail = "" if more <= 0 else f"; ... and {count(more)} more; {ALL_HOSTS_HINT}"
            text = f"{count(self.total)} tasks failed: {listed}{tail}"
        if self.rejoin and self.next:
            return f"{text}; generation {self.generation} is over: {self.next}"
        if self.rejoin:
            return f"{text}; generation {self.generation} is over, the cluster re-forms as generation {self.generation + 1}"
        if self.earlier:
            return f"{text} (generation {self.generation}; {self.earlier})"
        return text


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
    """0 while waiting, and always 0 over the wire (a client never learns another task's)."""
    hostname: str
    peer: str
    seconds_since_heartbeat: float | None
    """By the service's clock; None while waiting. While ``session_open``: the most its last answered
    keepalive ping can be old (one keepalive window), not a measured age."""
    cause: str
    """Why the task failed; empty unless FAILED."""
    fingerprint: str = ""
    """8 hex digits of a hash of the registration's credential (not a secret); empty while waiting."""
    session_open: bool = False
    """Its session stream is open: the service's keepalive pings on its connection vouch for it."""
    role: str = "member"
    """``member`` (in the current generation's plan), ``standby`` (registered, not in it) or ``out``
    (neither: not registered, failed or gone)."""
    rank: int | None = None
    """Its process rank in the current generation (None: not a member)."""


@dataclass(frozen=True)
class StandbySlice:
    """A roster slice that is not in the current generation (a spare slice, a replaced or dropped one)."""

    roster_slice: int
    first_task: int
    hosts: int
    registered: int
    """Hosts of it registered and connected (standing by)."""
    spare: bool
    """A spare slice of the spec (else one of its hosts' slices, replaced or dropped)."""

    @property
    def ready(self) -> bool:
        """Every host of it stands by: it can take any lost slice's place (its shape was checked when
        each host registered)."""
        return self.registered == self.hosts

    def as_dict(self) -> dict[str, Any]:
        return {
            "roster_slice": self.roster_slice,
            "tasks": [self.first_task, self.first_task + self.hosts - 1],
            "spare": self.spare,
            "registered": self.registered,
            "ready": self.ready,
            "can_replace": "any slice" if self.ready else None,
        }


@dataclass(frozen=True)
class OpenBarrier:
    """A barrier (or gather) instance some tasks reached and others not yet."""

    name: str
    instance: int
    arrived: tuple[int, ...]
    seconds_left: float
    kind: str = "barrier"

    def missing(self, tasks: Sequence[TaskInfo]) -> tuple[TaskInfo, ...]:
        arrived = set(self.arrived)
        return tuple(t for t in tasks if t.task_id not in arrived)


@dataclass(frozen=True)
class FailedBarrier:
    """A barrier (or gather) instance that failed (timed out, or a host left while it waited): one of the
    last ``RECENT_FAILURES_KEPT`` of the generation. Every host's next call to the name joins a later
    instance, so this one is history; kept so that ``tpuctl status`` can say what happened and who was
    missing (a sample and a count)."""

    name: str
    instance: int
    kind: str
    reason: str
    """``"timed out"`` or ``"host left"``."""
    message: str
    """What every caller of the instance was told (bounded: it names a sample of hosts)."""
    seconds_ago: float
    """Since it failed (a timeout: its deadline), by the service's clock."""
    arrived: int
    """How many hosts had arrived (of the cluster's)."""
    missing: tuple[TaskInfo, ...]
    """The first (lowest-id) hosts that had not arrived, at most ``SAMPLE``."""
    missing_count: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "instance": self.instance,
            "kind": self.kind,
            "reason": self.reason,
            "seconds_ago": self.seconds_ago,
            "message": self.message,
            "arrived": self.arrived,
            "missing": [t.task_id for t in self.missing],
            "missing_count": self.missing_count,
        }


@dataclass(frozen=True)
class ClusterStatus:
    """Everything the service knows, every task listed: the one O(hosts) answer."""

    cluster: str
    service_incarnation: int
    tasks: tuple[TaskStatus, ...]
    failure: ClusterFailure | None
    protocol_version: int = PROTOCOL_VERSION
    barriers: tuple[OpenBarrier, ...] = ()
    generation: int = 1
    forming: bool = False
    """The current generation is still forming (tasks missing); after a restart, who is missing."""
    ended: tuple[str, ...] = ()
    """What ended each earlier generation (one bounded line each; at most ``max`` restarts)."""
    watchdog: WatchdogView | None = None
    """The watchdog's view (step range, the hosts furthest behind, its standing verdicts), once a host's
    job reported progress."""
    failed_barriers: tuple[FailedBarrier, ...] = ()
    """The generation's most recent failed barrier and gather instances, oldest first (at most
    ``RECENT_FAILURES_KEPT``, each naming a sample of the missing hosts)."""
    goodput: GoodputSummary | None = None
    """The goodput ledger's one line (the fraction, the current bucket)."""
    preemption: PreemptionView | None = None
    """The latest preemption notices and their agreement on a checkpoint step, once a host raised one."""
    plan: Plan | None = None
    """The current generation's plan (None: an answer without one)."""
    spares: tuple[StandbySlice, ...] = ()
    """Roster slices not in the current generation, and how many of their hosts stand by."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready document with stable keys; 64-bit incarnations as decimal strings (JSON readers
        such as JavaScript and jq lose precision above 2**53)."""
        infos = [s.task for s in self.tasks]
        return {
            "cluster": self.cluster,
            "service_incarnation": str(self.service_incarnation),
            "protocol_version": self.protocol_version,
            "generation": self.generation,
            "forming": self.forming,
            "ended": list(self.ended),
            "tasks": [
                {
                    "task": t.task.task_id,
                    "address": t.task.address,
                    "state": t.state.value,
                    "fingerprint": t.fingerprint or None,
                    "hostname": t.hostname or None,
                    "peer": t.peer or None,
                    "heartbeat_age": t.seconds_since_heartbeat,
                    "session_open": t.session_open,
                    "cause": t.cause or None,
                    "role": t.role,
                    "rank": t.rank,
                }
                for t in self.tasks
            ],
            "plan": None if self.plan is None else {
                "slices": len(self.plan), "runs": [list(r) for r in self.plan.runs], "description": self.plan.describe()
            },
            "spares": [s.as_dict() for s in self.spares],
            "error": None if self.failure is None else str(self.failure),
            "barriers": [
                {
                    "name": b.name,
                    "instance": b.instance,
                    "arrived": list(b.arrived),
                    "missing": [t.task_id for t in b.missing(infos)],
                    "seconds_left": b.seconds_left,
                    **({"kind": b.kind} if b.kind != "barrier" else {}),
                }
                for b in self.barriers
            ],
            "failed_barriers": [f.as_dict() for f in self.failed_barriers],
            "watchdog": None if self.watchdog is None else self.watchdog.to_dict(),
            "goodput": None if self.goodput is None else self.goodput.to_dict(),
            "preemption": None if self.preemption is None else self.preemption.to_dict(
                {info.task_id: info.address for info in infos if info.task_id in self.preemption.tasks}
            ),
        }


RendezvousKind = Literal["barrier", "gather"]


@dataclass(frozen=True)
class BarrierId:
    """One instance of a barrier (or gather): a task's call to ``name`` joins the instance after the one its
    previous call joined, or after the latest that failed if that is later (``rendezvous.py``)."""

    name: str
    instance: int
    """1 for every task's first call to ``name``, 2 for the second, ... while none fails."""
    kind: RendezvousKind = "barrier"
    generation: int = 1
    """Barrier and gather counts are per generation: "step" #1 of generation 2 is not that of 1."""

    def __str__(self) -> str:
        return f"{self.kind} {shown(self.name)} #{self.instance}"


@dataclass(frozen=True)
class Gathered:
    """A passed gather: every task's value, by task id. The same object for every caller."""

    instance: int
    values: tuple[bytes, ...]


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
    NOT_PERMITTED = "no credential"
    """The call does not carry the credential of the task it names."""
    QUOTA = "over quota"
    OLD_GENERATION = "other generation"
    """The call is of a generation that ended (or that this coordinator never had: it restarted)."""
    CLUSTER_FAILED = "cluster failed"
    TIMED_OUT = "timed out"
    SHAPE_MISMATCH = "slice shape mismatch"
    """A host's slice is not shaped like the cluster's (accelerator type, topology, hosts per slice)."""
    STANDBY = "standby"
    """The call needs a member of the generation; the caller stands by (a spare, or a slice not in it)."""


class Refused(Exception):
    """The service's "no" to one call. Not a user-facing error itself: the servicer sends it as a gRPC
    status, and the client turns that status into a ``TpuctlError``."""

    def __init__(
        self, reason: Reason, message: str, *, hint: str | None = None, failure: ClusterFailure | None = None
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.hint = hint
        self.failure = failure
        """The cluster's final failure, when that is why (the caller learns it with the refusal itself: the
        service may be gone by the time it could ask, as after ``tpuctl down --all``)."""


class ClusterFailed(ClusterError):
    """A call refused because the cluster failed for good or was shut down, with that failure as the service
    answered it (``Refused.failure``): a shutdown is told from a failure by ``failure.shutdown``, never by
    the text."""

    def __init__(self, message: str, failure: ClusterFailure, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.failure = failure


@dataclass(frozen=True)
class Verdict:
    """A decided failure, kept so every later caller gets the same answer (a fresh exception each time:
    re-raising one instance would grow its traceback)."""

    reason: Reason
    message: str
    hint: str | None = None

    def refused(self) -> Refused:
        return Refused(self.reason, self.message, hint=self.hint)


def check_name(what: str, name: str) -> None:
    """Refuse an empty name or one longer than ``MAX_NAME_CHARS``."""
    if not name:
        raise Refused(Reason.INVALID, f"{what} is empty")
    if len(name) > MAX_NAME_CHARS:
        raise Refused(
            Reason.INVALID,
            f"{what} is {count(len(name))} characters long: {shown(name, 40)}; at most "
            f"{count(MAX_NAME_CHARS)} characters are allowed",
            hint=f"use a shorter {what}",
        )


def check_timeout(what: str, timeout: float) -> None:
    if not (math.isfinite(timeout) and timeout >= 0):
        raise Refused(Reason.INVALID, f"{what} timeout must be >= 0 seconds, got {timeout!r}")


# --- wake-ups ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WaitKey:
    """What a parked call waits on."""

    kind: Literal["registration", "errors", "barrier", "gather", "key"]
    name: str = ""
    instance: int = 0


REGISTRATION = WaitKey("registration")
"""Woken once: when the last task registers (not on every registration)."""
ERRORS = WaitKey("errors")


def barrier_key(barrier: BarrierId) -> WaitKey:
    return WaitKey(barrier.kind, barrier.name, barrier.instance)


def kv_key(key: str) -> WaitKey:
    return WaitKey("key", key)


@dataclass(frozen=True)
class Wakeup:
    """Which parked calls must look again: those on ``keys``, or all of them."""

    keys: frozenset[WaitKey] = frozenset()
    everyone: bool = False


# --- work counters -----------------------------------------------------------------------------------


@dataclass
class Counters:
    """Work the service did, counted (not timed) so tests can assert it is linear in the cluster size.

    ``touched``: task records, list entries and parked calls visited (every loop counts its steps);
    ``built``: protobuf messages built for answers; ``encoded``: answers serialized (a shared answer
    counts once); ``sent_bytes``: bytes of answers and refusal texts sent (a shared answer counts each
    time it is sent); ``woken``: parked calls woken; ``calls``: RPCs and stream messages handled;
    ``stream_in`` / ``stream_out``: messages read from / written to session streams (heartbeats, barrier
    arrivals and watches in; confirmations, barrier outcomes and pushed failures out), ``stream_bytes``:
    the bytes of those written (also in ``sent_bytes``).
    """

    calls: int = 0
    touched: int = 0
    built: int = 0
    encoded: int = 0
    sent_bytes: int = 0
    woken: int = 0
    stream_in: int = 0
    stream_out: int = 0
    stream_bytes: int = 0

    def snapshot(self) -> dict[str, int]:
        return dict(vars(self))

