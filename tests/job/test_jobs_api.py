"""The job-side API (``tpuctl.job.api``): loading the mapping for this task, DTensor mesh strings, JAX device
order and ``jax.distributed.initialize`` arguments; no framework imported until a helper needs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tpuctl.errors import MappingError, StateError
from tpuctl.job import api as jobs
from tpuctl.job import env as jobenv
from tpuctl.job.api import (
    JobMapping,
    default_mesh,
    dtensor_mesh_string,
    find_mesh,
    jax_device_order,
    jax_distributed_args,
    load_mapping,
    torch_distributed_args,
)
from tpuctl.mapping.file import write_mapping
from tpuctl.mesh.strings import default_job_name

from .mappings import sim_mapping, with_mesh

V4_16 = sim_mapping(accelerator="v4-16")  # 2 hosts; task 0 ids 0-3, task 1 ids 4-7
# a 2x4 mesh whose rows interleave the hosts: position i holds device ids[i]
MESHED = with_mesh(V4_16, "dp_mp", {"data": 2, "model": 4}, [0, 1, 4, 5, 2, 3, 6, 7])


@pytest.fixture
def mapping_file(tmp_path: Path) -> Path:
    return write_mapping(tmp_path / "mapping.json", MESHED)


def test_load_mapping_from_the_environment(mapping_file: Path) -> None:
    loaded = load_mapping(environ={"TPUCTL_MAPPING": str(mapping_file), "TPUCTL_TASK_ID": "1"})
    assert isinstance(loaded, JobMapping)
    assert loaded.task == 1
    assert loaded.path == str(mapping_file)
    assert loaded.cluster == "pod-a" and loaded.num_tasks == 2
    assert [d.id for d in loaded.local_devices] == [4, 5, 6, 7]
    assert loaded.this_task.address == "10.0.0.2"
    assert loaded.slice.accelerator_type == "v4-16"
    assert [m.name for m in loaded.meshes] == ["dp_mp"]
    assert loaded.topology.mesh_shape == V4_16.mesh_shape
    assert loaded.topology_proto_bytes == V4_16.topology_proto_bytes
    assert len(loaded.devices) == len(loaded.tasks) * 4
    # an explicit path and task win over the environment
    assert load_mapping(mapping_file, task=0, environ={"TPUCTL_TASK_ID": "1"}).task == 0


def test_load_mapping_refusals(mapping_file: Path, tmp_path: Path) -> None:
    with pytest.raises(MappingError, match=r"\$TPUCTL_MAPPING is not set") as info:
        load_mapping(environ={})
    assert info.value.exit_code == 7
    assert "tpuctl run" in str(info.value.hint)
    with pytest.raises(MappingError, match=r"\$TPUCTL_TASK_ID='one' is not a task id"):
        load_mapping(mapping_file, environ={"TPUCTL_TASK_ID": "one"})
    with pytest.raises(MappingError, match=r"\$TPUCTL_TASK_ID='\u0661' is not a task id"):
        load_mapping(mapping_file, environ={"TPUCTL_TASK_ID": "\u0661"})  # not 1: digits are ASCII
    with pytest.raises(MappingError, match=r"task 2 is not in the device mapping"):
        load_mapping(mapping_file, task=2, environ={})
    with pytest.raises(MappingError, match="no device mapping file at"):
        load_mapping(tmp_path / "missing.json", environ={})
    unknown = load_mapping(mapping_file, environ={})  # task unknown: fine until this task's devices are asked for
    assert unknown.task is None
    with pytest.raises(MappingError, match=r"this process's task in cluster 'pod-a' is unknown"):
        unknown.local_devices  # noqa: B018
    one = write_mapping(tmp_path / "one.json", sim_mapping(["10.9.9.9"], accelerator="v4-8"))
    assert load_mapping(one, environ={}).task == 0  # one host: task 0


def test_meshes_by_name_and_the_default_mesh() -> None:
    assert find_mesh(MESHED, "dp_mp").device_ids == (0, 1, 4, 5, 2, 3, 6, 7)
    default = find_mesh(MESHED)
    assert default == default_mesh(MESHED)
    assert (default.name, [(a.name, a.size) for a in default.axes]) == ("", [("x", 8)])
    assert default.device_ids == tuple(range(8))
    with pytest.raises(MappingError, match=r"has no mesh 'tp' \(meshes: 'dp_mp'\)"):
        find_mesh(MESHED, "tp")
    with pytest.raises(MappingError, match=r"\(meshes: none\)"):
        find_mesh(V4_16, "tp")


def test_dtensor_mesh_strings_follow_create_tpu_mesh() -> None:
    env: dict[str, str] = {}
    # default mesh: global ids 0..7, task 1's local ids 4..7, TPU devices by local ordinal
    tpu = dtensor_mesh_string(V4_16, task=1, environ=env)
    devices = ",".join(f"/job:worker/replica:0/task:1/device:TPU:{i}" for i in range(4))
    assert tpu == f"|x=8|0,1,2,3,4,5,6,7|4,5,6,7|{devices}"
    # a named mesh: local ids are the mesh positions of the task's devices, in local ordinal order
    named = dtensor_mesh_string(MESHED, "dp_mp", task=1, environ=env)
    assert named == f"dp_mp|data=2,model=4|0,1,2,3,4,5,6,7|2,3,6,7|{devices}"
    # its host mesh: unnamed (as Mesh.host_mesh() gives it), CPU devices 1:1
    host = dtensor_mesh_string(JobMapping.of(MESHED, 0), "dp_mp", host=True, environ=env)
    cpus = ",".join(f"/job:worker/replica:0/task:0/device:CPU:{i}" for i in range(4))
    assert host == f"|data=2,model=4|0,1,2,3,4,5,6,7|0,1,4,5|{cpus}"
    # the job name: $DTENSOR_JOB_NAME, else DTensor's default for the cluster size
    assert "/job:trainer/" in dtensor_mesh_string(V4_16, task=0, environ={"DTENSOR_JOB_NAME": "trainer"})
    one = sim_mapping(["10.9.9.9"], accelerator="v4-8")
    assert "/job:localhost/replica:0/task:0/device:CPU:3" in dtensor_mesh_string(one, host=True, task=0, environ={})
    with pytest.raises(MappingError, match="is unknown"):
        dtensor_mesh_string(V4_16, environ=env)


def test_dtensor_mesh_must_cover_the_task() -> None:
    partial = with_mesh(V4_16, "half", {"x": 4}, [0, 1, 2, 3])
    with pytest.raises(MappingError, match=r"mesh 'half' leaves out task 1's devices \[4, 5, 6, 7\]"):
        dtensor_mesh_string(partial, "half", task=1, environ={})


def test_jax_distributed_args() -> None:
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:9002", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    assert jax_distributed_args(env) == {"coordinator_address": "10.0.0.1:9002", "num_processes": 4, "process_id": 3}
    with pytest.raises(StateError, match="JAX_NUM_PROCESSES, JAX_PROCESS_ID not set"):
        jax_distributed_args({"JAX_COORDINATOR_ADDRESS": "h:1"})
    with pytest.raises(StateError, match="not integers"):
        jax_distributed_args({**env, "JAX_PROCESS_ID": "x"})
    with pytest.raises(StateError, match=r"JAX_PROCESS_ID=4 is not in 0..3"):
        jax_distributed_args({**env, "JAX_PROCESS_ID": "4"})


def test_torch_distributed_args() -> None:
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "9003", "WORLD_SIZE": "4", "RANK": "3"}
    assert torch_distributed_args("gloo", env) == {"backend": "gloo", "init_method": "env://", "world_size": 4, "rank": 3}
    assert torch_distributed_args("xla", env) == {"backend": "xla", "init_method": "xla://"}
    with pytest.raises(StateError, match="MASTER_PORT, RANK not set: this is not a job tpuctl started"):
        torch_distributed_args("gloo", {"MASTER_ADDR": "h", "WORLD_SIZE": "2"})
    with pytest.raises(StateError, match="not integers"):
        torch_distributed_args("gloo", {**env, "RANK": "x"})
    with pytest.raises(StateError, match=r"RANK=4 is not in 0..3"):
        torch_distributed_args("gloo", {**env, "RANK": "4"})


def tpu_devices(mapping: Any) -> list[SimpleNamespace]:
    """What jax.devices() lists on the real slice: id, coords, core_on_chip, process_index."""
    return [
        SimpleNamespace(id=d.id, coords=list(d.coords), core_on_chip=d.core, process_index=t.id, platform="tpu")
        for t in reversed(mapping.tasks)  # any order: matched by id
        for d in t.devices
    ]


def test_jax_device_order_on_tpu_matches_ids_and_checks_coordinates() -> None:
    devices = tpu_devices(MESHED)
    order = jax_device_order(MESHED, "dp_mp", devices)
    assert order.shape == (2, 4)
    assert [[d.id for d in row] for row in order] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert [d.id for d in JobMapping.of(MESHED, 1).jax_device_order(None, devices).ravel()] == list(range(8))
    moved = [SimpleNamespace(**{**vars(d), "coords": [9, 9, 9]}) if d.id == 5 else d for d in devices]
    with pytest.raises(MappingError, match=r"jax device 5 is at \[9, 9, 9\] core 0; the mapping puts it at"):
        jax_device_order(MESHED, "dp_mp", moved)
    with pytest.raises(MappingError, match=r"names device ids \[7\] that jax does not list"):
        jax_device_order(MESHED, "dp_mp", [d for d in devices if d.id != 7])


def test_jax_device_order_on_cpu_stands_in_by_process_and_position() -> None:
    # a CPU job: process p has 4 CPU devices with ids unrelated to the TPU ids
    cpus = [SimpleNamespace(id=1000 * p + i, process_index=p, platform="cpu") for p in (1, 0) for i in range(4)]
    order = jax_device_order(MESHED, "dp_mp", cpus)
    assert [[d.id for d in row] for row in order] == [[0, 1, 1000, 1001], [2, 3, 1002, 1003]]
    with pytest.raises(MappingError, match=r"process 1 has 3 jax device\(s\); task 1 of the mapping has 4") as info:
        jax_device_order(MESHED, "dp_mp", cpus[1:])
    assert "jax_num_cpu_devices" in str(info.value.hint)


def test_importing_and_loading_pull_in_no_framework(mapping_file: Path) -> None:
    code = (
        "import sys, tpuctl.job.api as j\n"
        f"m = j.load_mapping({str(mapping_file)!r}, task=1)\n"
        "m.dtensor_mesh_string('dp_mp', host=True)\n"
        "j.jax_distributed_args({'JAX_COORDINATOR_ADDRESS': 'h:1', 'JAX_NUM_PROCESSES': '1', 'JAX_PROCESS_ID': '0'})\n"
        "heavy = sorted(n for n in sys.modules if n.split('.')[0] in "
        "('grpc', 'click', 'tensorflow', 'jax', 'jaxlib', 'numpy'))\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_load_mapping_from_the_package_root(mapping_file: Path) -> None:
    code = (
        "import sys, tpuctl\n"
        "assert 'tpuctl.job.api' not in sys.modules  # lazy\n"
        f"m = tpuctl.load_mapping({str(mapping_file)!r}, task=0)\n"
        "assert m.local_devices[0].id == 0, m.local_devices\n"
        "assert tpuctl.load_mapping is tpuctl.job.api.load_mapping\n"
        "heavy = sorted(n for n in sys.modules if n.split('.')[0] in ('grpc', 'click', 'tensorflow', 'jax'))\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
@pytest.mark.oracle
def test_tensorflow_helpers(mapping_file: Path) -> None:
    loaded = load_mapping(mapping_file, task=1, environ={})
    topology = loaded.tf_topology()
    assert list(topology.mesh_shape) == list(V4_16.mesh_shape)
    assert topology.device_coordinates.tolist() == [[list(c) for c in task] for task in V4_16.device_coordinates]
    assert topology.serialized() == V4_16.topology_proto_bytes
    assert jobs.tf_topology(V4_16, 0).serialized() == V4_16.topology_proto_bytes
    mesh = loaded.dtensor_mesh("dp_mp", host=True)  # parsed and checked by DTensor (Mesh.from_string)
    assert mesh.to_string() == loaded.dtensor_mesh_string("dp_mp", host=True)
    assert mesh.dim_names == ["data", "model"]
    assert mesh.local_device_ids() == [2, 3, 6, 7]
    assert mesh.device_type() == "CPU"


def test_mesh_strings_agree_with_the_mapping_and_the_jobenv_job_name() -> None:
    """The job side gives the strings the mapping renders itself (``DeviceMapping.dtensor_mesh_string``, what
    the mesh builder records); and the job environment names DTensor's job as the mesh strings do."""
    for task in range(2):
        for host in (False, True):
            assert dtensor_mesh_string(MESHED, "dp_mp", task=task, host=host, environ={}) == MESHED.dtensor_mesh_string(
                "dp_mp", task, host=host
            )
    assert [default_job_name(n) for n in (1, 2, 64)] == [jobenv.dtensor_job_name(n) for n in (1, 2, 64)]
