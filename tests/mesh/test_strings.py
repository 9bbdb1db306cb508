"""DTensor mesh strings: parsed by the installed TensorFlow's ``Mesh.from_string``, and equal to what TF
prints back (``to_string``) and derives (``host_mesh()``, ``local_device_ids()``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tpuctl.errors import InputError
from tpuctl.mesh.build import build_mesh
from tpuctl.mesh.model import MeshSpec
from tpuctl.mesh.strings import default_job_name, dtensor_host_mesh_string, dtensor_mesh_string, local_device_ids
from tpuctl.spec.yamlfile import check_spec_text
from tpuctl.tpu.slice import resolve_slice

CASES = [
    ("v4-8", (("x", 4),), "ring"),
    ("v4-32", (("data", 4), ("model", 4)), "ring"),
    ("v3-32", (("batch", 2), ("fsdp", 4), ("model", 4)), "ring"),
    ("v5litepod-16", (("data", 2), ("model", 8)), "jax"),
    ("tpu7x-16", (("data", 2), ("model", 8)), "jax"),
    ("v5p-128", (("data", 16), ("model", 4)), "ring"),
]


@pytest.mark.oracle
@pytest.mark.parametrize(("accelerator", "axes", "mode"), CASES, ids=[c[0] for c in CASES])
def test_tensorflow_parses_and_prints_them_back(
    tf: SimpleNamespace, accelerator: str, axes: tuple[tuple[str, int], ...], mode: str
) -> None:
    tpu = resolve_slice(accelerator=accelerator)
    options = (("allow_split_physical_axes", True),) if mode == "jax" else ()
    mesh = build_mesh(MeshSpec("dp_mp", axes, mode, options), tpu)
    job = default_job_name(tpu.num_hosts)
    for task in sorted({0, tpu.num_hosts - 1}):
        local = local_device_ids(mesh, [d.id for d in tpu.devices_of_task(task)])
        text = dtensor_mesh_string(mesh, task, local, job)
        parsed = tf.Mesh.from_string(text)
        assert parsed.to_string() == text
        assert parsed.name == "dp_mp" and parsed.dim_names == [a for a, _ in axes]
        assert list(parsed.shape()) == [s for _, s in axes]
        assert parsed.local_device_ids() == local
        assert parsed.device_type() == "TPU"
        assert parsed.host_mesh().to_string() == dtensor_host_mesh_string(mesh, task, local, job)
        assert tf.Mesh.from_string(dtensor_host_mesh_string(mesh, task, local, job)).device_type() == "CPU"


# Repeated and reserved axis names: (axes, DTensor's dims text, the builder's refusal, the spec checker's).
REFUSED_AXES = [
    (
        (("x", 2), ("x", 2)),
        "x=2,x=2",
        "mesh 'm': axis 'x' appears twice; axis names must be unique",
        "c.yaml:6:29: meshes[0].shape.x: repeated axis name (first at line 6, column 23); expected each axis name once",
    ),
    (
        (("unsharded", 2), ("y", 2)),
        "unsharded=2,y=2",
        "mesh 'm': axis name 'unsharded' is reserved (unsharded, match, any, scalar are DTensor sharding specs)",
        "c.yaml:6:23: meshes[0].shape.unsharded: is reserved (unsharded, match, any, scalar are DTensor sharding "
        "specs); expected another axis name",
    ),
]


@pytest.mark.parametrize(("axes", "dims", "built", "checked"), REFUSED_AXES, ids=["repeated", "reserved"])
def test_tpuctl_refuses_repeated_and_reserved_axis_names(
    axes: tuple[tuple[str, int], ...], dims: str, built: str, checked: str
) -> None:
    """The builder refuses them (a MeshSpec made in code), and so does the spec check (a spec file)."""
    with pytest.raises(InputError) as info:
        build_mesh(MeshSpec("m", axes), resolve_slice(accelerator="v4-8"))
    assert info.value.message == built
    shape = ", ".join(f"{name}: {size}" for name, size in axes)
    text = f"cluster: c\naccelerator: v4-8\nbackend: sim\nhosts: [h]\nmeshes:\n  - {{name: m, shape: {{{shape}}}}}\n"
    assert check_spec_text(text, "c.yaml").formatted() == [checked]


@pytest.mark.oracle
@pytest.mark.parametrize(("axes", "dims", "built", "checked"), REFUSED_AXES, ids=["repeated", "reserved"])
def test_tensorflow_refuses_what_the_builder_refuses(
    tf: SimpleNamespace, axes: tuple[tuple[str, int], ...], dims: str, built: str, checked: str
) -> None:
    """DTensor's strict parser refuses the mesh string, and tpuctl refuses the mesh before any string exists."""
    devices = ",".join(f"/job:localhost/replica:0/task:0/device:TPU:{i}" for i in range(4))
    with pytest.raises(ValueError):
        tf.Mesh.from_string(f"m|{dims}|0,1,2,3|0,1,2,3|{devices}")
    with pytest.raises(InputError) as info:
        build_mesh(MeshSpec("m", axes), resolve_slice(accelerator="v4-8"))
    assert info.value.message == built


def test_format() -> None:
    tpu = resolve_slice(accelerator="v4-16")
    mesh = build_mesh(MeshSpec("dp", (("data", 2), ("model", 4))), tpu)
    local = local_device_ids(mesh, [d.id for d in tpu.devices_of_task(1)])
    assert local == [4, 5, 7, 6]
    prefix = "/job:worker/replica:0/task:1/device"
    assert dtensor_mesh_string(mesh, 1, local, "worker") == (
        f"dp|data=2,model=4|0,1,2,3,4,5,6,7|4,5,7,6|{prefix}:TPU:0,{prefix}:TPU:1,{prefix}:TPU:2,{prefix}:TPU:3"
    )
    assert dtensor_host_mesh_string(mesh, 1, local, "worker") == (
        f"|data=2,model=4|0,1,2,3,4,5,6,7|4,5,7,6|{prefix}:CPU:0,{prefix}:CPU:1,{prefix}:CPU:2,{prefix}:CPU:3"
    )
    assert default_job_name(1) == "localhost" and default_job_name(2) == "worker"
