"""A coordinator that can move (``coordinator.successors``, policy rejoin), on real processes: 2 slices of
2 hosts (v4-16, num_slices 2) on loopback, whose default standby list is tasks 0, 2, 1.

* kill -9 of task 0's agent: task 2 serves generation 2 on its own address within the heartbeat timeout
  + 2 s of the kill, tasks 1 and 3 register with it; ``tpuctl init`` on task 0 again finds it (the higher
  generation) and joins as a worker; generation 2 forms with every mapping byte-identical, and status
  names task 2's address as the coordinator.
* task 2's port taken by another process: task 2 hands over, and task 1 (the next successor) serves.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest
from harness import wait_until
from harness.clusters import LocalCluster

pytestmark = pytest.mark.slow

HEARTBEAT_TIMEOUT_S = 3.0
SPEC = {
    "heartbeat": "500ms", "heartbeat_timeout": "3s", "register_timeout": "30s", "barrier_timeout": "30s",
    "extra": "restart: {policy: rejoin, timeout: 30s, max: 5}\n",
}  # fmt: skip


def two_slices(make_cluster) -> LocalCluster:
    """4 hosts: v4-16 (2 hosts a slice), num_slices 2."""
    c: LocalCluster = make_cluster("v4-16", num_slices=2, **SPEC)
    return c


def serving(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def mappings_at(c: LocalCluster, generation: int, tasks: range) -> list[bytes] | None:
    found = []
    for task in tasks:
        try:
            data = c.mapping(task).read_bytes()
        except OSError:
            return None
        if json.loads(data)["generation"] != generation:
            return None
        found.append(data)
    return found


def test_task_2_takes_over_from_a_killed_task_0_which_comes_back_as_a_worker(make_cluster) -> None:
    c = two_slices(make_cluster)
    c.up()
    first = c.mapping(0).read_bytes()
    os.kill(c.agent_pid(0), signal.SIGKILL)
    killed = time.monotonic()
    wait_until(lambda: serving(c.hosts[2], c.port), HEARTBEAT_TIMEOUT_S + 10, "task 2 to serve", interval=0.05, logs=c.logs)
    took = time.monotonic() - killed
    assert took <= HEARTBEAT_TIMEOUT_S + 2.0, f"task 2 served {took:.1f} s after the kill\n{c.logs()}"
    for task in (1, 3):
        c.wait_for_log(task, f"registered with {c.hosts[2]}:{c.port} (generation 2)", timeout=15)
    c.wait_for_log(2, "at generation 2 (taking over from task 0)", timeout=5)

    c.start_init(0, label="init-again-0")
    back = c.wait_init("init-again-0", 60)
    assert back.code == 0, c.logs()
    assert f"the cluster's coordinator is task 2 ({c.hosts[2]}:{c.port}) at generation 2; joining it" in back.err
    assert not serving(c.hosts[0], c.port), "task 0 started a second service"
    wait_until(lambda: mappings_at(c, 2, range(4)) is not None, 30, "generation 2 everywhere", logs=c.logs)
    again = mappings_at(c, 2, range(4))
    assert again is not None and len(set(again)) == 1, "the hosts' mappings differ"
    assert json.loads(again[0])["generation"] == 2 and json.loads(first)["generation"] == 1
    for task in (0, 1, 3):
        status = json.loads(c.tpuctl("status", "--json", task=task).out)
        assert status["coordinator"] == f"{c.hosts[2]}:{c.port}", status
        assert status["generation"] == 2 and not status["forming"], status


def test_a_successor_that_cannot_bind_hands_over_to_the_next(make_cluster) -> None:
    c = two_slices(make_cluster)
    c.up()
    with socket.socket() as squatter:  # task 2's port on task 2's address, taken
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind((c.hosts[2], c.port))
        squatter.listen(1)
        os.kill(c.agent_pid(0), signal.SIGKILL)
        c.wait_for_log(2, "cannot serve as the coordinator", timeout=HEARTBEAT_TIMEOUT_S + 10)
        # Every survivor tries task 2 for the heartbeat timeout, then task 1, which serves.
        wait_until(lambda: serving(c.hosts[1], c.port), 2 * HEARTBEAT_TIMEOUT_S + 10, "task 1 to serve", logs=c.logs)
        c.wait_for_log(1, "at generation 2 (taking over from task 0)", timeout=5)
        for task in (2, 3):
            c.wait_for_log(task, f"registered with {c.hosts[1]}:{c.port} (generation 2)", timeout=2 * HEARTBEAT_TIMEOUT_S + 10)
    c.start_init(0, label="init-again-0")
    assert c.wait_init("init-again-0", 60).code == 0, c.logs()
    wait_until(lambda: mappings_at(c, 2, range(4)) is not None, 30, "generation 2 everywhere", logs=c.logs)
    again = mappings_at(c, 2, range(4))
    assert again is not None and len(set(again)) == 1
    status = json.loads(c.tpuctl("status", "--json", task=3).out)
    assert status["coordinator"] == f"{c.hosts[1]}:{c.port}", status


def one_generation(c: LocalCluster) -> list[bytes] | None:
    """Every host's mapping, when they are byte-identical and of a generation after the first."""
    try:
        found = [c.mapping(task).read_bytes() for task in range(c.num_hosts)]
    except OSError:
        return None
    return found if len(set(found)) == 1 and json.loads(found[0])["generation"] >= 2 else None


