"""Which task this host is, and a cluster spec detected from Cloud TPU VM metadata or GKE variables.

Pure: every function takes the environment as a mapping and the metadata server as an object with
``get(key)`` (:class:`tpuctl.spec.metadata.MetadataClient` at the edge, in ``hostenv.detect_cluster``);
nothing here reads ``os.environ`` or opens a socket. An empty variable counts as unset.

Detection, in JAX's order (``jax/_src/clusters/cloud_tpu_cluster.py``: GKE first, then the GCE metadata
server), every value's origin kept for ``tpuctl detect``:

1. a host list in the environment: ``TPUCTL_HOSTS``, else ``TPU_PROCESS_ADDRESSES`` (``host:port`` per TPU
   process; a machine may run several, on distinct ports), else ``TPU_WORKER_HOSTNAMES`` (GKE's webhook,
   JobSet, LeaderWorkerSet). With ``TPU_PROCESS_ADDRESSES`` or ``TPU_WORKER_HOSTNAMES`` set the metadata
   server is not asked (a GKE pod);
2. otherwise, unless ``TPU_SKIP_MDS_QUERY`` is set, the metadata server: ``agent-worker-number`` (its
   presence means a Cloud TPU VM), ``worker-network-endpoints``, ``accelerator-type`` and the ``tpu-env``
   lines (``TOPOLOGY``, ``CHIPS_PER_HOST_BOUNDS``, ``HOST_BOUNDS``, ``TPU_PROCESS_BOUNDS``,
   ``TPU_CHIPS_PER_PROCESS_BOUNDS``, ``MEGASCALE_*``). Process bounds that split machines make each TPU
   process a task (:mod:`tpuctl.spec.processes`). A variable set in the environment wins
   over the metadata value of the same meaning (JAX reads ``MEGASCALE_*`` the same way).

Task id, first answer wins:

1. ``--task-id N``;
2. ``TPUCTL_TASK_ID``;
3. this host's names and addresses (``hostenv.local_names()``) against ``hosts``: exactly one match wins;
   several (e.g. 127.0.0.2..5 all on one machine) is an error asking for ``--task-id``, unless the
   worker id below names one of them (several TPU processes on one machine);
4. ``CLOUD_TPU_TASK_ID`` (libtpu's and torch_xla's process index), else ``TPU_WORKER_ID`` (or the metadata's
   ``agent-worker-number``), + ``MEGASCALE_SLICE_ID`` * hosts per slice;
5. a spec with a single host: task 0.

``TPU_VISIBLE_CHIPS``, when set, must be the found task's chips on its machine
(:mod:`tpuctl.spec.processes`; several TPU processes per machine split it by ``TPU_PROCESS_BOUNDS``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator, Mapping, Set
from dataclasses import dataclass
from typing import Protocol, cast

from tpuctl.errors import InputError, SpecError, TopologyError
from tpuctl.hosts import normalize_host
from tpuctl.spec.metadata import MetadataUnavailable, parse_tpu_env
from tpuctl.spec.model import (
    DEFAULT_PORT,
    REPEAT_RULE,
    AuthSpec,
    Backend,
    ClusterSpec,
    CoordinatorSpec,
    backend_problem,
    cluster_name_problem,
    host_count_problem,
    host_problem,
    repeated_hosts,
    topology_problem,
)
from tpuctl.spec.processes import PROCESS_ENVS, parse_visible_chips, split_processes, visible_chips_problem
from tpuctl.tpu.slice import TpuSlice, parse_accelerator_type, resolve_slice

TASK_ID_ENV = "TPUCTL_TASK_ID"
CLUSTER_ENV = "TPUCTL_CLUSTER"
BACKEND_ENV = "TPUCTL_BACKEND"
HOSTS_ENV = "TPUCTL_HOSTS"
TOKEN_FILE_ENV = "TPUCTL_TOKEN_FILE"
PORT_ENV = "TPUCTL_COORDINATOR_PORT"
SKIP_METADATA_ENV = "TPU_SKIP_MDS_QUERY"
PROCESS_ADDRESSES_ENV = "TPU_PROCESS_ADDRESSES"
TASK_INDEX_ENV = "CLOUD_TPU_TASK_ID"  # libtpu's and torch_xla's process index within the slice
WORKER_HOSTNAMES_ENV = "TPU_WORKER_HOSTNAMES"
HOST_LIST_ENVS = (HOSTS_ENV, PROCESS_ADDRESSES_ENV, WORKER_HOSTNAMES_ENV)
DEFAULT_BACKEND: Backend = "jax"
ENV_SOURCE = "environment"
ENV_ORIGIN = "environment"
_TASK_HINT = "pass --task-id N (or set TPUCTL_TASK_ID=N), N = this host's position in hosts"
_ELSEWHERE = "(GKE's TPU device plugin sets it; on a Cloud TPU VM tpuctl reads the metadata server; elsewhere pass --config FILE)"

# Environment name -> where a Cloud TPU VM's metadata keeps the same value (an attribute, or a tpu-env line).
METADATA_KEYS: dict[str, tuple[str, ...]] = {
    "TPU_WORKER_ID": ("agent-worker-number", "tpu-env WORKER_ID"),
    WORKER_HOSTNAMES_ENV: ("worker-network-endpoints",),
    "TPU_ACCELERATOR_TYPE": ("accelerator-type", "tpu-env ACCELERATOR_TYPE"),
    "TPU_TOPOLOGY": ("tpu-env TOPOLOGY",),
    "TPU_CHIPS_PER_HOST_BOUNDS": ("tpu-env CHIPS_PER_HOST_BOUNDS",),
    "TPU_HOST_BOUNDS": ("tpu-env HOST_BOUNDS",),
    "TPU_PROCESS_BOUNDS": ("tpu-env TPU_PROCESS_BOUNDS",),
    "TPU_CHIPS_PER_PROCESS_BOUNDS": ("tpu-env TPU_CHIPS_PER_PROCESS_BOUNDS",),
    "MEGASCALE_NUM_SLICES": ("tpu-env MEGASCALE_NUM_SLICES",),
    "MEGASCALE_SLICE_ID": ("tpu-env MEGASCALE_SLICE_ID",),
    "MEGASCALE_COORDINATOR_ADDRESS": ("tpu-env MEGASCALE_COORDINATOR_ADDRESS",),
}


class MetadataSource(Protocol):
    """What detection needs of a metadata server: ``get`` (None for an absent key; raises
    :class:`~tpuctl.spec.metadata.MetadataUnavailable` when no server answers) and ``describe``."""

    def get(self, key: str) -> str | None: ...

    def describe(self) -> str: ...


class Values(Mapping[str, str]):
    """The variables detection reads, by their environment names, each with where it came from.

    The environment (non-empty values) first, then ``found`` (name -> (value, origin), e.g. the metadata's
    ``agent-worker-number`` under ``TPU_WORKER_ID``). Problems name a value by :meth:`label`: the variable
    for the environment (``TPU_WORKER_ID``), the origin otherwise (``metadata agent-worker-number``).
    """

    def __init__(self, environ: Mapping[str, str], found: Mapping[str, tuple[str, str]] | None = None) -> None:
        self._values: dict[str, tuple[str, str]] = dict(found or {})
        for name, value in environ.items():
            if value.strip():
                self._values[name] = (value, ENV_ORIGIN)

    def __getitem__(self, name: str) -> str:
        return self._values[name][0]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def origin(self, name: str) -> str:
        """``environment``, ``metadata agent-worker-number``, ...; ``unset`` for a missing name."""
        entry = self._values.get(name)
        return entry[1] if entry else "unset"

    def label(self, name: str) -> str:
        origin = self.origin(name)
        return name if origin in (ENV_ORIGIN, "unset") else origin

    def source(self, name: str) -> str:
        """For ``tpuctl detect``: ``env TPU_WORKER_ID`` or ``metadata agent-worker-number``."""
        origin = self.origin(name)
        return f"env {name}" if origin == ENV_ORIGIN else origin


@dataclass(frozen=True)
class TaskIdentity:
    """This host's task id and how it was found (for the log: ``task 2 (TPU_WORKER_ID=2)``)."""

    task_id: int
    reason: str


