"""``tpuctl down --all`` while the cluster re-forms (``restart: rejoin``, a killed host not back yet): every
agent hears the shutdown and exits. Found by the soak (``tools/soak``, seeds 10020, 10025, 10031): a host
waiting for the others to register was refused ("cluster failed during registration: ... shut down") and
then asked the service for the cluster's error to learn whether it was a shutdown; task 0's agent, which
heard the shutdown itself, had stopped the service by then, so the host found the port closed, said "the
coordinator ... stopped answering", took it for a coordinator to rejoin, and stayed up until the restart
timeout (about 2 runs of 3). The refusal now carries the cluster's failure (``Refused.failure``), so the
host knows it was a shutdown without asking again.
"""

from __future__ import annotations

import os
import signal

import pytest
from harness import wait_until

from tpuctl.processes import pid_alive

pytestmark = pytest.mark.slow

SPEC = {
    "heartbeat": "500ms", "heartbeat_timeout": "3s", "register_timeout": "30s", "barrier_timeout": "30s",
    "extra": "restart: {policy: rejoin, timeout: 60s, max: 5}\n",
}  # fmt: skip


def test_down_all_while_the_cluster_re_forms_stops_every_agent(make_cluster) -> None:
    c = make_cluster("v4-64", **SPEC)  # 8 hosts: 6 waiting in registration when the shutdown comes
    c.up()
    agents = {t: c.agent_pid(t) for t in range(8)}
    os.kill(agents[7], signal.SIGKILL)
    for t in range(7):
        c.wait_for_log(t, "for 1 of 8 hosts: task 7", timeout=20)  # generation 2 forms without it
    assert c.tpuctl("down", "--all", task=3, timeout=40).code == 0, c.logs()
    wait_until(lambda: not any(pid_alive(agents[t]) for t in range(7)), 5.0, "every agent to exit", logs=c.logs)
    for t in range(7):
        log = (c.state(t) / "agent.log").read_text()
        assert "stopped answering" not in log, f"task {t} missed the shutdown:\n{log[-3000:]}"
