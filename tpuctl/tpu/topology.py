"""The core-ID merge and DTensor's TPU topology, as pure functions of what the hosts report.

DTensor (``tensorflow/dtensor/python/tpu_util.py``, ``tpu_system_init_helper``) brings a TPU cluster up in
three steps that tpuctl reproduces here without TensorFlow:

1. every host reads its local TPU core ids from the runtime, in local device-ordinal order;
2. the hosts merge them (DTensor: an O(N²) AllReduce-sum of zero-padded vectors; semantically an
   all-gather ordered by (task, local ordinal)): :func:`merge_core_ids`, which also checks what DTensor
   assumes (every host present, equal device counts, unique ids inside the slice);
3. every core id becomes a location ``(x, y, z, core)`` and the locations become a
   ``tf.tpu.experimental.Topology``: :func:`build_topology` (``_create_tpu_topology``), serialized as
   ``tensorflow.tpu.TopologyProto`` by :func:`serialize_topology_proto` and read back, with the checks TF
   lacks, by :func:`parse_topology_proto`.

Core ids are TensorCore numbers, x-minor, per slice (libtpu's ``Core(kTensorCore, x, y, z, core).Id()``)::

    core_id = core + cores_per_chip * (x + X * (y + Y * z))

with ``cores_per_chip`` the chip's physical TensorCores (2 on v2/v3/v4/v5p/7x, 1 on v5e/v6e). A megacore
device (v4/v5p default: one device per chip) is core 0 of its chip, so its id is even: the runtime numbers
megacore chips 0, 1, 2, ... and DTensor multiplies them by 2. Example, ``v4-16`` (2x2x2 chips, megacore),
two hosts, one z-plane each::

    z=0   y\\x  0  1        z=1   y\\x  0  1
          0     0  2              0     8 10      task 0 reports [0, 2, 4, 6]
          1     4  6              1    12 14      task 1 reports [8, 10, 12, 14]

    locations (0,0,0,0) (1,0,0,0) (0,1,0,0) (1,1,0,0) | (0,0,1,0) ... ; mesh_shape [2, 2, 2, 1]

In a multislice every slice numbers its own cores from 0, so (slice, core_id) is the unique key and each
slice gets its own topology (:func:`build_topologies`).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tpuctl.errors import ClusterError, InputError
from tpuctl.messages import listed
from tpuctl.protowire import varint
from tpuctl.tpu.hardware import Triple
from tpuctl.tpu.slice import TpuSlice

MESH_RANK = 4
"""A TPU topology's mesh is [x, y, z, core]."""

_MAX_LISTED = 8
"""Problems listed in one error before "... and N more"."""

Coordinates = tuple[int, int, int, int]


@dataclass(frozen=True)
class CoreLocation:
    """Where a TensorCore sits: chip (x, y, z) within its slice and core index on the chip."""

    x: int
    y: int
    z: int
    core: int

    @property
    def coords(self) -> Triple:
        return (self.x, self.y, self.z)

    def to_list(self) -> list[int]:
        """``[x, y, z, core]``, as ``_CoreLocation.to_list`` and ``device_coordinates`` hold it."""
        return [self.x, self.y, self.z, self.core]


@dataclass(frozen=True)
class MergedCores:
    """Every host's core ids, gathered in (task, local ordinal) order: DTensor's ``all_core_ids``."""

    all_core_ids: tuple[int, ...]
    """Task-major, local-ordinal-minor; ids repeat across the slices of a multislice."""
    device_counts: tuple[int, ...]
    """Devices each task reported, indexed by task (all equal once merged)."""

    @property
    def num_tasks(self) -> int:
        return len(self.device_counts)

    @property
    def devices_per_task(self) -> int:
        return self.device_counts[0] if self.device_counts else 0

    def core_ids_of_task(self, task: int) -> tuple[int, ...]:
        if not 0 <= task < self.num_tasks:
            raise ClusterError(f"task {task} is not in the merged cores (tasks 0..{self.num_tasks - 1})")
        per = self.devices_per_task
        return self.all_core_ids[task * per : (task + 1) * per]


