"""Which of two live coordination services steps down (``tpuctl.agent.succession.yields_to``): decided the
same way on both sides, so one service is left to form the cluster (soak seed 30049: a returning task 0 and
its successor each waited for the hosts registered with the other)."""

from __future__ import annotations

import itertools

import pytest

from tpuctl.agent.succession import Found, yields_to

SUCCESSORS = (0, 2, 1)  # succession_order(SUCCESSORS, 0) == (2, 1, 0)


def found(task: int, generation: int) -> Found:
    return Found(task, f"127.0.0.{task + 2}:8476", generation)


def test_task_0s_own_service_yields_to_a_successor_at_the_same_or_a_higher_generation_only() -> None:
    assert yields_to(SUCCESSORS, 0, None, 2, found(2, 2))
    assert yields_to(SUCCESSORS, 0, None, 2, found(1, 3))
    assert not yields_to(SUCCESSORS, 0, None, 3, found(2, 2))  # a stale service: never


def test_at_one_generation_and_counts_unknown_a_successor_never_yields_to_the_coordinator_it_replaced() -> None:
    assert not yields_to(SUCCESSORS, 2, 0, 2, found(0, 2))
    assert yields_to(SUCCESSORS, 2, 0, 2, found(0, 5))  # a higher generation wins


def test_two_successors_at_one_generation_the_earlier_in_the_succession_order_wins() -> None:
    assert yields_to(SUCCESSORS, 1, 0, 2, found(2, 2))  # order after task 0: 2, 1
    assert not yields_to(SUCCESSORS, 2, 0, 2, found(1, 2))
    assert yields_to(SUCCESSORS, 2, 0, 2, found(1, 3))  # a higher generation wins


def test_at_one_generation_the_service_more_hosts_registered_with_wins_whatever_the_history() -> None:
    """Soak seed 41010: task 0 had taken over from task 1; frozen, it was replaced by task 1 in turn, and
    came back serving itself alone while the 7 others waited in task 1's service: by history each had
    replaced the other and neither yielded. At the same generation the lone service yields."""
    assert yields_to(SUCCESSORS, 0, 1, 18, found(1, 18), own_hosts=1, other_hosts=7)
    assert not yields_to(SUCCESSORS, 1, 0, 18, found(0, 18), own_hosts=7, other_hosts=1)
    assert yields_to(SUCCESSORS, 2, 0, 5, found(0, 5), own_hosts=1, other_hosts=6)  # a successor cut off, alone
    assert not yields_to(SUCCESSORS, 0, None, 5, found(2, 5), own_hosts=6, other_hosts=1)
    # a coordinator frozen, then resumed, lists the hosts that left it meanwhile: its generation is lower
    assert not yields_to(SUCCESSORS, 1, 2, 3, found(2, 2), own_hosts=3, other_hosts=4)
    assert yields_to(SUCCESSORS, 2, 0, 2, found(1, 3), own_hosts=4, other_hosts=3)
    # a tie: the one earlier in the spec's candidates (0, 2, 1) stays, whatever each replaced
    assert not yields_to(SUCCESSORS, 0, None, 2, found(2, 2), own_hosts=3, other_hosts=3)
    assert yields_to(SUCCESSORS, 2, 0, 2, found(0, 2), own_hosts=3, other_hosts=3)


def test_two_services_that_each_replaced_the_other_with_as_many_hosts_settle() -> None:
    """Soak seed 90453: task 2 (which had taken over from task 0) cut off past the heartbeat timeout; task 0
    took over from it, and when the cut healed half the hosts had found each: 4 and 4 at generation 6. By
    history each had replaced the other, and neither stepped down until a host gave up 28 s later."""
    assert not yields_to(SUCCESSORS, 0, 2, 6, found(2, 6), own_hosts=4, other_hosts=4)
    assert yields_to(SUCCESSORS, 2, 0, 6, found(0, 6), own_hosts=4, other_hosts=4)


@pytest.mark.parametrize("lost", [None, 0, 1, 2])
def test_of_two_services_at_most_one_yields(lost: int | None) -> None:
    """Antisymmetric over every pair of candidates and generations (each service took over from ``lost``,
    or, for task 0 with ``lost`` None, started on its own): no two services step down for each other."""
    for (a, ga), (b, gb) in itertools.product(itertools.product((0, 1, 2), (2, 3)), repeat=2):
        if a == b:
            continue
        from_a = None if a == 0 and lost is None else (lost if lost != a else None)
        from_b = None if b == 0 and lost is None else (lost if lost != b else None)
        if (from_a is None and a != 0) or (from_b is None and b != 0):
            continue  # only task 0 serves without taking over
        for na, nb in ((None, None), (1, 1), (1, 7), (7, 1), (4, 4)):
            both = yields_to(SUCCESSORS, a, from_a, ga, found(b, gb), na, nb) and yields_to(
                SUCCESSORS, b, from_b, gb, found(a, ga), nb, na
            )
            assert not both, (a, from_a, ga, na, b, from_b, gb, nb)
            if ga == gb and na is not None:  # counts known: exactly one yields (no stalemate either)
                either = yields_to(SUCCESSORS, a, from_a, ga, found(b, gb), na, nb) or yields_to(
                    SUCCESSORS, b, from_b, gb, found(a, ga), nb, na
                )
                assert either, (a, from_a, ga, na, b, from_b, gb, nb)
