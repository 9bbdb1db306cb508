"""A job that checkpoints a step counter and resumes from it, started (and restarted) by ``tpuctl run
--max-restarts``: optionally a real JAX CPU job (one process per simulated host, ``jax.distributed`` from
tpuctl's environment, a cross-process all-gather every step).

Run as: ``tpuctl run --max-restarts N --state-dir ROOT/host-N -- python job_resume.py DIR STEPS jax|jax-detect|plain``
(``jax-detect``: plain ``jax.distributed.initialize()``, JAX's own cluster detection under ``tpuctl run``;
``jax``: the arguments from ``tpuctl.job.api.jax_distributed_args()``).
Every start appends ``start WALL GENERATION RESTART_COUNT`` to ``DIR/starts-TASK`` before anything else (the
tests measure restarts with it), then, once it knows the step it resumes from, ``ready WALL GENERATION
RESTART_COUNT FIRST RANK PROCESSES SLICES MESH``: its rank (``TPUCTL_RANK``), the number of processes
(``jax.process_count()``; ``JAX_NUM_PROCESSES`` for ``plain``), ``MEGASCALE_NUM_SLICES`` (1 when unset) and the
first declared mesh's shape in its mapping (``data=4,model=4``; ``-`` without one). The JAX job checks that
JAX's view of the cluster agrees with the environment tpuctl gave it (``jax.process_index() == JAX_PROCESS_ID
== TPUCTL_RANK``, ``jax.process_count() == JAX_NUM_PROCESSES``, the mapping's rank holds this host's task id) and
exits 5 naming the difference otherwise. Rank 0 (whichever host holds it) writes the step reached to
``DIR/step`` (atomically) after every step; at STEPS the job prints ``RESULT {...}`` and exits 0.
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
rank = int(os.environ.get("TPUCTL_RANK", task))
with open(os.path.join(folder, f"starts-{task}"), "a") as handle:
    handle.write(f"start {time.time():.3f} {generation} {restarts}\n")
with open(os.path.join(folder, f"pid-{task}"), "w") as handle:  # the test's kill -9 of the whole host
    handle.write(f"{os.getpid()}\n")

import signal  # noqa: E402

signal.signal(signal.SIGTERM, signal.SIG_DFL)  # nothing to save: die at once, even inside a collective
checkpoint = os.path.join(folder, "step")


def read_step() -> int:
    try:
        with open(checkpoint) as handle:
            return int(handle.read().strip() or 0)
    except FileNotFoundError:
        return 0


jax_job = kind in ("jax", "jax-detect")
if jax_job:
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    import tpuctl.job.api

    mapping = tpuctl.job.api.load_mapping()
    assert mapping.generation == generation, (mapping.generation, generation)
    if mapping.this_task.id != rank or mapping.this_task.host_task != task:
        sys.exit(f"job: the mapping's task {mapping.this_task} is not rank {rank} of task {task}")
    jax.config.update("jax_num_cpu_devices", len(mapping.local_devices))
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    given_args = tpuctl.job.api.jax_distributed_args() if kind == "jax" else {}
    jax.distributed.initialize(**given_args, initialization_timeout=60)
    # jax.distributed installs a SIGTERM handler of its own (XLA's preemption notifier) that keeps the job
    # running; this job has nothing to save on SIGTERM, so it dies at once again (else every restart
    # waits out `tpuctl run --grace`)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    seen = (jax.process_index(), jax.process_count())
    given = (int(os.environ["JAX_PROCESS_ID"]), int(os.environ["JAX_NUM_PROCESSES"]))
    if seen != given or seen[0] != rank or seen[1] != mapping.num_tasks:
        print(f"job: JAX sees process {seen[0]} of {seen[1]}; the environment says JAX_PROCESS_ID={given[0]}, "
              f"JAX_NUM_PROCESSES={given[1]}, TPUCTL_RANK={rank}; the mapping has {mapping.num_tasks} tasks",
              file=sys.stderr, flush=True)  # fmt: skip
        os._exit(5)
    processes = seen[1]
    mesh = ",".join(f"{a.name}={a.size}" for a in mapping.meshes[0].axes) if mapping.meshes else "-"
    first = int(multihost_utils.broadcast_one_to_all(np.array([read_step()], dtype=np.int32))[0])
else:
    first = read_step()
    processes, mesh = int(os.environ.get("JAX_NUM_PROCESSES", "1")), "-"
slices = int(os.environ.get("MEGASCALE_NUM_SLICES", "1"))
with open(os.path.join(folder, f"starts-{task}"), "a") as handle:
    handle.write(f"ready {time.time():.3f} {generation} {restarts} {first} {rank} {processes} {slices} {mesh}\n")

step = first
while step < steps:
    step += 1
    if jax_job:
        gathered = multihost_utils.process_allgather(np.array([step * 10 + jax.process_index()], dtype=np.int32))
        assert np.asarray(gathered).ravel().tolist() == [step * 10 + p for p in range(jax.process_count())]
    time.sleep(0.2)
    if rank == 0:
        with open(checkpoint + ".tmp", "w") as handle:
            handle.write(f"{step}\n")
        os.replace(checkpoint + ".tmp", checkpoint)

print("RESULT " + json.dumps({"task": task, "rank": rank, "generation": generation, "restarts": restarts,
                              "first": first, "last": step}), flush=True)  # fmt: skip
if jax_job:
    jax.distributed.shutdown()
sys.exit(0)
