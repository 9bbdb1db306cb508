"""Real multi-process jobs on a simulated cluster, each started by ``tpuctl run`` on its host.

* JAX: 4 processes complete ``jax.distributed.initialize`` from what tpuctl provides and all-gather.
* TensorFlow DTensor: 2 clients initialise from ``DTENSOR_*``, build the mapping's host mesh, pass
  ``dtensor.barrier`` and round-trip a sharded DVariable through ``tf.train.Checkpoint``.
* ``tpuctl run`` watching: kill -9 one host's agent; every host's job is stopped within the heartbeat
  timeout plus a few seconds, and every table names that host.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from harness import alive, wait_until
from harness.clusters import SimCluster

from .simjobs import JOBS_DIR, result_line

pytestmark = pytest.mark.slow

PYTHON = os.environ.get("PYTHON_FOR_JOBS") or __import__("sys").executable
SIM_HEARTBEAT_TIMEOUT_S = 5.0  # what `tpuctl sim up` writes into its spec
MakeCluster = Callable[[str], SimCluster]


def test_jax_job_initialises_from_tpuctl_and_all_gathers(sim_cluster: MakeCluster) -> None:
    c = sim_cluster("v4-32")  # 4 hosts
    assert c.num_hosts == 4
    env = {"JAX_PLATFORMS": "cpu"}
    labels = [c.run(t, PYTHON, str(JOBS_DIR / "job_jax.py"), label=f"jax-{t}", env=env) for t in range(4)]
    done = c.wait_all(labels, timeout=120)
    assert [f.code for f in done] == [0, 0, 0, 0], c.logs()
    coordinator = f"{c.info(0)['hosts'][0]}:{c.info(0)['job_ports']['jax']}"
    for task, finished in enumerate(done):
        result = result_line(finished)
        assert result["process"] == task
        assert result["processes"] == 4
        assert result["gathered"] == [100, 101, 102, 103]
        assert result["coordinator"] == coordinator
        assert result["mapping"] == str(c.state(task) / "mapping.json")


def test_dtensor_job_initialises_from_tpuctl_and_round_trips_a_checkpoint(
    sim_cluster: MakeCluster, tmp_path: Path
) -> None:
    c = sim_cluster("v4-16")  # 2 hosts, 4 devices each
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    labels = [c.run(t, PYTHON, str(JOBS_DIR / "job_dtensor.py"), str(checkpoint), label=f"tf-{t}") for t in range(2)]
    done = c.wait_all(labels, timeout=150)
    assert [f.code for f in done] == [0, 0], c.logs()
    ports = c.info(0)["job_ports"]["dtensor"]
    jobs = f"127.0.0.2:{ports[0]},127.0.0.3:{ports[1]}"
    for task, finished in enumerate(done):
        result = result_line(finished)
        assert result["client"] == task
        assert result["clients"] == 2
        assert result["jobs"] == jobs
        local = ",".join(str(4 * task + i) for i in range(4))
        devices = ",".join(f"/job:worker/replica:0/task:{task}/device:CPU:{i}" for i in range(4))
        assert result["mesh"] == f"|x=8|0,1,2,3,4,5,6,7|{local}|{devices}"
        assert result["restored"] == [10.0 * (4 * task + i) + 1.0 for i in range(4)]
    assert (checkpoint / "ckpt.index").exists()


def start_sleep_jobs(c: SimCluster, grace: str = "2s") -> tuple[list[str], list[int]]:
    """``job_sleep.py`` under ``tpuctl run`` on every host; returns the labels and every job process's pid."""
    pids_files = [c.root / f"sleep-{t}.pids" for t in range(c.num_hosts)]
    labels = [
        c.run(t, PYTHON, str(JOBS_DIR / "job_sleep.py"), str(pids_files[t]), label=f"sleep-{t}", grace=grace)
        for t in range(c.num_hosts)
    ]
    wait_until(lambda: all(p.exists() for p in pids_files), 60, "every job to write its pids", logs=c.logs)
    job_pids = [int(pid) for p in pids_files for pid in p.read_text().split()]
    assert all(alive(pid) for pid in job_pids)
    return labels, job_pids


def assert_gone(c: SimCluster, job_pids: list[int]) -> None:
    """The jobs, and the helper in each job's group that ignored SIGTERM, are gone."""
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not any(alive(pid) for pid in job_pids), 5, "the jobs to be gone")
    assert not [pid for pid in job_pids if alive(pid)], c.logs()