def _env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def _label(environ: Mapping[str, str], name: str) -> str:
    return environ.label(name) if isinstance(environ, Values) else name


def _env_int(environ: Mapping[str, str], name: str, low: int, high: int, what: str) -> int | None:
    """An integer variable in [low, high], None when unset; InputError naming it otherwise."""
    raw = _env(environ, name)
    if raw is None:
        return None
    label = _label(environ, name)
    digits = raw[1:] if raw[:1] in ("-", "+") else raw
    if not (digits.isascii() and digits.isdigit()):  # int() alone reads any script's digits ('\u0661' is 1)
        raise InputError(f"{label}={raw!r} is not an integer; expected {what} from {low} to {high}")
    value = int(raw)
    if not low <= value <= high:
        raise InputError(f"{label}={value} is out of range; expected {what} from {low} to {high}")
    return value


def matching_tasks(hosts: tuple[str, ...], local_names: Set[str]) -> list[int]:
    """Positions in ``hosts`` naming this host (case, trailing dots and IPv6 spelling ignored)."""
    mine = {normalize_host(name) for name in local_names}
    return [task for task, host in enumerate(hosts) if normalize_host(host) in mine]


def identify(
    spec: ClusterSpec, *, task_id: int | None, environ: Mapping[str, str], local_names: Set[str]
) -> TaskIdentity:
    """This host's task id with the reason; InputError when it is ambiguous, unknown or out of range, or
    when ``TPU_VISIBLE_CHIPS`` names other chips than the task's.

    ``environ`` may be :class:`Values` (what detection found, metadata included) or a plain mapping.
    """
    found = _identify(spec, task_id=task_id, environ=environ, local_names=local_names)
    if found.task_id < spec.slice.num_hosts:
        problem = visible_chips_problem(environ, spec.slice, found.task_id, lambda name: _label(environ, name))
        if problem is not None:
            raise InputError(
                f"{problem} ({found.reason})",
                hint="set TPU_VISIBLE_CHIPS to this process's chips, or unset it; the task id comes from "
                "--task-id, TPUCTL_TASK_ID, CLOUD_TPU_TASK_ID or TPU_WORKER_ID",
            )
    return found


