"""tpuctl's topology against DTensor's own code in the installed TensorFlow, on the same inputs.

``tpu_util._create_tpu_topology`` builds the topology from the locations; ``tf.tpu.experimental.Topology``
serializes and parses TopologyProto. TensorFlow is imported once for the module (about 3-5 s).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from topology_cases import SLICE_IDS, SLICES, make_slice, sim_reports

from tpuctl.tpu.topology import (
    CoreLocation,
    DTensorTopology,
    build_topologies,
    core_location,
    merge_core_ids,
    parse_topology_proto,
    serialize_topology_proto,
    tasks_of_slice,
    topology_from_locations,
)

pytestmark = pytest.mark.oracle

ORACLE_SLICES: list[tuple[str, dict[str, Any]]] = [
    ("v4-32", {"accelerator": "v4-32"}),
    ("v4-16-non-megacore", {"accelerator": "v4-16", "megacore": False}),
    ("v3-32", {"accelerator": "v3-32"}),
    ("v5litepod-16", {"accelerator": "v5litepod-16"}),
    ("v5litepod-16-8chip-hosts", {"accelerator": "v5litepod-16", "chips_per_host": 8}),
    ("tpu7x-16", {"accelerator": "tpu7x-16"}),
    ("v6e-64", {"accelerator": "v6e-64"}),
    ("v5p-128", {"accelerator": "v5p-128"}),
]


@pytest.fixture(scope="module")
def tf() -> Iterator[SimpleNamespace]:
    tensorflow = pytest.importorskip("tensorflow")
    from tensorflow.dtensor.python import tpu_util

    yield SimpleNamespace(Topology=tensorflow.tpu.experimental.Topology, tpu_util=tpu_util)


def dtensor_topology(tf: SimpleNamespace, locations: list[CoreLocation], tasks: int, per: int) -> Any:
    core_locations = [tf.tpu_util._CoreLocation(loc.x, loc.y, loc.z, loc.core) for loc in locations]
    return tf.tpu_util._create_tpu_topology(core_locations, tasks, per)


def same(theirs: Any, ours: DTensorTopology) -> None:
    assert theirs.mesh_shape.tolist() == list(ours.mesh_shape)
    assert theirs.device_coordinates.tolist() == [[list(d) for d in task] for task in ours.device_coordinates]
    assert theirs.mesh_shape.dtype.name == theirs.device_coordinates.dtype.name == "int32"


@pytest.mark.parametrize(("label", "kw"), ORACLE_SLICES + SLICES, ids=[s for s, _ in ORACLE_SLICES] + SLICE_IDS)
def test_build_topology_equals_dtensor(tf: SimpleNamespace, label: str, kw: dict[str, Any]) -> None:
    tpu = make_slice(kw)
    merged = merge_core_ids(sim_reports(tpu), tpu)
    per = merged.devices_per_task
    for s, ours in enumerate(build_topologies(merged, tpu)):
        tasks = tasks_of_slice(tpu, s)
        ids = merged.all_core_ids[tasks.start * per : tasks.stop * per]
        theirs = dtensor_topology(tf, [core_location(i, tpu) for i in ids], len(tasks), per)
        same(theirs, ours)
        data = serialize_topology_proto(ours)
        assert data == theirs.serialized()
        coordinates = [[list(d) for d in task] for task in ours.device_coordinates]
        assert data == tf.Topology(mesh_shape=list(ours.mesh_shape), device_coordinates=coordinates).serialized()
        same(tf.Topology(serialized=data), ours)
        assert parse_topology_proto(theirs.serialized()) == ours


def test_the_76_byte_example(tf: SimpleNamespace) -> None:
    tpu = make_slice({"accelerator": "v4-32"})
    (ours,) = build_topologies(merge_core_ids(sim_reports(tpu), tpu), tpu)
    data = serialize_topology_proto(ours)
    assert len(data) == 76
    assert data[:12] == bytes.fromhex("0a 04 02 02 04 01 10 04 18 04 22 40")
    parsed = tf.Topology(serialized=data)
    assert parsed.task_ordinal_at_coordinates([1, 1, 2, 0]) == 2
    assert parsed.tpu_device_ordinal_at_coordinates([1, 1, 2, 0]) == 3
    assert parsed.missing_devices.size == 0


@st.composite
def location_sets(draw: st.DrawFn) -> tuple[list[CoreLocation], int, int]:
    """Distinct locations in a box that start at 0 on every axis (DTensor's precondition)."""
    mesh = [draw(st.integers(1, n)) for n in (5, 5, 4, 2)]
    cells = [
        CoreLocation(x, y, z, c)
        for x in range(mesh[0])
        for y in range(mesh[1])
        for z in range(mesh[2])
        for c in range(mesh[3])
    ]
    order = draw(st.permutations(cells))
    tasks = draw(st.integers(1, len(cells)))
    per = draw(st.integers(1, len(cells) // tasks))
    chosen = list(order[: tasks * per])
    origin = CoreLocation(0, 0, 0, 0)
    if origin not in chosen:  # with the origin in, every axis starts at 0
        chosen[draw(st.integers(0, len(chosen) - 1))] = origin
    return chosen, tasks, per


@settings(max_examples=100, deadline=None)
@given(case=location_sets())
def test_random_location_sets_equal_dtensor(tf: SimpleNamespace, case: tuple[list[CoreLocation], int, int]) -> None:
    locations, tasks, per = case
    ours = topology_from_locations(locations, tasks, per)
    theirs = dtensor_topology(tf, locations, tasks, per)
    same(theirs, ours)
    assert serialize_topology_proto(ours) == theirs.serialized()


def test_dtensor_asserts_where_tpuctl_explains(tf: SimpleNamespace) -> None:
    locations = [CoreLocation(1, 0, 0, 0), CoreLocation(2, 0, 0, 0)]
    with pytest.raises(AssertionError):
        dtensor_topology(tf, locations, 1, 2)
    from tpuctl.errors import ClusterError

    with pytest.raises(ClusterError, match="do not start at"):
        topology_from_locations(locations, 1, 2)


def test_tf_accepts_what_parse_topology_proto_refuses(tf: SimpleNamespace) -> None:
    from tpuctl.errors import InputError

    # Duplicate and negative coordinates: TF's parser takes them silently.
    duplicate = tf.Topology(mesh_shape=[2, 1, 1, 1], device_coordinates=[[[0, 0, 0, 0], [0, 0, 0, 0]]]).serialized()
    tf.Topology(serialized=duplicate)
    with pytest.raises(InputError, match="are both at"):
        parse_topology_proto(duplicate)
