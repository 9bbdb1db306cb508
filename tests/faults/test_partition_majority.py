"""Never two clusters (issue 26 part 4), on real processes in network namespaces the test creates: 3 slices
of v4-8 (one host each: tasks 0, 1, 2; default successors 0, 1, 2), restart policy elastic with
min_slices 1 (so only the majority rule stops a side), partitioned into 2 slices | 1 slice by taking one
host's port off the bridge (``netns.py``).

* the coordinator (task 0) on the majority side, task 2 cut off: tasks 0 and 1 form the next generation
  with 2 slices; task 2 serves a fresh service as the last successor it can reach, which never forms: at
  its restart timeout it fails naming the partition (the hosts it never heard from), with no mapping.
* the coordinator on the minority side, task 0 cut off: task 1 serves, and tasks 1 and 2 form with 2
  slices; task 0's own service cannot form (the majority rule) and fails naming the partition.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import wait_until
from harness.clusters import LocalCluster, spec_text

from . import netns
from .faultlib import init_in_namespaces

pytestmark = [pytest.mark.slow, pytest.mark.netns]  # make test runs these beside the rest

PORT = 8477  # nothing else listens inside these namespaces
HEARTBEAT_TIMEOUT_S = 3.0
RESTART_TIMEOUT_S = 10.0
EXTRA = "num_slices: 3\nrestart: {policy: elastic, min_slices: 1, timeout: 10s, max: 5}\n"


@pytest.fixture
def three_slices(namespaces_usable, make_cluster, request) -> Iterator[tuple[LocalCluster, netns.Network]]:
    c: LocalCluster = make_cluster("v4-8")
    tag = "m" + str(abs(hash(request.node.name)) % 1000)
    with netns.Network(3, tag) as net:
        c.hosts, c.num_hosts = net.addresses, 3
        c.spec.write_text(spec_text("v4-8", net.addresses, PORT, heartbeat="500ms", heartbeat_timeout="3s",
                                    register_timeout="60s", barrier_timeout="30s", extra=EXTRA))  # fmt: skip
        try:
            up(c, net)
            yield c, net
        finally:
            c.close()


def up(c: LocalCluster, net: netns.Network) -> None:
    init_in_namespaces(c, net, 3)
    assert all(generation_of(c.mapping(t)) == 1 for t in range(3))


def generation_of(path: Path) -> int | None:
    try:
        return int(json.loads(path.read_text())["generation"])
    except (OSError, ValueError, KeyError):
        return None


def log_of(c: LocalCluster, task: int) -> str:
    path = c.state(task) / "agent.log"
    return path.read_text(errors="replace") if path.exists() else ""


def formed_with_two_slices(c: LocalCluster, tasks: tuple[int, ...]) -> int | None:
    """The generation every host of ``tasks`` committed a mapping of, when it is the same one after 1."""
    generations = {generation_of(c.mapping(t)) for t in tasks}
    if len(generations) != 1:
        return None
    (generation,) = generations
    return generation if generation is not None and generation > 1 else None


def check_majority_formed(c: LocalCluster, tasks: tuple[int, int], since: float) -> int:
    wait_until(lambda: formed_with_two_slices(c, tasks) is not None, HEARTBEAT_TIMEOUT_S * 3 + 20,
               f"tasks {tasks} to form a generation", logs=c.logs)  # fmt: skip
    took = time.monotonic() - since
    generation = formed_with_two_slices(c, tasks)
    assert generation is not None
    mappings = [c.mapping(t).read_bytes() for t in tasks]
    assert mappings[0] == mappings[1], "the majority's hosts hold different mappings"
    mapping = json.loads(mappings[0])
    assert len(mapping["tasks"]) == 2, mapping  # two slices of one host
    print(f"the majority formed generation {generation} {took:.1f} s after the cut")
    return generation


def check_minority_failed(c: LocalCluster, task: int, never_heard: tuple[int, int]) -> None:
    """``task``'s agent failed at the restart timeout naming the majority rule and the hosts it never heard
    from, and wrote no mapping after generation 1."""
    def final() -> str | None:
        lines = log_of(c, task).splitlines()
        return next((x for x in lines if " ERROR " in x and "did not rejoin generation" in x and "not a majority" in x), None)

    wait_until(final, HEARTBEAT_TIMEOUT_S * 3 + RESTART_TIMEOUT_S + 20, f"task {task} to fail naming the partition",
               logs=c.logs)  # fmt: skip
    line = final()
    assert line is not None and "(a network partition?)" in line, line
    for other in never_heard:
        assert f"task {other} ({c.hosts[other]})" in line, line
    assert generation_of(c.mapping(task)) is None, "the minority host kept or wrote a mapping"
    assert not c.mapping(task).exists()


def test_the_coordinator_on_the_majority_side_forms_and_the_cut_off_slice_fails_naming_the_partition(
    three_slices,
) -> None:
    c, net = three_slices
    net.cut(2)
    cut = time.monotonic()
    try:
        generation = check_majority_formed(c, (0, 1), cut)
        check_minority_failed(c, 2, (0, 1))
        assert generation_of(c.mapping(0)) == generation, "the majority lost its generation meanwhile"
        assert "at generation 2 (taking over from task 0)" in log_of(c, 2)  # task 2's own fresh service
    finally:
        net.heal(2)
    took = time.monotonic() - cut
    assert took < HEARTBEAT_TIMEOUT_S * 3 + RESTART_TIMEOUT_S + 15, f"the minority failed {took:.1f} s after the cut"


def test_the_coordinator_on_the_minority_side_cannot_form_and_the_successor_s_side_does(three_slices) -> None:
    c, net = three_slices
    net.cut(0)
    cut = time.monotonic()
    try:
        check_majority_formed(c, (1, 2), cut)
        assert "at generation 2 (taking over from task 0)" in log_of(c, 1)  # task 1 serves the majority
        check_minority_failed(c, 0, (1, 2))
    finally:
        net.heal(0)
