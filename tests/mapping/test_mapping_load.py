"""load_mapping refuses every bad file with a MappingError that names the file and says what to do."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mapping_cases import sim_mapping

import tpuctl
from tpuctl.errors import MappingError
from tpuctl.job.env import MAPPING_ENV
from tpuctl.mapping.file import read_mapping, to_json, write_mapping
from tpuctl.mapping.model import DeviceMapping
from tpuctl.tpu.topology import DTensorTopology, serialize_topology_proto

GOOD = sim_mapping(accelerator="v5litepod-16")
GOOD_TEXT = to_json(GOOD)
MULTI_TEXT = to_json(sim_mapping(accelerator="v5litepod-8", num_slices=2))
REINIT = "re-run `tpuctl init` on every host"


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "mapping.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def refused(path: Path) -> MappingError:
    with pytest.raises(MappingError) as info:
        read_mapping(path)
    assert info.value.exit_code == 7
    assert str(path) in info.value.message
    return info.value


def edited(change: Callable[[dict[str, Any]], object], text: str = GOOD_TEXT) -> str:
    data = json.loads(text)
    change(data)
    return json.dumps(data, indent=1)


# --- finding the file ------------------------------------------------------------------------------


def test_path_from_the_environment(tmp_path: Path) -> None:
    path = write_mapping(tmp_path / "m.json", GOOD)
    loaded = tpuctl.load_mapping(environ={MAPPING_ENV: str(path)}, task=0)
    assert isinstance(loaded, DeviceMapping) and loaded.tasks == GOOD.tasks and loaded.task == 0


def test_no_path_and_no_environment() -> None:
    with pytest.raises(MappingError) as info:
        tpuctl.load_mapping(environ={})
    assert str(info.value) == (
        "no device mapping file given and $TPUCTL_MAPPING is not set\n"
        'hint: start the job with `tpuctl run -- CMD`, or `eval "$(tpuctl env)"` first'
    )


def test_missing_file(tmp_path: Path) -> None:
    error = refused(tmp_path / "nope.json")
    assert error.message == f"no device mapping file at {tmp_path / 'nope.json'}"
    assert "run `tpuctl init` on this host first" in str(error.hint)


def test_a_folder_is_not_a_file(tmp_path: Path) -> None:
    assert "cannot read device mapping" in refused(tmp_path).message


# --- damaged files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   \n"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    error = refused(write(tmp_path, text))
    assert error.message.endswith(": the file is empty")
    assert REINIT in str(error.hint)


def test_truncated_file_names_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_TEXT[: GOOD_TEXT.index('"all_core_ids"') + 20])
    error = refused(path)
    lines = GOOD_TEXT[: GOOD_TEXT.index('"all_core_ids"') + 20].count("\n") + 1
    assert error.message.startswith(f"{path}:{lines}:")
    assert "truncated" in error.message
    assert "the file is damaged" in str(error.hint) and REINIT in str(error.hint)


def test_garbage_is_not_json(tmp_path: Path) -> None:
    path = write(tmp_path, '{\n  "schema_version": 1,\n  oops\n}\n')
    assert refused(path).message == f"{path}:3:3: not valid JSON: Expecting property name enclosed in double quotes"


def test_binary_garbage(tmp_path: Path) -> None:
    path = write(tmp_path, b"\x89PNG\r\n\x1a\n\xff\xfe")
    assert refused(path).message == f"{path}: not UTF-8 text (byte 0): not a device mapping file"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, len(GOOD_TEXT.rstrip()) - 1))
def test_every_truncation_is_refused(tmp_path: Path, cut: int) -> None:
    refused(write(tmp_path, GOOD_TEXT[:cut]))


# --- wrong schema ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[1, 2]", "the file holds a JSON list, not a device mapping object"),
        ('{"accelerator": "v4-32"}', "no schema_version: this is not a tpuctl device mapping file"),
        (edited(lambda d: d.update(schema_version=2)), "schema_version 2 is not one this tpuctl reads (1)"),
        (edited(lambda d: d.update(schema_version="1")), "schema_version '1' is not one this tpuctl reads (1)"),
        (
            edited(lambda d: d.update(taks=[])),
            "not the device mapping schema: unknown field 'taks' (did you mean 'tasks'?)",
        ),
        (
            edited(lambda d: d["tasks"][2]["devices"][1].update(cord=[0, 0, 0])),
            "unknown field 'tasks[2].devices[1].cord' (did you mean 'coords'?)",
        ),
        (edited(lambda d: d["slice"].update(allCoreIds=[])), "unknown field 'slice.allCoreIds'"),
        (edited(lambda d: d["tasks"][0].update(id="zero")), "does not match the device mapping schema"),
        (
            GOOD_TEXT.replace('"cluster": "pod-a",', '"cluster": "pod-a", "cluster": "b",'),
            "key 'cluster' appears twice",
        ),
    ],
)
def test_wrong_schema(tmp_path: Path, text: str, why: str) -> None:
    error = refused(write(tmp_path, text))
    assert why in error.message


def test_newer_schema_hint(tmp_path: Path) -> None:
    error = refused(write(tmp_path, edited(lambda d: d.update(schema_version=2))))
    assert "use the same version for init and jobs" in str(error.hint)


# --- inconsistent files ----------------------------------------------------------------------------


def swap_core_ids(d: dict[str, Any]) -> None:
    a, b = d["tasks"][0]["devices"][0], d["tasks"][2]["devices"][1]
    b["core_id"] = a["core_id"]


FLIPPED = DTensorTopology((4, 4, 1, 1), tuple(reversed(GOOD.topology.device_coordinates)))


def other_topology_proto(d: dict[str, Any]) -> None:
    d["topology_proto"] = base64.b64encode(serialize_topology_proto(FLIPPED)).decode()


def other_topology(d: dict[str, Any]) -> None:
    other_topology_proto(d)
    d["device_coordinates"] = list(FLIPPED.flat_device_coordinates)


INCONSISTENT = [
    (lambda d: d["tasks"][1]["devices"].pop(), "task 1 reported 3 device(s)"),
    (lambda d: d.update(device_counts=[4, 4, 4, 5]), "device_counts [4, 4, 4, 5] do not match the tasks' devices"),
    (swap_core_ids, "core id 0 is claimed by task 0 (device 0) and task 2 (device 1)"),
    (lambda d: d["all_core_ids"].reverse(), "all_core_ids do not match the tasks' devices' core ids"),
    (
        lambda d: d["device_coordinates"].__setitem__(4, 3),
        "topology_proto puts task 0 device 1 at [1, 0, 0, 0]; device",
    ),
    (
        lambda d: d.update(mesh_shape=[4, 4, 2, 1]),
        "topology_proto has mesh_shape [4, 4, 1, 1]; mesh_shape is [4, 4, 2, 1]",
    ),
    (
        lambda d: d.update(device_coordinates_dims=[2, 8, 4]),
        "topology_proto has 4 tasks x 4 devices; device_coordinates_dims",
    ),
    (other_topology_proto, "topology_proto puts task 0 device 0 at [2, 2, 0, 0]; device_coordinates say [0, 0, 0, 0]"),
    (other_topology, "device_coordinates do not match the tasks' device coordinates"),
    (lambda d: d.update(topology_proto="AAAA"), "bad TopologyProto: field 0 with wire type 0"),
    (lambda d: d.update(topology_proto=""), "bad TopologyProto: empty input"),
    (lambda d: d.update(device_coordinates_dims=[4, 4]), "device_coordinates_dims [4, 4] should be"),
    (lambda d: d["tasks"][3]["devices"][0].update(id=99), "task 3 device 0 is id 99 at [2, 2, 0] core 0 ordinal 0;"),
    (lambda d: d["tasks"][3]["devices"][0].update(coords=[0, 0, 0]), "core id 10 is id 10 at [2, 2, 0]"),
    (lambda d: d["tasks"][3]["devices"][0].update(coords=[0, 0]), "task 3 device 0 coords has 2 values"),
    (lambda d: d["tasks"][3].update(id=7), "task #3 has id 7"),
    (lambda d: d["tasks"][3].update(slice=1), "task 3 is in slice 1; it belongs to slice 0"),
    (lambda d: d["tasks"][3].update(address=""), "task 3 has no address"),
    (lambda d: d["tasks"].pop(), "3 task(s); v5litepod-16 (4x4, 4 hosts) has 4"),
    (
        lambda d: d["slice"].update(accelerator_type="v5litepod-32"),
        "slice: generation, topology, chips_per_host_bounds",
    ),
    (lambda d: d["slice"].update(generation="v9"), "slice.generation 'v9' is not a TPU generation tpuctl knows"),
    (lambda d: d["slice"].update(megacore=True), "slice: v5e chips are never megacore"),
    (lambda d: d["slice"].update(topology=[4, 4]), "slice.topology has 2 values; expected 3"),
    (lambda d: d.pop("slice"), "the mapping has no slice"),
    (lambda d: d.pop("created"), "the mapping has no created time"),
    (lambda d: d.update(slice_topologies=[{"slice": 0}]), "a single-slice mapping keeps its topology in mesh_shape"),
]


@pytest.mark.parametrize(("change", "why"), INCONSISTENT)
def test_inconsistent_file(tmp_path: Path, change: Callable[[dict[str, Any]], object], why: str) -> None:
    error = refused(write(tmp_path, edited(change)))
    assert why in error.message
    assert REINIT in str(error.hint)


def test_inconsistent_multislice(tmp_path: Path) -> None:
    def move_topology(d: dict[str, Any]) -> None:
        d["mesh_shape"] = d["slice_topologies"][0]["mesh_shape"]

    assert "keeps one topology per slice in slice_topologies (found 2) and none at the top level" in (
        refused(write(tmp_path, edited(move_topology, MULTI_TEXT))).message
    )

    def renumber(d: dict[str, Any]) -> None:
        d["slice_topologies"][1]["tasks"] = [0]

    assert "slice_topologies[1] is for slice 1 with tasks [0]; expected slice 1 with tasks [1]" in (
        refused(write(tmp_path, edited(renumber, MULTI_TEXT))).message
    )


def test_inconsistency_message_shape(tmp_path: Path) -> None:
    path = write(tmp_path, edited(lambda d: d.update(device_counts=[4, 4, 4, 5])))
    assert refused(path).message == (
        f"{path}: inconsistent device mapping (1 problem(s))\n"
        "  device_counts [4, 4, 4, 5] do not match the tasks' devices [4, 4, 4, 4]"
    )


# --- staying light ---------------------------------------------------------------------------------


def test_loading_imports_no_grpc_click_or_tensorflow(tmp_path: Path) -> None:
    path = write_mapping(tmp_path / "m.json", GOOD)
    code = (
        "import sys, tpuctl\n"
        f"tpuctl.load_mapping({str(path)!r}, task=0)\n"
        "heavy = ('grpc', 'click', 'tensorflow', 'jax', 'numpy', 'yaml', 'asyncio',\n"
        "         'tpuctl.mesh.build', 'tpuctl.mesh.ring', 'tpuctl.mesh.jaxmode')\n"
        "heavy = [m for m in heavy if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
