"""The device mapping file: what ``tpuctl init`` found, written on every host and loaded by jobs.

A :class:`DeviceMapping` is the cluster-wide result of one init: the slice, every task with its address
and devices (global id, chip coordinates, core, core id, local ordinal), DTensor's ``all_core_ids``, and
the DTensor topology (``mesh_shape``, ``device_coordinates`` and the ``TopologyProto`` bytes) of each
slice. It holds nothing host-local, so every host writes a byte-identical file from the same merge.

The file is proto3 JSON of ``tpuctl.v1.DeviceMapping`` (``protos/tpuctl/proto/mapping.proto``), with
snake_case names and every field printed. A job loads it with::

    import tpuctl
    mapping = tpuctl.load_mapping()     # $TPUCTL_MAPPING, $TPUCTL_TASK_ID
    mapping.local_devices               # this host's devices, in local ordinal order
    mapping.topology_proto_bytes        # for tf.tpu.experimental.Topology(serialized=...)
    mapping.mesh("dp_mp").device_ids    # a declared mesh: global ids in row-major mesh order
    mapping.dtensor_mesh_string("dp_mp", task)   # for tf.experimental.dtensor.Mesh.from_string

This module holds the value, how it is built and its consistency checks; the protobuf conversion is in
:mod:`tpuctl.mapping.protobuf` and the file (JSON layout, atomic write, validated load) in
:mod:`tpuctl.mapping.file`. None of them imports grpc, click or
tensorflow (a test checks it), so loading stays cheap; none reads ``os.environ``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from tpuctl.errors import ClusterError, MappingError, TpuctlError
from tpuctl.mesh.model import RESERVED_AXIS_NAMES, Mesh
from tpuctl.mesh.model import AxisQuality as AxisQuality
from tpuctl.mesh.model import MeshAxis as MeshAxis
from tpuctl.mesh.quality import Torus, mesh_quality
from tpuctl.mesh.strings import default_job_name, dtensor_host_mesh_string, dtensor_mesh_string
from tpuctl.messages import did_you_mean, listed
from tpuctl.tpu.hardware import Triple
from tpuctl.tpu.slice import Device, TpuSlice
from tpuctl.tpu.topology import (
    DTensorTopology,
    MergedCores,
    build_topologies,
    core_location,
    merge_core_ids,
    serialize_topology_proto,
)

SCHEMA_VERSION = 1
"""The schema this tpuctl writes; :func:`tpuctl.mapping.file.read_mapping` reads only versions in ``KNOWN_SCHEMA_VERSIONS``."""
KNOWN_SCHEMA_VERSIONS = (1,)

"""Environment variable naming the mapping file a job loads by default."""

MAX_LISTED = 8

MappedMesh = Mesh
"""A named logical mesh as the mapping stores it: :class:`tpuctl.mesh.model.Mesh`."""


@dataclass(frozen=True)
class MappedDevice:
    """One device of a task, as the mapping records it."""

    id: int
    """Global device id (``jax.Device.id``)."""
    coords: Triple
    """Chip (x, y, z) within the slice."""
    core: int
    """``core_on_chip``."""
    core_id: int
    """TensorCore id within the slice, as the runtime reported it."""
    ordinal: int
    """Local device ordinal."""


@dataclass(frozen=True)
class MappedTask:
    id: int
    """The task's index in the mapping: its process rank in the generation."""
    address: str
    slice: int
    devices: tuple[MappedDevice, ...]
    task_id: int | None = None
    """The host's own task id (its place in the spec's hosts + spares) when the generation has a plan of its
    own (spares, policy elastic); None: the same as ``id``."""

    @property
    def host_task(self) -> int:
        """The host's task id in the spec (``TPUCTL_TASK_ID``)."""
        return self.id if self.task_id is None else self.task_id


