"""A JAX job as a user writes it: plain ``jax.distributed.initialize()``, nothing from tpuctl imported.

Run on every host of a simulated v4-32 by ``tpuctl sim run -- python job_plain_jax.py``: JAX finds the
cluster through tpuctl's detector (``tpuctl/job/jaxcluster.py``), then every process all-gathers its
index over gloo. Prints one ``RESULT {...}`` line.
"""

import json
import os
import sys

import jax
import numpy as np
from jax._src import clusters  # only to report which detectors are present
from jax.experimental import multihost_utils

jax.distributed.initialize(initialization_timeout=60)
gathered = multihost_utils.process_allgather(np.array([100 + jax.process_index()], dtype=np.int32))

present = [
    env.name for env in clusters.ClusterEnv._cluster_types if not env.opt_in_only_method and env.is_env_present()
]
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
                "devices": jax.device_count(),
                "local_devices": jax.local_device_count(),
                "platform": jax.devices()[0].platform,
                "gathered": np.asarray(gathered).ravel().tolist(),
                "detectors": present,
            }
        )
        + "\n"
    ).encode(),
)
jax.distributed.shutdown()
sys.exit(0)
