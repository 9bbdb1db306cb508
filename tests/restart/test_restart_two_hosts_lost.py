"""Two hosts lost within seconds (a preemption takes several VMs), the second replaced by a new VM without
its state dir: once it has been silent for the heartbeat timeout its place is free, its new `tpuctl init`
registers, and the cluster re-forms; what ended generation 1 names both hosts. Review 1's F4, on real
processes (4 hosts on loopback).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

pytestmark = pytest.mark.slow

SPEC = {
    "heartbeat": "500ms", "heartbeat_timeout": "3s", "register_timeout": "30s", "barrier_timeout": "30s",
    "extra": "restart: {policy: rejoin, timeout: 25s, max: 3}\n",
}  # fmt: skip


def test_a_second_host_lost_while_re_forming_and_replaced_by_a_new_vm_rejoins(make_cluster) -> None:
    c = make_cluster("v4-32", **SPEC)
    c.up()
    os.kill(c.agent_pid(2), signal.SIGKILL)
    time.sleep(1.5)
    os.kill(c.agent_pid(3), signal.SIGKILL)
    c.wait_for_log(0, "re-forming as the next generation", 15)
    started = time.monotonic()
    for task in (2, 3):  # new VMs: no registration.json (a tmpfs state dir after a reboot, a new disk)
        (c.state(task) / "registration.json").unlink(missing_ok=True)
    c.start_init(2, label="init-new-2")
    c.start_init(3, label="init-new-3")
    first = c.wait_init("init-new-3", 30)
    if first.code != 0:  # within task 3's heartbeat timeout of its last heartbeat: held, with how long
        assert first.code == 3 and "is held for the process that registered it in generation 1" in first.err, first.err
        retry = re.search(r"retry `tpuctl init` for task 3 after ([0-9.]+) s", first.err)
        assert retry is not None, f"the refusal does not say when to retry:\n{first.err}"
        wait = float(retry.group(1))
        assert wait <= 3.0, first.err
        time.sleep(wait + 0.1)
        c.start_init(3, label="init-new-3-again")
        assert c.wait_init("init-new-3-again").code == 0, c.logs()
    assert c.wait_init("init-new-2").code == 0, c.logs()
    took = time.monotonic() - started
    assert took < 10, f"{took:.1f} s to re-form"
    status = json.loads(c.tpuctl("status", "--json", task=3).out)
    assert status["generation"] == 2, status
    assert json.loads(c.mapping(3).read_text())["generation"] == 2
    text = json.dumps(status)
    assert "task 3 (127.0.0.5): no heartbeat for" in text and "while generation 2 formed" in text, text
