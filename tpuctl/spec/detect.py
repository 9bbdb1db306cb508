"""Which task this host is, and a cluster spec made from Cloud TPU / GKE variables: pure functions.

Both take the environment as a mapping (``hostenv.environ()`` at the edge); nothing here reads
``os.environ`` or asks the network. An empty variable counts as unset.

Task id, first answer wins:

1. ``--task-id N``;
2. ``TPUCTL_TASK_ID``;
3. this host's names and addresses (``hostenv.local_names()``) against ``hosts``: exactly one match wins,
   several (e.g. 127.0.0.2..5 all on one machine) is an error asking for ``--task-id``;
4. ``TPU_WORKER_ID`` + ``MEGASCALE_SLICE_ID`` * hosts per slice (Cloud TPU VMs, GKE);
5. a spec with a single host: task 0.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import cast

from tpuctl.errors import InputError, SpecError, TopologyError
from tpuctl.spec.model import (
    AuthSpec,
    Backend,
    ClusterSpec,
    CoordinatorSpec,
    backend_problem,
    cluster_name_problem,
    host_count_problem,
    host_problem,
    normalize_host,
    topology_problem,
)
from tpuctl.tpu.slice import TpuSlice, parse_accelerator_type, resolve_slice

TASK_ID_ENV = "TPUCTL_TASK_ID"
CLUSTER_ENV = "TPUCTL_CLUSTER"
BACKEND_ENV = "TPUCTL_BACKEND"
HOSTS_ENV = "TPUCTL_HOSTS"
TOKEN_FILE_ENV = "TPUCTL_TOKEN_FILE"
ENV_SOURCE = "environment"
_TASK_HINT = "pass --task-id N (or set TPUCTL_TASK_ID=N), N = this host's position in hosts"


@dataclass(frozen=True)
class TaskIdentity:
    """This host's task id and how it was found (for the log: ``task 2 (TPU_WORKER_ID=2)``)."""

    task_id: int
    reason: str