def test_a_coordinator_frozen_past_the_heartbeat_timeout_steps_down_for_its_successor(make_cluster) -> None:
    """Task 0 frozen (SIGSTOP) longer than the heartbeat timeout: task 2 serves generation 2. When task 0
    resumes there are two services for a moment, and exactly one stays (``yields_to``: the higher generation,
    then the one more hosts were heard by, then the succession order): usually task 0 finds task 2's service
    and joins it as a worker; on a loaded machine the other hosts may not have left task 0 yet, and task 2
    steps down for it. Either way: one service, one generation everywhere, byte-identical mappings, and every
    host's status names the same coordinator (no second cluster)."""
    c = two_slices(make_cluster)
    c.up()
    pid = c.agent_pid(0)
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: serving(c.hosts[2], c.port), HEARTBEAT_TIMEOUT_S + 10, "task 2 to serve", logs=c.logs)
    finally:
        os.kill(pid, signal.SIGCONT)
    # Task 0's own service may have started a generation 2 of its own before it stepped down: the successor's
    # service continues above any generation a host remembers, so the cluster may form at 3.
    wait_until(lambda: one_generation(c) is not None, 40, "one generation everywhere", logs=c.logs)
    again = one_generation(c)
    assert again is not None and json.loads(again[0])["generation"] in (2, 3), again[0]
    generation = json.loads(again[0])["generation"]
    coordinators = {f"{c.hosts[t]}:{c.port}" for t in (0, 2)}

    def one_service() -> bool:
        return serving(c.hosts[0], c.port) != serving(c.hosts[2], c.port)

    wait_until(one_service, 10, "one of the two services to stop", logs=c.logs)
    statuses = [json.loads(c.tpuctl("status", "--json", task=t).out) for t in range(4)]
    assert len({s["coordinator"] for s in statuses}) == 1, [s["coordinator"] for s in statuses]
    assert statuses[0]["coordinator"] in coordinators and all(s["generation"] == generation for s in statuses), statuses[0]


def test_a_frozen_coordinator_that_resumes_names_itself_at_once_and_one_service_stays(make_cluster) -> None:
    """Soak seed 70045: the coordinator frozen just past the heartbeat timeout; some hosts judged it lost
    and went to its successor, others saw it answer again and stayed, and were told only, a heartbeat
    timeout later, that the others had failed. Here task 0 and task 3 freeze together (task 3 cannot judge),
    so task 2 takes over while task 1 may or may not judge. On resuming, task 0's service knows it could
    not run for longer than the heartbeat timeout (its own watchdog woke that late): it ends generation 1
    with its own failure, which every host still with it hears at once, and looks for a successor at once.
    Of the two services one steps down (whichever fewer hosts joined), telling its hosts where the cluster
    went: one generation forms within the heartbeat timeout of the resume, one service stays."""
    c = two_slices(make_cluster)
    c.up()
    frozen = [c.agent_pid(0), c.agent_pid(3)]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: serving(c.hosts[2], c.port), HEARTBEAT_TIMEOUT_S + 10, "task 2 to serve", logs=c.logs)
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    resumed = time.monotonic()
    c.wait_for_log(0, "coordination service could not run for", timeout=HEARTBEAT_TIMEOUT_S)
    for task in (0, 3):  # task 3 stayed with it: it hears the coordinator's own failure, naming it
        c.wait_for_log(task, f"task 0 ({c.hosts[0]}) failed: could not run for", timeout=HEARTBEAT_TIMEOUT_S)
    wait_until(lambda: one_generation(c) is not None, 30, "one generation everywhere", logs=c.logs)
    formed = time.monotonic() - resumed
    assert formed < HEARTBEAT_TIMEOUT_S + 2, f"one generation formed {formed:.1f} s after the resume\n{c.logs()}"
    wait_until(lambda: serving(c.hosts[0], c.port) != serving(c.hosts[2], c.port), 10, "one service", logs=c.logs)
    statuses = [json.loads(c.tpuctl("status", "--json", task=t).out) for t in range(4)]
    assert len({s["coordinator"] for s in statuses}) == 1, [s["coordinator"] for s in statuses]
    assert statuses[0]["coordinator"] in {f"{c.hosts[t]}:{c.port}" for t in (0, 2)}, statuses[0]
    assert not any(s["forming"] for s in statuses), statuses


