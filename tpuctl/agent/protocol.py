"""What an agent and the one-shot commands say to each other: typed, versioned, standard library only.

Two contracts cross a process boundary on one host:

* ``agent.json`` in the state dir, written by the agent once the mapping exists: :class:`AgentInfo`;
* the control socket (:mod:`tpuctl.agent.control`): a request names a ``control.Op``, the answers are
  :class:`BarrierPassed`, :class:`ErrorReport`, a job environment (``tpuctl.job.env.JobEnv``) or
  the status document.

Each value is an immutable record, a ``NamedTuple`` to mypy and :class:`tpuctl.records.Record` at run
time (these are on the path of ``tpuctl barrier``, where importing typing costs more than the command;
build them with keywords) and converts to and from plain JSON (``to_json`` /
``from_json``); ``from_json`` refuses a
document of another schema version or with a field of the wrong type (StateError naming the field),
so a reader never works from a half-understood description. Nothing here imports asyncio, grpc or
click: ``tpuctl barrier``, ``status`` and ``env`` use it on their light path.
"""

from __future__ import annotations

from tpuctl.errors import StateError

TYPE_CHECKING = False  # typing is not imported on the light path (a Record is tpuctl.records' at run time)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import NamedTuple as Record
    from typing import TypeVar

    T = TypeVar("T")
else:
    from tpuctl.records import Record

SCHEMA_VERSION = 1
"""Version of ``agent.json`` and of the control messages; an agent and a command of other versions
refuse each other with a hint to restart the agent."""

_RESTART_HINT = "restart the cluster with this tpuctl version: `tpuctl down` on every host, then `tpuctl init`"

class ProtocolError(StateError):
    """The other side spoke a version or shape of the protocol this tpuctl does not."""


def _field(data: Mapping[str, object], name: str, kind: type[T] | tuple[type[T], ...], source: str) -> T:
    value = data.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float, (int, float))):
        raise ProtocolError(f"{source}: field {name!r} is {value!r}; expected {_kind_name(kind)}", hint=_RESTART_HINT)
    return value


def _optional(
    data: Mapping[str, object], name: str, kind: type[T] | tuple[type[T], ...], source: str
) -> T | None:
    return None if data.get(name) is None else _field(data, name, kind, source)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({"str": "a string", "int": "an integer", "float": "a number", "list": "a list",
                        "dict": "an object", "bool": "true or false"}.get(k.__name__, k.__name__) for k in kinds)


def _check_version(data: Mapping[str, object], source: str) -> None:
    version = data.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise ProtocolError(
            f"{source} is of schema version {version!r}; this tpuctl reads version {SCHEMA_VERSION}",
            hint=_RESTART_HINT,
        )


class JobPorts(Record):
    """Ports the agent reserved for the job's own runtimes."""

    dtensor: tuple[int, ...]
    """DTensor's gRPC server port of every task, in task order."""
    jax: int
    """JAX's coordinator port (on task 0's host)."""
    torch: int
    """torch.distributed's store port (``MASTER_PORT``, on task 0's host)."""


NO_JOB_PORTS = JobPorts(dtensor=(), jax=0, torch=0)
"""A standby host's: it reserves none until it takes a place."""
MEMBER, STANDBY = "member", "standby"
"""A host's role in its generation (``AgentInfo.role``, status's ``role``)."""