@dataclass(frozen=True)
class DeviceMapping:
    """The cluster-wide device mapping of one ``tpuctl init``."""

    cluster: str
    incarnation: int
    created: datetime
    slice: TpuSlice
    tasks: tuple[MappedTask, ...]
    all_core_ids: tuple[int, ...]
    device_counts: tuple[int, ...]
    topologies: tuple[DTensorTopology, ...]
    """One DTensor topology per slice, over that slice's tasks (renumbered from 0)."""
    meshes: tuple[MappedMesh, ...] = ()
    schema_version: int = SCHEMA_VERSION
    generation: int = 1
    """The cluster generation this mapping is of: 1, then one more after every restart (restart policy
    rejoin). A job restarted after a restart reads the new generation's mapping."""
    plan: tuple[tuple[int, int], ...] = ()
    """The generation's plan as runs (first roster slice, count), empty for every slice of the spec in order
    (``tpuctl.coordination.plan``); each task's ``task_id`` then says which host holds that rank."""

    def rank_of(self, task_id: int) -> int | None:
        """The rank (mapping task index) the host of spec task ``task_id`` holds (None: not a member)."""
        for task in self.tasks:
            if task.host_task == task_id:
                return task.id
        return None

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)

    @property
    def devices(self) -> tuple[MappedDevice, ...]:
        """Every device, task-major, in local ordinal order."""
        return tuple(d for task in self.tasks for d in task.devices)

    def get_task(self, task: int) -> MappedTask:
        """Task ``task`` (MappingError naming the range when there is no such task)."""
        if isinstance(task, bool) or not isinstance(task, int) or not 0 <= task < len(self.tasks):
            raise MappingError(
                f"task {task!r} is not in the device mapping of cluster {self.cluster!r} "
                f"(tasks 0..{len(self.tasks) - 1})",
                hint="pass this host's task id from the cluster spec",
            )
        return self.tasks[task]

    def devices_of_task(self, task: int) -> tuple[MappedDevice, ...]:
        """Task ``task``'s devices in local ordinal order."""
        return self.get_task(task).devices

    def topology_of_slice(self, slice_index: int) -> DTensorTopology:
        if not 0 <= slice_index < len(self.topologies):
            raise MappingError(f"slice {slice_index} is not in the device mapping ({len(self.topologies)} slice(s))")
        return self.topologies[slice_index]

    def topology_of_task(self, task: int) -> DTensorTopology:
        """The topology of the slice ``task`` belongs to."""
        return self.topologies[self.get_task(task).slice]

    @property
    def topology(self) -> DTensorTopology:
        """The topology of a single-slice cluster; a multislice has one per slice."""
        if len(self.topologies) != 1:
            raise MappingError(
                f"the device mapping of cluster {self.cluster!r} has {len(self.topologies)} slices, one topology each",
                hint="use topology_of_slice(s) or topology_of_task(t)",
            )
        return self.topologies[0]

    @property
    def mesh_shape(self) -> tuple[int, int, int, int]:
        return self.topology.mesh_shape

    @property
    def device_coordinates(self) -> tuple[tuple[tuple[int, int, int, int], ...], ...]:
        return self.topology.device_coordinates

    @property
    def topology_proto_bytes(self) -> bytes:
        """``tensorflow.tpu.TopologyProto`` bytes of the (single-slice) topology."""
        return serialize_topology_proto(self.topology)

    # --- meshes ----------------------------------------------------------------------------------

    def mesh(self, name: str) -> MappedMesh:
        """The declared mesh called ``name`` (MappingError, with a "did you mean", when there is none)."""
        for mesh in self.meshes:
            if mesh.name == name:
                return mesh
        names = [m.name for m in self.meshes]
        declared = ", ".join(repr(n) for n in names) or "none"
        raise MappingError(
            f"the device mapping of cluster {self.cluster!r} has no mesh {name!r} (meshes: {declared})",
            hint=did_you_mean(name, names, otherwise="declare it under meshes: in the spec and re-run tpuctl init"),
        )

    def mesh_local_device_ids(self, name: str, task: int) -> tuple[int, ...]:
        """DTensor's ``local_device_ids`` of mesh ``name`` on ``task``: the mesh position of each of the
        task's devices, in local ordinal order."""
        positions = self.mesh(name).positions()
        return tuple(positions[d.id] for d in self.devices_of_task(task))

    def mesh_core_ids(self, name: str) -> tuple[int, ...]:
        """The runtime core id of each device of mesh ``name``, in mesh order: what DTensor's
        ``create_tpu_mesh`` registers with ``set_tpu_core_ids(name, ...)``."""
        core_of = {d.id: d.core_id for d in self.devices}
        return tuple(core_of[i] for i in self.mesh(name).device_ids)

    def dtensor_mesh_string(self, name: str, task: int, *, host: bool = False, job: str | None = None) -> str:
        """``tf.experimental.dtensor.Mesh.to_string()`` of mesh ``name`` as ``task`` builds it (``host``:
        its ``host_mesh()``). ``job``: DTensor's job name; default ``worker`` (``localhost`` for one task)."""
        mesh = self.mesh(name)
        job = job or default_job_name(self.num_tasks)
        local = self.mesh_local_device_ids(name, task)
        render = dtensor_host_mesh_string if host else dtensor_mesh_string
        return render(mesh, task, local, job)


