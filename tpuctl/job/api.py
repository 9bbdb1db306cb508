"""The job side: load the device mapping ``tpuctl init`` wrote and hand it to TensorFlow DTensor, JAX or PyTorch.

A job started by ``tpuctl run`` (or after ``eval "$(tpuctl env)"``) finds everything in its environment::

    import tpuctl
    mapping = tpuctl.load_mapping()                      # $TPUCTL_MAPPING, task $TPUCTL_TASK_ID
    mapping.local_devices                                # this task's devices, local ordinal order

    # JAX
    jax.distributed.initialize(**tpuctl.job.api.jax_distributed_args())
    mesh = mapping.jax_mesh("dp_mp")                     # jax.sharding.Mesh in the mapping's order

    # TensorFlow DTensor (DTENSOR_* come from tpuctl)
    dtensor.initialize_accelerator_system("TPU")
    mesh = mapping.dtensor_mesh("dp_mp")                 # TPU mesh; host=True: its 1:1 CPU host mesh
    topology = mapping.tf_topology()                     # tf.tpu.experimental.Topology

    # PyTorch / PyTorch/XLA (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK come from tpuctl)
    torch.distributed.init_process_group(**tpuctl.job.api.torch_distributed_args("gloo"))   # env://
    torch.distributed.init_process_group(**tpuctl.job.api.torch_distributed_args("xla"))    # xla://

This module imports neither grpc nor click, and tensorflow / jax / numpy only inside the helpers that
need them; loading the mapping costs protobuf and the mapping checks, nothing more.

Meshes: ``name=None`` is the default mesh, every device of the cluster in runtime order (task-major,
local ordinal minor) along one axis ``x``; a name picks one of the mapping's ``meshes``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from tpuctl.errors import MappingError, StateError
from tpuctl.job.env import MAPPING_ENV, TASK_ENV, dtensor_job_name
from tpuctl.mapping.file import read_mapping
from tpuctl.mapping.model import DeviceMapping, MappedDevice, MappedMesh, MappedTask, MeshAxis
from tpuctl.mesh import strings as mesh_strings
from tpuctl.tpu.topology import DTensorTopology, serialize_topology_proto

DEFAULT_AXIS = "x"
_RUN_HINT = 'start the job with `tpuctl run -- CMD`, or `eval "$(tpuctl env)"` first'


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    if environ is not None:
        return environ
    from tpuctl.spec import hostenv

    return hostenv.environ()


@dataclass(frozen=True)
class JobMapping(DeviceMapping):
    """A device mapping as one job process sees it: the cluster-wide mapping (it is one) plus the task
    this process runs as, and where it was read from."""

    task: int | None = None
    """This process's task in the mapping: its rank in the generation (the host's ``TPUCTL_TASK_ID`` through the
    mapping's plan; the same number unless spares or policy elastic moved it); None when unknown (then
    ``local_devices`` refuses)."""
    path: str = ""

    @classmethod
    def of(cls, mapping: DeviceMapping, task: int | None, path: str = "") -> JobMapping:
        """``mapping`` seen from ``task``."""
        return cls(**{f.name: getattr(mapping, f.name) for f in fields(DeviceMapping)}, task=task, path=path)

    @property
    def topology(self) -> DTensorTopology:
        """The topology of this task's slice (of the only slice when the task is unknown)."""
        if self.task is not None:
            return self.topology_of_task(self.task)
        return super().topology

    @property
    def topology_proto_bytes(self) -> bytes:
        return serialize_topology_proto(self.topology)

    @property
    def this_task(self) -> MappedTask:
        return self.get_task(_require_task(self))

    @property
    def local_devices(self) -> tuple[MappedDevice, ...]:
        """This task's devices in local ordinal order (``jax.local_devices()`` order on a TPU VM)."""
        return self.devices_of_task(_require_task(self))

    def mesh(self, name: str | None = None) -> MappedMesh:
        """A declared mesh by name; ``None``: the default mesh (every device, runtime order, axis ``x``)."""
        return find_mesh(self, name)

    # --- framework helpers -----------------------------------------------------------------------

    def tf_topology(self) -> Any:
        return tf_topology(self)

    def dtensor_mesh_string(
        self, name: str | None = None, task: int | None = None, *, host: bool = False, job: str | None = None
    ) -> str:
        """DTensor's ``Mesh.to_string()`` of mesh ``name`` (None: the default mesh) as this task builds it."""
        return dtensor_mesh_string(self, name, host=host, task=task, job_name=job)

    def dtensor_mesh(self, name: str | None = None, *, host: bool = False) -> Any:
        return dtensor_mesh(self, name, host=host)

    def jax_device_order(self, name: str | None, devices: Sequence[Any]) -> Any:
        return jax_device_order(self, name, devices)

    def jax_mesh(self, name: str | None = None, devices: Sequence[Any] | None = None) -> Any:
        return jax_mesh(self, name, devices)