def _identify(
    spec: ClusterSpec, *, task_id: int | None, environ: Mapping[str, str], local_names: Set[str]
) -> TaskIdentity:
    roster = spec.roster_hosts  # hosts, then spares: a spare's task id is len(hosts) + its position in spares
    count = len(roster)
    last = count - 1
    if task_id is not None:
        if not 0 <= task_id <= last:
            spares = f" and {len(spec.spares)} spares" if spec.spares else ""
            raise InputError(
                f"--task-id {task_id} is out of range: {spec.source} has {len(spec.hosts)} hosts{spares}, "
                f"tasks 0 to {last}",
                hint="the task id is the host's position in hosts (then spares), counting from 0",
            )
        return TaskIdentity(task_id, "--task-id")
    from_env = _env_int(environ, TASK_ID_ENV, 0, last, f"a task id of {spec.source}")
    if from_env is not None:
        return TaskIdentity(from_env, f"{TASK_ID_ENV}={from_env}")
    matches = matching_tasks(roster, local_names)
    if len(matches) == 1:
        return TaskIdentity(matches[0], f"this host is {_roster_entry(spec, matches[0])} ({roster[matches[0]]})")
    slice_task = _task_from_tpu_env(spec.slice, environ)
    if len(matches) > 1:
        if slice_task is not None and slice_task.task_id in matches:
            return slice_task  # several TPU processes on this machine: the worker id tells them apart
        listed = ", ".join(f"task {t} ({roster[t]})" for t in matches)
        raise InputError(
            f"this host matches several hosts of {spec.source}: {listed}",
            hint=f"several tasks share this machine; {_TASK_HINT}",
        )
    if slice_task is not None:
        return slice_task
    if count == 1:
        return TaskIdentity(0, "the only host")
    names = ", ".join(sorted(local_names)) or "none found"
    raise InputError(
        f"cannot tell which of the {count} hosts of {spec.source} this is: none of this host's names "
        f"({names}) is in hosts, and TPU_WORKER_ID is not set",
        hint=_TASK_HINT,
    )


def _roster_entry(spec: ClusterSpec, task: int) -> str:
    """``hosts[3]`` or ``spares[1]``: where the spec names task ``task``."""
    active = len(spec.hosts)
    return f"hosts[{task}]" if task < active else f"spares[{task - active}]"


def check_spare(spec: ClusterSpec, task: int) -> None:
    """``tpuctl init --spare``: InputError (exit 2) unless task ``task`` is one of the spec's spares."""
    if spec.is_spare(task):
        return
    active = len(spec.hosts)
    if not spec.spares:
        spares = "the spec names no spares"
    else:
        spares = f"its spares are tasks {active} to {active + len(spec.spares) - 1} ({spec.spares[0]}, ...)"
    raise InputError(
        f"--spare, but this host is task {task} ({spec.hosts[task]}), one of the cluster's hosts (tasks 0 to "
        f"{active - 1}); {spares}",
        hint="run init without --spare on a host of hosts:, or list this host under spares: (docs/how-to/elastic.md)",
    )


def resolve_task_id(
    spec: ClusterSpec, *, task_id: int | None, environ: Mapping[str, str], local_names: Set[str]
) -> int:
    """This host's task id (see the module docstring for the order); InputError when it cannot tell."""
    return identify(spec, task_id=task_id, environ=environ, local_names=local_names).task_id


