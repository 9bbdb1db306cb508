"""A training job the watchdog watches: a real JAX CPU job (one process per simulated host, ``jax.distributed``
from tpuctl's environment, a cross-process all-gather every step) that reports each step with
``tpuctl.job.progress`` when its own work is done (before the step's collective) and checkpoints a step
counter, reporting ``tpuctl.job.checkpointed`` after each checkpoint.

Run as: ``tpuctl run ... -- python job_watched.py DIR STEPS STEP_S [SLOW_TASK:FACTOR:FROM] [JITTER]``. Every start appends
``start WALL GENERATION RESTART_COUNT FIRST_STEP`` to ``DIR/starts-TASK``; task 0 writes the step reached to
``DIR/step`` after each step. ``SLOW_TASK:FACTOR:FROM``: from step FROM on, that task's own work per step
takes FACTOR times longer. ``JITTER``: every host's work per step varies by up to this share, at random.
``JOB_DEADLOCK=TASK:STEP`` in the environment: that task blocks for good on a lock in ``wait_for_batch``
at STEP. At STEPS the job prints ``RESULT {...}`` and exits 0.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

import tpuctl.job
import tpuctl.job.api

folder, steps, step_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
slow = sys.argv[4].split(":") if len(sys.argv) > 4 and sys.argv[4] != "-" else ["-1", "1", "0"]
slow_task, factor, slow_from = int(slow[0]), float(slow[1]), int(slow[2])
jitter = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
task = int(os.environ["TPUCTL_TASK_ID"])
generation = int(os.environ["TPUCTL_GENERATION"])
restarts = int(os.environ.get("TPUCTL_RESTART_COUNT", "0"))
checkpoint = os.path.join(folder, "step")


def read_step() -> int:
    try:
        with open(checkpoint) as handle:
            return int(handle.read().strip() or 0)
    except FileNotFoundError:
        return 0


mapping = tpuctl.job.api.load_mapping()
jax.config.update("jax_num_cpu_devices", len(mapping.local_devices))
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(**tpuctl.job.api.jax_distributed_args(), initialization_timeout=60)
signal.signal(signal.SIGTERM, signal.SIG_DFL)  # nothing to save on SIGTERM: die at once, even in a collective
first = int(multihost_utils.broadcast_one_to_all(np.array([read_step()], dtype=np.int32))[0])
with open(os.path.join(folder, f"starts-{task}"), "a") as handle:
    handle.write(f"start {time.time():.3f} {generation} {restarts} {first}\n")

deadlock_task, deadlock_step = (int(x) for x in os.environ.get("JOB_DEADLOCK", "-1:-1").split(":"))
batches = threading.Lock()
batches.acquire()  # never released: a data loader that died with it held


def wait_for_batch() -> None:
    batches.acquire()


step = first
while step < steps:
    step += 1
    own = step_s * (factor if task == slow_task and step >= slow_from else 1.0)
    time.sleep(own * (1 + random.uniform(-jitter, jitter)))  # this host's own work for the step
    if task == deadlock_task and step == deadlock_step:
        wait_for_batch()  # deadlocked: the other hosts wait in the step's all-gather
    tpuctl.job.progress(step)
    gathered = multihost_utils.process_allgather(np.array([step * 10 + jax.process_index()], dtype=np.int32))
    assert np.asarray(gathered).ravel().tolist() == [step * 10 + p for p in range(jax.process_count())]
    if task == 0:
        with open(checkpoint + ".tmp", "w") as handle:
            handle.write(f"{step}\n")
        os.replace(checkpoint + ".tmp", checkpoint)
        tpuctl.job.checkpointed(step)

os.write(1, ("RESULT " + json.dumps({"task": task, "generation": generation, "first": first, "last": step}) + "\n").encode())
jax.distributed.shutdown()
sys.exit(0)
