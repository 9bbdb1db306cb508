"""``tpuctl run --max-restarts`` between two generations, on real processes (a 2-host v4-16 on loopback): a
stop signal ends the wait at once and starts nothing; a cluster that cannot re-form (restart policy fail)
is not waited for. Review 1's F1 and F2.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from harness import TPUCTL, Proc
from harness.clusters import LocalCluster

pytestmark = pytest.mark.slow

SPEC = {"heartbeat": "500ms", "heartbeat_timeout": "3s", "register_timeout": "30s", "barrier_timeout": "30s"}
REJOIN = {**SPEC, "extra": "restart: {policy: rejoin, timeout: 60s, max: 3}\n"}
WAITING = "waiting for the next generation to restart the job"


def run_job(c: LocalCluster, task: int, starts: Path, *options: str) -> Proc:
    """``tpuctl run --max-restarts 2`` of a job that notes each of its starts in ``starts``."""
    job = ["sh", "-c", f"echo start >> {starts}; exec sleep 100"]
    return c.start(f"run-{task}", [*TPUCTL, "run", "--max-restarts", "2", "--grace", "2s", *options,
                                   "--state-dir", str(c.state(task)), "--", *job])  # fmt: skip


def wait_started(c: LocalCluster, starts: Path, count: int = 1, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not (starts.exists() and len(starts.read_text().split()) >= count):
        assert time.monotonic() < deadline, f"the job did not start {count} time(s):\n{c.logs()}"
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_while_waiting_for_the_next_generation_ends_tpuctl_run_at_once(make_cluster, tmp_path, sig):
    c = make_cluster("v4-16", **REJOIN)
    c.up()
    starts = tmp_path / "starts"
    run = run_job(c, 1, starts)
    wait_started(c, starts)
    os.kill(c.agent_pid(1), signal.SIGKILL)
    c.processes.wait_for_output(run, WAITING, timeout=15)
    signalled = time.monotonic()
    run.send_signal(sig)
    done = c.processes.wait(run, 5)
    took = time.monotonic() - signalled
    assert done.code == 128 + sig, done.err
    assert took < 1.0, f"{took:.2f} s from {sig.name} to tpuctl run's exit"
    assert f"stopped by {sig.name} while waiting for the next generation; the job was not restarted" in done.err
    assert "GENERATION" in done.err, done.err  # the generations table
    # the host comes back and the cluster re-forms: nothing starts the job again
    c.start_init(1, label="init-again-1")
    assert c.wait_init("init-again-1").code == 0, c.logs()
    assert starts.read_text().split() == ["start"]


def test_under_policy_fail_max_restarts_warns_and_a_dead_agent_ends_tpuctl_run_at_once(make_cluster, tmp_path):
    c = make_cluster("v4-16", **SPEC)  # restart policy fail, the default
    c.up()
    starts = tmp_path / "starts"
    run = run_job(c, 1, starts)
    wait_started(c, starts)
    assert "--max-restarts 2 restarts nothing" in run.err() and "restart policy 'fail'" in run.err(), run.err()
    os.kill(c.agent_pid(1), signal.SIGKILL)
    killed = time.monotonic()
    done = c.processes.wait(run, 15)
    took = time.monotonic() - killed
    assert done.code == 3, done.err
    assert took < 3 + 2 + 1.5, f"{took:.1f} s"  # the agent's silence (heartbeat timeout) + --grace + margin
    assert WAITING not in done.err and "this host's tpuctl agent" in done.err, done.err
    assert starts.read_text().split() == ["start"]


def test_under_policy_fail_a_job_failing_by_itself_does_not_wait_for_the_agent(make_cluster, tmp_path):
    c = make_cluster("v4-16", **SPEC)
    c.up()
    done = c.processes.run("run-exit-1", [*TPUCTL, "run", "--max-restarts", "1", "--state-dir", str(c.state(1)),
                                          "--", "sh", "-c", "exit 1"], timeout=30)  # fmt: skip
    assert done.code == 1, done.err
    assert done.seconds < 2.0, f"{done.seconds:.1f} s (the heartbeat timeout is 3 s)"


def test_a_barrier_of_a_generation_ahead_of_the_agent_does_not_call_it_over(make_cluster) -> None:
    c = make_cluster("v4-16", **REJOIN)
    c.up()
    ahead = c.tpuctl("barrier", "step", task=1, timeout=20, env={"TPUCTL_GENERATION": "7"})
    assert ahead.code == 3 and "this job is of generation 7; the cluster is at generation 1" in ahead.err, ahead.err
    assert "is ahead of this host's agent" in ahead.err and "is over" not in ahead.err, ahead.err


def test_a_generation_that_ended_and_re_formed_before_the_watcher_asked_is_not_an_agent_replaced(make_cluster):
    """The watcher of a job of generation 1 first asks the agent when generation 2 has already formed (the
    window is one round trip in tpuctl run; here it is made wide): the same agent, so the job's generation
    ended, which is restartable, not 'this host's agent was replaced'."""
    from tpuctl.agent.statedir import StateDir
    from tpuctl.job.watcher import Watcher

    c = make_cluster("v4-16", **REJOIN)
    c.up()
    os.kill(c.agent_pid(0), signal.SIGKILL)
    c.start_init(0, label="init-again-0")
    assert c.wait_init("init-again-0").code == 0, c.logs()
    c.wait_for_log(1, "generation 2 formed", 15)
    seen = []
    watcher = Watcher(StateDir(c.state(1)), c.agent_pid(1), seen.append, silence=3.0, generation=1)
    watcher.start()
    watcher.join(10)
    assert len(seen) == 1, seen
    down = seen[0]
    assert not down.agent_gone, down
    assert down.report.rejoining and not down.report.final and down.report.generation == 1, down
    assert "generation 1 ended" in (down.report.ended or "") and "generation 2 formed" in down.report.ended, down


