"""Building declared meshes: checks and messages, the mapping's meshes (write, load, refuse edits)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from tpuctl.backends.sim import SimBackend
from tpuctl.errors import InputError, MappingError
from tpuctl.mapping.file import from_json, to_json
from tpuctl.mapping.model import DeviceMapping, build_mapping, merged_devices
from tpuctl.mesh.build import build_declared_meshes, build_mesh
from tpuctl.mesh.model import MeshSpec
from tpuctl.spec.yamlfile import load_spec_text
from tpuctl.tpu.slice import TpuSlice, resolve_slice
from tpuctl.tpu.topology import build_topologies, merge_core_ids

SPEC = """\
cluster: pod-a
accelerator: v4-32
backend: sim
hosts: [10.0.0.1, 10.0.0.2, 10.0.0.3, 10.0.0.4]
meshes:
  - {name: dp_mp, shape: {data: 4, model: 4}}
  - {name: one_ring, shape: {all: 16}, mode: ring, options: {ring_dims: 1}}
  - {name: jax_mesh, shape: {data: 2, model: 8}, mode: jax, options: {allow_split_physical_axes: true}}
"""


def mapping_with_meshes(
    tpu: TpuSlice, specs: tuple[MeshSpec, ...], reports: dict[int, list[int]] | None = None
) -> DeviceMapping:
    """What the agent does: merge, build the declared meshes over the merged devices, build the mapping."""
    sim = SimBackend(tpu)
    per_task = reports or {t: sim.local_core_ids(t) for t in range(tpu.num_hosts)}
    merged = merge_core_ids(per_task, tpu)
    meshes = build_declared_meshes(specs, tpu, merged_devices(tpu, merged))
    hosts = [f"10.0.0.{t + 1}" for t in range(tpu.num_hosts)]
    return build_mapping(
        slice=tpu,
        cluster="pod-a",
        incarnation=7,
        hosts=hosts,
        merged=merged,
        topology=build_topologies(merged, tpu),
        created=0.0,
        meshes=meshes,
    )


def test_spec_to_mapping_and_back() -> None:
    spec = load_spec_text(SPEC)
    mapping = mapping_with_meshes(spec.slice, spec.meshes)
    assert [m.name for m in mapping.meshes] == ["dp_mp", "one_ring", "jax_mesh"]
    assert [m.algorithm for m in mapping.meshes] == ["ring", "ring", "jax"]
    text = to_json(mapping)
    assert from_json(text) == mapping
    record = json.loads(text)["meshes"][0]
    assert record["axes"] == [{"name": "data", "size": 4}, {"name": "model", "size": 4}]
    assert record["tasks"][1] == {"task": 1, "local_device_ids": [4, 5, 7, 6]}
    assert record["dtensor_mesh"].startswith("dp_mp|data=4,model=4|0,1,2,3,")
    assert record["dtensor_host_mesh"].startswith("|data=4,model=4|")
    assert [q["ring"] for q in record["quality"]] == [False, True]
    assert mapping.mesh_local_device_ids("dp_mp", 1) == (4, 5, 7, 6)
    assert mapping.dtensor_mesh_string("dp_mp", 0) == record["dtensor_mesh"]
    assert mapping.dtensor_mesh_string("dp_mp", 0, host=True) == record["dtensor_host_mesh"]
    assert mapping.mesh_core_ids("dp_mp")[:4] == (0, 2, 6, 4)  # megacore: chip i is core 2i


def test_meshes_follow_the_devices_the_merge_found() -> None:
    """Hosts may report their devices in another order than the slice model's; local ids follow them."""
    tpu = resolve_slice(accelerator="v4-32")
    sim = SimBackend(tpu)
    reports = {t: sim.local_core_ids(t) for t in range(tpu.num_hosts)}
    reports[0] = list(reversed(reports[0]))
    mapping = mapping_with_meshes(tpu, (MeshSpec("dp", (("data", 4), ("model", 4))),), reports)
    assert mapping.mesh_local_device_ids("dp", 0) == (2, 3, 1, 0)
    assert from_json(to_json(mapping)) == mapping


