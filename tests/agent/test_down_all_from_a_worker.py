"""``tpuctl down --all`` on a worker: it reports the shutdown to the coordinator, which tells every host,
this one too; the agent's tear-down may then close its client while that report's answer is still on
its way. Required: no traceback in any agent log (the command and every agent still do their part).
Found by the soak (``tools/soak``, seeds 10014, 10061): the report's call was cancelled under the local
command's handler and asyncio printed "Exception in callback ... CancelledError" into agent.log, in
about one run of two on a 2-host cluster.
"""

from __future__ import annotations

import pytest
from harness import wait_until

from tpuctl.processes import pid_alive

pytestmark = pytest.mark.slow

ROUNDS = 4  # the race went wrong about every other time


def test_down_all_from_a_worker_leaves_no_traceback(make_cluster) -> None:
    for n in range(ROUNDS):
        c = make_cluster("v4-16", heartbeat_timeout="3s", extra="restart: {policy: rejoin, timeout: 60s, max: 3}\n")
        inits = [c.start_init(t, label=f"init-{n}-{t}") for t in range(2)]  # labels of this round's cluster
        assert [r.code for r in c.processes.wait_all(inits, 60)] == [0, 0], c.logs()
        agents = [c.agent_pid(t) for t in range(2)]
        done = c.tpuctl("down", "--all", task=1, timeout=40)
        assert done.code == 0 and "the cluster shut down" in done.err, c.logs()
        wait_until(lambda a=agents: not any(pid_alive(p) for p in a), 10, "both agents to exit", logs=c.logs)
        for t in range(2):
            log = (c.state(t) / "agent.log").read_text()
            assert "Traceback" not in log and "CancelledError" not in log, f"task {t}:\n{log[-3000:]}"
