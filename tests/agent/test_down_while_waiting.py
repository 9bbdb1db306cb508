"""``tpuctl down`` on a host while a ``tpuctl barrier`` waits there: the barrier is told its agent is
leaving (exit 5), and the agent leaves no traceback in its log. Found by the soak (``tools/soak``, seed
2035): the generation's end, a future every waiter shares, was cancelled with the agent's own tasks at
tear-down; the waiting barrier read it and died with CancelledError (asyncio printed "Exception in
callback ... Traceback" into agent.log) and its caller got no answer.
"""

from __future__ import annotations

import pytest
from harness import TPUCTL

pytestmark = pytest.mark.slow


def test_down_while_a_barrier_waits_tells_the_barrier_and_logs_no_traceback(make_cluster) -> None:
    c = make_cluster("v4-16", heartbeat_timeout="3s", extra="restart: {policy: rejoin, timeout: 60s, max: 3}\n")
    c.up()
    waiting = c.start("barrier-1", [*TPUCTL, "barrier", "alone", "--timeout", "30s", "--state-dir", str(c.state(1))])
    c.processes.wait_for_output(waiting, "waiting", timeout=20)  # parked: 1 of 2 hosts arrived
    assert c.tpuctl("down", task=1, timeout=30).code == 0, c.logs()
    done = c.processes.wait(waiting, 20)
    assert done.code == 5, c.logs()
    assert "leaving the cluster" in done.err and "barrier 'alone'" in done.err, done.err
    log = (c.state(1) / "agent.log").read_text()
    assert "Traceback" not in log and "CancelledError" not in log, log
