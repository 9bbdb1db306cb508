"""A TensorFlow DTensor multi-client CPU job, one client per simulated host, started by ``tpuctl run``.

DTensor initialises from the ``DTENSOR_*`` variables tpuctl set (``DTENSOR_JOBS``, ``DTENSOR_CLIENT_ID``,
``DTENSOR_JOB_NAME``); the mesh is the mapping's host mesh (CPU devices 1:1 with the host's TPU cores,
unnamed) from ``tpuctl.job.api``. Then ``dtensor.barrier``, and a sharded DVariable saved with
``tf.train.Checkpoint`` to the directory given as argv[1], overwritten, restored, and compared.
Prints one JSON line (``RESULT {...}``) for the test.

Run as: ``tpuctl run --state-dir ROOT/host-N -- python job_dtensor.py CHECKPOINT_DIR``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import tensorflow as tf
from tensorflow.experimental import dtensor

import tpuctl.job.api

started = time.monotonic()
checkpoint_dir = sys.argv[1]
mapping = tpuctl.job.api.load_mapping()
local = len(mapping.local_devices)

# As many logical CPU devices as this host has TPU cores: the host mesh's devices.
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * local)
dtensor.initialize_accelerator_system("CPU")
assert dtensor.client_id() == mapping.task, (dtensor.client_id(), mapping.task)
assert dtensor.num_clients() == mapping.num_tasks, (dtensor.num_clients(), mapping.num_tasks)
assert dtensor.job_name() == os.environ["DTENSOR_JOB_NAME"]

mesh_string = mapping.dtensor_mesh_string(host=True)
mesh = mapping.dtensor_mesh(host=True)
assert mesh.to_string() == mesh_string, (mesh.to_string(), mesh_string)
assert mesh.num_local_devices() == local
dtensor.barrier(mesh, "tpuctl-job-dtensor", timeout_in_ms=60_000)

# A DVariable sharded over every device of the cluster: element i holds 10 * i + 1.
size = mesh.size
layout = dtensor.Layout.batch_sharded(mesh, mesh.dim_names[0], rank=1)
positions = [int(i) for i in mesh_string.split("|")[3].split(",")]
components = [tf.constant([10.0 * p + 1.0]) for p in positions]
variable = dtensor.DVariable(dtensor.pack(components, layout))
checkpoint = tf.train.Checkpoint(v=variable)
prefix = checkpoint.write(os.path.join(checkpoint_dir, "ckpt"))
dtensor.barrier(mesh, "tpuctl-job-dtensor-saved", timeout_in_ms=60_000)

variable.assign(dtensor.call_with_layout(tf.zeros, layout, shape=[size]))
zeros = [float(t.numpy()[0]) for t in dtensor.unpack(variable.read_value())]
assert zeros == [0.0] * local, zeros
checkpoint.read(prefix).assert_consumed()
restored = [float(t.numpy()[0]) for t in dtensor.unpack(variable.read_value())]
assert restored == [10.0 * p + 1.0 for p in positions], (restored, positions)
dtensor.barrier(mesh, "tpuctl-job-dtensor-restored", timeout_in_ms=60_000)

# One write(2) for the whole line: gloo and XLA write to the same stdout from their own threads, and
# print() writes the text and its newline separately (a gloo line once landed between them).
sys.stdout.flush()
os.write(
    1,
    (
        "RESULT "
        + json.dumps(
            {
                "client": dtensor.client_id(),
                "clients": dtensor.num_clients(),
                "jobs": os.environ["DTENSOR_JOBS"],
                "mesh": mesh_string,
                "restored": restored,
                "seconds": round(time.monotonic() - started, 2),
            }
        )
        + "\n"
    ).encode(),
)
sys.stdout.flush()
# Multi-client DTensor cannot shut down its accelerator system; leave without waiting for TF's teardown.
os._exit(0)
