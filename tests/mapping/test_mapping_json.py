"""The mapping value and its JSON: golden layout, round trips, and identical files on every host."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mapping_cases import CREATED, INCARNATION, sim_mapping

from tpuctl.backends.sim import SimBackend
from tpuctl.errors import ClusterError, MappingError
from tpuctl.mapping.file import from_json, read_mapping, to_json, write_mapping
from tpuctl.mapping.model import MappedDevice, MappedMesh, MeshAxis, build_mapping
from tpuctl.tpu.slice import resolve_slice
from tpuctl.tpu.topology import build_topologies, build_topology, merge_core_ids, parse_topology_proto

GOLDEN_V4_8 = """\
{
  "schema_version": 1,
  "cluster": "pod-a",
  "incarnation": "18364758544493064720",
  "created": "2025-01-02T03:04:05.678901Z",
  "slice": {
    "accelerator_type": "v4-8",
    "generation": "v4",
    "topology": [2, 2, 1],
    "chips_per_host_bounds": [2, 2, 1],
    "num_slices": 1,
    "device_kind": "TPU v4",
    "megacore": true,
    "wraparound": [false, false, false]
  },
  "tasks": [
    {
      "id": 0,
      "address": "10.0.0.0",
      "slice": 0,
      "devices": [
        {"id": 0, "coords": [0, 0, 0], "core": 0, "core_id": 0, "ordinal": 0},
        {"id": 1, "coords": [1, 0, 0], "core": 0, "core_id": 2, "ordinal": 1},
        {"id": 2, "coords": [0, 1, 0], "core": 0, "core_id": 4, "ordinal": 2},
        {"id": 3, "coords": [1, 1, 0], "core": 0, "core_id": 6, "ordinal": 3}
      ]
    }
  ],
  "all_core_ids": [0, 2, 4, 6],
  "device_counts": [4],
  "mesh_shape": [2, 2, 1, 1],
  "device_coordinates": [0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0],
  "device_coordinates_dims": [1, 4, 4],
  "topology_proto": "CgQCAgEBEAEYBCIQAAAAAAEAAAAAAQAAAQEAAA==",
  "slice_topologies": [],
  "meshes": [],
  "generation": 1
}
"""

SLICES: list[dict[str, Any]] = [
    {"accelerator": "v4-8"},
    {"accelerator": "v4-32"},
    {"accelerator": "v4-16", "megacore": False},
    {"accelerator": "v3-32"},
    {"accelerator": "v5litepod-16", "chips_per_host": 8},
    {"accelerator": "tpu7x-16"},
    {"accelerator": "v6e-64"},
    {"accelerator": "v5p-128"},
    {"accelerator": "v5litepod-16", "num_slices": 2},
    # several TPU processes per machine: the machine block is written beside the task's
    {"accelerator": "tpu7x-16", "chips_per_process_bounds": (1, 2, 1)},
    {"accelerator": "v4-32", "chips_per_process_bounds": (1, 1, 1), "num_slices": 2},
]
SLICE_IDS = ["-".join(str(v).replace(", ", "x") for v in kw.values()) for kw in SLICES]


def test_golden_v4_8() -> None:
    assert to_json(sim_mapping(accelerator="v4-8")) == GOLDEN_V4_8


def test_a_machine_of_several_tasks_is_written_beside_the_task_block() -> None:
    data = json.loads(to_json(sim_mapping(accelerator="tpu7x-16", chips_per_process_bounds=(1, 2, 1))))
    assert data["slice"]["chips_per_host_bounds"] == [1, 2, 1]
    assert data["slice"]["chips_per_machine_bounds"] == [2, 2, 1]
    assert "chips_per_machine_bounds" not in json.loads(to_json(sim_mapping()))["slice"]  # older readers' file


def test_json_is_proto3_json_of_the_schema() -> None:
    data = json.loads(to_json(sim_mapping()))
    assert data["incarnation"] == str(INCARNATION)  # 64-bit: a string, as proto3 JSON says
    assert list(data) == [
        "schema_version", "cluster", "incarnation", "created", "slice", "tasks", "all_core_ids", "device_counts",
        "mesh_shape", "device_coordinates", "device_coordinates_dims", "topology_proto", "slice_topologies", "meshes",
        "generation",
    ]  # fmt: skip
    assert data["tasks"][3]["devices"][1] == {"id": 13, "coords": [1, 0, 3], "core": 0, "core_id": 26, "ordinal": 1}


def test_incarnation_as_a_json_number_is_read_too() -> None:
    text = to_json(sim_mapping(incarnation=12345)).replace('"incarnation": "12345"', '"incarnation": 12345')
    assert from_json(text).incarnation == 12345


@pytest.mark.parametrize("kw", SLICES, ids=SLICE_IDS)
def test_round_trip(kw: dict[str, Any], tmp_path: Any) -> None:
    mapping = sim_mapping(**kw)
    assert from_json(to_json(mapping)) == mapping
    path = write_mapping(tmp_path / "mapping.json", mapping)
    assert read_mapping(path) == mapping
    assert path.read_text() == to_json(mapping)


@pytest.mark.parametrize("kw", SLICES, ids=SLICE_IDS)
def test_every_host_writes_the_same_bytes(kw: dict[str, Any], tmp_path: Any) -> None:
    """Each host merges what arrived in its own order and builds its own value: the files are identical."""
    tpu = resolve_slice(**kw)
    sim = SimBackend(tpu)
    reports = {t: sim.local_core_ids(t) for t in range(tpu.num_hosts)}
    hosts = {t: f"host-{t}.example:8470" for t in range(tpu.num_hosts)}
    files = []
    for host in range(tpu.num_hosts):
        order = list(reports)
        random.Random(host).shuffle(order)
        merged = merge_core_ids({t: list(reports[t]) for t in order}, tpu)
        # Some hosts pass the addresses as a mapping, some as a list; some time in another zone.
        addresses: Any = hosts if host % 2 else [hosts[t] for t in range(tpu.num_hosts)]
        created = CREATED.astimezone(timezone(timedelta(hours=host % 3)))
        mapping = build_mapping(
            slice=tpu,
            cluster="pod-b",
            incarnation=7,
            hosts=addresses,
            merged=merged,
            topology=build_topologies(merged, tpu),
            created=created,
        )
        files.append(write_mapping(tmp_path / f"host{host}" / "mapping.json", mapping).read_bytes())
    assert all(f == files[0] for f in files)


def test_created_may_be_posix_seconds() -> None:
    tpu = resolve_slice(accelerator="v4-8")
    merged = merge_core_ids({0: [0, 2, 4, 6]}, tpu)
    mapping = build_mapping(
        slice=tpu,
        cluster="c",
        incarnation=1,
        hosts=["h"],
        merged=merged,
        topology=build_topology(merged, tpu),
        created=1735787045.5,
    )
    assert mapping.created == datetime(2025, 1, 2, 3, 4, 5, 500000, tzinfo=timezone.utc)
    with pytest.raises(ValueError, match="timezone-aware"):
        build_mapping(
            slice=tpu,
            cluster="c",
            incarnation=1,
            hosts=["h"],
            merged=merged,
            topology=build_topology(merged, tpu),
            created=datetime(2025, 1, 1),
        )
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        build_mapping(
            slice=tpu,
            cluster="c",
            incarnation=-1,
            hosts=["h"],
            merged=merged,
            topology=build_topology(merged, tpu),
            created=CREATED,
        )


def test_properties_single_slice() -> None:
    mapping = sim_mapping(accelerator="v5litepod-16")
    assert mapping.num_tasks == 4
    assert [d.id for d in mapping.devices_of_task(1)] == [2, 3, 6, 7]
    assert mapping.get_task(1).devices == mapping.devices_of_task(1)
    assert mapping.devices_of_task(3)[2] == MappedDevice(id=14, coords=(2, 3, 0), core=0, core_id=14, ordinal=2)
    assert mapping.mesh_shape == (4, 4, 1, 1)
    assert mapping.device_coordinates[1][0] == (2, 0, 0, 0)
    assert parse_topology_proto(mapping.topology_proto_bytes) == mapping.topology
    assert mapping.topology_of_task(2) is mapping.topology
    assert len(mapping.devices) == 16
    with pytest.raises(MappingError, match=r"task 4 is not in the device mapping of cluster 'pod-a' \(tasks 0\.\.3\)"):
        mapping.devices_of_task(4)


def test_properties_multislice() -> None:
    mapping = sim_mapping(accelerator="v5litepod-8", num_slices=2)
    assert [t.slice for t in mapping.tasks] == [0, 1]
    assert mapping.devices_of_task(1)[0].id == 200000
    assert mapping.topology_of_task(1) == mapping.topology_of_slice(1)
    with pytest.raises(MappingError, match="has 2 slices, one topology each") as info:
        _ = mapping.mesh_shape
    assert "topology_of_slice" in str(info.value.hint)
    with pytest.raises(MappingError, match="slice 2 is not in the device mapping"):
        mapping.topology_of_slice(2)


def test_devices_follow_the_reported_core_ids() -> None:
    """A host whose task id does not match its position still gets the devices it reported."""
    tpu = resolve_slice(accelerator="v4-16")
    merged = merge_core_ids({0: [8, 10, 12, 14], 1: [0, 2, 4, 6]}, tpu)
    mapping = build_mapping(
        slice=tpu,
        cluster="c",
        incarnation=1,
        hosts=["a", "b"],
        merged=merged,
        topology=build_topology(merged, tpu),
        created=CREATED,
    )
    assert [d.id for d in mapping.devices_of_task(0)] == [4, 5, 6, 7]
    assert mapping.device_coordinates[0][0] == (0, 0, 1, 0)
    assert from_json(to_json(mapping)) == mapping


def test_build_mapping_refuses_mismatched_pieces() -> None:
    tpu = resolve_slice(accelerator="v4-16", num_slices=2)
    sim = SimBackend(tpu)
    merged = merge_core_ids({t: sim.local_core_ids(t) for t in range(4)}, tpu)
    hosts = ["a", "b", "c", "d"]
    with pytest.raises(ClusterError, match=r"1 topology\(ies\) for 2 slice\(s\): pass build_topologies"):
        build_mapping(
            slice=tpu,
            cluster="c",
            incarnation=1,
            hosts=hosts,
            merged=merged,
            topology=build_topology(merged, tpu),
            created=CREATED,
        )
    with pytest.raises(ClusterError, match=r"host addresses for tasks \[0, 1, 3\]; expected tasks 0\.\.2"):
        build_mapping(
            slice=tpu,
            cluster="c",
            incarnation=1,
            hosts={0: "a", 1: "b", 3: "d"},
            merged=merged,
            topology=build_topologies(merged, tpu),
            created=CREATED,
        )
    with pytest.raises(ClusterError, match=r"3 host address\(es\) and 4 merged task\(s\) for 4 hosts"):
        build_mapping(
            slice=tpu,
            cluster="c",
            incarnation=1,
            hosts=hosts[:3],
            merged=merged,
            topology=build_topologies(merged, tpu),
            created=CREATED,
        )
    swapped = {t: sim.local_core_ids(t) for t in range(4)}
    swapped[0] = [0, 2, 6, 4]
    other = build_topologies(merge_core_ids(swapped, tpu), tpu)
    with pytest.raises(ClusterError, match="device_coordinates of slice 0 do not match"):
        build_mapping(
            slice=tpu, cluster="c", incarnation=1, hosts=hosts, merged=merged, topology=other, created=CREATED
        )


def test_meshes_round_trip() -> None:
    from dataclasses import replace

    mapping = sim_mapping(accelerator="v4-8")
    mesh = MappedMesh("dp", (MeshAxis("x", 2), MeshAxis("y", 2)), (0, 1, 3, 2), "dtensor_ring")
    with_mesh = replace(mapping, meshes=(mesh,))
    assert from_json(to_json(with_mesh)) == with_mesh
    bad = replace(mapping, meshes=(replace(mesh, device_ids=(0, 1, 3, 9)),))
    with pytest.raises(MappingError, match=r"mesh 'dp' names device ids that are not in the mapping: \[9\]"):
        from_json(to_json(bad))
    short = replace(mapping, meshes=(replace(mesh, device_ids=(0, 1, 3)),))
    with pytest.raises(MappingError, match="mesh 'dp' has 3 device ids; its axes hold 4"):
        from_json(to_json(short))


@settings(max_examples=25, deadline=None)
@given(
    cluster=st.text(min_size=1, max_size=20),
    incarnation=st.integers(0, 2**64 - 1),
    created=st.datetimes(
        min_value=datetime(1970, 1, 2), max_value=datetime(9000, 1, 1), timezones=st.just(timezone.utc)
    ),
)
def test_round_trip_any_header(cluster: str, incarnation: int, created: datetime) -> None:
    from dataclasses import replace

    mapping = replace(sim_mapping(accelerator="v4-8"), cluster=cluster, incarnation=incarnation, created=created)
    assert from_json(to_json(mapping)) == mapping