@dataclass(frozen=True)
class DTensorTopology:
    """``tf.tpu.experimental.Topology``'s data: the mesh shape and each (task, device)'s coordinates."""

    mesh_shape: Coordinates
    """[x, y, z, core] sizes: the occupied bounding box, in cores."""
    device_coordinates: tuple[tuple[Coordinates, ...], ...]
    """``[task][local device] -> (x, y, z, core)``; tasks count from 0 within the slice."""

    @property
    def num_tasks(self) -> int:
        return len(self.device_coordinates)

    @property
    def num_devices_per_task(self) -> int:
        return len(self.device_coordinates[0]) if self.device_coordinates else 0

    @property
    def device_coordinates_dims(self) -> tuple[int, int, int]:
        return (self.num_tasks, self.num_devices_per_task, MESH_RANK)

    @property
    def flat_device_coordinates(self) -> tuple[int, ...]:
        """Row-major flattening, as TopologyProto field 4 holds it."""
        return tuple(c for task in self.device_coordinates for device in task for c in device)

    @classmethod
    def from_flat(
        cls, mesh_shape: Sequence[int], flat: Sequence[int], num_tasks: int, devices_per_task: int
    ) -> DTensorTopology:
        """Reshape flat coordinates to ``[num_tasks][devices_per_task][4]`` (the length must match)."""
        if len(flat) != num_tasks * devices_per_task * MESH_RANK or len(mesh_shape) != MESH_RANK:
            raise InputError(
                f"device_coordinates has {len(flat)} values and mesh_shape {len(mesh_shape)}; expected "
                f"{num_tasks} tasks x {devices_per_task} devices x {MESH_RANK} = "
                f"{num_tasks * devices_per_task * MESH_RANK} and {MESH_RANK}"
            )
        per_task = devices_per_task * MESH_RANK
        coords = tuple(
            tuple(
                _coords(flat[t * per_task + d * MESH_RANK : t * per_task + (d + 1) * MESH_RANK])
                for d in range(devices_per_task)
            )
            for t in range(num_tasks)
        )
        return cls(_coords(mesh_shape), coords)


def _coords(values: Sequence[int]) -> Coordinates:
    return (int(values[0]), int(values[1]), int(values[2]), int(values[3]))


# --- core ids <-> locations ------------------------------------------------------------------------


def core_location(core_id: int, slice: TpuSlice) -> CoreLocation:
    """The location of TensorCore ``core_id`` within its slice (libtpu's ``CoreForId``). O(1)."""
    limit = slice.tensorcores_per_slice
    value = _integer(core_id)
    if value is None or not 0 <= value < limit:
        raise ClusterError(
            f"core id {core_id!r} is not a TensorCore of {slice.describe()}: ids are 0..{limit - 1}",
            hint="core ids count TensorCores per slice: core + cores_per_chip * (x + X * (y + Y * z))",
        )
    cores = slice.generation.cores_per_chip
    nx, ny, _ = slice.topology
    chip, core = divmod(value, cores)
    chip, x = divmod(chip, nx)
    z, y = divmod(chip, ny)
    return CoreLocation(x, y, z, core)


def core_id_of(coords: Triple, core: int, slice: TpuSlice) -> int:
    """The TensorCore id of ``core`` on the chip at ``coords`` (inverse of :func:`core_location`)."""
    x, y, z = coords
    nx, ny, _ = slice.topology
    return core + slice.generation.cores_per_chip * (x + nx * (y + ny * z))


def device_core_id(coords: Triple, core_on_chip: int, slice: TpuSlice) -> int:
    """The core id the runtime reports for a device: a megacore device is its chip's core 0."""
    return core_id_of(coords, 0 if slice.megacore else core_on_chip, slice)


def expected_core_ids(slice: TpuSlice) -> range:
    """Every core id one slice reports: all TensorCores, or every chip's core 0 under megacore."""
    step = slice.generation.cores_per_chip if slice.megacore else 1
    return range(0, slice.tensorcores_per_slice, step)


# --- the merge -------------------------------------------------------------------------------------


def _join(values: Iterable[int]) -> str:
    return ", ".join(str(v) for v in values)


