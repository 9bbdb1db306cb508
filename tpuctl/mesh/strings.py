"""DTensor's text forms of a mesh: ``Mesh.to_string()`` and its ``host_mesh()``, as TF 2.21 writes them.

A TPU mesh as task ``t`` of a cluster sees it (``tf.experimental.dtensor.Mesh.from_string`` parses it)::

    NAME|AXIS=SIZE,...|0,1,...,N-1|LOCAL_IDS|/job:JOB/replica:0/task:t/device:TPU:0,...

DTensor numbers a mesh's devices 0..N-1 in row-major mesh order and keeps the physical placement apart,
in a per-name map from mesh position to TPU core id (``set_tpu_core_ids``, which ``create_tpu_mesh``
fills). So the global ids are always ``0..N-1``; ``LOCAL_IDS[i]`` is the mesh position of the task's
local ``TPU:i``, in local ordinal order and not sorted (e.g. ``4,5,7,6``).

The host mesh (``Mesh.host_mesh()``: the CPU devices 1:1 with the TPU cores, which DTensor uses to save
and restore sharded variables) keeps dimensions, global and local ids, maps each local device to the
same-numbered ``CPU:i``, and clears the name, as TF does::

    |AXIS=SIZE,...|0,1,...,N-1|LOCAL_IDS|/job:JOB/replica:0/task:t/device:CPU:0,...

The job name is DTensor's default (``DTENSOR_JOB_NAME``): ``localhost`` for one task, else ``worker``.
Mesh names are the spec's names, so every host writes the same strings (DTensor's default name is
``mesh_<time.time()>``, different on every host).
"""

from __future__ import annotations

from collections.abc import Sequence

from tpuctl.mesh.model import Mesh


def default_job_name(num_tasks: int) -> str:
    """DTensor's default job name (``config.job_name()``)."""
    return "localhost" if num_tasks == 1 else "worker"


def local_device_ids(mesh: Mesh, task_device_ids: Sequence[int]) -> list[int]:
    """DTensor's ``local_device_ids``: the mesh position of each of a task's devices, given in local
    ordinal order. O(N) for the index, O(D) per call with ``positions``."""
    positions = mesh.positions()
    return [positions[d] for d in task_device_ids]


def _dims(mesh: Mesh) -> str:
    return ",".join(f"{a.name}={a.size}" for a in mesh.axes)


def _devices(job: str, task: int, kind: str, count: int) -> str:
    return ",".join(f"/job:{job}/replica:0/task:{task}/device:{kind}:{i}" for i in range(count))


def dtensor_mesh_string(mesh: Mesh, task: int, local_ids: Sequence[int], job: str) -> str:
    """``Mesh.to_string()`` of the TPU mesh as task ``task`` builds it (``local_ids`` from
    :func:`local_device_ids`)."""
    glob = ",".join(map(str, range(mesh.size)))
    local = ",".join(map(str, local_ids))
    return f"{mesh.name}|{_dims(mesh)}|{glob}|{local}|{_devices(job, task, 'TPU', len(local_ids))}"


def dtensor_host_mesh_string(mesh: Mesh, task: int, local_ids: Sequence[int], job: str) -> str:
    """``Mesh.host_mesh().to_string()`` of that TPU mesh: CPU devices, no name."""
    glob = ",".join(map(str, range(mesh.size)))
    local = ",".join(map(str, local_ids))
    return f"|{_dims(mesh)}|{glob}|{local}|{_devices(job, task, 'CPU', len(local_ids))}"