def test_a_returning_task_0_that_serves_before_any_successor_does_is_found_by_the_survivors(make_cluster) -> None:
    """The race of soak seed 30049: task 0's new init looks for a live service while the survivors are still
    looking for the successor (here task 2 cannot bind, so they would wait for it a heartbeat timeout before
    task 1 serves), finds none and serves itself. Two services would each wait for the hosts registered with
    the other: the survivors ask the lost coordinator beside each successor they try, so they find task 0's
    service at once; task 1 never serves, and one generation forms at task 0 well before task 1's turn."""
    spec = {**SPEC, "heartbeat_timeout": "5s"}  # a wider window between the loss and the successor serving
    c: LocalCluster = make_cluster("v4-16", num_slices=2, **spec)
    c.up()
    with socket.socket() as squatter:  # task 2, the first successor, cannot serve: it answers no probe either
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind((c.hosts[2], c.port))
        squatter.listen(8)
        os.kill(c.agent_pid(0), signal.SIGKILL)
        c.wait_for_log(2, "cannot serve as the coordinator", timeout=5.0 + 10)
        c.start_init(0, label="init-again-0")  # the survivors wait 5 s for task 2 before task 1 would serve
        back = c.wait_init("init-again-0", 20)  # well within the register timeout (30 s)
    assert back.code == 0, c.logs()
    assert "task 0: coordination service listening" in back.err, f"task 0 found a successor at once: no race\n{back.err}"
    for task in (1, 2, 3):
        c.wait_for_log(task, f"the coordinator is now task 0 ({c.hosts[0]}:{c.port}", timeout=5.0)
    wait_until(lambda: one_generation(c) is not None, 10, "one generation everywhere", logs=c.logs)
    assert not serving(c.hosts[1], c.port), "task 1 serves a second service"
    for task in range(4):
        status = json.loads(c.tpuctl("status", "--json", task=task).out)
        assert status["coordinator"] == f"{c.hosts[0]}:{c.port}" and not status["forming"], status


def test_a_coordinator_that_leaves_between_generations_is_succeeded_within_the_heartbeat_timeout(make_cluster) -> None:
    """`tpuctl down` on task 0: the others hear that it left (its generation ends) and register again with
    its address, where nothing answers any more (soak seed 30049). They judge it lost after the heartbeat
    timeout, as a session does, and register with the successor (task 2) instead of retrying task 0 for the
    whole restart timeout (30 s) while the others wait in task 2's service."""
    c = two_slices(make_cluster)
    c.up()
    assert c.tpuctl("down", task=0, timeout=30).code == 0, c.logs()
    for task in (1, 2, 3):  # generation 2 or 3: task 2's service continues above what a host remembers
        c.wait_for_log(task, f"registered with {c.hosts[2]}:{c.port} (generation", timeout=HEARTBEAT_TIMEOUT_S + 10)
    c.start_init(0, label="init-again-0")
    assert c.wait_init("init-again-0", 30).code == 0, c.logs()
    wait_until(lambda: one_generation(c) is not None, 15, "one generation everywhere", logs=c.logs)
    status = json.loads(c.tpuctl("status", "--json", task=1).out)
    assert status["coordinator"] == f"{c.hosts[2]}:{c.port}", status


def test_a_successor_frozen_past_the_heartbeat_timeout_steps_down_for_the_next(make_cluster) -> None:
    """Soak seed 41010: the coordinator moves twice. Task 0 killed: task 2 takes over (task 0 comes back as a
    worker); task 2 frozen past the heartbeat timeout: task 1 takes over from it. Task 2 resumes serving
    itself alone while the others wait in task 1's service for it: the lone service yields (the one more
    hosts registered with wins), task 2 joins task 1, one generation forms."""
    c = two_slices(make_cluster)
    c.up()
    os.kill(c.agent_pid(0), signal.SIGKILL)
    wait_until(lambda: serving(c.hosts[2], c.port), HEARTBEAT_TIMEOUT_S + 10, "task 2 to serve", logs=c.logs)
    c.start_init(0, label="init-again-0")
    assert c.wait_init("init-again-0", 60).code == 0, c.logs()
    wait_until(lambda: one_generation(c) is not None, 30, "one generation with task 0 back", logs=c.logs)
    pid = c.agent_pid(2)
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: serving(c.hosts[1], c.port), HEARTBEAT_TIMEOUT_S + 10, "task 1 to serve", logs=c.logs)
        c.wait_for_log(1, "(taking over from task 2)", timeout=5)
        for task in (0, 3):
            c.wait_for_log(task, f"registered with {c.hosts[1]}:{c.port} (generation", timeout=3 * HEARTBEAT_TIMEOUT_S + 10)
    finally:
        os.kill(pid, signal.SIGCONT)
    c.wait_for_log(2, f"task 1 ({c.hosts[1]}:{c.port}) took the coordination service over", timeout=20)
    target = f"{c.hosts[1]}:{c.port}"

    def formed_at_task_1() -> bool:
        found = one_generation(c)
        return found is not None and all(
            json.loads(c.tpuctl("status", "--json", task=t).out).get("coordinator") == target for t in range(4)
        )

    wait_until(formed_at_task_1, 30, "one generation served by task 1", interval=1.0, logs=c.logs)
    wait_until(lambda: not serving(c.hosts[2], c.port), 5, "task 2's own service to stop", logs=c.logs)
