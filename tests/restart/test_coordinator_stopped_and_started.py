"""Under ``restart: {policy: rejoin}``, task 0 stopped gracefully (``tpuctl down`` on task 0 alone) and its
``tpuctl init`` run again: the new coordinator starts above the generation the hosts that stayed remember,
as after a kill, so every host agrees on one generation number and it never goes back (a job of the old
generation 1 must not pass for the new one). Reported by the soak: the new service started at generation 1
while task 1 said "re-forms as generation 2" (or 3)."""

from __future__ import annotations

import json
import re
import time

import pytest
from harness import wait_until

pytestmark = pytest.mark.slow

SPEC = {
    "heartbeat": "500ms", "heartbeat_timeout": "3s", "register_timeout": "30s", "barrier_timeout": "30s",
    "extra": "restart: {policy: rejoin, timeout: 60s, max: 5}\n",
}  # fmt: skip


def registered_into(text: str) -> set[int]:
    """The generations an agent's log says it registered into (generation 1: no number)."""
    return {1} | {int(g) for g in re.findall(r"registered with \S+ \(generation (\d+)\)", text)}


def test_a_coordinator_stopped_and_started_again_continues_above_every_hosts_generation(make_cluster) -> None:
    c = make_cluster("v4-16", **SPEC)  # 2 hosts
    c.up()
    assert c.tpuctl("down", task=0, timeout=30).code == 0, c.logs()
    c.wait_for_log(1, "the cluster re-forms as generation 2", timeout=20)  # the old service's word
    remembered = max(registered_into((c.state(1) / "agent.log").read_text()))
    c.start_init(0, label="init-0-again")
    again = c.wait_init("init-0-again", timeout=60)
    assert again.code == 0, c.logs()
    generation = c.info(0)["generation"]
    assert generation > remembered, f"task 1 remembered generation {remembered}; task 0 started at {generation}"
    c.wait_for_log(1, f"generation {generation} formed", timeout=30)
    for t in range(2):
        assert c.info(t)["generation"] == generation, c.logs()
        assert json.loads(c.mapping(t).read_text())["generation"] == generation, c.logs()


def test_hosts_registering_when_the_coordinator_stops_wait_for_the_next_one(make_cluster) -> None:
    """Soak seed 2020: ``tpuctl down`` on task 0 alone; the others re-register at once, and the service stops
    under some of those registrations (answered, then broke off). Each such host must wait for the next
    coordinator within the restart timeout, as the others do, not fail for good after the heartbeat timeout."""
    c = make_cluster("v4-64", **SPEC)  # 8 hosts: some register while the service stops
    c.up()
    assert c.tpuctl("down", task=0, timeout=30).code == 0, c.logs()
    time.sleep(5.0)  # past the heartbeat timeout (3 s): a host that gave up has given up
    c.start_init(0, label="init-0-again")
    assert c.wait_init("init-0-again", timeout=60).code == 0, c.logs()
    generation = c.info(0)["generation"]

    def formed_everywhere() -> bool:
        try:
            return all(json.loads(c.mapping(t).read_text())["generation"] == generation for t in range(8))
        except (OSError, ValueError):
            return False

    wait_until(formed_everywhere, 30, f"generation {generation} to form on every host", interval=0.1, logs=c.logs)