def merge_core_ids(per_task: Mapping[int, Sequence[int]], slice: TpuSlice) -> MergedCores:
    """Gather every host's local core ids into DTensor's ``all_core_ids``, refusing what DTensor assumes.

    ``per_task[t]`` is task t's core ids in local device-ordinal order, as its backend reported them; the
    mapping's own order (arrival order) does not matter. Refused with a ClusterError that names the hosts:
    a missing or unknown task, a host whose device count is not the slice's devices per host (every count
    is listed), an id outside the slice or odd under megacore, and an id claimed twice within one slice.
    Once those pass, every expected id of every slice is present: each slice holds exactly as many
    distinct valid ids as it has devices. O(N) for N devices.
    """
    hosts = slice.num_hosts
    unknown = sorted(
        (t for t in per_task if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < hosts), key=repr
    )
    missing = [t for t in range(hosts) if t not in per_task]
    if unknown or missing:
        parts = []
        if missing:
            parts.append(f"no core ids from task(s) {_join(missing)}")
        if unknown:
            parts.append(f"core ids from unknown task(s) {', '.join(repr(t) for t in unknown)}")
        raise ClusterError(
            f"core-ID merge for {slice.describe()}: " + "; ".join(parts) + f" (expected tasks 0..{hosts - 1})",
            hint="every host must run tpuctl init with its own task id from the cluster spec",
        )

    per_host = slice.devices_per_host
    counts = tuple(len(per_task[t]) for t in range(hosts))
    wrong = [t for t in range(hosts) if counts[t] != per_host]
    if wrong:
        lines = [f"task {t} reported {counts[t]} device(s)" for t in wrong]
        lines += _missing_ids_lines(per_task, slice)
        raise ClusterError(
            f"core-ID merge for {slice.describe()}: every host has {per_host} TPU devices, but\n"
            + listed(lines, limit=_MAX_LISTED),
            hint="a host with fewer devices has a failed chip, a TPU held by another process, or the wrong "
            "accelerator type/megacore setting; per-host counts: " + _join(counts),
        )

    problems: list[str] = []
    owner: dict[tuple[int, int], tuple[int, int]] = {}
    valid = expected_core_ids(slice)
    for task in range(hosts):
        s = task // slice.hosts_per_slice
        for ordinal, reported in enumerate(per_task[task]):
            core_id = _integer(reported)
            if core_id is None or core_id not in valid:
                problems.append(f"task {task} device {ordinal}: core id {reported!r} {_why_invalid(core_id, slice)}")
                continue
            first = owner.setdefault((s, core_id), (task, ordinal))
            if first != (task, ordinal):
                where = f" of slice {s}" if slice.num_slices > 1 else ""
                problems.append(
                    f"core id {core_id}{where} is claimed by task {first[0]} (device {first[1]}) "
                    f"and task {task} (device {ordinal})"
                )
    if problems:
        raise ClusterError(
            f"core-ID merge for {slice.describe()}: {len(problems)} bad core id(s)\n"
            + listed(problems, limit=_MAX_LISTED),
            hint="two hosts reporting the same cores are attached to the same TPU, or have the wrong task ids; "
            "ids outside the slice mean the cluster spec names the wrong accelerator type",
        )
    all_ids = tuple(int(core_id) for t in range(hosts) for core_id in per_task[t])
    return MergedCores(all_ids, counts)


