"""A job that moves in lockstep without JAX: every step ends at a barrier of files (each host writes the step it
finished, then waits until every host has), so when one host dies the others stop advancing, as an SPMD job's
collective would. It reports each step with ``tpuctl.job.progress`` and, on task 0, checkpoints every EVERY
steps (a file) and reports ``tpuctl.job.checkpointed``; a restarted job resumes from the checkpoint.

Run as: ``tpuctl run ... -- python job_ledger.py DIR STEP_S EVERY HOSTS``. It writes its pid to ``DIR/job-TASK.pids``
(the harness stops it by pid) and appends to ``DIR/events-TASK``: ``start WALL GENERATION FIRST_STEP``,
``first WALL GENERATION STEP`` (its first step reported), ``ckpt WALL GENERATION STEP`` (task 0: the step a
checkpoint holds, when it was reported reached); task 0 writes its step to ``DIR/step`` after every step.
It runs until stopped; a barrier that waits 120 s fails it (exit 1).
"""

from __future__ import annotations

import os
import sys
import time

import tpuctl.job

folder, step_s, every, hosts = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
task = int(os.environ["TPUCTL_TASK_ID"])
generation = int(os.environ["TPUCTL_GENERATION"])
with open(os.path.join(folder, f"job-{task}.pids"), "a") as handle:
    handle.write(f"{os.getpid()}\n")


def note(*words: object) -> None:
    with open(os.path.join(folder, f"events-{task}"), "a") as handle:
        handle.write(" ".join(str(w) for w in words) + "\n")


def write(name: str, value: int) -> None:
    path = os.path.join(folder, name)
    with open(path + f".{os.getpid()}.tmp", "w") as handle:
        handle.write(f"{value}\n")
    os.replace(path + f".{os.getpid()}.tmp", path)


def read(name: str) -> int:
    try:
        with open(os.path.join(folder, name)) as handle:
            return int(handle.read().strip() or -1)
    except (FileNotFoundError, ValueError):
        return -1


first = max(0, read("checkpoint"))
note("start", f"{time.time():.3f}", generation, first)
step = first
while True:
    step += 1
    time.sleep(step_s)  # this host's own work for the step
    write(f"g{generation}-t{task}", step)
    deadline = time.monotonic() + 120
    while any(read(f"g{generation}-t{t}") < step for t in range(hosts)):  # the step's "collective"
        if time.monotonic() > deadline:
            sys.exit(1)
        time.sleep(0.005)
    tpuctl.job.progress(step)
    reached = time.time()
    if step == first + 1:
        note("first", f"{reached:.3f}", generation, step)
    if task == 0:
        write("step", step)
        if step % every == 0:
            note("ckpt", f"{reached:.3f}", generation, step)
            write("checkpoint", step)
            tpuctl.job.checkpointed(step)
