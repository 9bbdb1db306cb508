"""A job that checkpoints a step counter and resumes from it, started (and restarted) by ``tpuctl run
--max-restarts``: optionally a real JAX CPU job (one process per simulated host, ``jax.distributed`` from
tpuctl's environment, a cross-process all-gather every step).

Run as: ``tpuctl run --max-restarts N --state-dir ROOT/host-N -- python job_resume.py DIR STEPS jax|plain``.
Every start appends ``start WALL GENERATION RESTART_COUNT`` to ``DIR/starts-TASK`` before anything else (the
tests measure restarts with it); task 0 writes the step reached to ``DIR/step`` (atomically) after every
step; at STEPS the job prints ``RESULT {...}`` and exits 0.
"""

from __future__ import annotations

import json
import os
import sys
import time

folder, steps, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
task = int(os.environ["TPUCTL_TASK_ID"])
generation = int(os.environ["TPUCTL_GENERATION"])
restarts = int(os.environ.get("TPUCTL_RESTART_COUNT", "0"))
with open(os.path.join(folder, f"starts-{task}"), "a") as handle:
    handle.write(f"start {time.time():.3f} {generation} {restarts}\n")

import signal  # noqa: E402

signal.signal(signal.SIGTERM, signal.SIG_DFL)  # nothing to save: die at once, even inside a collective
checkpoint = os.path.join(folder, "step")


def read_step() -> int:
    try:
        with open(checkpoint) as handle:
            return int(handle.read().strip() or 0)
    except FileNotFoundError:
        return 0


if kind == "jax":
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    import tpuctl.job.api

    mapping = tpuctl.job.api.load_mapping()
    assert mapping.generation == generation, (mapping.generation, generation)
    jax.config.update("jax_num_cpu_devices", len(mapping.local_devices))
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**tpuctl.job.api.jax_distributed_args(), initialization_timeout=60)
    # jax.distributed installs a SIGTERM handler of its own (XLA's preemption notifier) that keeps the job
    # running; this job has nothing to save on SIGTERM, so it dies at once again (else every restart
    # waits out `tpuctl run --grace`)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    first = int(multihost_utils.broadcast_one_to_all(np.array([read_step()], dtype=np.int32))[0])
else:
    first = read_step()
with open(os.path.join(folder, f"starts-{task}"), "a") as handle:
    handle.write(f"ready {time.time():.3f} {generation} {restarts} {first}\n")

step = first
while step < steps:
    step += 1
    if kind == "jax":
        gathered = multihost_utils.process_allgather(np.array([step * 10 + jax.process_index()], dtype=np.int32))
        assert np.asarray(gathered).ravel().tolist() == [step * 10 + p for p in range(jax.process_count())]
    time.sleep(0.2)
    if task == 0:
        with open(checkpoint + ".tmp", "w") as handle:
            handle.write(f"{step}\n")
        os.replace(checkpoint + ".tmp", checkpoint)

print("RESULT " + json.dumps({"task": task, "generation": generation, "restarts": restarts, "first": first,
                              "last": step}), flush=True)  # fmt: skip
if kind == "jax":
    jax.distributed.shutdown()
sys.exit(0)
