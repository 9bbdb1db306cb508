"""``tpuctl run`` adopts and reaps the job's orphans (a child subreaper; PID 1 in a container).

* In one process (fast): the subreaper flag, an orphaned grandchild re-parented and reaped by
  :func:`reap_orphans`, and the job's own exit status left for the thread that waits on it.
* ``tpuctl run`` on a simulated v4-8 (slow): as a plain process, and as PID 1 of a new pid namespace
  (``unshare --pid --fork --mount-proc``, root only), a job that leaves orphans sees every one adopted by
  ``tpuctl run`` and reaped within seconds, and ``tpuctl run`` still returns the job's own exit code.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import TPUCTL, Processes
from harness.clusters import SimCluster

JOB = Path(__file__).resolve().parent / "job_orphans.py"
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER is Linux's")

# Runs in a child Python (the subreaper flag and the orphans must not touch pytest's own process).
PROBE = r"""
import json, os, sys, threading, time
from pathlib import Path
from tpuctl.job.orphans import become_subreaper, reap_orphans

def children():
    pids = []
    for task in Path("/proc/self/task").iterdir():
        pids += [int(p) for p in (task / "children").read_text().split()]
    return pids

def state(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None

out = {"subreaper": become_subreaper()}
read, write = os.pipe()
job = os.fork()
if job == 0:  # the job: leaves an orphan (its child exits at once, the grandchild 0.2 s later), exits 7
    middle = os.fork()
    if middle == 0:
        orphan = os.fork()
        if orphan == 0:
            time.sleep(0.2)
            os._exit(0)
        os.write(write, f"{orphan}\n".encode())
        os._exit(0)
    os.waitpid(middle, 0)
    time.sleep(1.0)
    os._exit(7)
orphan = int(os.read(read, 64))
statuses = []
waiter = threading.Thread(target=lambda: statuses.append(os.waitpid(job, 0)[1]))  # as JobRunner._reap does
waiter.start()
reaped = []
deadline = time.monotonic() + 10
while orphan not in reaped and time.monotonic() < deadline:
    if orphan in children():
        out.setdefault("orphan_state_seen", state(orphan))
    reaped += reap_orphans(job)
    time.sleep(0.02)
waiter.join(10)
out.update(orphan_adopted=out.get("orphan_state_seen") is not None, reaped=reaped == [orphan],
           job_code=os.waitstatus_to_exitcode(statuses[0]) if statuses else None,
           zombies=[p for p in children() if state(p) == "Z"])

# the job exited first and is a zombie beside an orphaned zombie: only the orphan is reaped
job = os.fork()
if job == 0:
    if os.fork() == 0:
        os._exit(0)
    os._exit(9)
deadline = time.monotonic() + 10
while time.monotonic() < deadline and not (state(job) == "Z" and len(children()) == 2 and all(state(p) == "Z" for p in children())):
    time.sleep(0.01)
for _ in range(5):
    reap_orphans(job)
left = children()
while len(left) > 1 and time.monotonic() < deadline:  # the job's zombie may hide the orphan's: reap it, then again
    reap_orphans(job)
    left = children()
out.update(job_zombie_kept=state(job) == "Z", second_code=os.waitstatus_to_exitcode(os.waitpid(job, 0)[1]))
out["after"] = reap_orphans(-1) + children()
print(json.dumps(out))
"""


@linux_only
def test_reap_orphans_reaps_the_adopted_orphan_and_leaves_the_jobs_status() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["subreaper"] is True
    assert out["orphan_adopted"], out  # re-parented to the subreaper, not to init
    assert out["reaped"], out
    assert out["job_code"] == 7, out  # the waiting thread got the job's own status
    assert out["zombies"] == [], out
    assert out["job_zombie_kept"] and out["second_code"] == 9, out
    assert out["after"] == [], out


# --- tpuctl run, for real ------------------------------------------------------------------------------


@pytest.fixture
def sim(tmp_path: Path, processes: Processes) -> Iterator[SimCluster]:
    cluster = SimCluster(tmp_path / "sim", "v4-8", processes)
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.close()


def _unshare_works() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    try:
        probe = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", "test $$ -eq 1"],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _check(done_code: int | None, out: str, err: str, code: int) -> None:
    assert done_code == code, f"exit {done_code}\nstdout: {out}\nstderr: {err}"
    report = json.loads(out.strip().splitlines()[-1])
    assert report["adopted"] and report["left"] == [], report


@linux_only
@pytest.mark.slow
def test_tpuctl_run_adopts_and_reaps_the_jobs_orphans(sim: SimCluster) -> None:
    done = sim.tpuctl("run", "--state-dir", str(sim.state(0)), "--", sys.executable, str(JOB), "7", timeout=60)
    _check(done.code, done.out, done.err, 7)


@linux_only
@pytest.mark.slow
@pytest.mark.skipif(not _unshare_works(), reason="needs root and `unshare --pid --fork --mount-proc`")
def test_tpuctl_run_as_pid_1_leaves_no_zombie(sim: SimCluster) -> None:
    command = [
        "unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
        *TPUCTL, "run", "--state-dir", str(sim.state(0)), "--", sys.executable, str(JOB), "7", "5",
    ]  # fmt: skip
    done = sim.processes.run("run-pid1", command, timeout=60)
    _check(done.code, done.out, done.err, 7)
    report = json.loads(done.out.strip().splitlines()[-1])
    assert report["runner"] == 1  # tpuctl run was the namespace's PID 1
