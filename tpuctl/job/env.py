"""The environment a job on one host needs, from that host's agent description and the device mapping.

Pure and deterministic: the same agent description and mapping give the same variables, in the same
order. ``tpuctl env`` prints them (``sh`` or ``json``) and ``tpuctl run`` starts the job with them.

Variables, and the rule each follows:

tpuctl
  ``TPUCTL_MAPPING`` (the mapping file, what :func:`tpuctl.load_mapping` reads), ``TPUCTL_TASK_ID``
  (this host's task: its place in the spec's hosts + spares, for life), ``TPUCTL_RANK`` (its process rank in
  the generation), ``TPUCTL_CLUSTER``, ``TPUCTL_GENERATION`` (the cluster generation the mapping and
  ports are of; ``tpuctl barrier`` refuses to pass for a generation that is over), ``TPUCTL_STATE_DIR``
  (so ``tpuctl barrier`` inside the job talks to this host's agent). ``tpuctl run --max-restarts`` adds
  ``TPUCTL_RESTART_COUNT`` (0, then how many times it restarted the job, as torchrun's
  ``TORCHELASTIC_RESTART_COUNT``).
TensorFlow DTensor (``tensorflow/dtensor/python/config.py``)
  ``DTENSOR_JOBS``: every task's ``host:port`` in task order; the position is DTensor's task index, so
  it is ``hosts[t]:dtensor_port[t]`` for t = 0..n-1. ``DTENSOR_CLIENT_ID``: this task. ``DTENSOR_NUM_CLIENTS``:
  n (Python derives it from ``DTENSOR_JOBS``; the C++ side still reads it). ``DTENSOR_JOB_NAME``:
  ``worker``, DTensor's default for several clients, set explicitly. A one-host cluster runs DTensor in
  local mode: ``DTENSOR_JOBS`` is removed (a single entry would start a gRPC server for nothing),
  the job name is ``localhost``, the client id 0.
JAX (``jax.distributed.initialize``)
  ``JAX_COORDINATOR_ADDRESS``: ``hosts[0]:jax_port`` (JAX reads it itself; process 0 binds ``[::]:port``).
  ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` (n and this task; JAX does not read these two, pass
  :func:`tpuctl.job.api.jax_distributed_args` to ``initialize``).
Cloud TPU (as the GKE TPU device plugin and webhook set them)
  ``TPU_SKIP_MDS_QUERY=true`` (libtpu, torch_xla and JAX read these variables, not the metadata server),
  ``TPU_WORKER_ID`` (task index within its slice), ``TPU_WORKER_HOSTNAMES`` (that slice's tasks' hosts),
  ``TPU_ACCELERATOR_TYPE``, ``TPU_TOPOLOGY``, ``TPU_HOST_BOUNDS`` and ``TPU_CHIPS_PER_HOST_BOUNDS`` (the
  machines), ``TPU_TOPOLOGY_WRAP``; with several slices also ``MEGASCALE_NUM_SLICES``, ``MEGASCALE_SLICE_ID``
  and ``MEGASCALE_COORDINATOR_ADDRESS`` (task 0's host).
  The process variables, always set or removed, never inherited (a stale list breaks libtpu: "Expected 4
  worker addresses, got 1", transformers#28204). When every task has a machine of its own they are removed:
  libtpu then uses the host variables, and torch_xla's ``xmp.spawn`` / torchrun start-up
  (``configure_topology``, which only fills unset variables) computes its own per-chip processes. When a
  machine runs several tasks (7x, LeaderWorkerSet with several TPU containers) they are set as LeaderWorkerSet
  and torch_xla set them: ``TPU_PROCESS_BOUNDS`` and ``TPU_CHIPS_PER_PROCESS_BOUNDS`` (the tasks' grid and
  block), ``TPU_VISIBLE_CHIPS`` (the task's chips on its machine, x fastest), ``CLOUD_TPU_TASK_ID`` (the task
  within its slice, which libtpu and torch_xla read before ``TPU_WORKER_ID``), ``TPU_PROCESS_PORT`` (8476 + k
  for the k-th task on a machine) and ``TPU_PROCESS_ADDRESSES`` (the slice's tasks as ``host:port``). A spec
  whose hosts repeat without process bounds gets the last three only.
PyTorch / PyTorch/XLA (``torch.distributed``'s ``env://``, torch_xla's ``xla://``, torchrun's names)
  ``PJRT_DEVICE=TPU``; ``MASTER_ADDR`` (task 0's host) and ``MASTER_PORT`` (a port the agent reserved on it:
  the store's); ``WORLD_SIZE`` (tasks) and ``RANK`` (this task); ``LOCAL_WORLD_SIZE`` and ``LOCAL_RANK`` (the
  tasks on this task's machine, and its position among them). ``TORCHELASTIC_RUN_ID`` and
  ``TORCHELASTIC_USE_AGENT_STORE`` are removed: inherited, they make torch_xla's ``xla://`` take the job for a
  torchrun worker (a one-chip start-up, or a store that never answers).

Ranks (spares, ``restart: {policy: elastic}``; docs/how-to/elastic.md): a generation is whole slices of the
spec's hosts and spares, and its mapping lists its members in rank order. Every variable above that says
"task" follows the *rank*, not the task id: ``JAX_PROCESS_ID``, ``RANK``, ``DTENSOR_CLIENT_ID``, ``TPU_WORKER_ID``
and ``TPU_WORKER_HOSTNAMES`` (the slice at the host's position), ``MEGASCALE_SLICE_ID`` (that position),
``MEGASCALE_NUM_SLICES`` (the generation's slice count), ``JAX_COORDINATOR_ADDRESS``, ``MASTER_ADDR`` and
``MEGASCALE_COORDINATOR_ADDRESS`` (rank 0's host). ``TPUCTL_TASK_ID`` alone stays the host's task id. Without
spares and elastic shrinking rank = task id. A standby host (not a member) gets no environment.

The job ports come from the agent (``AgentInfo.job_ports``, in ``agent.json``): it reserves them before the mapping
is written, holding every one open at once, so they differ from each other and from tpuctl's own
coordinator port even when several simulated hosts share a machine. :func:`port_collisions` checks that
again here: two ports that would be bound on one machine must differ.

Imports only the standard library (and tpuctl's error types where it raises), and on ``tpuctl env``'s
path neither typing, json, shlex nor ipaddress (each costs that command milliseconds; ipaddress is
imported by the agent's side only, :func:`job_environment`).
"""

