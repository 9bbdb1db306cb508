"""The majority rule in a coordination service that starts fresh above the generation its hosts were in
(a successor's, ``coordinator.successors``), on the pure state machine (issue 26 part 4). A partition can
put a successor on the side without the coordinator: its registrants bring the plan of the generation
they left (``Registration.previous_plan``), and its first generation forms only with more than half of
that generation's members; a heartbeat timeout after it learnt the plan, the hosts still missing count
as lost (a spare slice takes a place, policy elastic drops slices), as in the coordinator's own service.

Heartbeat timeout 1 s, restart timeout 30 s (``new_state``'s and ``elastic``'s defaults).
"""

from __future__ import annotations

import pytest
from test_coordination_elastic import REJOIN, SHAPE, elastic
from test_coordination_state import new_state, refusal, registration

from tpuctl.coordination.plan import Plan, Roster
from tpuctl.coordination.state import CoordinationState
from tpuctl.coordination.values import Reason, Refused, RestartPolicy, TaskRef

IDENTITY_3 = Plan(((0, 3),))


def successor(
    *, slices: int = 3, spares: int = 0, per: int = 2, policy: RestartPolicy = REJOIN, task: int = 2
) -> CoordinationState:
    """Task ``task``'s fresh service at generation 2, after the coordinator of generation 1 was lost."""
    roster = Roster(active=slices * per, spares=spares * per, hosts_per_slice=per)
    return new_state(
        roster.size, restart=policy, roster=roster, slice_shape=SHAPE, first_generation=2, coordinator_task=task
    )


def survivors(state: CoordinationState, tasks: list[int], plan: Plan, now: float, generation: int = 1) -> dict[int, TaskRef]:
    """Hosts of generation ``generation`` (of plan ``plan``) registering with the fresh service."""
    return {
        t: state.register(
            registration(t, generation=generation, previous_plan=plan, slice_shape=SHAPE), now=now
        ).task
        for t in tasks
    }


def alive(state: CoordinationState, refs: dict[int, TaskRef], now: float) -> None:
    for ref in refs.values():
        state.heartbeat(ref, now=now)


def again(state: CoordinationState, refs: dict[int, TaskRef], now: float) -> dict[int, TaskRef]:
    """The same processes registering into the generation that followed (as survivors do)."""
    return {
        t: state.register(
            registration(t, r.incarnation, generation=r.generation, previous_credential=r.credential, slice_shape=SHAPE),
            now=now,
        ).task
        for t, r in refs.items()
    }


def failed_at_the_restart_timeout(state: CoordinationState, ref: TaskRef, now: float) -> str:
    with pytest.raises(Refused) as excinfo:
        state.registration_waiting(ref, now=now)
    reason, message = refusal(excinfo)
    assert reason is Reason.CLUSTER_FAILED
    return message


def test_the_majority_side_s_successor_forms_the_next_generation_without_the_lost_slice() -> None:
    # 2 | 1 slices, the coordinator (task 0, slice 0) on the 1 side: task 2 serves slices 1 and 2.
    state = successor(policy=elastic(1))
    refs = survivors(state, [2, 3, 4, 5], IDENTITY_3, now=0.0)
    assert state.plan == IDENTITY_3 and not state.formed  # a heartbeat timeout for the others to come
    state.expire(now=0.5)
    assert state.generation == 2
    alive(state, refs, now=0.9)
    state.expire(now=1.1)  # the heartbeat timeout (1 s) after the service learnt generation 1's plan
    assert state.generation == 3 and state.plan == Plan(((1, 2),))
    ended = state.generations.ended(2)
    assert ended is not None
    assert str(ended).startswith(
        "2 tasks failed: task 0 (127.0.0.1): not heard from within the heartbeat timeout (1 s) after task 2 "
        "started the coordination service at generation 2"
    )
    assert "generation 3 shrinks to 2 slices (slice 0 dropped: tasks 0, 1)" in str(ended)
    refs = again(state, refs, now=1.2)
    assert all(r.generation == 3 for r in refs.values())
    assert state.registration_waiting(refs[2], now=1.2) is None and state.formed
    assert [state.placement.rank_of(t) for t in range(6)] == [None, None, 0, 1, 2, 3]


def test_the_minority_side_s_successor_never_forms_and_fails_naming_the_partition() -> None:
    # 2 | 1 slices, the coordinator on the 2 side: task 4, on the 1 side, serves a fresh service.
    state = successor(policy=elastic(1), task=4)
    refs = survivors(state, [4, 5], IDENTITY_3, now=0.0)
    alive(state, refs, now=0.9)
    state.expire(now=1.1)
    assert state.generation == 2 and state.plan == IDENTITY_3 and not state.formed  # the majority rule held it
    for half in range(3, 61):  # the survivors heartbeat; nothing forms
        alive(state, refs, now=half / 2 - 0.1)
        state.expire(now=half / 2)
        assert state.failure is None or half == 60
    assert state.failure is not None and not state.formed  # the restart timeout
    message = failed_at_the_restart_timeout(state, refs[4], now=30.2)
    assert "task 0 (127.0.0.1): did not rejoin generation 2 within the restart timeout (30 s)" in message
    assert "only 2 of generation 1's 6 hosts survived, not a majority" in message
    assert message.startswith("cluster failed during registration: 4 tasks failed: task 0 (127.0.0.1): did not")
    assert "(a network partition?)" in message