@pytest.mark.parametrize("victim", [2, 0], ids=["worker", "coordinator"])
def test_run_stops_every_job_when_one_host_agent_is_killed(sim_cluster: MakeCluster, victim: int) -> None:
    c = sim_cluster("v4-32")
    labels, job_pids = start_sleep_jobs(c)
    address = f"127.0.0.{2 + victim}"

    victim_agent = c.agent_pid(victim)
    os.kill(victim_agent, signal.SIGKILL)
    killed_at = time.monotonic()
    limit = SIM_HEARTBEAT_TIMEOUT_S + 2.0 + 5.0  # heartbeat timeout + --grace + a few seconds
    done = c.wait_all(labels, timeout=limit + 10)
    assert [f.code for f in done] == [3, 3, 3, 3], c.logs()
    for finished in done:
        elapsed = finished.seconds - (killed_at - c.processes[finished.label].started)
        assert elapsed < limit, f"{finished.label} took {elapsed:.1f} s after the kill\n{c.logs()}"
    # every table names the host that failed first, with its address, first
    for task, finished in enumerate(done):
        if task == victim:
            assert f"this host's tpuctl agent (pid {victim_agent}) is gone" in finished.err, finished.err
            assert "agent gone" in finished.err
        elif victim == 0:  # the coordinator's host: the others stop hearing from it
            assert "coordinator at 127.0.0.2:" in finished.err and "no heartbeat confirmed for" in finished.err, finished.err
            assert "unreachable" in finished.err
        else:
            assert f"task {victim} ({address}) failed first" in finished.err, finished.err
            assert "no heartbeat for" in finished.err
        table = finished.err.splitlines()
        assert table[2].startswith(f"  1  {victim}     {address}"), finished.err
        assert f"tpuctl: task {task}: stopped the job" in finished.err
    assert_gone(c, job_pids)

    if victim != 0:
        # the cluster is in error: a new job is not even started
        marker = c.root / "never-started"
        label = c.run(0, PYTHON, "-c", f"open({str(marker)!r}, 'w')", label="late-0")
        late = c.wait(label, timeout=30)
        assert late.code == 3, late.err
        assert "the job was not started" in late.err
        assert f"task {victim} ({address}) failed first" in late.err
        assert not marker.exists()


def test_a_frozen_agent_stops_its_own_hosts_job_within_the_heartbeat_timeout(sim_cluster: MakeCluster) -> None:
    """SIGSTOP the worker's agent: the cluster declares it failed after the heartbeat timeout, and the
    job on its own host (whose watcher gets no answer from the frozen agent) stops as soon."""
    c = sim_cluster("v4-16")
    labels, job_pids = start_sleep_jobs(c)
    frozen = c.agent_pid(1)
    os.kill(frozen, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        limit = SIM_HEARTBEAT_TIMEOUT_S + 2.0 + 3.0  # heartbeat timeout + --grace + a few seconds
        done = c.wait_all(labels, timeout=limit + 10)
        assert [f.code for f in done] == [3, 3], c.logs()
        for finished in done:
            elapsed = finished.seconds - (stopped_at - c.processes[finished.label].started)
            assert elapsed < limit, f"{finished.label} took {elapsed:.1f} s after the SIGSTOP\n{c.logs()}"
        assert f"this host's tpuctl agent (pid {frozen}) is not answering" in done[1].err, done[1].err
        assert "task 1 (127.0.0.3) failed first" in done[0].err, done[0].err
    finally:
        os.kill(frozen, signal.SIGCONT)
    assert_gone(c, job_pids)


def test_run_stops_every_job_when_the_cluster_is_shut_down(sim_cluster: MakeCluster) -> None:
    c = sim_cluster("v4-16")
    labels, job_pids = start_sleep_jobs(c)
    down = c.processes.run("down", [PYTHON, "-m", "tpuctl", "down", "--all", "--state-dir", str(c.state(1))])
    assert down.code == 0, down.err
    done = c.wait_all(labels, timeout=30)
    assert [f.code for f in done] == [3, 3], c.logs()
    for task, finished in enumerate(done):
        assert "was shut down" in finished.err or "is stopping" in finished.err, finished.err
        assert f"tpuctl: task {task}: stopped the job" in finished.err
    assert_gone(c, job_pids)


def test_a_job_whose_children_die_with_it_is_stopped_at_once_not_after_the_grace(sim_cluster: MakeCluster) -> None:
    """A job with a child (a shell script, a launcher): SIGTERM ends both; the child is then tpuctl run's
    zombie (a subreaper), still in the job's group. It is reaped, not waited for until --grace."""
    c = sim_cluster("v4-16")
    pids = c.root / "children.pids"
    label = c.run(0, "sh", "-c", f"sleep 1000 & echo $$ $! > {pids}; wait", grace="5s")
    wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 2, 20, "the job and its child to start")
    child = int(pids.read_text().split()[1])
    os.kill(c.agent_pid(1), signal.SIGKILL)
    done = c.wait(label, timeout=SIM_HEARTBEAT_TIMEOUT_S + 5 + 10)
    assert done.code == 3, done.err
    stopped = next(line for line in done.err.splitlines() if "stopped the job" in line)
    assert "with SIGTERM: exited in 0." in stopped and "leftover" not in stopped, stopped
    assert not alive(child), stopped