AnyMapping = DeviceMapping | JobMapping


def _require_task(mapping: JobMapping) -> int:
    if mapping.task is None:
        raise MappingError(
            f"this process's task in cluster {mapping.cluster!r} is unknown: ${TASK_ENV} is not set",
            hint=_RUN_HINT + f", or pass task= to load_mapping (0..{mapping.num_tasks - 1})",
        )
    return mapping.task


def _split(mapping: AnyMapping, task: int | None) -> tuple[DeviceMapping, int | None]:
    if isinstance(mapping, JobMapping):
        return mapping, mapping.task if task is None else task
    return mapping, task


def load_mapping(
    path: str | os.PathLike[str] | None = None,
    *,
    task: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> JobMapping:
    """Load and check the device mapping (default ``$TPUCTL_MAPPING``) for this process's task.

    ``task`` is this host's task id in the spec and defaults to ``$TPUCTL_TASK_ID`` (set by ``tpuctl run`` /
    ``tpuctl env``), or 0 in a one-host cluster; the mapping's task it picks is that host's rank in the
    generation (a generation with a plan of its own, under spares or policy elastic, places hosts by rank). A
    bad file, or a host that is not a member of the mapping's generation, raises MappingError (exit code 7)
    naming the file and the problem.
    """
    env = _environ(environ)
    if path is None:
        path = env.get(MAPPING_ENV) or None
        if path is None:
            raise MappingError(f"no device mapping file given and ${MAPPING_ENV} is not set", hint=_RUN_HINT)
    mapping = read_mapping(path)
    if task is None:
        raw = env.get(TASK_ENV, "").strip()
        if raw:
            if not (raw.isascii() and raw.isdigit()):  # int() alone reads any script's digits ('\u0661' is 1)
                raise MappingError(f"${TASK_ENV}={raw!r} is not a task id", hint=_RUN_HINT)
            task = int(raw)
        elif mapping.num_tasks == 1:
            task = 0
    if task is not None and mapping.plan:
        rank = mapping.rank_of(task)
        if rank is None:
            members = sorted(t.host_task for t in mapping.tasks)
            raise MappingError(
                f"task {task} is not a member of generation {mapping.generation} of cluster {mapping.cluster!r} "
                f"in {os.fspath(path)} (its members: tasks {_sample(members)})",
                hint="a standby host (a spare, or a host of a slice the generation left out) has no job until it "
                "takes a place: `tpuctl run` waits for that",
            )
        task = rank
    elif task is not None:
        mapping.get_task(task)  # MappingError when out of range
    return JobMapping.of(mapping, task, os.fspath(path))


def _sample(tasks: list[int], most: int = 8) -> str:
    """``0, 1, 6, 7`` or, past ``most``, the first ones and how many more (bounded in any cluster size)."""
    shown = ", ".join(str(t) for t in tasks[:most])
    return shown if len(tasks) <= most else f"{shown} and {len(tasks) - most} more"


# --- meshes ----------------------------------------------------------------------------------------


def default_mesh(mapping: AnyMapping) -> MappedMesh:
    """Every device of the cluster in runtime order (task-major, ordinal-minor) along one axis ``x``."""
    device_mapping, _ = _split(mapping, None)
    ids = tuple(d.id for d in device_mapping.devices)
    return MappedMesh("", (MeshAxis(DEFAULT_AXIS, len(ids)),), ids, "tpuctl_default")


def find_mesh(mapping: AnyMapping, name: str | None = None) -> MappedMesh:
    """The mapping's mesh called ``name``; ``None``: :func:`default_mesh`."""
    if name is None:
        return default_mesh(mapping)
    device_mapping, _ = _split(mapping, None)
    for mesh in device_mapping.meshes:
        if mesh.name == name:
            return mesh
    names = ", ".join(repr(m.name) for m in device_mapping.meshes) or "none"
    raise MappingError(
        f"the device mapping of cluster {device_mapping.cluster!r} has no mesh {name!r} (meshes: {names})",
        hint="declare it under meshes: in the cluster spec and re-run tpuctl init, or pass name=None",
    )


# --- TensorFlow ------------------------------------------------------------------------------------


def tf_topology(mapping: AnyMapping, slice_index: int | None = None) -> Any:
    """``tf.tpu.experimental.Topology`` of the mapping (``slice_index``: of that slice; default: this
    task's slice, or the only one). Byte-identical to what DTensor's TPU initialisation builds."""
    import tensorflow as tf

    device_mapping, task = _split(mapping, None)
    if slice_index is not None:
        topology = device_mapping.topology_of_slice(slice_index)
    elif task is not None:
        topology = device_mapping.topology_of_task(task)
    else:
        topology = device_mapping.topology
    return tf.tpu.experimental.Topology(serialized=serialize_topology_proto(topology))


def dtensor_mesh_string(
    mapping: AnyMapping,
    name: str | None = None,
    *,
    host: bool = False,
    task: int | None = None,
    job_name: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> str:
    """The mesh as DTensor's ``Mesh.to_string()`` spells it, for this task (no TensorFlow needed), written
    by :mod:`tpuctl.mesh.strings` as the mapping's own strings are.

    ``name|dims|global ids|local ids|local devices``, as ``create_tpu_mesh`` builds it: global ids
    ``0..N-1`` in mesh order; local ids the mesh positions of this task's devices in local ordinal order;
    local devices ``/job:J/replica:0/task:T/device:TPU:i``. ``host=True`` gives its 1:1 host mesh (what
    ``Mesh.host_mesh()`` gives): ``CPU:i`` devices and no name (DTensor clears it; a named CPU mesh also
    breaks ``tf.train.Checkpoint``). The job name is ``$DTENSOR_JOB_NAME``, else DTensor's default for
    the cluster's size. A mesh that leaves out some of this task's devices is refused (MappingError).
    """
    device_mapping, task = _split(mapping, task)
    if task is None:
        task = _require_task(JobMapping.of(device_mapping, None))
    mesh = find_mesh(device_mapping, name)
    env = _environ(environ)
    job = job_name or env.get("DTENSOR_JOB_NAME") or dtensor_job_name(device_mapping.num_tasks)
    positions = mesh.positions()
    local = device_mapping.devices_of_task(task)
    missing = [d.id for d in local if d.id not in positions]
    if missing:
        raise MappingError(
            f"mesh {mesh.name!r} leaves out task {task}'s devices {missing}: a DTensor mesh needs every device"
        )
    render = mesh_strings.dtensor_host_mesh_string if host else mesh_strings.dtensor_mesh_string
    return render(mesh, task, [positions[d.id] for d in local], job)


_REGISTERED_CORE_IDS: dict[str, tuple[int, ...]] = {}


def dtensor_mesh(mapping: AnyMapping, name: str | None = None, *, host: bool = False, task: int | None = None) -> Any:
    """A ``tf.experimental.dtensor.Mesh`` for this task, from :func:`dtensor_mesh_string`.

    TPU mesh (``host=False``): call after ``dtensor.initialize_accelerator_system("TPU")``; a named mesh's
    device order is registered with DTensor (``set_tpu_core_ids``) from the mapping's core ids, as
    ``create_tpu_mesh`` does. Host mesh (``host=True``): CPU devices 1:1 with this host's TPU cores; on a
    machine without TPUs it is the mesh a CPU job of the same shape uses (configure as many logical CPU
    devices as ``len(mapping.local_devices)``).
    """
    from tensorflow.experimental import dtensor

    mesh = dtensor.Mesh.from_string(dtensor_mesh_string(mapping, name, host=host, task=task))
    if not host and name is not None:  # pragma: no cover - needs a TPU
        _register_core_ids(mapping, find_mesh(mapping, name))
    return mesh


def _register_core_ids(mapping: AnyMapping, mesh: MappedMesh) -> None:  # pragma: no cover - needs a TPU
    from tensorflow.dtensor.python import api

    device_mapping, _ = _split(mapping, None)
    core_of = {d.id: d.core_id for d in device_mapping.devices}
    core_ids = tuple(core_of[i] for i in mesh.device_ids)
    if _REGISTERED_CORE_IDS.get(mesh.name) == core_ids:
        return
    api._dtensor_device().set_tpu_core_ids(mesh.name, list(core_ids))
    _REGISTERED_CORE_IDS[mesh.name] = core_ids


# --- JAX -------------------------------------------------------------------------------------------


def jax_distributed_args(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``jax.distributed.initialize(**jax_distributed_args())``: coordinator_address, num_processes and
    process_id from tpuctl's environment (``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``,
    ``JAX_PROCESS_ID``). JAX reads only the first of these itself."""
    env = _environ(environ)
    names = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
    missing = [n for n in names if not env.get(n, "").strip()]
    if missing:
        raise StateError(f"{', '.join(missing)} not set: this is not a job tpuctl started", hint=_RUN_HINT)
    try:
        num_processes = int(env["JAX_NUM_PROCESSES"])
        process_id = int(env["JAX_PROCESS_ID"])
    except ValueError as exc:
        raise StateError(f"JAX_NUM_PROCESSES / JAX_PROCESS_ID are not integers: {exc}", hint=_RUN_HINT) from None
    if not 0 <= process_id < num_processes:
        raise StateError(f"JAX_PROCESS_ID={process_id} is not in 0..{num_processes - 1}", hint=_RUN_HINT)
    return {
        "coordinator_address": env["JAX_COORDINATOR_ADDRESS"].strip(),
        "num_processes": num_processes,
        "process_id": process_id,
    }


# --- PyTorch ---------------------------------------------------------------------------------------

TORCH_ENVS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")


def torch_distributed_args(backend: str = "gloo", environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``torch.distributed.init_process_group(**torch_distributed_args(backend))`` from tpuctl's environment.

    ``xla`` (torch_xla's backend): ``init_method="xla://"``, torch_xla's rendezvous, which reads ``MASTER_ADDR``
    and ``MASTER_PORT`` and takes the world from its runtime. Any other backend (``gloo``, ``nccl``):
    ``init_method="env://"`` with ``world_size`` and ``rank``, checked here. StateError when the variables are
    missing or not numbers: the job was not started by tpuctl."""
    env = _environ(environ)
    missing = [n for n in TORCH_ENVS if not env.get(n, "").strip()]
    if missing:
        raise StateError(f"{', '.join(missing)} not set: this is not a job tpuctl started", hint=_RUN_HINT)
    if backend == "xla":
        return {"backend": "xla", "init_method": "xla://"}
    try:
        world_size, rank, port = int(env["WORLD_SIZE"]), int(env["RANK"]), int(env["MASTER_PORT"])
    except ValueError as exc:
        raise StateError(f"WORLD_SIZE / RANK / MASTER_PORT are not integers: {exc}", hint=_RUN_HINT) from None
    if not 0 <= rank < world_size or not 0 < port < 65536:
        raise StateError(f"RANK={rank} is not in 0..{world_size - 1}, or MASTER_PORT={port} is no port", hint=_RUN_HINT)
    return {"backend": backend, "init_method": "env://", "world_size": world_size, "rank": rank}


def _device_list(mapping: DeviceMapping, mesh: MappedMesh, devices: Sequence[Any]) -> list[Any]:
    """``devices`` (``jax.devices()``) in ``mesh`` order.

    TPU devices are matched by id, and their coords and core_on_chip are checked against the mapping.
    Other devices (a CPU job standing in for the cluster) are matched by position: the mapping's device
    ``(task t, ordinal o)`` is the o-th device (by id) of process t; every process must have as many.
    """
    wanted = {d.id: d for d in mapping.devices}
    by_id = {int(d.id): d for d in devices}
    if devices and all(getattr(d, "platform", "") == "tpu" for d in devices):
        missing = [i for i in mesh.device_ids if i not in by_id]
        if missing:
            raise MappingError(
                f"mesh {mesh.name or '(default)'!r} names device ids {missing[:8]} that jax does not list",
                hint="the mapping is from another slice: re-run tpuctl init on every host",
            )
        for i in mesh.device_ids:
            device, mapped = by_id[i], wanted[i]
            found = (tuple(int(c) for c in device.coords), int(device.core_on_chip))
            if found != (mapped.coords, mapped.core):
                raise MappingError(
                    f"jax device {i} is at {list(found[0])} core {found[1]}; the mapping puts it at "
                    f"{list(mapped.coords)} core {mapped.core}",
                    hint="the mapping is from another slice: re-run tpuctl init on every host",
                )
        return [by_id[i] for i in mesh.device_ids]
    per_process: dict[int, list[Any]] = {}
    for device in sorted(devices, key=lambda d: int(d.id)):
        per_process.setdefault(int(getattr(device, "process_index", 0)), []).append(device)
    stand_in: dict[int, Any] = {}
    for task in mapping.tasks:
        have = per_process.get(task.id, [])
        if len(have) != len(task.devices):
            raise MappingError(
                f"process {task.id} has {len(have)} jax device(s); task {task.id} of the mapping has "
                f"{len(task.devices)}",
                hint="run one process per host with as many local devices as the host has TPU cores "
                "(on CPU: jax.config.update('jax_num_cpu_devices', N))",
            )
        for mapped in task.devices:
            stand_in[mapped.id] = have[mapped.ordinal]
    return [stand_in[i] for i in mesh.device_ids]


def jax_device_order(mapping: AnyMapping, name: str | None, devices: Sequence[Any]) -> Any:
    """``devices`` (usually ``jax.devices()``) arranged as mesh ``name``: a numpy array shaped by its
    axes, ready for ``jax.sharding.Mesh(order, axis_names)``."""
    import numpy as np

    device_mapping, _ = _split(mapping, None)
    mesh = find_mesh(device_mapping, name)
    ordered = _device_list(device_mapping, mesh, devices)
    array = np.empty(len(ordered), dtype=object)
    array[:] = ordered
    return array.reshape(tuple(axis.size for axis in mesh.axes))


def jax_mesh(mapping: AnyMapping, name: str | None = None, devices: Sequence[Any] | None = None) -> Any:
    """``jax.sharding.Mesh`` for mesh ``name`` over ``devices`` (default ``jax.devices()``)."""
    import jax

    device_mapping, _ = _split(mapping, None)
    mesh = find_mesh(device_mapping, name)
    order = jax_device_order(device_mapping, name, jax.devices() if devices is None else devices)
    return jax.sharding.Mesh(order, tuple(axis.name for axis in mesh.axes))


__all__ = [
    "JobMapping",
    "default_mesh",
    "dtensor_mesh",
    "dtensor_mesh_string",
    "find_mesh",
    "jax_device_order",
    "jax_distributed_args",
    "jax_mesh",
    "load_mapping",
    "tf_topology",
    "torch_distributed_args",
]