def test_multislice_mapping() -> None:
    tpu = resolve_slice(accelerator="v5litepod-16", num_slices=2)
    mapping = mapping_with_meshes(tpu, (MeshSpec("dp", (("data", 8), ("model", 4)), "jax", (("dcn_shape", (2, 1)),)),))
    mesh = mapping.mesh("dp")
    assert mesh.dcn_shape == (2, 1) and mesh.device_ids[0] == 100000 and mesh.device_ids[16] == 200000
    assert from_json(to_json(mapping)) == mapping


def _edited(mapping: DeviceMapping, edit: Any) -> str:
    data = json.loads(to_json(mapping))
    edit(data["meshes"][0])
    return json.dumps(data)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m["device_ids"].__setitem__(1, m["device_ids"][0]), "names device ids more than once: [0]"),
        (lambda m: m.update(device_ids=m["device_ids"][:-1]), "has 15 device ids; its axes hold 16"),
        (lambda m: m["axes"][1].update(name="data"), "has repeated, reserved or empty axis names: ['data']"),
        (lambda m: m["axes"][1].update(name="unsharded"), "reserved"),
        (lambda m: m.update(dcn_shape=[2, 1]), "has dcn_shape [2, 1]; expected slices per axis"),
        (lambda m: m["tasks"][0].update(local_device_ids=[0, 1, 2, 3]), "its local_device_ids do not match"),
        (
            lambda m: m.update(dtensor_mesh=m["dtensor_mesh"].replace("dp_mp|", "other|")),
            "its dtensor_mesh do not match",
        ),
        (lambda m: m["quality"][0].update(ring=True), "its quality figures do not match its device order"),
    ],
)
def test_load_refuses_edited_meshes(edit: Any, message: str) -> None:
    spec = load_spec_text(SPEC)
    mapping = mapping_with_meshes(spec.slice, spec.meshes)
    with pytest.raises(MappingError) as info:
        from_json(_edited(mapping, edit))
    assert message in info.value.message


def test_a_mesh_must_hold_every_device() -> None:
    tpu = resolve_slice(accelerator="v4-16")
    mapping = mapping_with_meshes(tpu, (MeshSpec("dp", (("data", 2), ("model", 4))),))
    half = replace(
        mapping.meshes[0], axes=mapping.meshes[0].axes[1:], device_ids=mapping.meshes[0].device_ids[:4], quality=()
    )
    with pytest.raises(MappingError, match="holds 4 of the cluster's 8 devices; a mesh uses every device"):
        from_json(to_json(replace(mapping, meshes=(half,))))


def test_mesh_lookup_suggests() -> None:
    mapping = mapping_with_meshes(resolve_slice(accelerator="v4-8"), (MeshSpec("dp_mp", (("data", 2), ("model", 2))),))
    with pytest.raises(MappingError, match="has no mesh 'dp_pm'") as info:
        mapping.mesh("dp_pm")
    assert info.value.hint == "did you mean 'dp_mp'?"


# --- spec checks (the spec module checks these too; the builder is the last line for the CLI and API) ---

V4_32 = resolve_slice(accelerator="v4-32")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            MeshSpec("m", (("data", 4), ("model", 8))),
            "mesh 'm': data=4 x model=8 = 32 devices, but v4-32 (2x2x4, 4 hosts) has 16 devices",
        ),
        (MeshSpec("m", (("data", 4), ("data", 4))), "mesh 'm': axis 'data' appears twice; axis names must be unique"),
        (MeshSpec("m", (("match", 4), ("model", 4))), "mesh 'm': axis name 'match' is reserved"),
        (
            MeshSpec("m", (("data", 4), ("model", 4)), "rings"),
            "mesh 'm': mode 'rings' is not a mesh mode; did you mean 'ring'?",
        ),
        (
            MeshSpec("m", (("data", 4), ("model", 4)), "ring", (("ring_dim", 1),)),
            "mesh 'm': mode ring has no option 'ring_dim'",
        ),
        (
            MeshSpec("m", (("data", 4), ("model", 4)), "jax", (("ring_dims", 1),)),
            "mesh 'm': mode jax has no option 'ring_dims'",
        ),
        (
            MeshSpec("m", (("data", 4), ("model", 4)), "ring", (("ring_bounds", (2, 2, 3, 1)),)),
            "do not divide the slice's bounds [2, 2, 4, 1] (x, y, z, core): z=3",
        ),
        (
            MeshSpec("m", (("data", 2), ("model", 8)), "jax", (("contiguous_submeshes", True),)),
            "Available mesh_shapes: [(4, 4)]",
        ),
    ],
)
def test_builder_messages(spec: MeshSpec, message: str) -> None:
    with pytest.raises(InputError) as info:
        build_mesh(spec, V4_32)
    assert message in str(info.value)


