"""Faults on real clusters of ``tpuctl`` processes: every host names the real cause, within its deadline."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

pytestmark = pytest.mark.slow


def test_status_beside_a_frozen_coordinator_blames_the_coordinator_not_this_hosts_agent(make_cluster) -> None:
    c = make_cluster("v4-16", heartbeat_timeout="30s")  # long: nobody is declared failed during the test
    c.up()
    coordinator = c.agent_pid(0)
    os.kill(coordinator, signal.SIGSTOP)
    try:
        started = time.monotonic()
        status = c.tpuctl("status", "--json", task=1, timeout=30)
        took = time.monotonic() - started
    finally:
        os.kill(coordinator, signal.SIGCONT)
    assert status.code == 3, status.err  # the cluster is not healthy from here: exit 3, not the agent's 4/5
    doc = json.loads(status.out)
    # The call's deadline, or (protocol v8) the channel's keepalive ping going unanswered first.
    frozen = ("did not answer within", "ping timeout")
    assert any(why in doc["error"] for why in frozen) and "127.0.0.2" in doc["error"], doc
    assert "agent" not in status.err, status.err
    assert took < 8.0, f"status took {took:.1f} s"