def _task_from_tpu_env(tpu: TpuSlice, environ: Mapping[str, str]) -> TaskIdentity | None:
    """``TPU_WORKER_ID`` (within a slice) + ``MEGASCALE_SLICE_ID`` * hosts per slice, checked against the spec."""
    per_slice = tpu.hosts_per_slice
    worker_env = TASK_INDEX_ENV if _env(environ, TASK_INDEX_ENV) else "TPU_WORKER_ID"  # torch_xla's order
    worker = _env_int(environ, worker_env, 0, per_slice - 1, f"a worker index of {tpu.accelerator_type}")
    if worker is None:
        return None
    num_slices = _env_int(environ, "MEGASCALE_NUM_SLICES", 1, 1 << 20, "a slice count")
    if num_slices is not None and num_slices != tpu.num_slices:
        raise InputError(
            f"{_label(environ, 'MEGASCALE_NUM_SLICES')}={num_slices}, but the spec has {tpu.num_slices} slice(s)",
            hint="set num_slices in the spec to match, or check this host belongs to this cluster",
        )
    slice_id = _env_int(environ, "MEGASCALE_SLICE_ID", 0, tpu.num_slices - 1, "a slice index")
    worker_label = _label(environ, worker_env)
    if slice_id is None and tpu.num_slices > 1:
        raise InputError(
            f"{worker_label}={worker} counts hosts within one slice, but MEGASCALE_SLICE_ID is not set "
            f"and the spec has {tpu.num_slices} slices",
            hint=f"set MEGASCALE_SLICE_ID, or {_TASK_HINT}",
        )
    slice_id = slice_id or 0
    task = worker + slice_id * per_slice
    reason = f"{worker_label}={worker}"
    if tpu.num_slices > 1:
        reason += f", {_label(environ, 'MEGASCALE_SLICE_ID')}={slice_id} ({per_slice} hosts per slice)"
    return TaskIdentity(task, reason)


# --- host lists ----------------------------------------------------------------------------------------


def parse_host_list(name: str, value: str, *, ports: bool) -> tuple[list[str], list[str]]:
    """Hosts in a comma list variable, and the problems found.

    Items are a host name or address; ``name:uid:address`` (Cloud TPU's older worker-network-endpoints
    form: the address is kept); with ``ports``, ``host:port`` or ``[v6]:port`` (TPU_PROCESS_ADDRESSES: the
    port is dropped).
    """
    entries, problems = _parse_entries(name, value, ports=ports)
    return [host for host, _ in entries], problems


def _parse_entries(name: str, value: str, *, ports: bool) -> tuple[list[tuple[str, int | None]], list[str]]:
    entries: list[tuple[str, int | None]] = []
    problems: list[str] = []
    for index, raw in enumerate(value.split(",")):
        host, port = _endpoint(raw.strip(), ports=ports)
        problem = host_problem(host)
        if problem:
            problems.append(f"{name}={value!r}: item {index} {problem}")
        else:
            entries.append((host, port))
    return entries, problems


def _endpoint(item: str, *, ports: bool) -> tuple[str, int | None]:
    if ":" not in item:
        return item, None
    if not item.startswith("["):
        try:
            ipaddress.IPv6Address(item)
            return item, None
        except ValueError:
            pass
    if ports and item.startswith("[") and "]:" in item:
        port = item[item.index("]:") + 2 :]
        return item[1 : item.index("]:")], int(port) if port.isascii() and port.isdigit() else None
    parts = item.split(":", 2)
    if len(parts) == 3 and parts[1].isascii() and parts[1].isdigit():
        return parts[2], None  # name:uid:address
    if ports and len(parts) == 2 and parts[1].isascii() and parts[1].isdigit():
        return parts[0], int(parts[1])
    return item, None


def _endpoint_host(item: str, *, ports: bool) -> str:
    return _endpoint(item, ports=ports)[0]


@dataclass(frozen=True)
class _HostList:
    name: str
    hosts: tuple[str, ...]
    per_machine: int
    """Entries per machine (several TPU processes per machine when above 1)."""
    origin: str


def _host_entries(values: Values, problems: list[str]) -> _HostList | None:
    """TPUCTL_HOSTS, else TPU_PROCESS_ADDRESSES, else TPU_WORKER_HOSTNAMES (or its metadata equivalent)."""
    name = next((n for n in HOST_LIST_ENVS if _env(values, n)), None)
    if name is None:
        problems.append(
            f"{WORKER_HOSTNAMES_ENV} is not set (nor {PROCESS_ADDRESSES_ENV}); expected the slice's hosts in worker "
            f"order, comma separated {_ELSEWHERE}"
        )
        return None
    label = values.label(name)
    value = values[name]
    entries, found = _parse_entries(label, value, ports=name == PROCESS_ADDRESSES_ENV)
    problems.extend(found)
    hosts = [host for host, _ in entries]
    if name == WORKER_HOSTNAMES_ENV:  # one entry per machine: no repeats
        seen: dict[str, int] = {}
        for index, host in enumerate(hosts):
            if (first := seen.setdefault(normalize_host(host), index)) != index:
                problems.append(f"{label}: item {index} ({host}) repeats item {first}; expected each host once")
    else:
        reported: set[int] = set()
        seen_entries: dict[tuple[str, int | None], int] = {}
        for index, (host, port) in enumerate(entries):
            first = seen_entries.setdefault((normalize_host(host), port), index)
            if first != index and port is not None:
                problems.append(
                    f"{label}: item {index} ({host}:{port}) repeats item {first}; expected each process once "
                    "(several on one machine listen on distinct ports)"
                )
                reported.add(index)
        for index, first in repeated_hosts(hosts):
            if index not in reported:
                problems.append(f"{label}: item {index} ({hosts[index]}) repeats item {first}; expected {REPEAT_RULE}")
    per_machine = len(hosts) // max(1, len({normalize_host(h) for h in hosts})) if hosts else 1
    return _HostList(name, tuple(hosts), per_machine, values.source(name))


