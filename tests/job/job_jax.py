"""A JAX CPU job, one process per simulated host, started by ``tpuctl run``.

It learns the cluster only from what tpuctl gives it: ``jax.distributed.initialize`` gets its arguments
from ``tpuctl.job.api.jax_distributed_args()`` (the environment ``tpuctl run`` set), the device mapping
from ``$TPUCTL_MAPPING``. Then every process contributes one value to a cross-process all-gather and
checks it received every process's value. Prints one JSON line (``RESULT {...}``) for the test.

Run as: ``tpuctl run --state-dir ROOT/host-N -- python job_jax.py`` with ``JAX_PLATFORMS=cpu``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

import tpuctl.job.api

started = time.monotonic()
mapping = tpuctl.job.api.load_mapping()
# A CPU stand-in for the host: as many CPU devices as the host has TPU cores, collectives through gloo.
jax.config.update("jax_num_cpu_devices", len(mapping.local_devices))
jax.config.update("jax_cpu_collectives_implementation", "gloo")

args = tpuctl.job.api.jax_distributed_args()
jax.distributed.initialize(**args, initialization_timeout=60)
assert jax.process_index() == mapping.task == args["process_id"], (jax.process_index(), mapping.task)
assert jax.process_count() == mapping.num_tasks

value = np.array([100 + jax.process_index()], dtype=np.int32)
gathered = multihost_utils.process_allgather(value)
expected = [[100 + p] for p in range(jax.process_count())]
assert np.asarray(gathered).tolist() == expected, (np.asarray(gathered).tolist(), expected)

# The mapping's device order as a jax Mesh over the CPU stand-ins, and one collective over it.
mesh = mapping.jax_mesh()
assert mesh.devices.size == len(mapping.devices)
local_ids = [d.id for d in mesh.devices.flat if d.process_index == jax.process_index()]
assert sorted(local_ids) == sorted(d.id for d in jax.local_devices()), (local_ids, jax.local_devices())
multihost_utils.sync_global_devices("tpuctl-job-jax")

# One write(2) for the whole line: gloo and XLA write to the same stdout from their own threads, and
# print() writes the text and its newline separately (a gloo line once landed between them).
sys.stdout.flush()
os.write(
    1,
    (
        "RESULT "
        + json.dumps(
            {
                "process": jax.process_index(),
                "processes": jax.process_count(),
                "gathered": np.asarray(gathered).ravel().tolist(),
                "coordinator": args["coordinator_address"],
                "mapping": os.environ["TPUCTL_MAPPING"],
                "seconds": round(time.monotonic() - started, 2),
            }
        )
        + "\n"
    ).encode(),
)
jax.distributed.shutdown()
sys.exit(0)