def test_a_50_50_split_stops_both_successors() -> None:
    for side, task in (([0, 1], 0), ([2, 3], 2)):
        state = successor(slices=2, policy=elastic(1), task=task)
        refs = survivors(state, side, Plan(((0, 2),)), now=0.0)
        alive(state, refs, now=0.9)
        state.expire(now=1.1)
        assert state.generation == 2 and not state.formed
        message = failed_at_the_restart_timeout(state, refs[task], now=31.0)
        assert "only 2 of generation 1's 4 hosts survived, not a majority" in message


def test_under_policy_rejoin_the_successor_waits_for_the_lost_host_as_before() -> None:
    state = successor(slices=2, task=2)
    refs = survivors(state, [1, 2, 3], Plan(((0, 2),)), now=0.0)
    alive(state, refs, now=0.9)
    state.expire(now=1.1)  # 3 of 4: a majority, and policy rejoin keeps slice 0 (waits for task 0)
    assert state.generation == 2 and state.plan == Plan(((0, 2),))
    alive(state, refs, now=1.9)
    refs |= survivors(state, [0], Plan(((0, 2),)), now=2.0)
    assert state.registration_waiting(refs[0], now=2.0) is None and state.formed


def test_the_fresh_service_takes_the_previous_plan_so_a_dropped_slice_is_not_waited_for() -> None:
    # Generation 4 had shrunk to slices 0 and 2; its coordinator's host was lost and comes back at once.
    shrunk = Plan.of([0, 2])
    state = successor(policy=elastic(1), task=4)
    refs = survivors(state, [4, 5, 0, 1], shrunk, now=0.0, generation=1)
    assert state.plan == shrunk
    assert state.registration_waiting(refs[4], now=0.1) is None and state.formed and state.generation == 2


def test_a_spare_counts_only_for_the_place_it_took() -> None:
    # Generation 1's plan: roster slices 0, 3 (the spare, in slice 1's place), 2. Hosts of roster slices 0
    # and 1 (four hosts, but only two of generation 1's members) are a minority; slices 3 and 2 a majority.
    plan = Plan.of([0, 3, 2])
    minority = successor(spares=1, policy=elastic(1), task=0)
    refs = survivors(minority, [0, 1, 2, 3], plan, now=0.0)
    alive(minority, refs, now=0.9)
    minority.expire(now=1.1)
    assert minority.generation == 2 and not minority.formed
    assert "only 2 of generation 1's 6 hosts survived" in failed_at_the_restart_timeout(minority, refs[0], now=31.0)

    majority = successor(spares=1, policy=elastic(1), task=6)
    refs = survivors(majority, [6, 7, 4, 5], plan, now=0.0)
    alive(majority, refs, now=0.9)
    majority.expire(now=1.1)
    assert majority.generation == 3 and majority.plan == Plan.of([3, 2])


def test_a_previous_plan_that_does_not_fit_the_roster_is_refused_naming_it() -> None:
    state = successor(policy=elastic(1))
    with pytest.raises(Refused) as excinfo:
        survivors(state, [2], Plan(((0, 4),)), now=0.0)
    reason, message = refusal(excinfo)
    assert reason is Reason.INVALID
    assert "the plan of generation 1 this host brought (roster slices 0-3) does not fit this cluster's roster" in message


def test_the_coordinator_s_own_minority_names_the_partition_at_the_restart_timeout() -> None:
    # Task 0's service: slices 1 and 2 cut off, their silence found at two checks (two generations of
    # plans): the second plan still needs slice 2, and the restart timeout names the majority rule.
    roster = Roster(active=3, hosts_per_slice=1)
    state = new_state(3, restart=elastic(1), roster=roster)
    refs = {t: state.register(registration(t), now=0.0).task for t in range(3)}
    state.heartbeat(refs[0], now=0.9)
    state.heartbeat(refs[2], now=0.3)
    state.expire(now=1.5)  # task 1 is late: 2 of 3 survive, slice 1 dropped
    assert state.generation == 2 and state.plan == Plan.of([0, 2])
    ref = state.register(
        registration(0, refs[0].incarnation, generation=1, previous_credential=refs[0].credential), now=1.6
    ).task
    message = failed_at_the_restart_timeout(state, ref, now=40.0)
    assert "task 2 (127.0.0.3) failed: did not rejoin generation 2 within the restart timeout (30 s)" in message
    assert "this coordinator heard from only 1 of generation 1's 3 hosts, not a majority" in message
