"""kill -9 and SIGSTOP of a worker's and of task 0's agent, in every phase of a 4-host cluster's life.

Each test brings up (part of) a v4-32 cluster of real ``tpuctl init`` processes on loopback, hits the
victim's agent, and watches what runs on every host: the waiting ``init``s (registering, merging), parked
``tpuctl barrier``s (inside a barrier), the agents' logs then ``tpuctl status`` (steady state), ``tpuctl
run`` jobs (under run). Required: every host exits non-zero (the job is stopped) within heartbeat timeout
+ 2 s of the fault (+ the run grace), each peer naming the victim host and the cause. That includes the
victim's own waiting ``init`` when its agent is frozen (it hears from its agent a few times a second), and
the peers of a frozen coordinator (their heartbeat confirmations are due within the heartbeat timeout + 1 s,
not the 10 s RPC timeout).
"""

from __future__ import annotations

import time

import pytest
from harness import Proc
from harness.clusters import LocalCluster

from .faultlib import (
    DEADLINE_S,
    RUN_GRACE_S,
    SLACK_S,
    SPEC,
    Victim,
    agent_error_outcomes,
    causes,
    check,
    fault,
    outcomes,
    park_barriers,
    start_runs,
    start_status,
    watch_exits,
)
from .recorder import HostOutcome, Measurement, first_error

pytestmark = pytest.mark.slow

PHASES = ["registering", "merging", "barrier", "steady", "run"]
VICTIMS = {"worker": 2, "coordinator": 0}
KNOWN_DEFECTS: dict[tuple[str, str, str], str] = {}
"""(kind, phase, role) -> the defect observed, for a fault the code does not handle yet (an xfail)."""


def _params() -> list[object]:
    out = []
    for phase in PHASES:
        for kind in ("kill", "stop"):
            for role, task in VICTIMS.items():
                defect = KNOWN_DEFECTS.get((kind, phase, role))
                marks = [pytest.mark.xfail(strict=True, reason=defect)] if defect else []
                out.append(pytest.param(kind, phase, task, id=f"{kind}-{phase}-{role}", marks=marks))
    return out


def _prepare(c: LocalCluster, phase: str, victim: int) -> tuple[dict[int, Proc], str]:
    """Bring the cluster to ``phase``; returns what to watch on each host and how it detects the fault."""
    if phase == "registering":  # task 3 never comes: the others wait in registration
        for t in range(3):
            c.start_init(t)
        for t in range(3):
            c.wait_for_log(t, "registered with")
        return {t: c.processes[f"init-{t}"] for t in range(3)}, "waiting `init`"
    if phase == "merging":  # the victim is stuck in its (simulated) TPU runtime start-up
        for t in range(4):
            c.start_init(t, env={"TPUCTL_SIM_INIT_DELAY": "60"} if t == victim else None)
        c.wait_for_log(victim, "simulated TPU runtime starting")
        return {t: c.processes[f"init-{t}"] for t in range(4)}, "waiting `init`"
    c.up()
    if phase == "barrier":  # every host but the victim waits in barrier 'step'
        peers = [t for t in range(4) if t != victim]
        procs = park_barriers(c, peers)
        return procs, "parked `tpuctl barrier`"
    if phase == "run":
        return start_runs(c, range(4)), "`tpuctl run`"
    return {}, "agent (its log), then `tpuctl status`"


@pytest.mark.parametrize(("kind", "phase", "victim_task"), _params())
def test_fault(make_cluster, kind: str, phase: str, victim_task: int, request: pytest.FixtureRequest) -> None:
    c = make_cluster("v4-32", **SPEC)
    victim = Victim(victim_task)
    watched, detected_by = _prepare(c, phase, victim.task)
    limit = DEADLINE_S + (RUN_GRACE_S if phase == "run" else 0.0)
    pid = c.agent_pid(victim.task)
    hosts: list[HostOutcome]
    wall = time.time()
    with fault(kind, pid) as at:
        # the victim's own host: what its local CLI says at the time of the fault (nothing else runs there)
        asked = start_status(c, victim.task) if phase in ("barrier", "steady") else None
        if watched:
            exits = watch_exits(watched, at, limit + SLACK_S)
            hosts = outcomes(watched, exits, victim.task, "init" if phase in ("registering", "merging") else phase)
        else:  # steady state: each peer's agent logs the failure; then `tpuctl status` there says it
            hosts = agent_error_outcomes(c, [t for t in range(4) if t != victim.task], wall, limit + SLACK_S)
        if asked is not None:
            done = c.processes.wait(asked, 20)
            text = done.err + done.out
            hosts.append(HostOutcome(victim.task, "victim", "status", done.code, first_error(text), None, text))
    problems = check(hosts, c, victim, causes(kind, victim), limit)
    Measurement(
        test=request.node.nodeid, fault=f"{'kill -9' if kind == 'kill' else 'SIGSTOP'} of the agent",
        phase=phase, victim=victim.describe(c), detected_by=detected_by, limit_s=limit, hosts=hosts,
        problems=problems, expected_defect=KNOWN_DEFECTS.get((kind, phase, victim.role)),
    ).write()  # fmt: skip
    assert not problems, "\n".join(problems)