def _env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def _env_int(environ: Mapping[str, str], name: str, low: int, high: int, what: str) -> int | None:
    """An integer variable in [low, high], None when unset; InputError naming it otherwise."""
    raw = _env(environ, name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InputError(f"{name}={raw!r} is not an integer; expected {what} from {low} to {high}") from None
    if not low <= value <= high:
        raise InputError(f"{name}={value} is out of range; expected {what} from {low} to {high}")
    return value


def matching_tasks(hosts: tuple[str, ...], local_names: Set[str]) -> list[int]:
    """Positions in ``hosts`` naming this host (case, trailing dots and IPv6 spelling ignored)."""
    mine = {normalize_host(name) for name in local_names}
    return [task for task, host in enumerate(hosts) if normalize_host(host) in mine]


def identify(
    spec: ClusterSpec, *, task_id: int | None, environ: Mapping[str, str], local_names: Set[str]
) -> TaskIdentity:
    """This host's task id with the reason; InputError when it is ambiguous, unknown or out of range."""
    count = len(spec.hosts)
    last = count - 1
    if task_id is not None:
        if not 0 <= task_id <= last:
            raise InputError(
                f"--task-id {task_id} is out of range: {spec.source} has {count} hosts, tasks 0 to {last}",
                hint="the task id is the host's position in hosts, counting from 0",
            )
        return TaskIdentity(task_id, "--task-id")
    from_env = _env_int(environ, TASK_ID_ENV, 0, last, f"a task id of {spec.source}")
    if from_env is not None:
        return TaskIdentity(from_env, f"{TASK_ID_ENV}={from_env}")
    matches = matching_tasks(spec.hosts, local_names)
    if len(matches) == 1:
        return TaskIdentity(matches[0], f"this host is hosts[{matches[0]}] ({spec.hosts[matches[0]]})")
    if len(matches) > 1:
        listed = ", ".join(f"task {t} ({spec.hosts[t]})" for t in matches)
        raise InputError(
            f"this host matches several hosts of {spec.source}: {listed}",
            hint=f"several tasks share this machine; {_TASK_HINT}",
        )
    slice_task = _task_from_tpu_env(spec.slice, environ)
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


def resolve_task_id(
    spec: ClusterSpec, *, task_id: int | None, environ: Mapping[str, str], local_names: Set[str]
) -> int:
    """This host's task id (see the module docstring for the order); InputError when it cannot tell."""
    return identify(spec, task_id=task_id, environ=environ, local_names=local_names).task_id


def _task_from_tpu_env(tpu: TpuSlice, environ: Mapping[str, str]) -> TaskIdentity | None:
    """``TPU_WORKER_ID`` (within a slice) + ``MEGASCALE_SLICE_ID`` * hosts per slice, checked against the spec."""
    per_slice = tpu.hosts_per_slice
    worker = _env_int(environ, "TPU_WORKER_ID", 0, per_slice - 1, f"a worker index of {tpu.accelerator_type}")
    if worker is None:
        return None
    num_slices = _env_int(environ, "MEGASCALE_NUM_SLICES", 1, 1 << 20, "a slice count")
    if num_slices is not None and num_slices != tpu.num_slices:
        raise InputError(
            f"MEGASCALE_NUM_SLICES={num_slices}, but the spec has {tpu.num_slices} slice(s)",
            hint="set num_slices in the spec to match, or check this host belongs to this cluster",
        )
    slice_id = _env_int(environ, "MEGASCALE_SLICE_ID", 0, tpu.num_slices - 1, "a slice index")
    if slice_id is None and tpu.num_slices > 1:
        raise InputError(
            f"TPU_WORKER_ID={worker} counts hosts within one slice, but MEGASCALE_SLICE_ID is not set "
            f"and the spec has {tpu.num_slices} slices",
            hint=f"set MEGASCALE_SLICE_ID, or {_TASK_HINT}",
        )
    slice_id = slice_id or 0
    task = worker + slice_id * per_slice
    reason = f"TPU_WORKER_ID={worker}"
    if tpu.num_slices > 1:
        reason += f", MEGASCALE_SLICE_ID={slice_id} ({per_slice} hosts per slice)"
    return TaskIdentity(task, reason)


# --- a spec from the environment ---------------------------------------------------------------------


def parse_host_list(name: str, value: str, *, ports: bool) -> tuple[list[str], list[str]]:
    """Hosts in a comma list variable, and the problems found.

    Items are a host name or address; ``name:uid:address`` (Cloud TPU's worker-network-endpoints form:
    the address is kept); with ``ports``, ``host:port`` or ``[v6]:port`` (TPU_PROCESS_ADDRESSES: the port
    is dropped).
    """
    hosts: list[str] = []
    problems: list[str] = []
    for index, raw in enumerate(value.split(",")):
        item = raw.strip()
        host = _endpoint_host(item, ports=ports)
        problem = host_problem(host)
        if problem:
            problems.append(f"{name}={value!r}: item {index} {problem}")
        else:
            hosts.append(host)
    return hosts, problems


def _endpoint_host(item: str, *, ports: bool) -> str:
    if ":" not in item:
        return item
    if not item.startswith("["):
        try:
            ipaddress.IPv6Address(item)
            return item
        except ValueError:
            pass
    if ports and item.startswith("[") and "]:" in item:
        return item[1 : item.index("]:")]
    parts = item.split(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return parts[2]  # name:uid:address
    if ports and len(parts) == 2 and parts[1].isdigit():
        return parts[0]
    return item


def _slice_from_env(environ: Mapping[str, str], problems: list[str]) -> TpuSlice | None:
    accelerator = _env(environ, "TPU_ACCELERATOR_TYPE")
    if accelerator is None:
        problems.append(
            "TPU_ACCELERATOR_TYPE is not set; expected the slice's accelerator type, e.g. v4-32 "
            "(set on Cloud TPU VMs and GKE TPU pods; elsewhere pass --config FILE)"
        )
        return None
    try:
        num_slices = _env_int(environ, "MEGASCALE_NUM_SLICES", 1, 1 << 20, "a slice count") or 1
        _env_int(environ, "MEGASCALE_SLICE_ID", 0, num_slices - 1, "a slice index")
    except InputError as exc:
        problems.append(exc.message)
        return None
    bounds = _env(environ, "TPU_CHIPS_PER_HOST_BOUNDS")
    block: tuple[int, int, int] | None = None
    chips_per_host: int | None = None
    if bounds is not None:
        parts = bounds.replace(" ", "").split(",")
        if not 2 <= len(parts) <= 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            problems.append(f"TPU_CHIPS_PER_HOST_BOUNDS={bounds!r} is not x,y,z; expected chips per host, e.g. 2,2,1")
            return None
        x, y, *z = (int(p) for p in parts)
        block = (x, y, z[0] if z else 1)
        chips_per_host = x * y * block[2]
    topology = _env(environ, "TPU_TOPOLOGY")
    step = "TPU_ACCELERATOR_TYPE"
    try:
        generation, dims = parse_accelerator_type(accelerator)
        if topology is not None:
            step = "TPU_TOPOLOGY"
            resolve_slice(generation=generation.name, topology=topology)
        step = "TPU_CHIPS_PER_HOST_BOUNDS" if bounds is not None else step
        tpu = resolve_slice(
            accelerator=None if topology else accelerator,
            generation=generation.name if topology else None,
            topology=topology,
            chips_per_host=chips_per_host,
            num_slices=num_slices,
        )
    except TopologyError as exc:
        value = {"TPU_ACCELERATOR_TYPE": accelerator, "TPU_TOPOLOGY": topology}.get(step, bounds)
        problems.append(f"{step}={value!r}: {topology_problem(exc)}")
        return None
    if tpu.chips_per_slice != dims[0] * dims[1] * dims[2]:
        problems.append(
            f"TPU_TOPOLOGY={topology!r} has {tpu.chips_per_slice} chips, but TPU_ACCELERATOR_TYPE={accelerator!r} "
            f"has {dims[0] * dims[1] * dims[2]}; expected the two to describe the same slice"
        )
        return None
    if block is not None and block != tpu.chips_per_host_bounds:
        shown = ",".join(map(str, tpu.chips_per_host_bounds))
        problems.append(
            f"TPU_CHIPS_PER_HOST_BOUNDS={bounds!r}: tpuctl lays {tpu.chips_per_host}-chip hosts out as {shown}; "
            f"expected {shown}"
        )
        return None
    return tpu


def _hosts_from_env(environ: Mapping[str, str], tpu: TpuSlice | None, problems: list[str]) -> tuple[str, ...]:
    """TPUCTL_HOSTS, else TPU_WORKER_HOSTNAMES, else TPU_PROCESS_ADDRESSES, checked against the slice."""
    found_var = next(
        ((n, v) for n in (HOSTS_ENV, "TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES") if (v := _env(environ, n))),
        None,
    )
    if found_var is None:
        problems.append(
            "TPU_WORKER_HOSTNAMES is not set (nor TPU_PROCESS_ADDRESSES); expected the slice's hosts in worker "
            "order, comma separated (set on Cloud TPU VMs and GKE TPU pods; elsewhere pass --config FILE)"
        )
        return ()
    name, value = found_var
    hosts, found = parse_host_list(name, value, ports=name == "TPU_PROCESS_ADDRESSES")
    problems.extend(found)
    seen: dict[str, int] = {}
    for index, host in enumerate(hosts):
        if (first := seen.setdefault(normalize_host(host), index)) != index:
            problems.append(f"{name}: item {index} ({host}) repeats item {first}; expected each host once")
    if tpu is None or found:
        return tuple(hosts)
    if tpu.num_slices > 1 and name != HOSTS_ENV and len(hosts) == tpu.hosts_per_slice:
        problems.append(
            f"{name} lists the {len(hosts)} hosts of one slice, but MEGASCALE_NUM_SLICES={tpu.num_slices} and "
            f"the other slices' hosts are not in the environment; expected all {tpu.num_hosts} hosts in "
            f"{HOSTS_ENV} (slice 0's workers, then slice 1's, ...), or a spec file (--config FILE)"
        )
    elif (problem := host_count_problem(len(hosts), tpu)) is not None:
        problems.append(f"{name}: {problem}")
    return tuple(hosts)


def spec_from_tpu_env(environ: Mapping[str, str]) -> ClusterSpec:
    """A spec from Cloud TPU / GKE variables, for ``tpuctl init`` without ``--config``.

    Reads TPU_ACCELERATOR_TYPE (+ TPU_TOPOLOGY, TPU_CHIPS_PER_HOST_BOUNDS), the hosts (TPUCTL_HOSTS,
    TPU_WORKER_HOSTNAMES or TPU_PROCESS_ADDRESSES), MEGASCALE_NUM_SLICES / MEGASCALE_SLICE_ID /
    MEGASCALE_COORDINATOR_ADDRESS, and TPUCTL_CLUSTER / TPUCTL_BACKEND / TPUCTL_TOKEN_FILE.
    SpecError (source ``environment``) lists every missing or malformed variable.
    """
    problems: list[str] = []
    tpu = _slice_from_env(environ, problems)
    hosts = _hosts_from_env(environ, tpu, problems)
    coordinator = CoordinatorSpec()
    if (raw := _env(environ, "MEGASCALE_COORDINATOR_ADDRESS")) is not None:
        address = _endpoint_host(raw, ports=True)
        if (problem := host_problem(address)) is not None:
            problems.append(f"MEGASCALE_COORDINATOR_ADDRESS={raw!r}: {problem}")
        else:
            coordinator = CoordinatorSpec(address=address)
    accelerator = tpu.accelerator_type if tpu is not None else "unknown"
    cluster = _env(environ, CLUSTER_ENV) or f"tpu-{accelerator}".lower()
    if (problem := cluster_name_problem(cluster)) is not None:
        problems.append(f"{CLUSTER_ENV}={cluster!r}: {problem}")
    backend = _env(environ, BACKEND_ENV) or "jax"
    if (problem := backend_problem(backend)) is not None:
        problems.append(f"{BACKEND_ENV}={backend!r}: {problem}")
    token_file = _env(environ, TOKEN_FILE_ENV)
    if problems or tpu is None:
        raise SpecError(problems, source=ENV_SOURCE)
    return ClusterSpec(
        cluster=cluster,
        slice=tpu,
        backend=cast(Backend, backend),
        hosts=hosts,
        coordinator=coordinator,
        auth=AuthSpec(token_file) if token_file else None,
        source=ENV_SOURCE,
    )