class AgentInfo(Record):
    """``agent.json``: what a running agent is (cluster, task, coordinator, mapping, job ports)."""

    cluster: str
    task: int
    num_tasks: int
    coordinator: str
    """The coordination service's ``host:port``."""
    mapping: str
    """The device mapping file this agent wrote."""
    job_ports: JobPorts
    pid: int | None = None
    address: str = ""
    hosts: tuple[str, ...] = ()
    accelerator: str = ""
    topology: str = ""
    config: str | None = None
    backend: str = ""
    """The spec's backend (``sim``, ``jax``, ``tensorflow``); empty in a description from before it was kept."""
    incarnation: str = ""
    service_incarnation: str = ""
    barrier_timeout: float = 600.0
    heartbeat_timeout: float = 30.0
    """The cluster's heartbeat timeout: a host silent this long is failed (jobs watch their agent as long)."""
    started: float = 0.0
    generation: int = 1
    """The cluster generation this description (and the mapping) is of."""
    restart_policy: str = "fail"
    restart_timeout: float = 600.0
    max_restarts: int = 3
    rank: int | None = None
    """This host's process rank in the generation (spares, policy elastic); None: the same as ``task``."""
    role: str = MEMBER
    """``member``, or ``standby``: a host registered into ``generation`` without being one of its members (a
    spare, a host of a slice the generation left out). A standby description has no rank, no job ports and no
    mapping yet; ``hosts`` are the generation's members."""

    @property
    def standby(self) -> bool:
        return self.role == STANDBY

    @property
    def position(self) -> int:
        """The host's index among the generation's ``hosts`` (its rank)."""
        return self.task if self.rank is None else self.rank

    def to_json(self) -> dict[str, object]:
        return {
            "schema_version": SCHEMA_VERSION,
            "pid": self.pid,
            "cluster": self.cluster,
            "task": self.task,
            "rank": self.rank,
            "role": self.role,
            "address": self.address,
            "num_tasks": self.num_tasks,
            "hosts": list(self.hosts),
            "coordinator": self.coordinator,
            "accelerator": self.accelerator,
            "topology": self.topology,
            "mapping": self.mapping,
            "config": self.config,
            "backend": self.backend,
            "incarnation": self.incarnation,
            "service_incarnation": self.service_incarnation,
            "barrier_timeout": self.barrier_timeout,
            "heartbeat_timeout": self.heartbeat_timeout,
            "job_ports": {
                "dtensor": list(self.job_ports.dtensor),
                "jax": self.job_ports.jax,
                "torch": self.job_ports.torch,
            },
            "started": self.started,
            "generation": self.generation,
            "restart": {"policy": self.restart_policy, "timeout": self.restart_timeout, "max": self.max_restarts},
        }

    @classmethod
    def from_json(cls, data: object, source: str = "the agent's description") -> AgentInfo:
        """Read ``agent.json``'s document; ProtocolError (a StateError, exit 5) naming what is wrong."""
        if not isinstance(data, dict):
            raise ProtocolError(f"{source} is not an agent description (a JSON object)", hint=_RESTART_HINT)
        _check_version(data, source)
        num_tasks = _field(data, "num_tasks", int, source)
        task = _field(data, "task", int, source)
        rank = _optional(data, "rank", int, source)
        role = _optional(data, "role", str, source) or MEMBER
        if role not in (MEMBER, STANDBY):
            raise ProtocolError(f"{source}: role {_short(role)}; expected {MEMBER!r} or {STANDBY!r}", hint=_RESTART_HINT)
        standby = role == STANDBY  # not one of the generation's members: no rank, no job ports yet
        if task < 0 or (not standby and not 0 <= (task if rank is None else rank) < num_tasks):
            what = f"task {task}" if rank is None else f"rank {rank}"
            raise ProtocolError(f"{source}: {what} is not one of 0..{num_tasks - 1}", hint=_RESTART_HINT)
        hosts = tuple(str(h) for h in (_optional(data, "hosts", list, source) or ()))
        return cls(
            cluster=_field(data, "cluster", str, source),
            task=task,
            rank=rank,
            num_tasks=num_tasks,
            coordinator=_field(data, "coordinator", str, source),
            mapping=_field(data, "mapping", str, source),
            job_ports=NO_JOB_PORTS if standby else _job_ports(data.get("job_ports"), num_tasks, source),
            role=role,
            pid=_optional(data, "pid", int, source),
            address=str(data.get("address") or ""),
            hosts=hosts,
            accelerator=str(data.get("accelerator") or ""),
            topology=str(data.get("topology") or ""),
            config=_optional(data, "config", str, source),
            backend=str(data.get("backend") or ""),
            incarnation=str(data.get("incarnation") or ""),
            service_incarnation=str(data.get("service_incarnation") or ""),
            barrier_timeout=float(_optional(data, "barrier_timeout", (int, float), source) or 600.0),
            heartbeat_timeout=float(_optional(data, "heartbeat_timeout", (int, float), source) or 30.0),
            started=float(_optional(data, "started", (int, float), source) or 0.0),
            generation=int(_optional(data, "generation", int, source) or 1),
            restart_policy=(restart := _restart(data.get("restart"), source))[0],  # read last, as it is written
            restart_timeout=restart[1],
            max_restarts=restart[2],
        )


