"""What tpuctl says stays true after a generation ended or the coordinator died (issue 24, items 2, 3 and
10), on real ``tpuctl`` processes on loopback:

* after a rejoin, ``tpuctl down --all`` is the shutdown of the generation the job runs in, not the old
  failure with a new time; what ended generation 1 is listed as history;
* a coordinator that was up and died gets advice for that (not the start-up advice), and ``status`` and
  ``sim status`` still list every host with its address and what is known of it;
* a worker's ``init`` waiting while the next generation forms hears at once that the coordinator died,
  and its final error says the coordinator answered before.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from harness import TPUCTL, wait_until
from harness.clusters import LocalCluster

pytestmark = pytest.mark.slow

SPEC = {"heartbeat": "500ms", "heartbeat_timeout": "3s", "register_timeout": "30s", "barrier_timeout": "30s"}
REJOIN = {**SPEC, "extra": "restart: {policy: rejoin, timeout: 60s, max: 3}\n"}
STARTUP_ADVICE = "check that `tpuctl init` runs on task 0"


def test_after_a_rejoin_down_all_is_the_shutdown_of_the_new_generation_and_the_old_failure_history(
    make_cluster,
) -> None:
    c: LocalCluster = make_cluster("v4-16", **REJOIN)
    c.up()
    os.kill(c.agent_pid(1), signal.SIGKILL)
    c.start_init(1, label="init-again-1")
    assert c.wait_init("init-again-1").code == 0, c.logs()
    c.wait_for_log(0, "generation 2 formed", 15)
    started = c.root / "started"
    run = c.start("run-0", [*TPUCTL, "run", "--grace", "2s", "--state-dir", str(c.state(0)), "--",
                            "sh", "-c", f"touch {started}; exec sleep 100"])  # fmt: skip
    wait_until(started.exists, 20, "the job to start", logs=c.logs)
    status = json.loads(c.tpuctl("status", "--json", task=0).out)
    assert status["generation"] == 2 and status["health"]["verdict"] == "healthy", status
    assert all(t["cause"] is None for t in status["tasks"]), status  # generation 1's cause is not a row's
    down = c.tpuctl("down", "--all", task=1)
    assert down.code == 0, down.err
    done = c.processes.wait(run, 20)
    assert done.code == 3, done.err
    headline = done.err.splitlines()[0]
    assert "was shut down (tpuctl down --all) in generation 2" in headline, done.err
    assert "failed first" not in done.err and "restarted: a new process" not in headline, done.err
    history = done.err[done.err.index("previous generations") :]
    assert "generation 1 (formed " in history and "task 1 (127.0.0.3) failed: restarted" in history, done.err


def test_a_coordinator_that_died_gets_its_own_hint_and_status_still_lists_every_host(sim_cluster) -> None:
    sim = sim_cluster("v4-16")  # heartbeat timeout 5 s
    os.kill(sim.agent_pid(0), signal.SIGKILL)
    sim.wait_for_log(1, "unreachable", 15)
    barrier = sim.tpuctl("barrier", "after", "--timeout", "10s", task=1)
    assert barrier.code == 3, barrier.err
    assert STARTUP_ADVICE not in barrier.err, barrier.err
    assert "the coordinator answered before; now its host refuses connections" in barrier.err, barrier.err

    status = sim.tpuctl("status", task=1)
    assert status.code == 3, status.err
    rows = [line.split() for line in status.out.splitlines() if line[:1].isdigit()]
    assert [r[:3] for r in rows] == [["0", "unreachable", "127.0.0.2"], ["1", "unknown", "127.0.0.3"]], status.out
    assert "task 0 (127.0.0.2) failed: coordinator at 127.0.0.2:" in status.out, status.out
    # the cause once on stdout (the health line), and stderr says the verdict without it
    assert status.out.count("Connection refused") == 1 and "Connection refused" not in status.err, status

    doc = json.loads(sim.tpuctl("sim", "status", "--root", str(sim.root), "-o", "json", env=sim.env).out)
    assert [(t["task"], t["address"], t["agent"]) for t in doc["tasks"]] == [
        (0, "127.0.0.2", "stopped"),
        (1, "127.0.0.3", "running"),
    ], doc
    text = sim.tpuctl("sim", "status", "--root", str(sim.root), env=sim.env).out
    assert "(?)" not in text and "task 0 (127.0.0.2) failed: its agent is not running" in text, text
    assert max(len(line) for line in text.splitlines()) < 60 + len(str(sim.root)) + 60, text  # no cause in a row


def test_a_worker_init_hears_at_once_when_the_coordinator_dies_while_the_next_generation_forms(make_cluster):
    # Task 0 coordinates for life (``successors: [0]``): nobody takes over (tests/restart/test_coordinator_moves.py).
    c: LocalCluster = make_cluster("v4-32", **{**REJOIN, "register_timeout": "15s", "successors": "[0]"})
    c.up()
    for victim in (2, 3):  # task 3 stays away: generation 2 keeps forming
        os.kill(c.agent_pid(victim), signal.SIGKILL)
    c.wait_for_log(1, "re-forming as the next generation", 15)
    init = c.start_init(2, label="init-again-2")
    c.processes.wait_for_output(init, "waiting for every host", timeout=20)
    os.kill(c.agent_pid(0), signal.SIGKILL)
    killed = time.monotonic()
    c.processes.wait_for_output(init, "ended before init finished", timeout=3 + 6)
    heard = time.monotonic() - killed
    assert heard < 3 + 4, f"init said it after {heard:.1f} s"  # the heartbeat timeout + a margin, not 15 s
    said = init.err()
    assert "the coordinator at 127.0.0.2:" in said and "stopped answering" in said, said
    done = c.processes.wait(init, 15 + 15)
    assert done.code == 3, done.err
    assert STARTUP_ADVICE not in done.err, done.err
    assert "it answered this host before" in done.err and "the coordinator answered before" in done.err, done.err