def _integer(value: object) -> int | None:
    """``value`` as an int when it is an integer (numpy's too), else None; bools are not core ids."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def _why_invalid(core_id: int | None, slice: TpuSlice) -> str:
    limit = slice.tensorcores_per_slice
    if core_id is None:
        return "is not an integer"
    if not 0 <= core_id < limit:
        return f"is outside the slice (ids 0..{limit - 1})"
    return f"is odd: a megacore device is core 0 of its chip, so ids are multiples of {slice.generation.cores_per_chip}"


def _missing_ids_lines(per_task: Mapping[int, Sequence[int]], slice: TpuSlice) -> list[str]:
    """Which expected ids no host reported, per slice (to help find the short host)."""
    lines = []
    per = slice.hosts_per_slice
    for s in range(slice.num_slices):
        seen = {_integer(i) for t in range(s * per, (s + 1) * per) for i in per_task[t]}
        gone = [i for i in expected_core_ids(slice) if i not in seen]
        if gone:
            where = f" of slice {s}" if slice.num_slices > 1 else ""
            shown = _join(gone[:16]) + (", ..." if len(gone) > 16 else "")
            lines.append(f"missing core id(s){where}: {shown}")
    return lines


# --- topology --------------------------------------------------------------------------------------


def topology_from_locations(
    locations: Sequence[CoreLocation], num_tasks: int, num_devices_per_task: int
) -> DTensorTopology:
    """DTensor's ``_create_tpu_topology``: the bounding box of the locations and their [task][device] grid.

    ``locations`` are ordered by task, then local ordinal. DTensor asserts each axis starts at 0; here a
    location set that does not (a partial slice), a duplicate location, or a count that is not
    ``num_tasks * num_devices_per_task`` is a ClusterError. O(N).
    """
    if num_tasks < 1 or num_devices_per_task < 1 or len(locations) != num_tasks * num_devices_per_task:
        raise ClusterError(
            f"cannot build a TPU topology from {len(locations)} core locations for {num_tasks} task(s) x "
            f"{num_devices_per_task} device(s)"
        )
    columns = list(zip(*(loc.to_list() for loc in locations), strict=True))
    low = [min(c) for c in columns]
    if any(low):
        raise ClusterError(
            f"TPU core locations do not start at (0, 0, 0, 0): the smallest x, y, z, core are {low}",
            hint="the hosts hold a partial slice; run on every host of the slice, or fix the accelerator type",
        )
    seen: dict[CoreLocation, int] = {}
    for index, loc in enumerate(locations):
        first = seen.setdefault(loc, index)
        if first != index:
            per = num_devices_per_task
            raise ClusterError(
                f"TPU core location {loc.to_list()} is held by task {first // per} device {first % per} "
                f"and task {index // per} device {index % per}"
            )
    mesh_shape = _coords([max(c) + 1 for c in columns])
    grid = tuple(
        tuple(_coords(locations[t * num_devices_per_task + d].to_list()) for d in range(num_devices_per_task))
        for t in range(num_tasks)
    )
    return DTensorTopology(mesh_shape, grid)


def tasks_of_slice(slice: TpuSlice, slice_index: int) -> range:
    """Global task ids of one slice; topology task k is task ``start + k``."""
    if not 0 <= slice_index < slice.num_slices:
        raise ClusterError(f"slice {slice_index} is not in {slice.describe()}")
    per = slice.hosts_per_slice
    return range(slice_index * per, (slice_index + 1) * per)


def build_topology(merged: MergedCores, slice: TpuSlice, slice_index: int = 0) -> DTensorTopology:
    """One slice's DTensor topology from the merged core ids (its tasks renumbered from 0). O(N)."""
    if merged.num_tasks != slice.num_hosts or merged.devices_per_task != slice.devices_per_host:
        raise ClusterError(
            f"merged cores of {merged.num_tasks} task(s) x {merged.devices_per_task} device(s) do not "
            f"match {slice.describe()} ({slice.num_hosts} x {slice.devices_per_host})"
        )
    tasks = tasks_of_slice(slice, slice_index)
    per = merged.devices_per_task
    ids = merged.all_core_ids[tasks.start * per : tasks.stop * per]
    return topology_from_locations([core_location(i, slice) for i in ids], len(tasks), per)


def build_topologies(merged: MergedCores, slice: TpuSlice) -> tuple[DTensorTopology, ...]:
    """One topology per slice (one element unless multislice)."""
    return tuple(build_topology(merged, slice, s) for s in range(slice.num_slices))


# --- TopologyProto ---------------------------------------------------------------------------------
#
# Hand-encoded rather than generated: the message is four scalar fields, and a vendored copy of
# tensorflow/core/protobuf/tpu/topology.proto would register the same file name in protobuf's default
# descriptor pool as TensorFlow does, so a process importing both would fail to load one of them.
#
#   1 mesh_shape               repeated int32, packed
#   2 num_tasks                int32
#   3 num_tpu_devices_per_task int32
#   4 device_coordinates       repeated int32, packed, [num_tasks][devices][4] flattened
#   5 tpu_hardware_feature     message (never written by DTensor; skipped on read)

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _packed(field: int, values: Sequence[int]) -> bytes:
    if not values:
        return b""
    payload = b"".join(varint(v) for v in values)
    return varint(field << 3 | _LEN) + varint(len(payload)) + payload


def _scalar(field: int, value: int) -> bytes:
    return varint(field << 3 | _VARINT) + varint(value) if value else b""