def _restart(restart: object, source: str) -> tuple[str, float, int]:
    """The ``restart`` object: (policy, timeout, max restarts), each its default where missing."""
    if restart is None:
        return "fail", 600.0, 3
    if not isinstance(restart, dict):
        raise ProtocolError(f"{source}: field 'restart' is {_short(restart)}; expected an object", hint=_RESTART_HINT)
    policy = _optional(restart, "policy", str, source) or "fail"
    timeout = _optional(restart, "timeout", (int, float), source) or 600.0
    most = _optional(restart, "max", int, source)
    return policy, float(timeout), 3 if most is None else most


def _is_port(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536


def _job_ports(ports: object, num_tasks: int, source: str) -> JobPorts:
    dtensor = ports.get("dtensor") if isinstance(ports, dict) else None
    jax = ports.get("jax") if isinstance(ports, dict) else None
    torch = ports.get("torch") if isinstance(ports, dict) else None
    if (
        not isinstance(dtensor, list)
        or len(dtensor) != num_tasks
        or not all(_is_port(p) for p in dtensor)
        or not isinstance(jax, int)
        or not _is_port(jax)
        or not isinstance(torch, int)
        or not _is_port(torch)
    ):
        raise ProtocolError(
            f"{source} has no usable job ports for {num_tasks} tasks (job_ports: {_short(ports)})", hint=_RESTART_HINT
        )
    return JobPorts(dtensor=tuple(dtensor), jax=jax, torch=torch)


def _short(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text):,} characters)"


class Failure(Record):
    """One failed host, as the coordinator named it."""

    task: int
    address: str
    cause: str