# --- building --------------------------------------------------------------------------------------


def merged_devices(slice: TpuSlice, merged: MergedCores) -> tuple[Device, ...]:
    """Every device the merge found, task-major in local ordinal order, placed by its reported core id
    (``tpuctl.mesh.build_declared_meshes`` takes these). Raises ClusterError for a core id outside the
    slice; :func:`build_mapping` checks the rest."""
    out: list[Device] = []
    for t in range(merged.num_tasks):
        s = t // slice.hosts_per_slice
        for ordinal, core_id in enumerate(merged.core_ids_of_task(t)):
            loc = core_location(core_id, slice)
            core = 0 if slice.megacore else loc.core
            out.append(Device(slice.device_id(loc.coords, core, s), t, s, loc.coords, core, ordinal))
    return tuple(out)


def build_mapping(
    *,
    slice: TpuSlice,
    cluster: str,
    incarnation: int,
    hosts: Sequence[str] | Mapping[int, str],
    merged: MergedCores,
    topology: DTensorTopology | Sequence[DTensorTopology],
    created: datetime | float,
    meshes: Sequence[MappedMesh] = (),
    generation: int = 1,
    task_ids: Sequence[int] | None = None,
    plan: tuple[tuple[int, int], ...] = (),
) -> DeviceMapping:
    """Assemble the mapping every host writes after the merge.

    ``hosts`` gives each task's address (a sequence in task order, or task -> address); ``topology`` is
    :func:`~tpuctl.tpu.topology.build_topology`'s result, or :func:`~tpuctl.tpu.topology.build_topologies`' (one
    per slice, needed for a multislice); ``created`` is a timezone-aware datetime or POSIX seconds. No
    clock is read here: for byte-identical files on every host, pass a time the cluster agreed on.
    Devices are placed by the core ids the hosts reported, not by the slice model, so a host's task id
    need not match its position. ``task_ids`` and ``plan``: a generation of a plan of its own (spares, policy
    elastic): each rank's task id in the spec, and the plan's runs. Raises a ClusterError when the pieces disagree (the checks
    :func:`tpuctl.mapping.file.read_mapping` makes on a file).
    """
    if not 0 <= incarnation < 2**64:
        raise ValueError(f"incarnation must be an unsigned 64-bit integer, got {incarnation}")
    if not isinstance(created, datetime):
        created = datetime.fromtimestamp(created, timezone.utc)
    if created.tzinfo is None or created.utcoffset() is None:
        raise ValueError(f"created must be timezone-aware, got {created!r}")
    topologies = (topology,) if isinstance(topology, DTensorTopology) else tuple(topology)
    if len(topologies) != slice.num_slices:
        raise _cluster_error(
            [f"{len(topologies)} topology(ies) for {slice.num_slices} slice(s): pass build_topologies(merged, slice)"]
        )
    if isinstance(hosts, Mapping):
        if sorted(hosts) != list(range(len(hosts))):
            raise _cluster_error([f"host addresses for tasks {sorted(hosts)}; expected tasks 0..{len(hosts) - 1}"])
        addresses = [hosts[t] for t in range(len(hosts))]
    else:
        addresses = list(hosts)
    if len(addresses) != slice.num_hosts or merged.num_tasks != slice.num_hosts:
        raise _cluster_error(
            [f"{len(addresses)} host address(es) and {merged.num_tasks} merged task(s) for {slice.num_hosts} hosts"]
        )
    tasks = []
    placed = merged_devices(slice, merged)
    per = merged.devices_per_task
    for t, address in enumerate(addresses):
        own = placed[t * per : (t + 1) * per]
        core_ids = merged.core_ids_of_task(t)
        devices = tuple(MappedDevice(d.id, d.coords, d.core, c, d.ordinal) for d, c in zip(own, core_ids, strict=True))
        host_task = task_ids[t] if task_ids is not None else None
        tasks.append(MappedTask(t, address, t // slice.hosts_per_slice, devices, host_task))
    mapping = DeviceMapping(
        cluster=cluster,
        incarnation=incarnation,
        created=created.astimezone(timezone.utc),
        slice=slice,
        tasks=tuple(tasks),
        all_core_ids=merged.all_core_ids,
        device_counts=merged.device_counts,
        topologies=topologies,
        meshes=tuple(meshes),
        generation=generation,
        plan=plan,
    )
    problems = mapping_problems(mapping)
    if problems:
        raise _cluster_error(problems)
    return mapping


def _cluster_error(problems: Sequence[str]) -> ClusterError:
    return ClusterError("cannot build the device mapping:\n" + listed(problems, limit=MAX_LISTED))


def mapping_problems(mapping: DeviceMapping) -> list[str]:
    """Every inconsistency between the mapping's parts, one line each (empty when consistent). O(N)."""
    tpu = mapping.slice
    problems: list[str] = []
    if mapping.schema_version not in KNOWN_SCHEMA_VERSIONS:
        problems.append(f"schema_version {mapping.schema_version} is not one of {list(KNOWN_SCHEMA_VERSIONS)}")
    if len(mapping.tasks) != tpu.num_hosts:
        return [*problems, f"{len(mapping.tasks)} task(s); {tpu.describe()} has {tpu.num_hosts}"]
    for index, task in enumerate(mapping.tasks):
        if task.id != index:
            problems.append(f"task #{index} has id {task.id}; tasks must be listed in id order 0..n-1")
        if task.slice != index // tpu.hosts_per_slice:
            problems.append(
                f"task {index} is in slice {task.slice}; it belongs to slice {index // tpu.hosts_per_slice}"
            )
        if not task.address:
            problems.append(f"task {index} has no address")
    counts = tuple(len(t.devices) for t in mapping.tasks)
    if mapping.device_counts != counts:
        problems.append(f"device_counts {list(mapping.device_counts)} do not match the tasks' devices {list(counts)}")
    try:
        merged = merge_core_ids({t.id: [d.core_id for d in t.devices] for t in mapping.tasks}, tpu)
    except TpuctlError as exc:
        return [*problems, exc.message]
    if mapping.all_core_ids != merged.all_core_ids:
        problems.append("all_core_ids do not match the tasks' devices' core ids (task-major, ordinal-minor)")
    problems += _device_problems(mapping)
    expected = build_topologies(merged, tpu)
    if len(mapping.topologies) != len(expected):
        problems.append(f"{len(mapping.topologies)} topologies for {tpu.num_slices} slice(s)")
    for s, (have, want) in enumerate(zip(mapping.topologies, expected, strict=False)):
        where = f" of slice {s}" if tpu.num_slices > 1 else ""
        if have.mesh_shape != want.mesh_shape:
            problems.append(f"mesh_shape{where} {list(have.mesh_shape)} should be {list(want.mesh_shape)}")
        if have.device_coordinates != want.device_coordinates:
            problems.append(f"device_coordinates{where} do not match the tasks' device coordinates")
    problems += _mesh_problems(mapping)
    return problems


def _mesh_problems(mapping: DeviceMapping) -> list[str]:
    """Each mesh: a unique name, unique and unreserved axis names, sizes that multiply to its device ids,
    every device of the cluster exactly once, a DCN shape that fits, and quality figures (when stored)
    equal to what its order gives. O(N) per mesh and axis."""
    problems: list[str] = []
    ids = {d.id for d in mapping.devices}
    names = [m.name for m in mapping.meshes]
    for mesh in mapping.meshes:
        if not mesh.name or names.count(mesh.name) > 1:
            problems.append(f"mesh {mesh.name!r}: mesh names must be non-empty and unique")
        found = _one_mesh_problems(mesh, ids, mapping.slice.num_slices)
        if not found and mesh.quality:
            expected = mesh_quality(mesh.axis_names, mesh.shape, mesh.device_ids, Torus.of(mapping.slice))
            if mesh.quality != expected:
                found.append(f"mesh {mesh.name!r}: its quality figures do not match its device order")
        problems += found
    return problems


def _one_mesh_problems(mesh: MappedMesh, ids: set[int], num_slices: int) -> list[str]:
    where = f"mesh {mesh.name!r}"
    problems: list[str] = []
    names = mesh.axis_names
    bad = sorted({n for n in names if names.count(n) > 1 or n in RESERVED_AXIS_NAMES or not n})
    if bad:
        problems.append(f"{where} has repeated, reserved or empty axis names: {bad}")
    if not names:
        problems.append(f"{where} has no axes")
    if mesh.size != len(mesh.device_ids):
        problems.append(f"{where} has {len(mesh.device_ids)} device ids; its axes hold {mesh.size}")
    unknown = sorted(set(mesh.device_ids) - ids)
    if unknown:
        problems.append(f"{where} names device ids that are not in the mapping: {unknown[:8]}")
    repeated = sorted(i for i, count in Counter(mesh.device_ids).items() if count > 1)
    if repeated:
        problems.append(f"{where} names device ids more than once: {repeated[:8]}")
    if not unknown and not repeated and len(mesh.device_ids) != len(ids):
        problems.append(
            f"{where} holds {len(mesh.device_ids)} of the cluster's {len(ids)} devices; a mesh uses every device"
        )
    if mesh.dcn_shape:
        dcn = list(mesh.dcn_shape)
        fits = len(dcn) == len(names) and all(d >= 1 and a.size % d == 0 for d, a in zip(dcn, mesh.axes, strict=False))
        if not fits or math.prod(dcn) != num_slices:
            problems.append(
                f"{where} has dcn_shape {dcn}; expected slices per axis dividing its sizes, multiplying to {num_slices}"
            )
    return problems


def _device_problems(mapping: DeviceMapping) -> list[str]:
    tpu = mapping.slice
    problems: list[str] = []
    for task in mapping.tasks:
        for ordinal, device in enumerate(task.devices):
            loc = core_location(device.core_id, tpu)  # merge_core_ids checked the range
            core = 0 if tpu.megacore else loc.core
            want = MappedDevice(tpu.device_id(loc.coords, core, task.slice), loc.coords, core, device.core_id, ordinal)
            if device != want:
                problems.append(
                    f"task {task.id} device {ordinal} is {_show(device)}; core id {device.core_id} is {_show(want)}"
                )
    return problems


def _show(d: MappedDevice) -> str:
    return f"id {d.id} at {list(d.coords)} core {d.core} ordinal {d.ordinal}"
