"""The device mapping file: what ``tpuctl init`` found, written on every host and loaded by jobs.

A :class:`DeviceMapping` is the cluster-wide result of one init: the slice, every task with its address
and devices (global id, chip coordinates, core, core id, local ordinal), DTensor's ``all_core_ids``, and
the DTensor topology (``mesh_shape``, ``device_coordinates`` and the ``TopologyProto`` bytes) of each
slice. It holds nothing host-local, so every host writes a byte-identical file from the same merge.

The file is proto3 JSON of ``tpuctl.v1.DeviceMapping`` (``protos/tpuctl/proto/mapping.proto``), with
snake_case names and every field printed. A job loads it with::

    from tpuctl.mapping import load_mapping
    mapping = load_mapping()            # $TPUCTL_MAPPING
    mapping.local_devices(task)         # this host's devices, in local ordinal order
    mapping.topology_proto_bytes        # for tf.tpu.experimental.Topology(serialized=...)
    mapping.mesh("dp_mp").device_ids    # a declared mesh: global ids in row-major mesh order
    mapping.dtensor_mesh_string("dp_mp", task)   # for tf.experimental.dtensor.Mesh.from_string

This module imports neither grpc, click nor tensorflow (a test checks it), so loading stays cheap; it
reads ``os.environ`` only in :func:`load_mapping`.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor

from tpuctl.errors import ClusterError, MappingError, StateError, TpuctlError
from tpuctl.hardware import Triple, find_generation
from tpuctl.mesh.model import RESERVED_AXIS_NAMES, Mesh
from tpuctl.mesh.model import AxisQuality as AxisQuality
from tpuctl.mesh.model import MeshAxis as MeshAxis
from tpuctl.mesh.quality import Torus, mesh_quality
from tpuctl.mesh.strings import default_job_name, dtensor_host_mesh_string, dtensor_mesh_string
from tpuctl.proto import mapping_pb2
from tpuctl.topology import (
    MESH_RANK,
    DTensorTopology,
    MergedCores,
    build_topologies,
    core_location,
    merge_core_ids,
    parse_topology_proto,
    serialize_topology_proto,
    tasks_of_slice,
)
from tpuctl.tpuslice import Device, TpuSlice, format_dims, resolve_slice

SCHEMA_VERSION = 1
"""The schema this tpuctl writes; :func:`load_mapping` reads only versions in ``KNOWN_SCHEMA_VERSIONS``."""
KNOWN_SCHEMA_VERSIONS = (1,)

MAPPING_ENV = "TPUCTL_MAPPING"
"""Environment variable naming the mapping file a job loads by default."""

_REINIT_HINT = "re-run `tpuctl init` on every host to write a fresh mapping"
_MAX_LISTED = 8
_INLINE_WIDTH = 100
_LIST_CHUNK = 16  # scalars per line when a list wraps (4 devices of device_coordinates)

_pb = mapping_pb2.DeviceMapping

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
    address: str
    slice: int
    devices: tuple[MappedDevice, ...]


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

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)

    @property
    def devices(self) -> tuple[MappedDevice, ...]:
        """Every device, task-major, in local ordinal order."""
        return tuple(d for task in self.tasks for d in task.devices)

    def task(self, task: int) -> MappedTask:
        if isinstance(task, bool) or not isinstance(task, int) or not 0 <= task < len(self.tasks):
            raise MappingError(
                f"task {task!r} is not in the device mapping of cluster {self.cluster!r} "
                f"(tasks 0..{len(self.tasks) - 1})",
                hint="pass this host's task id from the cluster spec",
            )
        return self.tasks[task]

    def devices_of_task(self, task: int) -> tuple[MappedDevice, ...]:
        """Task ``task``'s devices in local ordinal order."""
        return self.task(task).devices

    def local_devices(self, task: int) -> tuple[MappedDevice, ...]:
        """The devices a process of ``task`` sees locally (``jax.local_devices()`` order)."""
        return self.devices_of_task(task)

    def topology_of_slice(self, slice_index: int) -> DTensorTopology:
        if not 0 <= slice_index < len(self.topologies):
            raise MappingError(f"slice {slice_index} is not in the device mapping ({len(self.topologies)} slice(s))")
        return self.topologies[slice_index]

    def topology_of_task(self, task: int) -> DTensorTopology:
        """The topology of the slice ``task`` belongs to."""
        return self.topologies[self.task(task).slice]

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
        guess = difflib.get_close_matches(name, names, n=1)
        listed = ", ".join(repr(n) for n in names) or "none"
        raise MappingError(
            f"the device mapping of cluster {self.cluster!r} has no mesh {name!r} (meshes: {listed})",
            hint=f"did you mean {guess[0]!r}?"
            if guess
            else "declare it under meshes: in the spec and re-run tpuctl init",
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
    slice: TpuSlice,
    cluster: str,
    incarnation: int,
    hosts: Sequence[str] | Mapping[int, str],
    merged: MergedCores,
    topology: DTensorTopology | Sequence[DTensorTopology],
    created: datetime | float,
    meshes: Sequence[MappedMesh] = (),
) -> DeviceMapping:
    """Assemble the mapping every host writes after the merge.

    ``hosts`` gives each task's address (a sequence in task order, or task -> address); ``topology`` is
    :func:`~tpuctl.topology.build_topology`'s result, or :func:`~tpuctl.topology.build_topologies`' (one
    per slice, needed for a multislice); ``created`` is a timezone-aware datetime or POSIX seconds. No
    clock is read here: for byte-identical files on every host, pass a time the cluster agreed on.
    Devices are placed by the core ids the hosts reported, not by the slice model, so a host's task id
    need not match its position. Raises a ClusterError when the pieces disagree (the checks
    :func:`load_mapping` makes on a file).
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
        tasks.append(MappedTask(t, address, t // slice.hosts_per_slice, devices))
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
    )
    problems = mapping_problems(mapping)
    if problems:
        raise _cluster_error(problems)
    return mapping


def _cluster_error(problems: Sequence[str]) -> ClusterError:
    return ClusterError("cannot build the device mapping:\n" + _listed(problems))


def _listed(problems: Sequence[str]) -> str:
    shown = ["  " + p.replace("\n", "\n  ") for p in problems[:_MAX_LISTED]]
    if len(problems) > _MAX_LISTED:
        shown.append(f"  ... and {len(problems) - _MAX_LISTED} more")
    return "\n".join(shown)


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


# --- proto conversion ------------------------------------------------------------------------------


def _flat_topology(message: Any, topology: DTensorTopology) -> None:
    message.mesh_shape.extend(topology.mesh_shape)
    message.device_coordinates.extend(topology.flat_device_coordinates)
    message.device_coordinates_dims.extend(topology.device_coordinates_dims)
    message.topology_proto = serialize_topology_proto(topology)


def to_proto(mapping: DeviceMapping) -> mapping_pb2.DeviceMapping:
    tpu = mapping.slice
    msg = _pb(schema_version=mapping.schema_version, cluster=mapping.cluster, incarnation=mapping.incarnation)
    msg.created.FromDatetime(mapping.created)
    msg.slice.CopyFrom(
        _pb.SliceShape(
            accelerator_type=tpu.accelerator_type,
            generation=tpu.generation.name,
            topology=tpu.topology,
            chips_per_host_bounds=tpu.chips_per_host_bounds,
            num_slices=tpu.num_slices,
            device_kind=tpu.device_kind,
            megacore=tpu.megacore,
            wraparound=tpu.wraparound,
        )
    )
    for task in mapping.tasks:
        devices = [
            _pb.Device(id=d.id, coords=d.coords, core=d.core, core_id=d.core_id, ordinal=d.ordinal)
            for d in task.devices
        ]
        msg.tasks.append(_pb.Task(id=task.id, address=task.address, slice=task.slice, devices=devices))
    msg.all_core_ids.extend(mapping.all_core_ids)
    msg.device_counts.extend(mapping.device_counts)
    if len(mapping.topologies) == 1 and tpu.num_slices == 1:
        _flat_topology(msg, mapping.topologies[0])
    else:
        for s, topology in enumerate(mapping.topologies):
            entry = msg.slice_topologies.add(slice=s, tasks=list(tasks_of_slice(tpu, s)))
            _flat_topology(entry, topology)
    for mesh in mapping.meshes:
        msg.meshes.append(_mesh_to_proto(mapping, mesh))
    return msg


def _mesh_to_proto(mapping: DeviceMapping, mesh: MappedMesh) -> mapping_pb2.DeviceMapping.Mesh:
    """The mesh, with what every task needs derived from it (local ids, task 0's DTensor strings)."""
    positions = mesh.positions()
    local = [[positions.get(d.id, 0) for d in task.devices] for task in mapping.tasks]
    job = default_job_name(mapping.num_tasks)
    first = local[0] if local else []
    return _pb.Mesh(
        name=mesh.name,
        axes=[_pb.Axis(name=a.name, size=a.size) for a in mesh.axes],
        device_ids=mesh.device_ids,
        algorithm=mesh.algorithm,
        dcn_shape=mesh.dcn_shape,
        tasks=[_pb.MeshTask(task=t, local_device_ids=ids) for t, ids in enumerate(local)],
        dtensor_mesh=dtensor_mesh_string(mesh, 0, first, job),
        dtensor_host_mesh=dtensor_host_mesh_string(mesh, 0, first, job),
        quality=[
            _pb.AxisQuality(
                axis=q.axis, neighbours=q.neighbours, ring=q.ring, max_hop=q.max_hop, closing_hop=q.closing_hop,
                wraparound=q.wraparound, dcn_steps=q.dcn_steps, reason=q.reason,
            )
            for q in mesh.quality
        ],
    )  # fmt: skip


def _mesh_record_problems(msg: mapping_pb2.DeviceMapping, mapping: DeviceMapping) -> list[str]:
    """The derived fields of each stored mesh against what its order gives (after mapping_problems)."""
    problems: list[str] = []
    for stored, mesh in zip(msg.meshes, mapping.meshes, strict=True):
        want = _mesh_to_proto(mapping, mesh)
        for field in ("tasks", "dtensor_mesh", "dtensor_host_mesh"):
            if getattr(stored, field) != getattr(want, field):
                what = "local_device_ids" if field == "tasks" else field
                problems.append(f"mesh {mesh.name!r}: its {what} do not match its device order and the tasks' devices")
    return problems


def _triple(values: Sequence[int], what: str) -> Triple:
    if len(values) != 3:
        raise MappingError(f"{what} has {len(values)} values; expected 3 (x, y, z)")
    return (int(values[0]), int(values[1]), int(values[2]))


def _slice_from_proto(shape: mapping_pb2.DeviceMapping.SliceShape) -> TpuSlice:
    gen = find_generation(shape.generation) if shape.generation else None
    if gen is None:
        raise MappingError(f"slice.generation {shape.generation!r} is not a TPU generation tpuctl knows")
    dims = _triple(shape.topology, "slice.topology")
    block = _triple(shape.chips_per_host_bounds, "slice.chips_per_host_bounds")
    options: dict[str, Any] = {
        "chips_per_host": block[0] * block[1] * block[2],
        "num_slices": shape.num_slices,
        "megacore": shape.megacore,
        "device_kind": shape.device_kind or None,
    }
    try:
        # The accelerator type names the default chip grid (v4-8 is 2x2x1, which the generation + topology
        # form refuses as unsorted); any other grid is given by generation and topology.
        tpu = resolve_slice(accelerator=shape.accelerator_type, **options)
        if tpu.generation is not gen or tpu.topology != dims:
            tpu = resolve_slice(generation=gen.name, topology=format_dims(dims), **options)
    except TpuctlError as exc:
        raise MappingError(f"slice: {exc.message}") from exc
    found = (tpu.generation.name, tpu.topology, tpu.chips_per_host_bounds, tpu.accelerator_type, tpu.wraparound)
    stored = (shape.generation, dims, block, shape.accelerator_type, tuple(shape.wraparound))
    if found != stored:
        raise MappingError(
            "slice: generation, topology, chips_per_host_bounds, accelerator_type, wraparound are "
            f"{_plain(stored)}; the slice they describe has {_plain(found)}"
        )
    return tpu


def _plain(values: tuple[Any, ...]) -> str:
    return ", ".join(str(list(v) if isinstance(v, tuple) else v) for v in values)


def _topology_from_proto(message: Any, where: str) -> DTensorTopology:
    dims = list(message.device_coordinates_dims)
    if len(dims) != 3 or dims[2] != MESH_RANK or dims[0] < 1 or dims[1] < 1:
        raise MappingError(
            f"{where}device_coordinates_dims {dims} should be [num_tasks, devices_per_task, {MESH_RANK}]"
        )
    try:
        topology = DTensorTopology.from_flat(message.mesh_shape, message.device_coordinates, dims[0], dims[1])
        decoded = parse_topology_proto(message.topology_proto)
    except TpuctlError as exc:
        raise MappingError(f"{where}{exc.message}") from exc
    if decoded != topology:
        raise MappingError(f"{where}{_difference(decoded, topology)}")
    return topology


def _difference(decoded: DTensorTopology, stored: DTensorTopology) -> str:
    if decoded.mesh_shape != stored.mesh_shape:
        return f"topology_proto has mesh_shape {list(decoded.mesh_shape)}; mesh_shape is {list(stored.mesh_shape)}"
    if decoded.device_coordinates_dims != stored.device_coordinates_dims:
        return (
            f"topology_proto has {decoded.num_tasks} tasks x {decoded.num_devices_per_task} devices; "
            f"device_coordinates_dims are {list(stored.device_coordinates_dims)}"
        )
    for t, (ours, theirs) in enumerate(zip(decoded.device_coordinates, stored.device_coordinates, strict=True)):
        for d, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            if a != b:
                return f"topology_proto puts task {t} device {d} at {list(a)}; device_coordinates say {list(b)}"
    return "topology_proto differs from device_coordinates"  # pragma: no cover - equal fields, equal values


def from_proto(msg: mapping_pb2.DeviceMapping) -> DeviceMapping:
    """The mapping a message holds; structural problems raise MappingError (see :func:`mapping_problems`)."""
    if not msg.HasField("slice") or not msg.HasField("created"):
        raise MappingError("the mapping has no " + ("slice" if not msg.HasField("slice") else "created time"))
    tpu = _slice_from_proto(msg.slice)
    tasks = []
    for task in msg.tasks:
        devices = tuple(
            MappedDevice(
                d.id, _triple(d.coords, f"task {task.id} device {d.ordinal} coords"), d.core, d.core_id, d.ordinal
            )
            for d in task.devices
        )
        tasks.append(MappedTask(task.id, task.address, task.slice, devices))
    flat_fields = ("mesh_shape", "device_coordinates", "device_coordinates_dims", "topology_proto")
    has_flat = any(getattr(msg, name) for name in flat_fields)
    topologies: tuple[DTensorTopology, ...]
    if tpu.num_slices == 1:
        if msg.slice_topologies or not has_flat:
            raise MappingError(
                "a single-slice mapping keeps its topology in mesh_shape, device_coordinates, "
                "device_coordinates_dims and topology_proto, and no slice_topologies"
            )
        topologies = (_topology_from_proto(msg, ""),)
    else:
        if has_flat or len(msg.slice_topologies) != tpu.num_slices:
            raise MappingError(
                f"a mapping of {tpu.num_slices} slices keeps one topology per slice in "
                f"slice_topologies (found {len(msg.slice_topologies)}) and none at the top level"
            )
        for s, entry in enumerate(msg.slice_topologies):
            if entry.slice != s or list(entry.tasks) != list(tasks_of_slice(tpu, s)):
                raise MappingError(
                    f"slice_topologies[{s}] is for slice {entry.slice} with tasks {list(entry.tasks)}; "
                    f"expected slice {s} with tasks {list(tasks_of_slice(tpu, s))}"
                )
        topologies = tuple(_topology_from_proto(e, f"slice_topologies[{e.slice}]: ") for e in msg.slice_topologies)
    meshes = tuple(
        MappedMesh(
            m.name,
            tuple(MeshAxis(a.name, a.size) for a in m.axes),
            tuple(m.device_ids),
            m.algorithm,
            tuple(m.dcn_shape),
            tuple(
                AxisQuality(
                    q.axis, next((a.size for a in m.axes if a.name == q.axis), 0), q.neighbours, q.ring,
                    q.max_hop, q.closing_hop, q.wraparound, q.dcn_steps, q.reason,
                )
                for q in m.quality
            ),
        )
        for m in msg.meshes
    )  # fmt: skip
    return DeviceMapping(
        cluster=msg.cluster,
        incarnation=msg.incarnation,
        created=msg.created.ToDatetime(tzinfo=timezone.utc),
        slice=tpu,
        tasks=tuple(tasks),
        all_core_ids=tuple(msg.all_core_ids),
        device_counts=tuple(msg.device_counts),
        topologies=topologies,
        meshes=meshes,
        schema_version=msg.schema_version,
    )


# --- JSON ------------------------------------------------------------------------------------------


def _in_field_order(descriptor: Descriptor, obj: dict[str, Any]) -> dict[str, Any]:
    """json_format lists set fields before defaulted ones; order by declaration so the layout is fixed."""
    out: dict[str, Any] = {}
    for field in descriptor.fields:
        if field.name not in obj:
            continue
        value = obj[field.name]
        sub = field.message_type
        if sub is not None and sub.full_name != "google.protobuf.Timestamp":
            value = [_in_field_order(sub, v) for v in value] if field.is_repeated else _in_field_order(sub, value)
        out[field.name] = value
    return out


def _scalar(value: Any) -> bool:
    return not isinstance(value, (dict, list))


def _atom(value: Any) -> str:
    if type(value) is int:  # most of the file: a cheaper path than json.dumps
        return str(value)
    return json.dumps(value)


def _render(value: Any, indent: str) -> str:
    """JSON with flat objects and scalar lists on one line (wrapped when long), one device per line. O(size)."""
    inner = indent + "  "
    if isinstance(value, dict):
        if not value:
            return "{}"
        flat = all(_scalar(v) or (isinstance(v, list) and all(map(_scalar, v))) for v in value.values())
        if flat:
            one_line = "{" + ", ".join(f"{json.dumps(k)}: {_render(v, inner)}" for k, v in value.items()) + "}"
            if len(one_line) <= _INLINE_WIDTH:
                return one_line
        items = [f"{inner}{json.dumps(k)}: {_render(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(value, list):
        if not value:
            return "[]"
        if all(map(_scalar, value)):
            atoms = [_atom(v) for v in value]
            one_line = "[" + ", ".join(atoms) + "]"
            if len(one_line) <= _INLINE_WIDTH:
                return one_line
            rows = [", ".join(atoms[i : i + _LIST_CHUNK]) for i in range(0, len(atoms), _LIST_CHUNK)]
        else:
            rows = [_render(v, inner) for v in value]
        return "[\n" + ",\n".join(inner + r for r in rows) + f"\n{indent}]"
    return _atom(value)


def to_json(mapping: DeviceMapping) -> str:
    """The file's text: proto3 JSON, fields in declaration order, deterministic for equal mappings."""
    msg = to_proto(mapping)
    obj = json_format.MessageToDict(msg, always_print_fields_with_no_presence=True, preserving_proto_field_name=True)
    return _render(_in_field_order(msg.DESCRIPTOR, obj), "") + "\n"


def from_json(text: str, source: str = "device mapping") -> DeviceMapping:
    """Parse and validate a mapping file's text; every problem is a MappingError naming ``source``."""
    try:
        return _from_json(text, source)
    except MappingError as exc:
        if exc.message.startswith(source):
            raise
        raise MappingError(f"{source}: {exc.message}", hint=exc.hint or _REINIT_HINT) from exc


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise MappingError(f"key {key!r} appears twice in one JSON object")
        out[key] = value
    return out


def _unknown_keys(descriptor: Descriptor, obj: Any, path: str) -> list[str]:
    """Keys the schema does not have, with a "did you mean" (json_format's message lists camelCase names)."""
    if not isinstance(obj, dict):
        return []  # json_format reports the type error
    fields = {f.name: f for f in descriptor.fields} | {f.json_name: f for f in descriptor.fields}
    problems = []
    for key, value in obj.items():
        field = fields.get(key)
        where = f"{path}.{key}" if path else key
        if field is None:
            guess = difflib.get_close_matches(key, [f.name for f in descriptor.fields], n=1)
            problems.append(f"unknown field {where!r}" + (f" (did you mean {guess[0]!r}?)" if guess else ""))
            continue
        sub = field.message_type
        if sub is None or sub.full_name.startswith("google.protobuf."):
            continue
        items = value if field.is_repeated and isinstance(value, list) else [value]
        for i, item in enumerate(items):
            problems += _unknown_keys(sub, item, f"{where}[{i}]" if field.is_repeated else where)
    return problems


def _from_json(text: str, source: str) -> DeviceMapping:
    if not text.strip():
        raise MappingError(f"{source}: the file is empty", hint=_REINIT_HINT)
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        what = "not valid JSON" if text.rstrip().endswith("}") else "truncated"
        raise MappingError(
            f"{source}:{exc.lineno}:{exc.colno}: {what}: {exc.msg}", hint="the file is damaged; " + _REINIT_HINT
        ) from exc
    if not isinstance(data, dict):
        raise MappingError(f"{source}: the file holds a JSON {type(data).__name__}, not a device mapping object")
    version = data.get("schema_version")
    if version is None:
        raise MappingError(f"{source}: no schema_version: this is not a tpuctl device mapping file")
    if version not in KNOWN_SCHEMA_VERSIONS or isinstance(version, bool):
        known = ", ".join(map(str, KNOWN_SCHEMA_VERSIONS))
        raise MappingError(
            f"{source}: schema_version {version!r} is not one this tpuctl reads ({known})",
            hint="it was written by another tpuctl version: use the same version for init and jobs, or " + _REINIT_HINT,
        )
    unknown = _unknown_keys(_pb.DESCRIPTOR, data, "")
    if unknown:
        raise MappingError(
            f"{source}: not the device mapping schema: " + "; ".join(unknown),
            hint="the file was edited or written by another tpuctl version; " + _REINIT_HINT,
        )
    msg = _pb()
    try:
        json_format.ParseDict(data, msg)
    except json_format.ParseError as exc:
        raise MappingError(f"{source}: does not match the device mapping schema: {exc}") from exc
    mapping = from_proto(msg)
    problems = mapping_problems(mapping) or _mesh_record_problems(msg, mapping)
    if problems:
        raise MappingError(
            f"{source}: inconsistent device mapping ({len(problems)} problem(s))\n" + _listed(problems),
            hint="the file was edited or is from a different init; " + _REINIT_HINT,
        )
    return mapping


# --- files -----------------------------------------------------------------------------------------


def write_mapping(path: str | os.PathLike[str], mapping: DeviceMapping) -> Path:
    """Write the mapping atomically: a reader sees the old file or the new one, never a partial one.

    Temp file in the same folder, write, flush, fsync, ``os.replace``, fsync the folder (so the rename
    survives a crash). Parent folders are created. The file is mode 0644 (jobs of other users read it).
    """
    target = Path(path)
    text = to_json(mapping)  # fail before touching the disk
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise StateError(f"cannot write device mapping {target}: {exc.strerror or exc}") from exc
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise StateError(f"cannot write device mapping {target}: {exc.strerror or exc}") from exc
        raise
    _fsync_dir(target.parent)
    return target


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some filesystems cannot open folders; the rename itself is already atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_mapping(path: str | os.PathLike[str] | None = None) -> DeviceMapping:
    """Read and validate a device mapping file (default: ``$TPUCTL_MAPPING``).

    Refuses (MappingError, exit 7) a missing, empty, truncated or non-JSON file (with line and column), an
    unknown schema_version, fields the schema does not have, and a file whose parts disagree: device
    counts, unique core ids, ``all_core_ids`` vs the tasks, ``device_coordinates`` vs the devices'
    coordinates, and the TopologyProto bytes vs ``mesh_shape``/``device_coordinates``.
    """
    if path is None:
        env = os.environ.get(MAPPING_ENV, "")
        if not env:
            raise MappingError(
                f"no device mapping file given and ${MAPPING_ENV} is not set",
                hint=f"pass the path, or export {MAPPING_ENV}=<file written by tpuctl init>",
            )
        path = env
    source = os.fspath(path)
    try:
        raw = Path(source).read_bytes()
    except FileNotFoundError as exc:
        raise MappingError(
            f"no device mapping file at {source}", hint="run `tpuctl init` on this host first, or fix the path"
        ) from exc
    except OSError as exc:
        raise MappingError(f"cannot read device mapping {source}: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MappingError(
            f"{source}: not UTF-8 text (byte {exc.start}): not a device mapping file", hint=_REINIT_HINT
        ) from exc
    return from_json(text, source)