_JOBSET_RE = re.compile(r"^(?P<prefix>[a-z0-9][-a-z0-9]*)-(?P<job>\d+)-(?P<pod>\d+)(?P<rest>(\.[^,]*)?)$", re.ASCII)


def jobset_hosts(
    hosts: tuple[str, ...], slice_id: int, num_slices: int, environ: Mapping[str, str]
) -> tuple[str, ...] | None:
    """Every slice's hosts from one slice's JobSet pod names, or None when they are not JobSet names.

    JobSet names a pod ``<jobSet>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>``, and a multislice
    JobSet runs one Job per slice (``jobIndex`` = ``MEGASCALE_SLICE_ID``, as xpk sets it). The names must
    all share the prefix and subdomain, carry this slice's job index and pod indices 0..n-1 in order; the
    prefix must be ``$JOBSET_NAME-$REPLICATED_JOB_NAME`` when both are set, else hold a ``-``.
    """
    matches = [_JOBSET_RE.match(h.lower()) for h in hosts]
    if not hosts or any(m is None for m in matches):
        return None
    found = [cast(re.Match[str], m) for m in matches]
    prefix, rest = found[0]["prefix"], found[0]["rest"]
    jobset, job = _env(environ, "JOBSET_NAME"), _env(environ, "REPLICATED_JOB_NAME")
    if jobset and job:
        if prefix != f"{jobset}-{job}".lower():
            return None
    elif "-" not in prefix:
        return None
    for pod, m in enumerate(found):
        if m["prefix"] != prefix or m["rest"] != rest or int(m["job"]) != slice_id or int(m["pod"]) != pod:
            return None
    return tuple(f"{prefix}-{j}-{p}{rest}" for j in range(num_slices) for p in range(len(hosts)))


# --- the slice -----------------------------------------------------------------------------------------


def _slice_from_env(
    values: Mapping[str, str], problems: list[str], per_task: tuple[int, str] | None = None
) -> tuple[TpuSlice | None, str]:
    """The slice and where its chips per host came from; ``per_task`` = (chips, why) when a host list
    runs several TPU processes per machine and TPU_CHIPS_PER_HOST_BOUNDS is unset."""

    def label(name: str) -> str:
        return _label(values, name)

    accelerator = _env(values, "TPU_ACCELERATOR_TYPE")
    if accelerator is None:
        problems.append(
            f"TPU_ACCELERATOR_TYPE is not set; expected the slice's accelerator type, e.g. v4-32 {_ELSEWHERE}"
        )
        return None, ""
    try:
        num_slices = _env_int(values, "MEGASCALE_NUM_SLICES", 1, 1 << 20, "a slice count") or 1
        _env_int(values, "MEGASCALE_SLICE_ID", 0, num_slices - 1, "a slice index")
    except InputError as exc:
        problems.append(exc.message)
        return None, ""
    bounds = _env(values, "TPU_CHIPS_PER_HOST_BOUNDS")
    block: tuple[int, int, int] | None = None
    chips_per_host: int | None = None
    chips_origin = "derived from the accelerator type"
    if bounds is not None:
        parts = bounds.replace(" ", "").split(",")
        if not 2 <= len(parts) <= 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            problems.append(
                f"{label('TPU_CHIPS_PER_HOST_BOUNDS')}={bounds!r} is not x,y,z; expected chips per host, e.g. 2,2,1"
            )
            return None, ""
        x, y, *z = (int(p) for p in parts)
        block = (x, y, z[0] if z else 1)
        chips_per_host = x * y * block[2]
        chips_origin = "TPU_CHIPS_PER_HOST_BOUNDS"
    elif per_task is not None:
        chips_per_host, chips_origin = per_task
    topology = _env(values, "TPU_TOPOLOGY")
    step = "TPU_ACCELERATOR_TYPE"
    try:
        generation, dims = parse_accelerator_type(accelerator)
        if topology is not None:
            step = "TPU_TOPOLOGY"
            resolve_slice(generation=generation.name, topology=topology)
        if bounds is not None:
            step = "TPU_CHIPS_PER_HOST_BOUNDS"
        elif per_task is not None:
            step = "per task"
        tpu = resolve_slice(
            accelerator=None if topology else accelerator,
            generation=generation.name if topology else None,
            topology=topology,
            chips_per_host=chips_per_host,
            num_slices=num_slices,
        )
    except TopologyError as exc:
        if step == "per task":
            problems.append(f"{chips_origin}: {topology_problem(exc)}")
        else:
            value = {"TPU_ACCELERATOR_TYPE": accelerator, "TPU_TOPOLOGY": topology}.get(step, bounds)
            problems.append(f"{label(step)}={value!r}: {topology_problem(exc)}")
        return None, ""
    if tpu.chips_per_slice != dims[0] * dims[1] * dims[2]:
        problems.append(
            f"{label('TPU_TOPOLOGY')}={topology!r} has {tpu.chips_per_slice} chips, but "
            f"{label('TPU_ACCELERATOR_TYPE')}={accelerator!r} has {dims[0] * dims[1] * dims[2]}; "
            "expected the two to describe the same slice"
        )
        return None, ""
    if block is not None and block != tpu.chips_per_host_bounds:
        shown = ",".join(map(str, tpu.chips_per_host_bounds))
        problems.append(
            f"{label('TPU_CHIPS_PER_HOST_BOUNDS')}={bounds!r}: tpuctl lays {tpu.chips_per_host}-chip hosts out as "
            f"{shown}; expected {shown}"
        )
        return None, ""
    return tpu, chips_origin


