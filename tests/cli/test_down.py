"""``tpuctl down --all`` on a host whose agent cannot take the command yet (it is still joining: its
control socket opens once its mapping is written) stops that agent with SIGTERM, which shuts nothing
else down. Required: it says so (exit 5, the other hosts' agents still run, what to do), never "the
cluster shut down". Found by the soak (``tools/soak``, seed 134): ``down --all`` right after a host's
``tpuctl init`` again printed "stopped and the cluster shut down" while 7 agents kept running.
"""

from __future__ import annotations

import os
import signal

import pytest

from tpuctl.processes import pid_alive

pytestmark = pytest.mark.slow


def test_down_all_on_an_agent_still_joining_says_the_cluster_was_not_shut_down(make_cluster) -> None:
    c = make_cluster("v4-16", heartbeat_timeout="3s", extra="restart: {policy: rejoin, timeout: 60s, max: 3}\n")
    c.up()
    os.kill(c.agent_pid(1), signal.SIGKILL)
    c.start_init(1, label="init-again", env={"TPUCTL_SIM_INIT_DELAY": "60"})  # joins, then waits in its runtime
    c.wait_for_log(1, "simulated TPU runtime starting")
    coordinator = c.agent_pid(0)
    done = c.tpuctl("down", "--all", task=1, timeout=40)
    assert done.code == 5, c.logs()
    assert "the cluster was not shut down" in done.err, done.err
    assert "tpuctl down --all" in done.err and "on a host whose agent is up" in done.err, done.err
    assert "the cluster shut down" not in done.out + done.err.replace("the cluster was not shut down", "")
    assert pid_alive(coordinator), "task 0's agent was to keep running: nothing told it"
    assert c.processes.wait("init-again", 20).code not in (0, None)
