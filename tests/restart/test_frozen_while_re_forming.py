"""A survivor frozen (SIGSTOP) for longer than the heartbeat timeout right after it registered into the
next generation, while that generation still waits for the host that failed, under ``restart: rejoin``.
The service drops its registration (it is only missing again); once it resumes, its agent must register
again by itself, so the cluster forms when the failed host is back. Found by the soak (``tools/soak``,
seeds 30019 and 30042): the agent took the refusal of its heartbeat for a final error, logged nothing and
stayed up outside the cluster, which waited for it until the restart timeout and then failed for good.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from harness import wait_until

pytestmark = pytest.mark.slow

SPEC = {
    "heartbeat": "500ms", "heartbeat_timeout": "3s", "register_timeout": "30s", "barrier_timeout": "30s",
    "extra": "restart: {policy: rejoin, timeout: 40s, max: 5}\n",
}  # fmt: skip
FROZEN_S = 5.0  # heartbeat timeout 3 s, + 2
FORM_S = 20.0  # well under the restart timeout (40 s), at which the cluster would fail for good


def test_a_survivor_frozen_while_the_next_generation_forms_registers_again_when_it_resumes(make_cluster) -> None:
    c = make_cluster("v4-32", **SPEC)
    c.up()
    os.kill(c.agent_pid(1), signal.SIGKILL)
    c.wait_for_log(2, "(generation 2); waiting for every host", 15)
    frozen = c.agent_pid(2)
    os.kill(frozen, signal.SIGSTOP)
    try:
        c.wait_for_log(0, "task 2 (127.0.0.4) failed: no heartbeat for", 15)  # dropped from generation 2
        time.sleep(max(0.0, FROZEN_S - 3.0))
    finally:
        os.kill(frozen, signal.SIGCONT)
    started = time.monotonic()
    c.start_init(1, label="init-again-1")
    back = c.wait_init("init-again-1", FORM_S + 10)
    assert back.code == 0, f"task 1's init again exited {back.code}:\n{back.err}\n{c.logs()}"

    def generation_2_everywhere() -> bool:
        mappings = []
        for task in range(4):
            try:
                mappings.append(c.mapping(task).read_bytes())
            except OSError:
                return False
        return len(set(mappings)) == 1 and json.loads(mappings[0])["generation"] == 2

    wait_until(generation_2_everywhere, max(1.0, FORM_S - (time.monotonic() - started)),
               "generation 2 to form on every host", interval=0.1, logs=c.logs)  # fmt: skip
    assert c.agent_pid(2) == frozen  # the same agent took its place again
    log = (c.state(2) / "agent.log").read_text(errors="replace")
    assert "the coordinator dropped this host's registration into generation 2 while it formed" in log, log
    assert "Traceback" not in log and "ERROR" not in log, log