class ErrorReport(Record):
    """The cluster's health as this host's agent knows it (answer to :attr:`Op.WAIT_ERROR`)."""

    error: str | None = None
    """The cluster's error, when it is in error."""
    error_type: str | None = None
    """The error's class name (``ClusterError``, ``CoordinatorUnreachable``, ...)."""
    failures: tuple[Failure, ...] = ()
    detected_at: float | None = None
    """Wall-clock time this agent learnt of the error."""
    shutdown: bool = False
    """The cluster was shut down on purpose (``tpuctl down --all``)."""
    stopping: bool = False
    """This agent is leaving (``tpuctl down``, a signal)."""
    generation: int = 0
    """The generation this host is in (while re-forming: the one that ended)."""
    rejoining: bool = False
    """The generation ended and the cluster re-forms (restart policy rejoin): the job must stop, and may
    start again once the next generation formed."""
    formed: bool = False
    """The generation formed: its mapping is committed and a job may start (or restart) under it."""
    ended: str | None = None
    """What ended the generation, while re-forming."""
    history: tuple[Mapping[str, object], ...] = ()
    """Every generation this agent took part in: ``generation``, ``formed``/``ended`` (epoch s), ``cause``."""
    standby: bool = False
    """This host stands by in ``generation`` (a spare, or a host of a slice the generation left out): no job
    runs here until a later generation takes it in (``formed`` then)."""
    preemption: Mapping[str, object] | None = None
    """The latest preemption notice this host heard and its agreement (``tpuctl.agent.notices.Notices.record``):
    ``generation``, ``task``, ``source``, ``reason``, ``deadline`` (epoch s), ``state``, ``step``, ``why``."""

    def agreed_step(self, generation: int) -> int | None:
        """The checkpoint step every host agreed on in ``generation``, if they did."""
        record = self.preemption
        if record is None or record.get("generation") != generation or record.get("state") != "agreed":
            return None
        step = record.get("step")
        return step if isinstance(step, int) and not isinstance(step, bool) else None

    def notice_deadline(self, generation: int) -> float | None:
        """When the host of ``generation``'s notice goes (epoch s), if there was one."""
        record = self.preemption
        deadline = record.get("deadline") if record is not None and record.get("generation") == generation else None
        return float(deadline) if isinstance(deadline, (int, float)) and not isinstance(deadline, bool) else None

    @property
    def down(self) -> bool:
        """Whether a job on this host should stop: an error, a shutdown, this agent leaving, or its
        generation over."""
        return bool(self.error) or self.shutdown or self.stopping or self.rejoining

    @property
    def seen(self) -> list[object]:
        """What ``Op.WAIT_ERROR``'s ``since`` compares: a long-poll answers once it changes. The fourth
        entry is the preemption notice's state (``"2:agreed"``), compared only when ``since`` has it."""
        record = self.preemption
        notice = None if record is None else f"{record.get('generation')}:{record.get('state')}"
        return [self.generation, self.rejoining, self.formed, notice]

    @property
    def final(self) -> bool:
        """Down for good: no next generation will form on this agent."""
        return bool(self.error) or self.shutdown or self.stopping

    def to_json(self) -> dict[str, object]:
        return {
            "generation": self.generation,
            "rejoining": self.rejoining,
            "formed": self.formed,
            "standby": self.standby,
            "ended": self.ended,
            "history": [dict(h) for h in self.history],
            "error": self.error,
            "error_type": self.error_type,
            "failures": [{"task": f.task, "address": f.address, "cause": f.cause} for f in self.failures],
            "detected_at": self.detected_at,
            "shutdown": self.shutdown,
            "stopping": self.stopping,
            "preemption": None if self.preemption is None else dict(self.preemption),
        }

    @classmethod
    def from_json(cls, data: object, source: str = "the agent's error report") -> ErrorReport:
        if not isinstance(data, dict):
            raise ProtocolError(f"{source} is not a JSON object", hint=_RESTART_HINT)
        failures = []
        for item in _optional(data, "failures", list, source) or ():
            if not isinstance(item, dict):
                raise ProtocolError(f"{source}: a failure is {_short(item)}; expected an object", hint=_RESTART_HINT)
            failures.append(
                Failure(task=_field(item, "task", int, source), address=str(item.get("address") or "?"),
                        cause=str(item.get("cause") or ""))
            )
        detected = _optional(data, "detected_at", (int, float), source)
        return cls(
            error=_optional(data, "error", str, source),
            error_type=_optional(data, "error_type", str, source),
            failures=tuple(failures),
            detected_at=None if detected is None else float(detected),
            shutdown=bool(data.get("shutdown")),
            stopping=bool(data.get("stopping")),
            generation=int(_optional(data, "generation", int, source) or 0),
            rejoining=bool(data.get("rejoining")),
            formed=bool(data.get("formed")),
            standby=bool(data.get("standby")),
            ended=_optional(data, "ended", str, source),
            history=tuple(h for h in (_optional(data, "history", list, source) or ()) if isinstance(h, dict)),
            preemption=_optional(data, "preemption", dict, source),
        )


class BarrierPassed(Record):
    """Answer to :attr:`Op.BARRIER`: which instance of the barrier passed, among how many hosts."""

    name: str
    instance: int
    hosts: int

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "instance": self.instance, "hosts": self.hosts}

    @classmethod
    def from_json(cls, data: object, source: str = "the agent's barrier answer") -> BarrierPassed:
        if not isinstance(data, dict):
            raise ProtocolError(f"{source} is not a JSON object", hint=_RESTART_HINT)
        return cls(name=_field(data, "name", str, source), instance=_field(data, "instance", int, source),
                   hosts=_field(data, "hosts", int, source))


__all__ = [
    "SCHEMA_VERSION",
    "AgentInfo",
    "BarrierPassed",
    "ErrorReport",
    "Failure",
    "JobPorts",
    "ProtocolError",
]
