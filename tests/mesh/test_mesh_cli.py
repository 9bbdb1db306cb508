"""``tpuctl mesh plan`` and ``tpuctl topology show --mesh`` through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpuctl.backends.sim import SimBackend
from tpuctl.cli import main
from tpuctl.mapping.file import write_mapping
from tpuctl.mapping.model import build_mapping, merged_devices
from tpuctl.mesh.build import build_declared_meshes
from tpuctl.spec.yamlfile import load_spec
from tpuctl.tpu.topology import build_topologies, merge_core_ids

SPEC = """\
cluster: pod-a
accelerator: v4-32
backend: sim
hosts: [10.0.0.1, 10.0.0.2, 10.0.0.3, 10.0.0.4]
meshes:
  - {name: dp_mp, shape: {data: 4, model: 4}}
  - {name: j, shape: {data: 2, model: 8}, mode: jax, options: {allow_split_physical_axes: true}}
"""


def run(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(SPEC)
    return path


@pytest.fixture
def mapping_file(spec_file: Path, tmp_path: Path) -> Path:
    spec = load_spec(spec_file)
    sim = SimBackend(spec.slice)
    merged = merge_core_ids({t: sim.local_core_ids(t) for t in range(spec.slice.num_hosts)}, spec.slice)
    meshes = build_declared_meshes(spec.meshes, spec.slice, merged_devices(spec.slice, merged))
    mapping = build_mapping(
        slice=spec.slice,
        cluster=spec.cluster,
        incarnation=1,
        hosts=list(spec.hosts),
        merged=merged,
        topology=build_topologies(merged, spec.slice),
        created=0.0,
        meshes=meshes,
    )
    return write_mapping(tmp_path / "mapping.json", mapping)


def test_plan_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run("mesh", "plan", "--accelerator", "v4-32", "--shape", "data=4,model=4", capsys=capsys)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "mesh data_model: data=4 x model=4 = 16 devices, mode ring (algorithm ring)"
    assert lines[1] == "slice v4-32 (2x2x4, 4 hosts), wraparound x=no y=no z=no"
    assert "data=1      4        5        7        6" in lines
    assert any(line.startswith("model  4     yes         yes   1        1            ring") for line in lines)
    assert any(line.startswith("DTensor mesh (task 0): data_model|data=4,model=4|0,1,2,") for line in lines)


def test_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        "mesh", "plan", "-a", "v5p-128", "--shape", "data=16,model=4", "--mode", "jax", "-f", "json", capsys=capsys
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["axes"] == [{"name": "data", "size": 16}, {"name": "model", "size": 4}]
    assert doc["mode"] == "jax" and len(doc["device_ids"]) == 16 and doc["device_ids"][1] == [16, 17, 18, 19]
    assert [q["axis"] for q in doc["quality"]] == ["data", "model"] and doc["quality"][1]["ring"] is True
    assert doc["dtensor_mesh"].startswith("data_model|data=16,model=4|0,1,")
    assert len(doc["local_device_ids"]) == 16


def test_plan_options(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "plan.json"
    code, out, err = run(
        "mesh", "plan", "-a", "v3-32", "--shape", "data=8,model=4", "--ring-axes", "z,y,x,core", "--compat",
        "dtensor", "--name", "cols", "-f", "json", "--out", str(out_file), capsys=capsys,
    )  # fmt: skip
    assert code == 0 and out == "" and err == f"wrote {out_file}\n"
    doc = json.loads(out_file.read_text())
    assert doc["name"] == "cols" and doc["algorithm"] == "ring:dtensor"
    assert doc["device_ids"][0] == [0, 24, 16, 8]
    code, out, _ = run(
        "mesh", "plan", "-a", "v5litepod-16", "--num-slices", "2", "--shape", "data=8,model=4", "--dcn-shape",
        "model=2", "--mode", "jax", "--allow-split-physical-axes", "-f", "json", capsys=capsys,
    )  # fmt: skip
    assert code == 0 and json.loads(out)["dcn_shape"] == [1, 2]
    code, out, _ = run(
        "mesh", "plan", "-a", "v4-32", "-s", "all=16", "--ring-dims", "1", "--cells", "coords", capsys=capsys
    )
    assert code == 0 and "all=0   (1,0,0)  (1,1,0)  (0,1,0)  (0,1,1)" in out  # DTensor's 3D snake
    assert "all   16    yes         yes   1        1            ring" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["-s", "data=4,model=8"],
            "mesh 'data_model': data=4 x model=8 = 32 devices, but v4-32 (2x2x4, 4 hosts) has 16 devices",
        ),
        (["-s", "data:4"], "--shape 'data:4': 'data:4' is not NAME=SIZE"),
        # digits are ASCII: int() alone reads ARABIC-INDIC FOUR as 4 (issue 24)
        (["-s", "data=\u0664,model=4"], "--shape 'data=\u0664,model=4': 'data=\u0664' is not NAME=SIZE"),
        (["-s", "data=4,model=4", "--ring-bounds", "1,\u0662,1,1"], "--ring-bounds '1,\u0662,1,1' is not a list of integers"),
        (["-s", "data=4,model=4", "--mode", "jax", "--ring-dims", "1"], "mode jax has no option 'ring_dims'"),
        (
            ["-s", "data=4,model=4", "--ring-bounds", "1,16,1,1"],
            "ring_bounds [1, 16, 1, 1] do not divide the slice's bounds",
        ),
        (["-s", "data=4,model=4", "--dcn-shape", "2,1"], "dcn_shape [2, 1] makes 2 slices, but the cluster has 1"),
        (["-s", "data=4,model=4", "--whole-hosts", "--ring-dims", "0"], "too small to keep hosts of 4 devices whole"),
    ],
)
def test_plan_errors(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, out, err = run("mesh", "plan", "-a", "v4-32", *args, capsys=capsys)
    assert code == 2 and out == ""
    assert message in err and "Traceback" not in err


def test_plan_needs_a_slice(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run("mesh", "plan", "-s", "x=4", capsys=capsys)
    assert code == 2 and "name the slice: --accelerator, or --generation with --topology" in err


def test_topology_show_mesh_from_spec_and_mapping(
    capsys: pytest.CaptureFixture[str], spec_file: Path, mapping_file: Path
) -> None:
    code, from_spec, _ = run("topology", "show", "--config", str(spec_file), "--mesh", "dp_mp", capsys=capsys)
    assert code == 0 and "mesh dp_mp: data=4 x model=4 = 16 devices" in from_spec
    code, from_mapping, _ = run("topology", "show", "--mapping", str(mapping_file), "--mesh", "dp_mp", capsys=capsys)
    assert code == 0 and from_mapping == from_spec  # the mapping holds what the spec builds
    code, out, _ = run("topology", "show", "--mapping", str(mapping_file), "--mesh", "j", "-f", "json", capsys=capsys)
    doc = json.loads(out)
    assert doc["accelerator"] == "v4-32" and doc["mesh"]["name"] == "j" and doc["mesh"]["mode"] == "jax"


def test_topology_show_mesh_errors(capsys: pytest.CaptureFixture[str], spec_file: Path, mapping_file: Path) -> None:
    code, _, err = run("topology", "show", "--config", str(spec_file), "--mesh", "dp_pm", capsys=capsys)
    assert code == 2 and "declares no mesh 'dp_pm' (meshes: dp_mp, j)" in err and "did you mean 'dp_mp'?" in err
    code, _, err = run("topology", "show", "--mapping", str(mapping_file), "--mesh", "dp_pm", capsys=capsys)
    assert code == 7 and "has no mesh 'dp_pm'" in err
    code, _, err = run("topology", "show", "-a", "v4-32", "--mesh", "dp_mp", capsys=capsys)
    assert code == 2 and "--mesh needs --config" in err
    code, _, err = run("topology", "show", "--config", str(spec_file), "--mesh-axis", "data", capsys=capsys)
    assert code == 2 and "--mesh-axis goes with --mesh NAME --format svg" in err


def test_topology_show_mesh_svg(capsys: pytest.CaptureFixture[str], spec_file: Path, tmp_path: Path) -> None:
    picture = tmp_path / "mesh.svg"
    args = ["topology", "show", "--config", str(spec_file), "--mesh", "dp_mp", "-f", "svg", "--out", str(picture)]
    code, _, _ = run(*args, "--mesh-axis", "data", capsys=capsys)
    assert code == 0
    svg = picture.read_text()
    assert "mesh dp_mp: axis data (4 devices a line): open: consecutive devices are neighbours" in svg
    assert svg.count('class="mesh mesh-close mesh-far"') == 4  # each z-line closes over 3 hops
    assert svg.count("<circle") == 4
    code, _, _ = run(*args, capsys=capsys)  # default: the last axis, rings in each z-plane
    svg = picture.read_text()
    assert "axis model (4 devices a line): ring" in svg and "mesh-far" not in svg.split("</style>")[1]
    code, _, err = run(*args, "--mesh-axis", "modle", capsys=capsys)
    assert code == 2 and "mesh 'dp_mp' has no axis 'modle'" in err
