"""A PyTorch / PyTorch-XLA job, one process per task, started by ``tpuctl run`` on a simulated slice.

It learns the cluster only from what tpuctl gives it (the environment and ``$TPUCTL_MAPPING``), then:

1. runs torch_xla's own start-up functions (``torch_xla._internal.tpu``: the ones that read the environment
   to find the slice, this worker and the process bounds; no TPU is touched) and its one-chip start-up
   (``configure_one_chip_topology``, which must find nothing left to fill in);
2. joins a ``torch.distributed`` gloo group with ``init_method="env://"`` (MASTER_ADDR, MASTER_PORT,
   WORLD_SIZE, RANK from tpuctl) and all-gathers every rank's view;
3. joins a second gloo group through torch_xla's ``xla://`` rendezvous handler (it reads MASTER_ADDR and
   MASTER_PORT and builds the store). The two questions it asks the TPU runtime (process count and index)
   are answered by torch_xla's own environment readers (``tpu.num_tpu_workers``, ``tpu.worker_id``): there
   is no TPU here. Both groups use the same port, so task 0 says (in ``SHARED/store-free``) when the first
   store has let go of it.

Prints one JSON line (``RESULT {...}``). Run as ``tpuctl run -- python job_torch.py SHARED``.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import time
from pathlib import Path

import tpuctl.job.api

SHARED = Path(sys.argv[1])
TIMEOUT = datetime.timedelta(seconds=90)
TOUCHED_BY_ONE_CHIP_START = ("TPU_VISIBLE_CHIPS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_BOUNDS")

mapping = tpuctl.job.api.load_mapping()
before = dict(os.environ)

import torch  # noqa: E402  (after the mapping: a bad mapping fails fast, before torch's import)
import torch.distributed as dist  # noqa: E402
from torch_xla import runtime as xr  # noqa: E402
from torch_xla._internal import tpu  # noqa: E402

xla = {
    "tpu_env": dict(tpu.get_tpu_env()),
    "version": tpu.version(),
    "worker_id": tpu.worker_id(),
    "task_id": tpu.task_id(),
    "worker_ips": tpu.get_worker_ips(),
    "num_tpu_workers": tpu.num_tpu_workers(),
    "process_bounds_size": tpu.process_bounds_size(),
}
tpu.configure_one_chip_topology()  # what xla:// under torchrun with one process, and _run_singleprocess, call
xla["one_chip_start_changed"] = [k for k in TOUCHED_BY_ONE_CHIP_START if os.environ.get(k) != before.get(k)]


def view(group: str) -> dict[str, object]:
    return {
        "group": group,
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "task": mapping.task,
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "local_world_size": int(os.environ["LOCAL_WORLD_SIZE"]),
        "visible_chips": os.environ.get("TPU_VISIBLE_CHIPS"),
        "local_devices": [d.id for d in mapping.local_devices],
    }


def gather(group: str) -> tuple[list[object], float]:
    views: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(views, view(group))
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    return views, float(total.item())


args = tpuctl.job.api.torch_distributed_args("gloo")
dist.init_process_group(**args, timeout=TIMEOUT)
env_views, env_sum = gather("env")
dist.barrier()
dist.destroy_process_group()

port = int(os.environ["MASTER_PORT"])
free = SHARED / "store-free"
if mapping.task == 0:  # the env:// store's listener is gone once its port binds again
    deadline = time.monotonic() + 30
    while True:
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
        finally:
            probe.close()
    free.write_text("free")
else:
    deadline = time.monotonic() + 60
    while not free.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"task 0 never freed port {port}")
        time.sleep(0.1)

xr.process_count = tpu.num_tpu_workers  # the TPU runtime's answers, from torch_xla's own environment readers
xr.process_index = tpu.worker_id
xr.is_spmd = lambda: True  # one process per task: world and rank are the process count and index
xla_args = tpuctl.job.api.torch_distributed_args("xla")
dist.init_process_group("gloo", init_method=xla_args["init_method"], timeout=TIMEOUT)
xla_views, xla_sum = gather("xla")
dist.barrier()
dist.destroy_process_group()

result = {
    "task": mapping.task,
    "xla": xla,
    "env": {"views": env_views, "sum": env_sum},
    "xla_rendezvous": {"views": xla_views, "sum": xla_sum},
    "torch": torch.__version__,
}
sys.stdout.flush()
os.write(1, ("RESULT " + json.dumps(result) + "\n").encode())
