"""A coordinator frozen (SIGSTOP: a stalled VM, a debugger) longer than the heartbeat timeout, then
resumed, under ``restart: rejoin``. The workers give generation 1 up ("the coordinator stopped
answering"), and the coordinator, silent past the heartbeat timeout by its own clock, ends generation 1
itself as it resumes, naming itself; every host registers again with it. Required: the
cluster re-forms as generation 2 on every host, mappings identical, and a barrier on every host passes.
Found by the soak (``tools/soak``, seed 138): the workers were taken back into generation 1 and waited
in a core-ID merge task 0 had long finished, failing at the barrier timeout (30 s), for good.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from harness import TPUCTL, wait_until

pytestmark = pytest.mark.slow

SPEC = {
    "heartbeat": "500ms", "heartbeat_timeout": "3s", "register_timeout": "30s", "barrier_timeout": "30s",
    "extra": "restart: {policy: rejoin, timeout: 30s, max: 5}\n",
}  # fmt: skip
FROZEN_S = 5.0  # heartbeat timeout 3 s, + 2


def test_a_coordinator_frozen_past_the_heartbeat_timeout_re_forms_the_cluster_when_it_resumes(make_cluster) -> None:
    c = make_cluster("v4-32", **SPEC, successors="[0]")  # task 0 for life (a successor: test_coordinator_moves.py)
    c.up()
    pid = c.agent_pid(0)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(FROZEN_S)
    finally:
        os.kill(pid, signal.SIGCONT)

    def generation_2_everywhere() -> bool:
        mappings = []
        for task in range(4):
            try:
                mappings.append(c.mapping(task).read_bytes())
            except OSError:
                return False
        return len(set(mappings)) == 1 and json.loads(mappings[0])["generation"] == 2

    wait_until(generation_2_everywhere, 15, "generation 2 to form on every host", interval=0.1, logs=c.logs)
    barriers = [c.start(f"barrier-{t}", [*TPUCTL, "barrier", "after", "--timeout", "15s", "--state-dir",
                                         str(c.state(t))]) for t in range(4)]  # fmt: skip
    done = c.processes.wait_all(barriers, 25)
    assert [d.code for d in done] == [0, 0, 0, 0], c.logs()
    status = json.loads(c.tpuctl("status", "--json", task=0).out)
    assert status["generation"] == 2 and not status["forming"], status
    # The coordinator, silent past the heartbeat timeout, ended generation 1 itself as it resumed, naming itself.
    assert "task 0 (127.0.0.2) failed: could not run for " in json.dumps(status["ended"]), status["ended"]
