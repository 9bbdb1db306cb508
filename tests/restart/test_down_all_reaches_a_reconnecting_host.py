"""``tpuctl down --all`` reaches a host whose session was reconnecting just then. Found by the soak
(``tools/soak``, seed 50486): a cut of task 0 shorter than the heartbeat timeout cost task 2 its session (a
keepalive ping went unanswered); ``tpuctl down --all`` came before it reconnected, task 0 pushed the shutdown
to the open sessions and stopped its service at once, and task 2 found the port closed, took it for a
coordinator to rejoin and stayed up for the restart timeout. Task 0 now keeps the service up until every
registered host has heard the shutdown (at most the heartbeat timeout).

Here a worker is frozen (SIGSTOP) long enough for the service to drop its session, but well under the
heartbeat timeout; the shutdown comes while it is frozen; it resumes and must exit, naming the shutdown.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from harness import wait_until

from tpuctl.processes import pid_alive

pytestmark = pytest.mark.slow

SPEC = {
    "heartbeat": "500ms", "heartbeat_timeout": "8s", "register_timeout": "30s", "barrier_timeout": "30s",
    "extra": "restart: {policy: rejoin, timeout: 90s, max: 5}\n",
}  # fmt: skip
DROPPED_S = 3.5  # the service's keepalive (8 s / 6 per ping, as long for its answer) drops the session by then
RESUME_BY_S = 6.5  # under the heartbeat timeout: the host is not declared failed


def test_down_all_reaches_a_host_whose_session_was_reconnecting(make_cluster) -> None:
    c = make_cluster("v4-32", **SPEC)  # 4 hosts
    c.up()
    agents = {t: c.agent_pid(t) for t in range(4)}
    frozen_at = time.monotonic()
    os.kill(agents[2], signal.SIGSTOP)
    try:
        time.sleep(DROPPED_S)
        down = c.spawn("down", "--all", task=1)
        # the shutdown is out (task 0 logged it) while task 2 is still frozen
        wait_until(lambda: "shut the cluster down" in (c.state(0) / "agent.log").read_text(),
                   RESUME_BY_S - DROPPED_S, "task 0 to hear the shutdown", logs=c.logs)  # fmt: skip
        assert time.monotonic() - frozen_at < RESUME_BY_S, "too slow to test: the shutdown came too late"
        time.sleep(0.5)  # before the fix task 0's service was gone by now
    finally:
        os.kill(agents[2], signal.SIGCONT)
    assert c.wait(down.label, 40).code == 0, c.logs()
    # before the fix task 2 waited for the coordinator for the restart timeout (90 s)
    wait_until(lambda: not any(pid_alive(p) for p in agents.values()), 15.0, "every agent to exit", logs=c.logs)
    log = (c.state(2) / "agent.log").read_text()
    assert "cluster shut down" in log, f"task 2 never heard the shutdown:\n{log[-3000:]}"