def _per_task_chips(values: Mapping[str, str], found: _HostList | None) -> tuple[int, str] | None:
    """Chips per task when the host list runs several TPU processes per machine (entries split the slice)."""
    accelerator = _env(values, "TPU_ACCELERATOR_TYPE")
    if found is None or found.per_machine < 2 or accelerator is None or found.name == HOSTS_ENV:
        return None
    if any(_env(values, name) for name in (*PROCESS_ENVS, "TPU_CHIPS_PER_HOST_BOUNDS")):
        return None  # the bounds say how machines split
    try:
        _, dims = parse_accelerator_type(accelerator)
    except TopologyError:
        return None
    chips = dims[0] * dims[1] * dims[2]
    tasks = len(found.hosts)
    if tasks == 0 or chips % tasks:
        return None
    why = (
        f"{_label(values, found.name)} lists {tasks} TPU processes, {found.per_machine} per machine: "
        f"{chips // tasks} of the slice's {chips} chips each"
    )
    return chips // tasks, why


# --- detection -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """One detected value and where it came from (``env TPU_WORKER_ID``, ``metadata accelerator-type``, ...)."""

    key: str
    value: str
    origin: str


@dataclass(frozen=True)
class Detection:
    spec: ClusterSpec
    platform: str
    """``Cloud TPU VM (metadata server ...)``, ``GKE``, ``GKE JobSet``, ``LeaderWorkerSet`` or ``environment``."""
    values: Values
    """The variables the spec was made from (metadata values under their environment names): pass them to
    :func:`identify` as ``environ``."""
    sources: tuple[Source, ...]
    notes: tuple[str, ...] = ()


def _platform(environ: Mapping[str, str]) -> str:
    if any(_env(environ, n) for n in ("LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX")):
        return "LeaderWorkerSet"
    if _env(environ, "JOBSET_NAME"):
        return "GKE JobSet"
    if _env(environ, PROCESS_ADDRESSES_ENV) or _env(environ, WORKER_HOSTNAMES_ENV):
        return "GKE"
    return "environment"


def _no_detection(why: str) -> InputError:
    return InputError(
        f"no cluster spec given and none detected: {why}",
        hint="pass --config FILE; on a Cloud TPU VM the metadata server answers (GCE_METADATA_HOST=HOST:PORT names "
        "another one); on GKE the TPU device plugin and webhook set TPU_ACCELERATOR_TYPE and TPU_WORKER_HOSTNAMES; "
        "`tpuctl detect` shows what was found",
    )