def test_builder_hints() -> None:
    with pytest.raises(InputError) as info:
        build_mesh(MeshSpec("m", (("data", 4), ("model", 4)), "jax", (("ring_dims", 1),)), V4_32)
    assert info.value.hint == "ring_dims is an option of mode ring"
    with pytest.raises(InputError) as info:
        build_mesh(MeshSpec("m", (("data", 2), ("model", 8)), "jax"), resolve_slice(accelerator="v5litepod-16"))
    assert "does not fit the physical box [4, 4, 1]" in info.value.message
    assert info.value.hint == "set allow_split_physical_axes: true (mode jax), or use mode ring"


def test_multislice_dcn_checks() -> None:
    tpu = resolve_slice(accelerator="v4-16", num_slices=2)
    with pytest.raises(
        InputError, match=r"the 2 slices go along the first axis by default, but one=1 does not split into 2"
    ):
        build_mesh(MeshSpec("m", (("one", 1), ("all", 16))), tpu)
    with pytest.raises(InputError, match=r"dcn_shape \[2, 2\] makes 4 slices, but the cluster has 2"):
        build_mesh(MeshSpec("m", (("data", 4), ("model", 4)), "jax", (("dcn_shape", (2, 2)),)), tpu)
    with pytest.raises(InputError, match="contiguous_submeshes does not apply to a multislice mesh"):
        build_mesh(MeshSpec("m", (("data", 4), ("model", 4)), "jax", (("contiguous_submeshes", True),)), tpu)
    mesh = build_mesh(MeshSpec("m", (("data", 4), ("model", 4)), "jax", (("dcn_shape", (1, 2)),)), tpu)
    assert mesh.dcn_shape == (1, 2) and mesh.ici_shape == (4, 2)


def test_declared_names_are_unique() -> None:
    spec = MeshSpec("m", (("data", 4), ("model", 4)))
    with pytest.raises(InputError, match="mesh 'm': is declared twice"):
        build_declared_meshes((spec, spec), V4_32, V4_32.devices)


# --- the options as one typed value ------------------------------------------------------------------


def test_mesh_options_name_every_option_of_both_modes() -> None:
    from dataclasses import fields

    from tpuctl.mesh.build import COMMON_OPTIONS, JAX_ONLY_OPTIONS, RING_ONLY_OPTIONS
    from tpuctl.mesh.model import MeshOptions

    assert [f.name for f in fields(MeshOptions)] == [*RING_ONLY_OPTIONS, *JAX_ONLY_OPTIONS, *COMMON_OPTIONS]


def test_mesh_options_round_trip_through_the_spec_form() -> None:
    from tpuctl.mesh.build import mesh_options
    from tpuctl.mesh.model import MeshOptions

    ring = MeshOptions(ring_dims=-1, ring_bounds=(2, 2, 1, 1), can_split_host_across_rings=False, compat="dtensor")
    assert ring.pairs() == (
        ("ring_dims", -1), ("ring_bounds", (2, 2, 1, 1)), ("can_split_host_across_rings", False), ("compat", "dtensor"),
    )  # fmt: skip
    assert mesh_options(MeshSpec("m", (("data", 4), ("model", 4)), "ring", ring.pairs())) == ring
    jax = MeshOptions(allow_split_physical_axes=True, dcn_shape=(2, 1))
    assert mesh_options(MeshSpec("m", (("data", 8), ("model", 4)), "jax", jax.pairs())) == jax
    assert MeshOptions().pairs() == ()
    with pytest.raises(TypeError):
        MeshOptions(-1)  # type: ignore[misc]  # keyword-only


def test_mesh_options_refuse_wrong_types_naming_the_mesh() -> None:
    from tpuctl.mesh.build import mesh_options

    with pytest.raises(InputError, match=r"mesh 'm': option ring_dims is 'two'; expected an integer"):
        mesh_options(MeshSpec("m", (("data", 16),), "ring", (("ring_dims", "two"),)))
    with pytest.raises(InputError, match=r"mesh 'm': option contiguous_submeshes is 1; expected true or false"):
        mesh_options(MeshSpec("m", (("data", 16),), "jax", (("contiguous_submeshes", 1),)))
