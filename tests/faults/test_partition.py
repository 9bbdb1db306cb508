"""Partitions in network namespaces the test creates: four hosts, each in its own namespace with a veth
on one bridge (in a hub namespace of its own; addresses 10.213.0.2-5 exist only inside them), each running
its real ``tpuctl init`` there (``ip netns exec``). One host's port is taken off the bridge and put back.

Required: both sides learn within heartbeat timeout + 2 s; ``tpuctl status`` on the isolated host blames
the coordinator, never its own healthy agent; a cut shorter than the heartbeat timeout is survived with
no error on any host.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from harness import TPUCTL, Proc
from harness.clusters import LocalCluster, spec_text

from . import netns
from .faultlib import (
    SLACK_S,
    Victim,
    check,
    init_in_namespaces,
    names_victim,
    outcomes,
    park_barriers,
    status,
    watch_exits,
)
from .recorder import HostOutcome, Measurement, first_error

pytestmark = [pytest.mark.slow, pytest.mark.netns]  # make test runs these beside the rest

HEARTBEAT_TIMEOUT_S = 5.0
DEADLINE_S = HEARTBEAT_TIMEOUT_S + 2.0
SHORT_CUT_S = 2.0
PORT = 8476  # nothing else listens inside these namespaces


@pytest.fixture
def net_cluster(namespaces_usable, make_cluster, request) -> Iterator[tuple[LocalCluster, netns.Network]]:
    """A v4-32 cluster, one host per namespace; the namespaces (and with them every veth and the bridge)
    are removed afterwards, the processes stopped first."""
    c = make_cluster("v4-32")
    tag = "ab"[len(request.node.name) % 2] + str(abs(hash(request.node.name)) % 100)
    with netns.Network(4, tag) as net:
        c.hosts = net.addresses
        c.spec.write_text(spec_text("v4-32", net.addresses, PORT, heartbeat="1s", heartbeat_timeout="5s",
                                    register_timeout="60s", barrier_timeout="60s"))  # fmt: skip
        try:
            yield c, net
        finally:
            c.close()


def up(c: LocalCluster, net: netns.Network) -> None:
    init_in_namespaces(c, net, 4)


def blames_own_agent(text: str) -> bool:
    lower = text.lower()
    return "this host's tpuctl agent" in lower or ("agent" in lower and "not answering" in lower)


@pytest.mark.parametrize("isolated", [pytest.param(3, id="worker"), pytest.param(0, id="coordinator")])
def test_partition_both_sides_learn_in_time_and_status_blames_the_coordinator(net_cluster, isolated, request) -> None:
    c, net = net_cluster
    up(c, net)
    victim = Victim(isolated)
    peers = [t for t in range(4) if t != isolated]
    procs: dict[int, Proc] = park_barriers(c, peers)  # waiting for the host about to be cut off
    procs[isolated] = c.start(f"barrier-iso-{isolated}", [*TPUCTL, "barrier", "alone", "--timeout", "30s",
                                                          "--state-dir", str(c.state(isolated))])  # fmt: skip
    time.sleep(0.5)
    net.cut(isolated)
    at = time.monotonic()
    try:
        exits = watch_exits(procs, at, DEADLINE_S + SLACK_S)
        code, said = status(c, isolated, timeout=20)
    finally:
        net.heal(isolated)
    hosts = outcomes(procs, exits, isolated, "barrier")
    hosts.append(HostOutcome(isolated, "victim", "status", code, first_error(said), None, said))
    problems = check(hosts, c, victim, ("no heartbeat", "unreachable", "did not answer", "did not confirm"),
                     DEADLINE_S)  # fmt: skip
    isolated_barrier = next(h for h in hosts if h.role == "victim" and h.what == "barrier")
    if blames_own_agent(isolated_barrier.text) or blames_own_agent(said):
        problems.append(f"the isolated host blamed its own healthy agent: {first_error(said)!r}")
    if isolated != 0 and not names_victim(said, c, Victim(0)):
        problems.append(f"`tpuctl status` on the isolated host did not name the coordinator: {first_error(said)!r}")
    if code in (0, None):
        problems.append(f"`tpuctl status` on the isolated host exited {code}")
    Measurement(
        test=request.node.nodeid, fault="partition (port off the bridge), heal after", phase="steady",
        victim=victim.describe(c), detected_by="parked `tpuctl barrier` on both sides, `tpuctl status`",
        limit_s=DEADLINE_S, hosts=hosts, problems=problems,
        notes="victim rows: the isolated host; heartbeat timeout 5 s",
    ).write()  # fmt: skip
    assert not problems, "\n".join(problems)


def test_a_cut_shorter_than_the_heartbeat_timeout_is_survived(net_cluster, request) -> None:
    c, net = net_cluster
    up(c, net)
    isolated = 3
    wall = time.time()
    net.cut(isolated)
    try:
        time.sleep(SHORT_CUT_S)
    finally:
        net.heal(isolated)
    time.sleep(HEARTBEAT_TIMEOUT_S + 2.0)  # anything that was to fail has failed by now
    barriers = {t: c.start(f"barrier-{t}", [*TPUCTL, "barrier", "after", "--timeout", "20s", "--state-dir",
                                            str(c.state(t))]) for t in range(4)}  # fmt: skip
    exits = watch_exits(barriers, time.monotonic(), 30)
    hosts = outcomes(barriers, exits, isolated, "barrier")
    for h in hosts:
        h.seconds = None  # nothing to detect
    problems = [f"task {h.task}: barrier after the cut exited {h.code}: {h.said!r}" for h in hosts if h.code != 0]
    for t in range(4):
        code, text = status(c, t, timeout=20)
        if code != 0:
            problems.append(f"task {t}: status exited {code}: {first_error(text)!r}")
        log = (c.state(t) / "agent.log").read_text(errors="replace")
        errors = [line for line in log.splitlines() if " ERROR " in line]
        if errors:
            problems.append(f"task {t}'s agent logged {errors[0]!r}")
    Measurement(
        test=request.node.nodeid, fault=f"partition of {SHORT_CUT_S:g} s (under the 5 s heartbeat timeout)",
        phase="steady", victim=Victim(isolated).describe(c), detected_by="(must survive) barrier + status after",
        limit_s=None, hosts=hosts, problems=problems, notes=f"cut at {wall:.0f}; survived = every barrier exit 0",
    ).write()  # fmt: skip
    assert not problems, "\n".join(problems)
