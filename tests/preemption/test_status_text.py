"""`tpuctl status` shows the latest preemption notices and the agreement (the light path's text renderer)."""

from __future__ import annotations

from tpuctl.cli.light import render_status

BASE = {"cluster": "pod", "task": 0, "coordinator": "10.0.0.1:8490", "service_incarnation": "1", "tasks": []}


def preemption(state: str, step: int | None, notices: int = 1) -> dict[str, object]:
    return {
        "generation": 1,
        "notices": [
            {
                "task": 2 + i,
                "address": f"10.0.0.{3 + i}",
                "source": "gce-preempted",
                "reason": "instance/preempted is TRUE",
                "deadline_in": 27.4,
                "notice": 1 + i,
            }
            for i in range(min(notices, 10))
        ],
        "count": notices,
        "agreement": {"state": state, "step": step, "reason": "no host's job asks", "reported": 3, "hosts": 4},
        "checkpointed": None,
        "saved": 0,
    }


def test_the_notice_and_the_agreed_step() -> None:
    text = render_status({**BASE, "preemption": preemption("agreed", 1204)})
    assert "preemption: task 2 (10.0.0.3) goes: gce-preempted (instance/preempted is TRUE), deadline in 27 s" in text
    assert "checkpoint: every host saves step 1,204 (0 saved so far)" in text


def test_a_pending_agreement_a_failed_one_and_many_notices() -> None:
    assert "checkpoint: agreeing on a step (3 of 4 hosts said where their jobs stand)" in render_status(
        {**BASE, "preemption": preemption("pending", None)}
    )
    text = render_status({**BASE, "preemption": preemption("none", None, notices=40)})
    assert "checkpoint: no agreed step: no host's job asks" in text
    assert text.count("preemption: task") == 3 and "... and 37 more notices" in text  # bounded at any size


def test_no_notice_no_lines() -> None:
    assert "preemption" not in render_status({**BASE, "preemption": None})
