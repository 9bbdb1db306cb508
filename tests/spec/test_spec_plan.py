"""A generation's spec from its plan (``tpuctl.spec.elastic``): hosts in rank order, the slice count, the
meshes resized on their slice axis, or an error naming the mesh; and the shape a host reports."""

from __future__ import annotations

import pytest

from tpuctl.coordination.plan import Plan, SliceShape
from tpuctl.errors import InputError, SpecError
from tpuctl.spec.elastic import MeshResizeError, for_plan, host_shape, roster_of
from tpuctl.spec.model import ClusterSpec
from tpuctl.spec.yamlfile import check_spec_text

SPEC = """\
cluster: pod-a
accelerator: v4-16
num_slices: 3
backend: sim
hosts: [h0, h1, h2, h3, h4, h5]
spares: [s0, s1]
restart: {policy: elastic, min_slices: 2}
meshes:
  - {name: dp, shape: {data: 6, model: 4}}
  - {name: hybrid, shape: {model: 4, data: 6}, options: {dcn_shape: [1, 3]}}
"""


def _spec(text: str = SPEC) -> ClusterSpec:
    return check_spec_text(text, "c.yaml").unwrap()


def test_generation_one_is_the_spec_itself() -> None:
    spec = _spec()
    assert for_plan(spec, roster_of(spec).identity()) is spec


def test_shrunk_to_slices_0_and_2() -> None:
    spec = _spec()
    gen = for_plan(spec, Plan.of([0, 2]))
    assert gen.hosts == ("h0", "h1", "h4", "h5")  # rank order: task 4 (h4) is rank 2
    assert gen.slice.num_slices == 2 and gen.slice.num_hosts == 4
    assert [(m.name, m.axes) for m in gen.meshes] == [
        ("dp", (("data", 4), ("model", 4))),
        ("hybrid", (("model", 4), ("data", 4))),
    ]
    assert gen.meshes[1].option("dcn_shape") == (1, 2)
    assert gen.meshes[0].option("dcn_shape") is None
    assert gen.spares == () and gen.cluster == spec.cluster


def test_spare_slice_in_slice_1s_place() -> None:
    spec = _spec()
    gen = for_plan(spec, Plan.of([0, 3, 2]))
    assert gen.hosts == ("h0", "h1", "s0", "s1", "h4", "h5")
    assert gen.slice == spec.slice and gen.meshes == spec.meshes


def test_one_slice_left() -> None:
    gen = for_plan(_spec(), Plan.of([2]))
    assert gen.hosts == ("h4", "h5") and gen.slice.num_slices == 1
    assert gen.meshes[0].axes == (("data", 2), ("model", 4))
    assert gen.meshes[1].option("dcn_shape") == (1, 1)


def test_a_mesh_with_slices_over_two_axes_is_named() -> None:
    text = SPEC.replace("num_slices: 3", "num_slices: 4").replace(
        "hosts: [h0, h1, h2, h3, h4, h5]", "hosts: [h0, h1, h2, h3, h4, h5, h6, h7]"
    )
    text = text.split("meshes:")[0] + "meshes:\n  - {name: grid, shape: {a: 4, b: 8}, options: {dcn_shape: [2, 2]}}\n"
    with pytest.raises(SpecError, match=r"mesh 'grid' .* cannot go to 2 slices"):  # validate names it first
        _spec(text)
    text = text.replace("policy: elastic, min_slices: 2", "policy: rejoin")  # a spec that never shrinks
    with pytest.raises(MeshResizeError) as caught:
        for_plan(_spec(text), Plan.of([0, 1, 2]))
    assert caught.value.message == (
        "mesh 'grid' {a: 4, b: 8} cannot go to 3 slices: its dcn_shape [2, 2] spreads the 4 slices over several axes"
    )
    assert caught.value.exit_code == 2


def test_a_plan_beyond_the_roster_is_refused() -> None:
    with pytest.raises(InputError, match="names task 9, but the spec has 8 hosts and spares"):
        for_plan(_spec(), Plan.of([0, 4]))


def test_host_shape_from_the_sim_variable() -> None:
    spec = _spec()
    assert host_shape(spec, {}) == SliceShape("v4-16", "2x2x2", 2)
    liar = host_shape(spec, {"TPUCTL_SIM_ACCELERATOR": "v4-32"})
    assert liar == SliceShape("v4-32", "2x2x4", 4)
    assert liar.differences(host_shape(spec, {})) == [
        "accelerator type v4-32 (the cluster's slices: v4-16)",
        "topology 2x2x4 (the cluster's slices: 2x2x2)",
        "hosts per slice 4 (the cluster's slices: 2)",
    ]
    with pytest.raises(InputError, match="TPUCTL_SIM_ACCELERATOR='v9-8'"):
        host_shape(spec, {"TPUCTL_SIM_ACCELERATOR": "v9-8"})
