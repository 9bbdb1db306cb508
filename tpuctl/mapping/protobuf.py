"""The device mapping as a protobuf message: ``tpuctl.v1.DeviceMapping`` <-> :class:`DeviceMapping`.

:func:`to_proto` derives what every task needs from each mesh (local device ids, task 0's DTensor
strings); :func:`from_proto` rebuilds the value, refusing (MappingError) a message whose slice or
topologies do not hold together. :mod:`tpuctl.mapping.file` writes and reads the message as JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timezone
from typing import Any

from tpuctl.errors import MappingError, TpuctlError
from tpuctl.mapping.model import DeviceMapping, MappedDevice, MappedMesh, MappedTask
from tpuctl.mesh.model import AxisQuality, MeshAxis
from tpuctl.mesh.strings import default_job_name, dtensor_host_mesh_string, dtensor_mesh_string
from tpuctl.proto import mapping_pb2
from tpuctl.tpu.hardware import Triple, find_generation
from tpuctl.tpu.slice import TpuSlice, format_dims, resolve_slice, with_blocks
from tpuctl.tpu.topology import (
    MESH_RANK,
    DTensorTopology,
    parse_topology_proto,
    serialize_topology_proto,
    tasks_of_slice,
)

_pb = mapping_pb2.DeviceMapping


# --- proto conversion ------------------------------------------------------------------------------


def _flat_topology(message: Any, topology: DTensorTopology) -> None:
    message.mesh_shape.extend(topology.mesh_shape)
    message.device_coordinates.extend(topology.flat_device_coordinates)
    message.device_coordinates_dims.extend(topology.device_coordinates_dims)
    message.topology_proto = serialize_topology_proto(topology)


def to_proto(mapping: DeviceMapping) -> mapping_pb2.DeviceMapping:
    tpu = mapping.slice
    msg = _pb(
        schema_version=mapping.schema_version,
        cluster=mapping.cluster,
        incarnation=mapping.incarnation,
        generation=mapping.generation,
    )
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
            chips_per_machine_bounds=tpu.chips_per_machine_bounds or (),
        )
    )
    for task in mapping.tasks:
        devices = [
            _pb.Device(id=d.id, coords=d.coords, core=d.core, core_id=d.core_id, ordinal=d.ordinal)
            for d in task.devices
        ]
        msg.tasks.append(
            _pb.Task(id=task.id, address=task.address, slice=task.slice, devices=devices, task_id=task.task_id or 0)
        )
    msg.plan.extend(_pb.PlanRun(first=first, count=count) for first, count in mapping.plan)
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
    machine = None
    if shape.chips_per_machine_bounds:
        machine = _triple(shape.chips_per_machine_bounds, "slice.chips_per_machine_bounds")
    options: dict[str, Any] = {
        "chips_per_host": block[0] * block[1] * block[2] if machine is None else None,
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
        if machine is not None:  # several tasks per machine: the blocks as written, checked against each other
            tpu = with_blocks(tpu, block, machine)
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
        tasks.append(MappedTask(task.id, task.address, task.slice, devices, task.task_id if msg.plan else None))
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
        generation=msg.generation or 1,
        plan=tuple((run.first, run.count) for run in msg.plan),
    )