def serialize_topology_proto(topology: DTensorTopology) -> bytes:
    """The bytes ``tf.tpu.experimental.Topology(mesh_shape=..., device_coordinates=...).serialized()`` gives."""
    return (
        _packed(1, topology.mesh_shape)
        + _scalar(2, topology.num_tasks)
        + _scalar(3, topology.num_devices_per_task)
        + _packed(4, topology.flat_device_coordinates)
    )


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def varint(self) -> int:
        value = shift = 0
        start = self.pos
        while True:
            if self.pos >= len(self.data):
                raise _bad(f"truncated varint at byte {start}")
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift >= 70:
                raise _bad(f"varint longer than 10 bytes at byte {start}")

    def int32(self) -> int:
        start = self.pos
        value = self.varint()
        if value >= 1 << 63:
            value -= 1 << 64
        if not _INT32_MIN <= value <= _INT32_MAX:
            raise _bad(f"value {value} at byte {start} does not fit an int32")
        return value

    def take(self, size: int) -> bytes:
        if size > len(self.data) - self.pos:
            raise _bad(f"field of {size} bytes at byte {self.pos} runs past the end ({len(self.data)} bytes)")
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def skip(self, wire: int) -> None:
        if wire == _VARINT:
            self.varint()
        elif wire == _I64:
            self.take(8)
        elif wire == _LEN:
            self.take(self.varint())
        elif wire == _I32:
            self.take(4)
        else:
            raise _bad(f"unsupported wire type {wire} at byte {self.pos}")


def _bad(what: str) -> InputError:
    return InputError(
        f"bad TopologyProto: {what}", hint="the bytes must come from tpuctl init or Topology.serialized()"
    )


def _repeated_int32(reader: _Reader, wire: int, into: list[int]) -> None:
    if wire == _VARINT:  # unpacked encoding: parsers must accept both
        into.append(reader.int32())
    elif wire == _LEN:
        inner = _Reader(reader.take(reader.varint()))
        while inner.pos < len(inner.data):
            into.append(inner.int32())
    else:
        raise _bad(f"repeated int32 field with wire type {wire}")


def parse_topology_proto(data: bytes) -> DTensorTopology:
    """Decode ``tensorflow.tpu.TopologyProto`` bytes and check what TF's parser does not.

    Refused (InputError): empty input, truncated or malformed wire data, a mesh_shape that is not four
    positive entries, fewer than one task or device per task, a coordinate count that is not
    tasks x devices x 4, negative coordinates, coordinates at or past mesh_shape, and two devices at
    one location. O(len(data)).
    """
    if not data:
        raise _bad("empty input (0 bytes)")
    reader = _Reader(bytes(data))
    mesh_shape: list[int] = []
    flat: list[int] = []
    num_tasks = devices = 0
    while reader.pos < len(reader.data):
        key = reader.varint()
        field, wire = key >> 3, key & 7
        if field == 1:
            _repeated_int32(reader, wire, mesh_shape)
        elif field == 4:
            _repeated_int32(reader, wire, flat)
        elif field in (2, 3) and wire == _VARINT:
            value = reader.int32()
            num_tasks, devices = (value, devices) if field == 2 else (num_tasks, value)
        elif field in (2, 3) or field == 0:
            raise _bad(f"field {field} with wire type {wire}")
        else:
            reader.skip(wire)  # tpu_hardware_feature and future fields
    if len(mesh_shape) != MESH_RANK or any(d < 1 for d in mesh_shape):
        raise _bad(f"mesh_shape must be {MESH_RANK} positive entries [x, y, z, core]; got {mesh_shape}")
    if num_tasks < 1 or devices < 1:
        raise _bad(f"num_tasks and num_tpu_devices_per_task must be >= 1; got {num_tasks} and {devices}")
    if len(flat) != num_tasks * devices * MESH_RANK:
        raise _bad(
            f"device_coordinates has {len(flat)} values; {num_tasks} tasks x {devices} devices x {MESH_RANK} "
            f"= {num_tasks * devices * MESH_RANK}"
        )
    topology = DTensorTopology.from_flat(mesh_shape, flat, num_tasks, devices)
    problems = topology_problems(topology)
    if problems:
        raise _bad(f"{len(problems)} bad device coordinate(s)\n" + listed(problems, limit=_MAX_LISTED))
    return topology


def topology_problems(topology: DTensorTopology) -> list[str]:
    """Coordinates outside ``[0, mesh_shape)`` and locations held by two devices, one line each."""
    problems: list[str] = []
    seen: dict[Coordinates, tuple[int, int]] = {}
    for t, task in enumerate(topology.device_coordinates):
        for d, coords in enumerate(task):
            if any(not 0 <= c < m for c, m in zip(coords, topology.mesh_shape, strict=True)):
                problems.append(
                    f"task {t} device {d} at {list(coords)} is outside mesh_shape {list(topology.mesh_shape)}"
                )
                continue
            first = seen.setdefault(coords, (t, d))
            if first != (t, d):
                problems.append(f"task {first[0]} device {first[1]} and task {t} device {d} are both at {list(coords)}")
    return problems