from __future__ import annotations

from tpuctl import lightjson as json

TYPE_CHECKING = False  # typing is not imported on the light path (a Record is tpuctl.records' at run time)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any
    from typing import NamedTuple as Record

    from tpuctl.agent.protocol import AgentInfo
    from tpuctl.mapping.model import DeviceMapping
else:
    from tpuctl.records import Record

MAPPING_ENV = "TPUCTL_MAPPING"  # the device mapping file a job loads (tpuctl.load_mapping)
TASK_ENV = "TPUCTL_TASK_ID"  # the same name `tpuctl init` reads (tpuctl.spec.detect.TASK_ID_ENV)
RANK_ENV = "TPUCTL_RANK"  # the host's process rank in its generation (= the task id unless spares or elastic)
CLUSTER_ENV = "TPUCTL_CLUSTER"
STATE_DIR_ENV = "TPUCTL_STATE_DIR"
GENERATION_ENV = "TPUCTL_GENERATION"
RESTART_COUNT_ENV = "TPUCTL_RESTART_COUNT"
ENV_SCHEMA = "tpuctl.env/v1"  # `tpuctl env --format json`

TPU_PROCESS_ADDRESSES_ENV = "TPU_PROCESS_ADDRESSES"
TPU_PROCESS_PORT_ENV = "TPU_PROCESS_PORT"
TPU_TASK_ENV = "CLOUD_TPU_TASK_ID"
# Set only when a machine runs several tasks and the slice model knows how its chips split.
PROCESS_SPLIT_ENVS = ("TPU_PROCESS_BOUNDS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_VISIBLE_CHIPS")
# Inherited from an outer torchrun, these make torch_xla's xla:// handler take the job for a torchrun worker.
TORCHRUN_ONLY_ENVS = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE")
TPU_PROCESS_BASE_PORT = 8476  # LeaderWorkerSet's TpuProcessDefaultPort, torch_xla's base_port: +k per process

