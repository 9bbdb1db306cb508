"""DTensor topologies from merged cores, and TopologyProto bytes without TensorFlow.

v4-32 megacore: 2x2x4 chips, four hosts of one z-plane each, mesh_shape [2, 2, 4, 1]::

    task t, device d -> (x, y, z, core):  d0 (0,0,t,0)  d1 (1,0,t,0)  d2 (0,1,t,0)  d3 (1,1,t,0)
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from topology_cases import SLICE_IDS, SLICES, make_slice, sim_reports

from tpuctl.errors import ClusterError, InputError
from tpuctl.tpu.slice import resolve_slice
from tpuctl.tpu.topology import (
    CoreLocation,
    DTensorTopology,
    build_topologies,
    build_topology,
    merge_core_ids,
    parse_topology_proto,
    serialize_topology_proto,
    topology_from_locations,
)


def topology_of(**kw: Any) -> DTensorTopology:
    tpu = resolve_slice(**kw)
    return build_topology(merge_core_ids(sim_reports(tpu), tpu), tpu)


# The v4-32-like example of dtensor.md §5.4: 76 bytes, all values below 128 so one byte each.
V4_32_FLAT = [c for z in range(4) for (x, y) in ((0, 0), (1, 0), (0, 1), (1, 1)) for c in (x, y, z, 0)]
V4_32_BYTES = bytes.fromhex("0a 04 02 02 04 01 10 04 18 04 22 40") + bytes(V4_32_FLAT)


def test_v4_32_topology_and_its_76_bytes() -> None:
    topology = topology_of(accelerator="v4-32")
    assert topology.mesh_shape == (2, 2, 4, 1)
    assert topology.device_coordinates_dims == (4, 4, 4)
    assert topology.device_coordinates[2][3] == (1, 1, 2, 0)
    assert list(topology.flat_device_coordinates) == V4_32_FLAT
    data = serialize_topology_proto(topology)
    assert len(data) == 76
    assert data == V4_32_BYTES
    assert parse_topology_proto(data) == topology


@pytest.mark.parametrize(
    ("kw", "mesh_shape", "dims"),
    [
        ({"accelerator": "v4-16"}, (2, 2, 2, 1), (2, 4, 4)),
        ({"accelerator": "v4-16", "megacore": False}, (2, 2, 2, 2), (2, 8, 4)),
        ({"accelerator": "v3-32"}, (4, 4, 1, 2), (4, 8, 4)),
        ({"accelerator": "v5litepod-16"}, (4, 4, 1, 1), (4, 4, 4)),
        ({"accelerator": "v5litepod-16", "chips_per_host": 8}, (4, 4, 1, 1), (2, 8, 4)),
        ({"accelerator": "tpu7x-16"}, (2, 2, 2, 2), (2, 8, 4)),
        ({"accelerator": "v6e-64"}, (8, 8, 1, 1), (16, 4, 4)),
        ({"accelerator": "v5p-128"}, (4, 4, 4, 1), (16, 4, 4)),
    ],
)
def test_mesh_shapes_golden(kw: dict[str, Any], mesh_shape: tuple[int, ...], dims: tuple[int, ...]) -> None:
    topology = topology_of(**kw)
    assert topology.mesh_shape == mesh_shape
    assert topology.device_coordinates_dims == dims


def test_v5litepod_16_host_blocks() -> None:
    topology = topology_of(accelerator="v5litepod-16")
    #  y\x  0  1 | 2  3
    #  0    t0   | t1
    #  1         |
    #  2    t2   | t3
    assert topology.device_coordinates[1] == ((2, 0, 0, 0), (3, 0, 0, 0), (2, 1, 0, 0), (3, 1, 0, 0))
    assert topology.device_coordinates[2][0] == (0, 2, 0, 0)


def test_multislice_has_one_topology_per_slice_over_its_own_tasks() -> None:
    tpu = resolve_slice(accelerator="v5litepod-16", num_slices=2)
    merged = merge_core_ids(sim_reports(tpu), tpu)
    tops = build_topologies(merged, tpu)
    assert len(tops) == 2
    assert tops[0] == tops[1] == topology_of(accelerator="v5litepod-16")
    assert build_topology(merged, tpu, 1) == tops[1]
    with pytest.raises(ClusterError, match="slice 2 is not in"):
        build_topology(merged, tpu, 2)


def test_build_topology_refuses_cores_of_another_slice() -> None:
    merged = merge_core_ids(sim_reports(resolve_slice(accelerator="v4-16")), resolve_slice(accelerator="v4-16"))
    with pytest.raises(ClusterError, match=r"merged cores of 2 task\(s\) x 4 device\(s\) do not match v4-32"):
        build_topology(merged, resolve_slice(accelerator="v4-32"))


def test_the_largest_pod_is_fast_enough() -> None:
    tpu = resolve_slice(generation="v5p", topology="16x20x28")
    topology = build_topology(merge_core_ids(sim_reports(tpu), tpu), tpu)
    assert topology.mesh_shape == (16, 20, 28, 1)
    assert parse_topology_proto(serialize_topology_proto(topology)) == topology


# --- topology_from_locations: DTensor's _create_tpu_topology, minus the asserts -----------------------


def test_locations_not_starting_at_zero_are_a_cluster_error() -> None:
    locations = [CoreLocation(x, y, 1, 0) for y in range(2) for x in range(2)]
    with pytest.raises(ClusterError) as info:
        topology_from_locations(locations, 1, 4)
    assert info.value.message == (
        "TPU core locations do not start at (0, 0, 0, 0): the smallest x, y, z, core are [0, 0, 1, 0]"
    )
    assert "partial slice" in str(info.value.hint)


def test_duplicate_locations_are_refused() -> None:
    locations = [CoreLocation(0, 0, 0, 0), CoreLocation(1, 0, 0, 0), CoreLocation(0, 0, 0, 0), CoreLocation(1, 1, 0, 0)]
    with pytest.raises(ClusterError, match=r"\[0, 0, 0, 0\] is held by task 0 device 0 and task 1 device 0"):
        topology_from_locations(locations, 2, 2)


@pytest.mark.parametrize(("tasks", "per"), [(2, 3), (0, 4), (1, 0)])
def test_location_count_must_match(tasks: int, per: int) -> None:
    with pytest.raises(ClusterError, match="cannot build a TPU topology from 4 core locations"):
        topology_from_locations([CoreLocation(i, 0, 0, 0) for i in range(4)], tasks, per)


def test_a_partially_occupied_box_gives_its_bounding_box() -> None:
    # Like DTensor: mesh_shape is max + 1 per axis, holes allowed.
    locations = [CoreLocation(0, 0, 0, 0), CoreLocation(2, 0, 0, 0), CoreLocation(0, 3, 0, 1), CoreLocation(1, 1, 0, 0)]
    assert topology_from_locations(locations, 2, 2).mesh_shape == (3, 4, 1, 2)


# --- serialize / parse -----------------------------------------------------------------------------


@st.composite
def topologies(draw: st.DrawFn) -> DTensorTopology:
    """Any valid topology: distinct locations inside a box (holes allowed), split evenly over tasks."""
    mesh = tuple(draw(st.integers(1, n)) for n in (6, 6, 4, 2))
    cells = [
        (x, y, z, c) for x in range(mesh[0]) for y in range(mesh[1]) for z in range(mesh[2]) for c in range(mesh[3])
    ]
    chosen = draw(st.permutations(cells))
    tasks = draw(st.integers(1, len(cells)))
    per = draw(st.integers(1, len(cells) // tasks))
    used = chosen[: tasks * per]
    grid = tuple(tuple(used[t * per : (t + 1) * per]) for t in range(tasks))
    return DTensorTopology((mesh[0], mesh[1], mesh[2], mesh[3]), grid)


@settings(max_examples=200, deadline=None)
@given(topology=topologies())
def test_serialize_parse_round_trip(topology: DTensorTopology) -> None:
    data = serialize_topology_proto(topology)
    assert parse_topology_proto(data) == topology
    assert serialize_topology_proto(parse_topology_proto(data)) == data


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64))
def test_parse_never_fails_with_anything_but_input_error(data: bytes) -> None:
    try:
        topology = parse_topology_proto(data)
    except InputError as exc:
        assert exc.message.startswith("bad TopologyProto: ")
    else:
        assert topology.num_tasks >= 1


@settings(max_examples=100, deadline=None)
@given(topology=topologies(), data=st.data())
def test_every_truncation_is_refused(topology: DTensorTopology, data: st.DataObject) -> None:
    encoded = serialize_topology_proto(topology)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(InputError, match="bad TopologyProto"):
        parse_topology_proto(encoded[:cut])


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _packed(field: int, values: list[int]) -> bytes:
    payload = b"".join(_varint(v) for v in values)
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _proto(mesh: list[int], tasks: int, per: int, flat: list[int], extra: bytes = b"") -> bytes:
    return (
        _packed(1, mesh) + _varint(2 << 3) + _varint(tasks) + _varint(3 << 3) + _varint(per) + _packed(4, flat) + extra
    )


ONE_TASK = [0, 0, 0, 0, 1, 0, 0, 0]


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", r"empty input \(0 bytes\)"),
        (
            _proto([2, 1, 1], 1, 2, ONE_TASK),
            r"mesh_shape must be 4 positive entries \[x, y, z, core\]; got \[2, 1, 1\]",
        ),
        (_proto([2, 0, 1, 1], 1, 2, ONE_TASK), r"got \[2, 0, 1, 1\]"),
        (_proto([2, 1, 1, 1], 0, 2, ONE_TASK), r"num_tasks and num_tpu_devices_per_task must be >= 1; got 0 and 2"),
        (_proto([2, 1, 1, 1], -1, 2, ONE_TASK), r"got -1 and 2"),
        (_proto([2, 1, 1, 1], 1, 3, ONE_TASK), r"device_coordinates has 8 values; 1 tasks x 3 devices x 4 = 12"),
        (_proto([2, 1, 1, 1], 1, 2, [0, 0, 0, 0, -1, 0, 0, 0]), r"task 0 device 1 at \[-1, 0, 0, 0\] is outside"),
        (
            _proto([2, 1, 1, 1], 1, 2, [0, 0, 0, 0, 2, 0, 0, 0]),
            r"at \[2, 0, 0, 0\] is outside mesh_shape \[2, 1, 1, 1\]",
        ),
        (_proto([2, 1, 1, 1], 1, 2, [0, 0, 0, 0, 0, 0, 0, 0]), r"task 0 device 0 and task 0 device 1 are both at"),
        (_proto([2, 1, 1, 1], 1, 2, [0, 0, 0, 0, 1, 0, 0, 2**31]), r"does not fit an int32"),
        (b"\x0a\x04\x02\x01", r"field of 4 bytes at byte 2 runs past the end \(4 bytes\)"),
        (b"\x0a\x01\x82", r"truncated varint"),
        (b"\x10" + b"\xff" * 11, r"varint longer than 10 bytes"),
        (b"\x0b\x0c", r"repeated int32 field with wire type 3"),
        (b"\x2b\x0c", r"unsupported wire type 3"),
        (b"\x12\x00", r"field 2 with wire type 2"),
        (b"\x02\x00", r"field 0 with wire type 2"),
    ],
)
def test_parse_refuses(data: bytes, why: str) -> None:
    with pytest.raises(InputError, match=why) as info:
        parse_topology_proto(data)
    assert info.value.message.startswith("bad TopologyProto: ")


def test_parse_accepts_unpacked_repeated_and_skips_unknown_fields() -> None:
    unpacked_mesh = b"".join(_varint(1 << 3) + _varint(v) for v in (2, 1, 1, 1))
    hardware_feature = _varint(5 << 3 | 2) + _varint(2) + b"\x08\x01"  # tpu_hardware_feature {embedding_feature: V1}
    data = (
        unpacked_mesh + _varint(2 << 3) + b"\x01" + _varint(3 << 3) + b"\x02" + _packed(4, ONE_TASK) + hardware_feature
    )
    expected = DTensorTopology((2, 1, 1, 1), (((0, 0, 0, 0), (1, 0, 0, 0)),))
    assert parse_topology_proto(data) == expected
    assert serialize_topology_proto(expected) == _proto([2, 1, 1, 1], 1, 2, ONE_TASK)


def test_from_flat_checks_the_length() -> None:
    with pytest.raises(InputError, match=r"device_coordinates has 7 values and mesh_shape 4; expected 2 tasks x 1"):
        DTensorTopology.from_flat([2, 1, 1, 1], [0] * 7, 2, 1)


@pytest.mark.parametrize(("label", "kw"), SLICES, ids=SLICE_IDS)
def test_every_catalog_slice_round_trips(label: str, kw: dict[str, Any]) -> None:
    tpu = make_slice(kw)
    for topology in build_topologies(merge_core_ids(sim_reports(tpu), tpu), tpu):
        assert parse_topology_proto(serialize_topology_proto(topology)) == topology