def test_a_generation_ending_between_the_formed_word_and_the_job_env_waits_for_the_next(make_cluster, tmp_path):
    """ENV refused (GenerationOver) after the agent said a generation formed: the job is started under the
    next generation, not failed with a bare message."""
    import threading

    from tpuctl.agent.statedir import StateDir
    from tpuctl.job.runner import JobRunner

    c = make_cluster("v4-16", **REJOIN)
    c.up()
    os.kill(c.agent_pid(0), signal.SIGKILL)
    c.wait_for_log(1, "re-forming as the next generation", 15)
    said: list[str] = []
    starts = tmp_path / "starts"
    runner = JobRunner(["sh", "-c", f"echo $TPUCTL_GENERATION >> {starts}"], StateDir(c.state(1)),
                       grace=2.0, say=said.append, max_restarts=1)  # fmt: skip
    threading.Timer(1.0, lambda: c.start_init(0, label="init-again-0")).start()
    code = runner._attempt()  # as after _next_generation said generation 1 formed: it is over already
    assert code == 0, said
    assert starts.read_text().split() == ["2"], said
    assert any("generation 1 of cluster" in line and "waiting for the next generation" in line for line in said), said


def test_status_while_re_forming_with_the_coordinator_down_says_so(make_cluster) -> None:
    import json

    c = make_cluster("v4-16", **REJOIN, successors="[0]")  # task 0 for life: nobody takes over
    c.up()
    os.kill(c.agent_pid(0), signal.SIGKILL)
    c.wait_for_log(1, "re-forming as the next generation", 15)
    text = c.tpuctl("status", task=1, timeout=20)
    assert text.code == 0, text.err
    assert "None" not in text.out and "cluster error" not in text.out, text.out
    assert "generation   1" in text.out and "(not answering: " in text.out, text.out
    assert "health       degraded" in text.out and "this host is re-forming: generation 1 ended" in text.out, text.out
    document = json.loads(c.tpuctl("status", "--json", task=1, timeout=20).out)
    assert document["generation"] == 1 and not document.get("error"), document
    assert document["health"]["verdict"] == "degraded", document