def _from_metadata(metadata: MetadataSource, environ: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """The metadata values under their environment names (only those the environment does not set)."""
    found: dict[str, tuple[str, str]] = {}
    tpu_env: dict[str, str] | None = None
    for name, keys in METADATA_KEYS.items():
        if _env(environ, name):
            continue  # the environment wins; the metadata key is not even asked
        for key in keys:
            if key.startswith("tpu-env "):
                if tpu_env is None:
                    tpu_env = parse_tpu_env(metadata.get("tpu-env") or "")
                value = tpu_env.get(key.split(" ", 1)[1], "").strip()
            else:
                value = (metadata.get(key) or "").strip()
            if value:
                found[name] = (value, f"metadata {key}")
                break
    return found


def detect(environ: Mapping[str, str], metadata: MetadataSource | None = None) -> Detection:
    """The spec this host's environment (and, on a Cloud TPU VM, its metadata server) describes.

    ``metadata`` None: the environment only (no server asked). SpecError (source ``environment``) lists
    every missing or malformed value; InputError when there is nothing to detect from.
    """
    notes: list[str] = []
    platform = _platform(environ)
    found: dict[str, tuple[str, str]] = {}
    in_pod = bool(_env(environ, PROCESS_ADDRESSES_ENV) or _env(environ, WORKER_HOSTNAMES_ENV))
    if in_pod:
        notes.append(f"the metadata server was not asked: the environment lists the hosts ({platform})")
    elif metadata is not None and (skip := _env(environ, SKIP_METADATA_ENV)):
        notes.append(f"the metadata server was not asked: {SKIP_METADATA_ENV}={skip}")
    elif metadata is not None:
        try:
            worker = metadata.get("agent-worker-number")
            if worker is None:
                raise _no_detection(
                    f"the metadata server at {metadata.describe()} answered, but has no instance attribute "
                    "agent-worker-number: a GCE VM, but not a Cloud TPU VM"
                )
            found = _from_metadata(metadata, environ)
            platform = f"Cloud TPU VM (metadata server {metadata.describe()})"
        except MetadataUnavailable as exc:
            if not (_env(environ, HOSTS_ENV) and _env(environ, "TPU_ACCELERATOR_TYPE")):
                raise _no_detection(
                    f"no TPU host list in the environment ({', '.join(HOST_LIST_ENVS)} unset) and {exc}"
                ) from None
            notes.append(str(exc))
    values = Values(environ, found)
    spec, sources = _spec(values)
    return Detection(spec, platform, values, sources, tuple(notes))


def _spec(values: Values) -> tuple[ClusterSpec, tuple[Source, ...]]:
    problems: list[str] = []
    host_problems: list[str] = []
    host_list = _host_entries(values, host_problems)
    per_task = _per_task_chips(values, host_list)
    tpu, chips_origin = _slice_from_env(values, problems, per_task)
    if tpu is not None:  # tasks are TPU processes: split machines as the process bounds (or the host list) say
        per_machine = host_list.per_machine if host_list else 1
        tpu = split_processes(values, tpu, per_machine, per_task is not None, values.label, problems)
    if tpu is not None:
        parse_visible_chips(values, tpu, values.label, problems)
    problems += host_problems  # reported in this order: the slice, then the hosts
    hosts: tuple[str, ...] = host_list.hosts if host_list else ()
    hosts_origin = host_list.origin if host_list else ""
    if tpu is not None and host_list is not None and not problems:
        name = values.label(host_list.name)
        if tpu.num_slices > 1 and host_list.name != HOSTS_ENV and len(hosts) == tpu.hosts_per_slice:
            slice_id = _env_int(values, "MEGASCALE_SLICE_ID", 0, tpu.num_slices - 1, "a slice index")
            derived = None
            if host_list.name == WORKER_HOSTNAMES_ENV and slice_id is not None:
                derived = jobset_hosts(hosts, slice_id, tpu.num_slices, values)
            if derived is None:
                problems.append(
                    f"{name} lists the {len(hosts)} hosts of one slice, but MEGASCALE_NUM_SLICES={tpu.num_slices} and "
                    f"the other slices' hosts are not in the environment; expected all {tpu.num_hosts} hosts in "
                    f"{HOSTS_ENV} (slice 0's workers, then slice 1's, ...), or a spec file (--config FILE)"
                )
            else:
                hosts = derived
                hosts_origin = f"derived from {host_list.origin}: JobSet pod names, one job per slice"
        elif (problem := host_count_problem(len(hosts), tpu)) is not None:
            problems.append(f"{name}: {problem}")
    coordinator_address: str | None = None
    if (raw := _env(values, "MEGASCALE_COORDINATOR_ADDRESS")) is not None:
        address = _endpoint_host(raw, ports=True)
        if (problem := host_problem(address)) is not None:
            problems.append(f"{values.label('MEGASCALE_COORDINATOR_ADDRESS')}={raw!r}: {problem}")
        else:
            coordinator_address = address
    try:
        port = _env_int(values, PORT_ENV, 1, 65535, "a TCP port")
    except InputError as exc:
        problems.append(exc.message)
        port = None
    accelerator = tpu.accelerator_type if tpu is not None else "unknown"
    cluster = _env(values, CLUSTER_ENV) or f"tpu-{accelerator}".lower()
    if (problem := cluster_name_problem(cluster)) is not None:
        problems.append(f"{CLUSTER_ENV}={cluster!r}: {problem}")
    backend = _env(values, BACKEND_ENV) or DEFAULT_BACKEND
    if (problem := backend_problem(backend)) is not None:
        problems.append(f"{BACKEND_ENV}={backend!r}: {problem}")
    token_file = _env(values, TOKEN_FILE_ENV)
    if problems or tpu is None:
        raise SpecError(problems, source=ENV_SOURCE)
    spec = ClusterSpec(
        cluster=cluster,
        slice=tpu,
        backend=cast(Backend, backend),
        hosts=hosts,
        coordinator=CoordinatorSpec(port=port or DEFAULT_PORT, address=coordinator_address),
        auth=AuthSpec(token_file) if token_file else None,
        source=ENV_SOURCE,
    )
    default = "default"

    def given(name: str, otherwise: str) -> str:
        return values.source(name) if _env(values, name) else otherwise

    sources = (
        Source("cluster", cluster, given(CLUSTER_ENV, f"{default} (tpu-<accelerator type>)")),
        Source("accelerator", tpu.accelerator_type, values.source("TPU_ACCELERATOR_TYPE")),
        Source("topology", tpu.topology_str, given("TPU_TOPOLOGY", "derived from the accelerator type")),
        Source("chips_per_host", str(tpu.chips_per_host), _chips_origin(values, tpu, chips_origin)),
        *_machine_sources(values, tpu, chips_origin),
        Source("num_slices", str(tpu.num_slices), given("MEGASCALE_NUM_SLICES", f"{default} (1)")),
        Source("backend", backend, given(BACKEND_ENV, f"{default} ({DEFAULT_BACKEND})")),
        Source("hosts", ",".join(hosts), hosts_origin),
        Source(
            "coordinator.address",
            spec.coordinator_address,
            given("MEGASCALE_COORDINATOR_ADDRESS", f"{default} (hosts[0])")
            + (" (its port dropped)" if raw is not None and raw != coordinator_address else ""),
        ),
        Source("coordinator.port", str(spec.coordinator.port), given(PORT_ENV, f"{default} ({DEFAULT_PORT})")),
        Source("auth.token_file", token_file or "", given(TOKEN_FILE_ENV, "unset (no token)")),
    )
    return spec, sources


def _chips_origin(values: Values, tpu: TpuSlice, chips_origin: str) -> str:
    """Where a task's chips came from: the process bounds, the host bounds, the host list or the type."""
    if tpu.tasks_per_machine > 1 and _env(values, "TPU_CHIPS_PER_PROCESS_BOUNDS"):
        return values.source("TPU_CHIPS_PER_PROCESS_BOUNDS")
    if tpu.tasks_per_machine > 1 and _env(values, "TPU_PROCESS_BOUNDS"):
        return values.source("TPU_PROCESS_BOUNDS") + " (the chip grid over it)"
    return values.source(chips_origin) if chips_origin == "TPU_CHIPS_PER_HOST_BOUNDS" else chips_origin


def _machine_sources(values: Values, tpu: TpuSlice, chips_origin: str) -> tuple[Source, ...]:
    """``processes_per_machine`` when several tasks share a machine (nothing otherwise)."""
    if tpu.tasks_per_machine == 1:
        return ()
    block = ",".join(map(str, tpu.machine_block))
    if _env(values, "TPU_CHIPS_PER_HOST_BOUNDS"):
        origin = f"{values.source('TPU_CHIPS_PER_HOST_BOUNDS')} ({block}) over {_chips_origin(values, tpu, chips_origin)}"
    elif any(_env(values, name) for name in PROCESS_ENVS):
        origin = f"{tpu.generation.name}'s {block} machines over {_chips_origin(values, tpu, chips_origin)}"
    else:
        origin = f"consecutive entries of one machine in the host list: {block} chips"
    return (Source("processes_per_machine", str(tpu.tasks_per_machine), origin),)


def spec_from_tpu_env(environ: Mapping[str, str]) -> ClusterSpec:
    """A spec from Cloud TPU / GKE variables alone (no metadata server): :func:`detect` without one.

    Reads TPU_ACCELERATOR_TYPE (+ TPU_TOPOLOGY, TPU_CHIPS_PER_HOST_BOUNDS), the hosts (TPUCTL_HOSTS,
    TPU_PROCESS_ADDRESSES or TPU_WORKER_HOSTNAMES), MEGASCALE_NUM_SLICES / MEGASCALE_SLICE_ID /
    MEGASCALE_COORDINATOR_ADDRESS, and TPUCTL_CLUSTER / TPUCTL_BACKEND / TPUCTL_TOKEN_FILE /
    TPUCTL_COORDINATOR_PORT. SpecError (source ``environment``) lists every missing or malformed variable.
    """
    return detect(environ, None).spec
