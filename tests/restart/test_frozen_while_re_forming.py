"""A worker frozen (SIGSTOP) past the heartbeat timeout while the next generation forms (``restart:
rejoin``, a killed host not back yet): the service drops its registration (it is only missing again), and
once resumed the worker registers again, so the generation forms when the killed host is back. Found by
the soak (``tools/soak``, seeds 2002 and 2008, a cut or a stop while a generation formed): the worker's
agent took the refusal ("declared failed", then "has not registered") for the cluster's final error, went
silent without a word in its log, and the generation never formed (the restart timeout failed the cluster).
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
    "extra": "restart: {policy: rejoin, timeout: 60s, max: 5}\n",
}  # fmt: skip
FROZEN_S = 5.0  # heartbeat timeout 3 s, + 2


def test_a_worker_frozen_while_a_generation_forms_registers_again_and_the_generation_forms(make_cluster) -> None:
    c = make_cluster("v4-32", **SPEC)  # 4 hosts
    c.up()
    os.kill(c.agent_pid(3), signal.SIGKILL)
    c.wait_for_log(1, "for 1 of 4 hosts: task 3", timeout=20)  # generation 2 forms without task 3
    frozen = c.agent_pid(1)
    os.kill(frozen, signal.SIGSTOP)
    try:
        c.wait_for_log(0, "task 1 (127.0.0.3) failed: no heartbeat", timeout=FROZEN_S + 10)  # dropped
        time.sleep(0.5)
    finally:
        os.kill(frozen, signal.SIGCONT)
    c.start_init(3, label="init-3-again")

    def one_generation_everywhere() -> bool:
        try:
            mappings = [c.mapping(t).read_bytes() for t in range(4)]
        except OSError:
            return False
        return len(set(mappings)) == 1 and json.loads(mappings[0])["generation"] == 2

    wait_until(one_generation_everywhere, 30, "generation 2 to form on every host", interval=0.1, logs=c.logs)
    assert c.wait_init("init-3-again", timeout=30).code == 0, c.logs()
    log = (c.state(1) / "agent.log").read_text()
    assert "its registration into generation 2 was dropped while that generation formed" in log, log[-3000:]