DTENSOR_MULTI_CLIENT_JOB = "worker"
DTENSOR_LOCAL_JOB = "localhost"

_RESTART_HINT = "restart the cluster with this tpuctl version: `tpuctl down` on every host, then `tpuctl init`"


class JobEnv(Record):
    """Variables to set (in a fixed order) and variables to remove from the job's environment."""

    set: dict[str, str]
    unset: tuple[str, ...] = ()

    def apply(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` (e.g. this process's environment) with these variables set and removed."""
        out = {k: v for k, v in base.items() if k not in self.unset}
        out.update(self.set)
        return out

    def to_sh(self) -> str:
        """``export NAME=value`` lines for ``eval "$(tpuctl env)"`` (bash, dash, zsh); values quoted."""
        lines = [f"unset {name}" for name in self.unset]
        lines += [f"export {name}={sh_quote(value)}" for name, value in self.set.items()]
        return "\n".join(lines) + "\n"

    def to_json(self) -> str:
        """``tpuctl env --format json``: the variables to set (``set``: NAME -> value) and to remove (``unset``)."""
        return json.dumps({"schema": ENV_SCHEMA, "set": self.set, "unset": list(self.unset)}, indent=2) + "\n"

    def to_message(self) -> dict[str, Any]:
        """The agent's answer to ``Op.ENV``: ``set`` as [name, value] pairs (order kept), ``unset``."""
        return {"set": [[k, v] for k, v in self.set.items()], "unset": list(self.unset)}

    @classmethod
    def from_message(cls, data: object) -> JobEnv:
        """Read the agent's answer to ``Op.ENV``; ProtocolError when it is not one."""
        pairs = data.get("set") if isinstance(data, dict) else None
        unset = data.get("unset", []) if isinstance(data, dict) else None
        if (
            not isinstance(pairs, list)
            or not all(isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in pairs)
            or not isinstance(unset, list)
            or not all(isinstance(u, str) for u in unset)
        ):
            from tpuctl.agent.protocol import ProtocolError  # here: `tpuctl env` imports no more than it uses

            raise ProtocolError("the agent's job environment is not [name, value] pairs and names to unset")
        return cls({k: v for k, v in pairs}, tuple(unset))


_SH_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")


def sh_quote(value: str) -> str:
    """``shlex.quote(value)``, the same text: a word of safe characters as it is, else in single quotes.
    (shlex compiles a regular expression when imported, which costs ``tpuctl env`` ``re``'s import.)"""
    if value and all(c in _SH_SAFE for c in value):
        return value
    return "'" + value.replace("'", "'\"'\"'") + "'"


def dtensor_job_name(num_tasks: int) -> str:
    """DTensor's job name for a cluster of ``num_tasks`` hosts (local mode for one host)."""
    return DTENSOR_LOCAL_JOB if num_tasks == 1 else DTENSOR_MULTI_CLIENT_JOB


def host_port(host: str, port: int) -> str:
    """``host:port``; an IPv6 address in brackets (``[fd00::1]:8476``), as gRPC and JAX expect."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _triple(values: Sequence[int]) -> str:
    return ",".join(str(int(v)) for v in values)


def _machine(host: str) -> str:
    """Hosts that are the same machine for port purposes: every loopback address is this machine."""
    import ipaddress

    try:
        if ipaddress.ip_address(host.split("%", 1)[0]).is_loopback:
            return "loopback"
    except ValueError:
        if host.lower().rstrip(".") in ("localhost", "localhost.localdomain"):
            return "loopback"
    return host


def port_collisions(bindings: Sequence[tuple[str, str, int]]) -> list[str]:
    """Every pair of (what, host, port) bindings that would share one port on one machine."""
    seen: dict[tuple[str, int], str] = {}
    problems = []
    for what, host, port in bindings:
        key = (_machine(host), port)
        if key in seen:
            problems.append(f"{what} and {seen[key]} both use port {port} on {host}")
        else:
            seen[key] = what
    return problems


def local_ranks(hosts: Sequence[str]) -> list[tuple[int, int]]:
    """Each task's (rank among the tasks on its machine, how many tasks that machine runs), machines told
    apart by name as :func:`tpu_process_ports` does."""
    from tpuctl.hosts import normalize_host

    keys = [normalize_host(h) for h in hosts]
    counts: dict[str, int] = {}
    ranks = []
    for key in keys:
        ranks.append(counts.get(key, 0))
        counts[key] = counts.get(key, 0) + 1
    return [(rank, counts[key]) for rank, key in zip(ranks, keys, strict=True)]


def tpu_process_ports(hosts: Sequence[str]) -> list[int] | None:
    """Each task's TPU process port (8476 + its rank among the tasks on its machine), or None when every task
    has a machine of its own. Machines are told apart by name (case, trailing dot and IPv6 spelling ignored)."""
    from tpuctl.hosts import normalize_host

    keys = [normalize_host(h) for h in hosts]
    if len(set(keys)) == len(keys):
        return None
    seen: dict[str, int] = {}
    ports = []
    for key in keys:
        ports.append(TPU_PROCESS_BASE_PORT + seen.get(key, 0))
        seen[key] = seen.get(key, 0) + 1
    return ports


def _coordinator_binding(info: AgentInfo) -> tuple[str, int] | None:
    target = info.coordinator
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def job_environment(info: AgentInfo, mapping: DeviceMapping, *, state_dir: str | None = None) -> JobEnv:
    """The environment of a job on the task ``info`` describes (``agent.json``), for ``mapping``.

    Raises StateError when the description and the mapping disagree (another cluster's mapping file, or
    an agent without job ports) or when two ports would collide on one machine.
    """
    from tpuctl.errors import StateError  # the agent's side: `tpuctl env` does not load the error types

    tpu = mapping.slice
    hosts = [task.address for task in mapping.tasks]
    num_tasks = len(hosts)
    own = info.task
    rank = mapping.rank_of(own) if mapping.plan else own  # the generation's process rank (module docstring)
    if rank is None:
        raise StateError(
            f"task {own} is not a member of generation {mapping.generation} (a standby host: a spare, or a host of a "
            "slice the generation left out); its job waits until the host is chosen",
            hint="`tpuctl run` waits for that; `tpuctl status` shows each host's role",
        )
    if not 0 <= rank < num_tasks:
        raise StateError(f"the agent's description names task {own!r}; the mapping has tasks 0..{num_tasks - 1}")
    task = rank
    if info.cluster != mapping.cluster or info.num_tasks != num_tasks or (info.hosts and list(info.hosts) != hosts):
        from tpuctl.messages import sample

        raise StateError(
            f"the mapping {info.mapping} is of cluster {mapping.cluster!r} with {num_tasks} hosts ({sample(hosts)}); "
            f"the agent runs cluster {info.cluster!r} with {info.num_tasks} hosts ({sample(info.hosts)})",
            hint="the mapping file was overwritten by another init; " + _RESTART_HINT,
        )
    dtensor_ports, jax_port, torch_port = list(info.job_ports.dtensor), info.job_ports.jax, info.job_ports.torch
    bindings = [(f"the DTensor server of task {t}", hosts[t], dtensor_ports[t]) for t in range(num_tasks)]
    bindings.append(("the JAX coordinator", hosts[0], jax_port))
    bindings.append(("the torch.distributed store", hosts[0], torch_port))
    split = tpu.tasks_per_machine > 1  # the slice model knows how each machine's chips split among its tasks
    if split:
        process_ports: list[int] | None = [TPU_PROCESS_BASE_PORT + tpu.rank_on_machine(t) for t in range(num_tasks)]
        ranks = [(tpu.rank_on_machine(task), tpu.tasks_per_machine)]
    else:
        process_ports = tpu_process_ports(hosts)
        ranks = local_ranks(hosts)[task : task + 1]
    if process_ports is not None:  # on loopback (a simulated cluster) no TPU runtime binds them
        bindings += [
            (f"the TPU process of task {t}", hosts[t], process_ports[t])
            for t in range(num_tasks)
            if _machine(hosts[t]) != "loopback"
        ]
    if (coordinator := _coordinator_binding(info)) is not None:
        bindings.append(("the tpuctl coordinator", *coordinator))
    collisions = port_collisions(bindings)
    if collisions:
        raise StateError("job ports collide: " + "; ".join(collisions), hint=_RESTART_HINT)

    env: dict[str, str] = {}
    unset: list[str] = []
    if info.mapping:
        env[MAPPING_ENV] = info.mapping
    env[TASK_ENV] = str(own)
    env[RANK_ENV] = str(task)
    env[CLUSTER_ENV] = mapping.cluster
    env[GENERATION_ENV] = str(mapping.generation)
    if state_dir is not None:
        env[STATE_DIR_ENV] = state_dir

    if num_tasks > 1:
        env["DTENSOR_JOBS"] = ",".join(host_port(h, p) for h, p in zip(hosts, dtensor_ports, strict=True))
    else:
        unset.append("DTENSOR_JOBS")
    env["DTENSOR_CLIENT_ID"] = str(task)
    env["DTENSOR_NUM_CLIENTS"] = str(num_tasks)
    env["DTENSOR_JOB_NAME"] = dtensor_job_name(num_tasks)

    env["JAX_COORDINATOR_ADDRESS"] = host_port(hosts[0], jax_port)
    env["JAX_NUM_PROCESSES"] = str(num_tasks)
    env["JAX_PROCESS_ID"] = str(task)

    per_slice = tpu.hosts_per_slice
    slice_index = mapping.tasks[task].slice
    env["TPU_SKIP_MDS_QUERY"] = "true"
    env["TPU_WORKER_ID"] = str(task - slice_index * per_slice)
    env["TPU_WORKER_HOSTNAMES"] = ",".join(hosts[slice_index * per_slice : (slice_index + 1) * per_slice])
    env["TPU_ACCELERATOR_TYPE"] = tpu.accelerator_type
    env["TPU_TOPOLOGY"] = tpu.topology_str
    env["TPU_HOST_BOUNDS"] = _triple(tpu.machine_bounds)
    env["TPU_CHIPS_PER_HOST_BOUNDS"] = _triple(tpu.machine_block)
    env["TPU_TOPOLOGY_WRAP"] = ",".join("true" if w else "false" for w in tpu.wraparound)
    if split:
        env["TPU_PROCESS_BOUNDS"] = _triple(tpu.host_bounds)
        env["TPU_CHIPS_PER_PROCESS_BOUNDS"] = _triple(tpu.chips_per_host_bounds)
        env["TPU_VISIBLE_CHIPS"] = ",".join(str(c) for c in tpu.visible_chips(task))
    else:
        unset += PROCESS_SPLIT_ENVS
    if process_ports is None:
        unset += [TPU_TASK_ENV, TPU_PROCESS_ADDRESSES_ENV, TPU_PROCESS_PORT_ENV]
    else:
        in_slice = range(slice_index * per_slice, (slice_index + 1) * per_slice)
        env[TPU_TASK_ENV] = env["TPU_WORKER_ID"]
        env[TPU_PROCESS_ADDRESSES_ENV] = ",".join(host_port(hosts[t], process_ports[t]) for t in in_slice)
        env[TPU_PROCESS_PORT_ENV] = str(process_ports[task])
    if tpu.num_slices > 1:
        env["MEGASCALE_NUM_SLICES"] = str(tpu.num_slices)
        env["MEGASCALE_SLICE_ID"] = str(slice_index)
        env["MEGASCALE_COORDINATOR_ADDRESS"] = hosts[0]

    env["PJRT_DEVICE"] = "TPU"
    env["MASTER_ADDR"] = hosts[0]
    env["MASTER_PORT"] = str(torch_port)
    env["WORLD_SIZE"] = str(num_tasks)
    env["RANK"] = str(task)
    env["LOCAL_WORLD_SIZE"] = str(ranks[0][1])
    env["LOCAL_RANK"] = str(ranks[0][0])
    unset += TORCHRUN_ONLY_ENVS
    return JobEnv(env, tuple(unset))


__all__ = [
    "CLUSTER_ENV",
    "GENERATION_ENV",
    "MAPPING_ENV",
    "RANK_ENV",
    "RESTART_COUNT_ENV",
    "STATE_DIR_ENV",
    "TASK_ENV",
    "JobEnv",
    "dtensor_job_name",
    "host_port",
    "job_environment",
    "local_ranks",
    "port_collisions",
    "tpu_process_ports",
]
