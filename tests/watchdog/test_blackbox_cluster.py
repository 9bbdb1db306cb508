"""The black box on real processes: the 4-host simulated cluster and JAX CPU job of
``test_watchdog_cluster.py``; ``tpuctl dump --format json`` on one host names the odd one out (a job frozen
with SIGSTOP, a job deadlocked on a lock in ``wait_for_batch``) apart from the three hosts waiting in the
step's all-gather; the hang the watchdog declares takes the same dump by itself (task 0's agent log)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from harness import TPUCTL, wait_until
from harness.clusters import LocalCluster
from test_watchdog_cluster import JOB, STEP_S, agent_line, job_pid, step, watched_spec

from tpuctl.watchdog.blackbox import MAX_REPORT_BYTES, STOPPED

pytestmark = pytest.mark.slow


def start_jobs(c: LocalCluster, folder: Path, env: dict[str, str] | None = None) -> None:
    for t in range(c.num_hosts):
        c.start(f"run-{t}", [*TPUCTL, "run", "--grace", "2s", "--state-dir", str(c.state(t)), "--", sys.executable,
                             str(JOB), str(folder), "100000", str(STEP_S)], env={"JAX_PLATFORMS": "cpu", **(env or {})})  # fmt: skip


def dump(c: LocalCluster, task: int) -> dict:
    done = c.tpuctl("dump", "--format", "json", "--state-dir", str(c.state(task)), timeout=60)
    assert done.code == 0, done.err
    assert len(done.out.encode()) <= MAX_REPORT_BYTES * 2  # indented JSON of a report of at most 64 KiB
    return json.loads(done.out)


def test_a_frozen_job_is_the_odd_one_out(make_cluster, tmp_path: Path) -> None:
    c = make_cluster("v4-32", **watched_spec())
    c.up()
    start_jobs(c, tmp_path)
    wait_until(lambda: step(tmp_path) >= 20, 120, "the job to reach step 20", logs=c.logs)
    victim = 2
    pid = job_pid(c, victim)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(1.0)  # the others reach the step's all-gather and wait there
        report = dump(c, 1)
        assert report["answered"] == 4 and report["no_answer"]["count"] == 0, report
        odd, rest = report["groups"]
        assert odd["hosts"] == 1 and odd["sample"][0]["task"] == victim and odd["state"] == STOPPED, report
        assert rest["hosts"] == 3 and "process_allgather" in rest["signature"], report
        assert "job_watched.py" in rest["signature"], report
        for host in (*odd["sample"], *rest["sample"]):
            assert host["method"] == "py-spy" and Path(host["path"]).is_file(), host
        assert str(c.state(victim)) in odd["sample"][0]["path"]
        text = c.tpuctl("dump", "--state-dir", str(c.state(3)), timeout=60)
        assert text.code == 0, text.err
        lines = text.out.splitlines()
        assert lines[1].startswith(f"1 host, task {victim} (127.0.0.4): stopped (SIGSTOP or a debugger): "), text.out
        assert any(line.startswith("3 hosts: ") and "process_allgather" in line for line in lines), text.out
        # The hang the watchdog declares takes the dump by itself: the report in task 0's agent log.
        wait_until(lambda: agent_line(c, 0, f"1 host, task {victim} (127.0.0.4): stopped") is not None, 30,
                   "the hang's black box in task 0's log", logs=c.logs)  # fmt: skip
        assert agent_line(c, victim, "black box: dump") is not None
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_job_deadlocked_on_a_lock_is_grouped_apart(make_cluster, tmp_path: Path) -> None:
    c = make_cluster("v4-32", **watched_spec())
    c.up()
    start_jobs(c, tmp_path, {"JOB_DEADLOCK": "3:15"})
    wait_until(lambda: step(tmp_path) >= 14, 120, "the job to reach step 14", logs=c.logs)
    time.sleep(1.5)  # task 3 is in wait_for_batch; the others wait in step 15's all-gather
    report = dump(c, 0)
    assert report["answered"] == 4, report
    odd, rest = report["groups"]
    assert odd["hosts"] == 1 and odd["sample"][0]["task"] == 3, report
    assert odd["signature"].startswith("wait_for_batch (job_watched.py:"), report
    assert rest["hosts"] == 3 and "process_allgather" in rest["signature"], report
    assert odd["state"] == rest["state"] == "running"
