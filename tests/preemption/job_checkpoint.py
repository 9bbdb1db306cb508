"""A training job that asks every step whether to checkpoint (``tpuctl.job.should_checkpoint``), saves and exits
when told, and resumes from its checkpoint: a real JAX CPU job (one process per simulated host, ``jax.distributed``
from tpuctl's environment, a cross-process all-gather every step) or a plain Python loop.

Run as: ``tpuctl run --max-restarts N --state-dir ROOT/host-N -- python job_checkpoint.py DIR STEPS STEP_S jax|plain``.
Every start appends ``start WALL GENERATION RESTART_COUNT FIRST_STEP`` to ``DIR/starts-TASK``; every host writes
the step it reached to ``DIR/at-TASK`` each step. When ``should_checkpoint(step)`` is True the job saves ``step`` to
``DIR/ckpt-TASK`` (atomically), reports ``tpuctl.job.checkpointed(step)``, appends ``saved WALL GENERATION STEP``
to ``DIR/starts-TASK`` and exits 0. At STEPS it prints ``RESULT {...}`` and exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import tpuctl.job

folder, steps, step_s, kind = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
task = int(os.environ["TPUCTL_TASK_ID"])
generation = int(os.environ["TPUCTL_GENERATION"])
restarts = int(os.environ.get("TPUCTL_RESTART_COUNT", "0"))
checkpoint = os.path.join(folder, f"ckpt-{task}")
log = os.path.join(folder, f"starts-{task}")


def note(line: str) -> None:
    with open(log, "a") as handle:
        handle.write(line + "\n")


def write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)


def read_step() -> int:
    try:
        with open(checkpoint) as handle:
            return int(handle.read().strip() or 0)
    except FileNotFoundError:
        return 0


signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a SIGTERM that reaches the job ends it at once
if kind == "jax":
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    import tpuctl.job.api

    mapping = tpuctl.job.api.load_mapping()
    jax.config.update("jax_num_cpu_devices", len(mapping.local_devices))
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**tpuctl.job.api.jax_distributed_args(), initialization_timeout=60)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # jax.distributed's own preemption notifier would keep it running
    first = int(multihost_utils.broadcast_one_to_all(np.array([read_step()], dtype=np.int32))[0])
else:
    first = read_step()
note(f"start {time.time():.3f} {generation} {restarts} {first}")

step = first
while step < steps:
    step += 1
    time.sleep(step_s)
    if kind == "jax":
        gathered = multihost_utils.process_allgather(np.array([step * 10 + jax.process_index()], dtype=np.int32))
        assert np.asarray(gathered).ravel().tolist() == [step * 10 + p for p in range(jax.process_count())]
    write(os.path.join(folder, f"at-{task}"), f"{step}\n")
    tpuctl.job.progress(step)
    if tpuctl.job.should_checkpoint(step):
        write(checkpoint, f"{step}\n")
        tpuctl.job.checkpointed(step)
        note(f"saved {time.time():.3f} {generation} {step}")
        if kind == "jax":
            jax.distributed.shutdown()
        sys.exit(0)

print("RESULT " + json.dumps({"task": task, "generation": generation, "restarts": restarts, "first": first,
                              "last": step}), flush=True)  # fmt: skip
if kind == "jax":
    jax.distributed.shutdown()
sys.exit(0)
