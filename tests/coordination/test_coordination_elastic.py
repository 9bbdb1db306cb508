"""Spares, elastic shrinking and growing by whole slices, and the majority rule, on the pure state machine
(issue 26): a generation is whole roster slices by position; the others stand by."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_coordination_state import new_state, refusal, registration

from tpuctl.coordination.plan import Plan, Roster, SliceShape
from tpuctl.coordination.state import CoordinationState
from tpuctl.coordination.values import Gathered, Reason, Refused, RestartPolicy, TaskRef, TaskState

REJOIN = RestartPolicy(rejoin=True, timeout=30.0, max_restarts=5)
SHAPE = SliceShape("v4-16", "2x2x2", 2)


def elastic(min_slices: int, max_restarts: int = 5) -> RestartPolicy:
    return RestartPolicy(elastic=True, min_slices=min_slices, timeout=30.0, max_restarts=max_restarts)


def cluster(
    slices: int = 3, spares: int = 1, per: int = 2, policy: RestartPolicy = REJOIN, **overrides: object
) -> CoordinationState:
    roster = Roster(active=slices * per, spares=spares * per, hosts_per_slice=per)
    return new_state(roster.size, restart=policy, roster=roster, slice_shape=SHAPE, **overrides)


def join(state: CoordinationState, task_ids: range | list[int], now: float = 0.0) -> dict[int, TaskRef]:
    return {i: state.register(registration(i, slice_shape=SHAPE), now=now).task for i in task_ids}


def rejoin(state: CoordinationState, refs: dict[int, TaskRef], task_ids: list[int], now: float) -> dict[int, TaskRef]:
    """Survivors re-registering into the current generation (same process, the generation they were in)."""
    return {
        t: state.register(
            registration(t, refs[t].incarnation, generation=refs[t].generation, previous_credential=refs[t].credential),
            now=now,
        ).task
        for t in task_ids
    }


def formed(state: CoordinationState, refs: dict[int, TaskRef], now: float) -> bool:
    member = next(r for t, r in refs.items() if state.placement.rank_of(t) is not None)
    return state.registration_waiting(member, now=now) is None


def ended_message(state: CoordinationState, ref: TaskRef) -> str:
    ended = state.poll_error(ref, now=0.0)
    assert ended is not None and ended.rejoin
    return str(ended)


# --- spares ------------------------------------------------------------------------------------------------


def test_a_spare_slice_takes_a_lost_slice_s_place_and_the_survivors_stand_by() -> None:
    state = cluster()
    memberships = {i: state.register(registration(i, slice_shape=SHAPE), now=0.0) for i in range(8)}
    assert [memberships[i].standby for i in range(8)] == [False] * 6 + [True] * 2
    assert memberships[6].plan == Plan(((0, 3),)) and state.member_count == 6
    refs = {i: m.task for i, m in memberships.items()}
    assert formed(state, refs, 0.0)
    state.report_error(refs[3], "VM preempted", now=1.0)
    assert state.generation == 2 and state.plan == Plan.of([0, 3, 2])
    message = ended_message(state, refs[0])
    assert message == (
        "task 3 (127.0.0.4) failed: reported an error: VM preempted; generation 1 is over: "
        "generation 2 forms with spare slice 3 (tasks 6, 7) in place of slice 1"
    )
    # Everyone but the failed host comes back; the spare slice's hosts get slice 1's ranks.
    again = {m.task.task_id: m for m in (
        state.register(
            registration(t, refs[t].incarnation, generation=1, previous_credential=refs[t].credential), now=2.0
        ) for t in (0, 1, 2, 4, 5, 6, 7)
    )}  # fmt: skip
    assert again[2].standby and not again[6].standby and not again[7].standby
    assert [state.placement.rank_of(t) for t in range(8)] == [0, 1, None, None, 4, 5, 2, 3]
    assert state.registration_waiting(again[6].task, now=2.0) is None  # formed without task 3
    assert state.failure is None
    # The generation's gather is over its members, in rank order: task 6's value is rank 2's.
    members = [0, 1, 6, 7, 4, 5]
    gathers = [state.gather_arrive(again[t].task, "ids", f"t{t}".encode(), 5.0, now=2.5) for t in members]
    outcome = state.gather_outcome(gathers[0], now=2.5)
    assert isinstance(outcome, Gathered) and outcome.values == tuple(f"t{t}".encode() for t in members)


def test_a_host_whose_slice_is_not_the_cluster_s_shape_is_refused_naming_every_difference() -> None:
    state = cluster()
    with pytest.raises(Refused) as excinfo:
        state.register(registration(6, slice_shape=SliceShape("v5e-16", "4x4", 4)), now=0.0)
    reason, message = refusal(excinfo)
    assert reason is Reason.SHAPE_MISMATCH
    assert message == (
        "task 6 (127.0.0.7): its slice is not shaped like the cluster's: accelerator type v5e-16 (the cluster's "
        "slices: v4-16); topology 4x4 (the cluster's slices: 2x2x2); hosts per slice 4 (the cluster's slices: 2)"
    )
    assert excinfo.value.hint is not None and "topology" in excinfo.value.hint
    assert state.status(now=0.0).tasks[6].state is TaskState.WAITING  # nothing registered


def test_a_host_that_says_it_is_a_spare_but_is_not_is_refused_naming_the_ranges() -> None:
    state = cluster()
    with pytest.raises(Refused) as excinfo:
        state.register(registration(2, spare=True), now=0.0)
    reason, message = refusal(excinfo)
    assert reason is Reason.INVALID
    assert "task 2 registered as a spare" in message and "tasks 0..5" in message and "tasks 6..7" in message
    assert state.register(registration(6, spare=True), now=0.0).standby


# --- standby -----------------------------------------------------------------------------------------------


def test_a_standby_host_s_failure_never_ends_a_generation() -> None:
    state = cluster()
    refs = join(state, range(8))
    for t in range(6):
        state.heartbeat(refs[t], now=0.9)
    failures = state.expire(now=1.5)  # the spares (6, 7) were silent for 1.5 s > 1 s
    assert [f.task.task_id for f in failures] == [6, 7]
    assert state.generation == 1 and state.failure is None and state.formed
    roles = [(t.role, t.rank) for t in state.status(now=1.5).tasks]
    assert roles == [("member", i) for i in range(6)] + [("out", None)] * 2
    # It may come back and stand by again.
    assert state.register(registration(6, 99, slice_shape=SHAPE), now=1.6).standby


def test_a_standby_host_s_member_calls_are_refused_clearly_and_change_nothing() -> None:
    state = cluster()
    refs = join(state, range(8))
    spare = refs[6]
    for call in (
        lambda: state.barrier_arrive(spare, "step", 5.0, now=0.1),
        lambda: state.gather_arrive(spare, "ids", b"x", 5.0, now=0.1),
        lambda: state.kv_set("k", b"v", allow_overwrite=False, now=0.1, caller=spare),
        lambda: state.report_error(spare, "bored", now=0.1),
        lambda: state.rendezvous_progress(spare, "step", now=0.1),
        lambda: state.live_task(spare),
    ):
        with pytest.raises(Refused) as excinfo:
            call()
        reason, message = refusal(excinfo)
        assert reason is Reason.STANDBY
        assert message.startswith("task 6 (127.0.0.7) is a spare in generation 1 (roster slices 0-2)")
    assert state.heartbeat(spare, now=0.2) == 77  # heartbeats, error polls and status are its own
    assert state.poll_error(spare, now=0.2) is None
    assert not state.is_live(6) and state.is_live(5)
    assert state.generation == 1 and state.failure is None
    state.disconnect(spare, now=0.3)  # leaving only stops it standing by
    assert state.generation == 1 and state.failure is None and state.status(now=0.3).tasks[6].role == "out"


def test_status_lists_roles_ranks_the_plan_and_the_spare_slices() -> None:
    state = cluster()
    join(state, [0, 1, 2, 3, 4, 5, 6])
    status = state.status(now=0.0)
    assert [(t.role, t.rank) for t in status.tasks] == [("member", i) for i in range(6)] + [
        ("standby", None),
        ("out", None),
    ]
    assert status.plan == Plan(((0, 3),))
    (spare,) = status.spares
    assert (spare.roster_slice, spare.first_task, spare.registered, spare.spare, spare.ready) == (3, 6, 1, True, False)
    state.register(registration(7, slice_shape=SHAPE), now=0.0)
    document = state.status(now=0.0).as_dict()
    assert document["spares"] == [
        {"roster_slice": 3, "tasks": [6, 7], "spare": True, "registered": 2, "ready": True, "can_replace": "any slice"}
    ]
    assert document["plan"] == {"slices": 3, "runs": [[0, 3]], "description": "roster slices 0-2"}
    assert document["tasks"][7]["role"] == "standby" and document["tasks"][3]["rank"] == 3


# --- elastic -----------------------------------------------------------------------------------------------


def test_elastic_drops_a_lost_slice_only_down_to_min_slices_then_waits() -> None:
    state = cluster(spares=0, policy=elastic(2))
    refs = join(state, range(6))
    state.report_error(refs[3], "gone", now=1.0)
    assert state.plan == Plan.of([0, 2])
    assert ended_message(state, refs[0]).endswith(
        "generation 1 is over: generation 2 shrinks to 2 slices (slice 1 dropped: tasks 2, 3)"
    )
    refs = rejoin(state, refs, [0, 1, 2, 4, 5], 2.0)
    assert formed(state, refs, 2.0) and state.placement.rank_of(4) == 2 and state.placement.rank_of(2) is None
    # Another slice lost: 1 slice would be fewer than min_slices 2, so the cluster keeps it and waits.
    state.report_error(refs[5], "gone too", now=3.0)
    assert state.generation == 3 and state.plan == Plan.of([0, 2])
    assert ended_message(state, refs[0]).endswith("generation 2 is over, the cluster re-forms as generation 3")
    refs = rejoin(state, refs, [0, 1, 2, 4], 4.0)
    progress = state.registration_progress(refs[0], now=4.0)
    assert (progress.missing_count, progress.total, [t.task_id for t in progress.missing]) == (1, 4, [5])


def test_elastic_grows_back_when_a_dropped_slice_s_hosts_register_again() -> None:
    state = cluster(spares=0, policy=elastic(2))
    refs = join(state, range(6))
    state.report_error(refs[3], "gone", now=1.0)
    refs = rejoin(state, refs, [0, 1, 2, 4, 5], 2.0)
    assert state.generation == 2 and formed(state, refs, 2.0)
    ranks = {t: state.placement.rank_of(t) for t in range(6)}
    back = state.register(registration(3, 333, slice_shape=SHAPE), now=3.0)  # the host's new process
    assert state.generation == 3 and state.plan == Plan.of([0, 2, 1])  # appended: the others keep their ranks
    # The registration that completed the slice is answered in the generation it grows, as a member (answered
    # in generation 2, which it ended, the host's session stream was refused: its `tpuctl init` failed)
    assert not back.standby and back.task.generation == 3 and state.placement.rank_of(3) == 5
    ended = state.generations.ended(2)
    assert ended is not None and not ended.failures
    assert str(ended) == (
        "generation 2 is over: roster slice 1 (tasks 2, 3) is complete again: generation 3 grows to 3 slices"
    )
    assert state.failed_since is None  # not a failure
    assert all(state.placement.rank_of(t) == ranks[t] for t in (0, 1, 4, 5))
    refs = rejoin(state, refs, [0, 1, 2, 4, 5], 4.0) | {3: back.task}
    assert formed(state, refs, 4.0) and [state.placement.rank_of(t) for t in (2, 3)] == [4, 5]
    assert state.session_opened(back.task, 1, now=4.0) is None  # its session stream is of a live generation


def test_grow_needs_a_restart_left() -> None:
    state = cluster(spares=0, policy=elastic(2, max_restarts=1))
    refs = join(state, range(6))
    state.report_error(refs[3], "gone", now=1.0)
    refs = rejoin(state, refs, [0, 1, 2, 4, 5], 2.0)
    state.register(registration(3, 333, slice_shape=SHAPE), now=3.0)
    assert state.generation == 2 and state.formed  # no restart left: it stays at 2 slices


# --- a successor's service (the coordinator's host was lost) -------------------------------------------------


def test_a_successors_service_puts_a_ready_spare_slice_in_the_lost_coordinators_slice() -> None:
    """Task 2's new service at generation 2, task 0 lost with the old one: it waits for slice 0 only until the
    spare slice is ready, then gives way to generation 3 with the spare slice in slice 0's place (before the
    fix it waited for task 0 until the restart timeout, the spare slice standing by)."""
    state = cluster(first_generation=2, coordinator_task=2, lost=(0,))
    assert state.plan == Plan.of([0, 1, 2])  # no standby slice known ready yet: the position waits
    refs = join(state, [1, 2, 3, 4, 5, 6])
    assert state.generation == 2 and not state.formed
    last = state.register(registration(7, slice_shape=SHAPE), now=1.0)  # the spare slice is complete
    assert state.generation == 3 and state.plan == Plan.of([3, 1, 2])
    assert not last.standby and last.task.generation == 3 and state.placement.rank_of(7) == 1
    ended = state.generations.ended(2)
    assert ended is not None and str(ended) == (
        "generation 2 is over: generation 3 forms with spare slice 3 (tasks 6, 7) in place of slice 0"
    )
    refs = rejoin(state, refs, [1, 2, 3, 4, 5, 6], 2.0) | {7: last.task}
    assert formed(state, refs, 2.0) and [state.placement.rank_of(t) for t in (6, 1, 2)] == [0, None, 2]
    assert state.register(registration(0, 999, slice_shape=SHAPE), now=3.0).standby  # the old host, back


def test_an_elastic_successors_service_drops_the_lost_coordinators_slice_at_once() -> None:
    state = cluster(spares=0, policy=elastic(2), first_generation=2, coordinator_task=2, lost=(0,))
    assert state.plan == Plan.of([1, 2])
    refs = join(state, [1, 2, 3, 4, 5])
    assert formed(state, refs, 0.0) and state.generation == 2 and state.placement.rank_of(2) == 0
    assert state.placement.rank_of(1) is None  # its slice's other host stands by


def test_a_successors_service_starts_from_the_lost_coordinators_plan() -> None:
    """A shrunk generation's successor keeps the shrunk plan (it does not wait for the dropped slice)."""
    state = cluster(spares=0, policy=elastic(2), first_generation=3, coordinator_task=4, previous_plan=Plan.of([0, 2]))
    assert state.plan == Plan.of([0, 2])
    refs = join(state, [0, 1, 4, 5])
    assert formed(state, refs, 0.0)


# --- the majority rule -----------------------------------------------------------------------------------


def test_the_minority_side_of_a_partition_keeps_every_lost_position_and_fails_naming_it() -> None:
    # 2 | 1 slices, the coordinator on the 1 side with the spare slice: the spare may not make it a cluster.
    state = cluster(policy=elastic(1))
    refs = join(state, range(8))
    for t in (0, 1, 6, 7):
        state.heartbeat(refs[t], now=0.9)
    failures = state.expire(now=1.5)
    assert sorted(f.task.task_id for f in failures) == [2, 3, 4, 5]
    assert state.generation == 2 and state.plan == Plan(((0, 3),))  # unchanged: wait for the lost hosts
    message = ended_message(state, refs[0])
    assert "only 2 of generation 1's 6 hosts survived, not a majority" in message
    refs = rejoin(state, refs, [0, 1, 6, 7], 2.0)
    assert state.register(registration(6, refs[6].incarnation, generation=2), now=2.0).standby  # took no place
    with pytest.raises(Refused) as excinfo:
        state.registration_waiting(refs[0], now=40.0)  # the restart timeout (30 s)
    reason, text = refusal(excinfo)
    assert reason is Reason.CLUSTER_FAILED
    assert "did not rejoin generation 2 within the restart timeout (30 s); only 2 of generation 1's 6 hosts" in text
    assert "(a network partition?)" in text and "task 2 (127.0.0.3)" in text


def test_a_50_50_split_stops_both_halves() -> None:
    state = cluster(slices=2, spares=0, policy=elastic(1))
    refs = join(state, range(4))
    state.heartbeat(refs[0], now=0.9)
    state.heartbeat(refs[1], now=0.9)
    state.expire(now=1.5)
    assert state.generation == 2 and state.plan == Plan(((0, 2),))
    assert "only 2 of generation 1's 4 hosts survived, not a majority" in ended_message(state, refs[0])


def test_a_majority_side_shrinks() -> None:
    state = cluster(slices=3, spares=0, policy=elastic(1))
    refs = join(state, range(6))
    state.report_error(refs[5], "gone", now=1.0)
    assert state.plan == Plan.of([0, 1])  # 4 of 6 survived


# --- bounded messages and work ----------------------------------------------------------------------------


def test_end_messages_are_bounded_and_precise() -> None:
    state = cluster(slices=40, spares=30, per=1, policy=elastic(10))
    refs = join(state, range(70))
    for t in range(40):
        if t % 2 == 0 or t >= 38:
            state.heartbeat(refs[t], now=0.9)
    for t in range(40, 70):
        state.heartbeat(refs[t], now=0.9)
    state.expire(now=1.5)  # 19 hosts (one per slice) lost; 30 spares ready: all replaced
    message = ended_message(state, refs[0])
    assert (
        "generation 2 forms with spare slice 40 (task 40) in place of slice 1, spare slice 41 (task 41) in " in message
    )
    assert "and 9 more" in message and len(message) < 2000
    assert len(state.plan) == 40


def _end_cost(slices: int) -> int:
    state = cluster(slices=slices, spares=slices, per=2)
    refs = join(state, range(4 * slices))
    before = state.counters.touched
    state.report_error(refs[3], "gone", now=1.0)
    return state.counters.touched - before


def test_a_generation_end_costs_o_slices_and_a_registration_o_1() -> None:
    small, large = _end_cost(50), _end_cost(400)
    assert large < 9 * small  # linear in the slices (8x), not quadratic
    costs = []
    for slices in (50, 400):
        state = cluster(slices=slices, spares=slices, per=2)
        join(state, range(4 * slices - 1))
        before = state.counters.touched
        join(state, [4 * slices - 1])  # a spare's registration
        costs.append(state.counters.touched - before)
    assert costs[0] == costs[1] <= 4


# --- a property over random failures and returns -----------------------------------------------------------

_events = st.lists(
    st.tuples(st.sampled_from(["fail", "return", "heartbeat"]), st.integers(0, 11)), min_size=1, max_size=40
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=_events, min_slices=st.integers(1, 4), elastic_policy=st.booleans(), spares=st.sampled_from([0, 1, 2]))
def test_every_formed_generation_is_whole_slices_of_registered_hosts(
    events: list[tuple[str, int]], min_slices: int, elastic_policy: bool, spares: int
) -> None:
    """Random failures and returns (hosts of any slice, spare slices standing by from the start or not):
    every generation that forms is whole roster slices, each in one position, between min_slices (policy
    elastic; else all) and num_slices of them, and every member is registered."""
    policy = (
        elastic(min_slices, max_restarts=50)
        if elastic_policy
        else RestartPolicy(rejoin=True, timeout=1e6, max_restarts=50)
    )
    state = cluster(slices=4, spares=2, per=2, policy=policy, heartbeat_timeout=1e6)
    refs = join(state, range(8 + 2 * spares))
    incarnation = 5000
    now = 0.0
    dead: set[int] = set()
    """Hosts whose process failed: only a new process (``return``) brings them back."""

    def check() -> None:
        if not state.formed:
            return
        plan, roster = state.plan, state.roster
        slices = list(plan.slices())
        assert len(set(slices)) == len(slices)  # no roster slice (so no task) in two positions
        assert (min_slices if elastic_policy else 4) <= len(slices) <= 4
        assert all(0 <= s < roster.roster_slices for s in slices)
        status = state.status(now=now)
        members = plan.members(roster)
        assert sorted(state.placement.rank_of(t) for t in members) == list(range(len(members)))  # type: ignore[type-var]
        for t in members:
            assert status.tasks[t].state is TaskState.CONNECTED and status.tasks[t].role == "member"

    for kind, task in events:
        now += 0.01
        if state.failure is not None:
            break
        record = state.status(now=now).tasks[task]
        ref = refs.get(task, TaskRef(task, 1))
        if kind == "fail" and record.state is TaskState.CONNECTED and ref.generation == state.generation:
            dead.add(task)
            state.report_error(ref, "x", now=now) if state.placement.rank_of(task) is not None else state.disconnect(
                ref, now=now
            )
        elif kind == "return" and record.state is not TaskState.CONNECTED:
            incarnation += 1
            try:  # a host's new process (refused while its place is held for a survivor)
                refs[task] = state.register(registration(task, incarnation, slice_shape=SHAPE), now=now).task
                dead.discard(task)
            except Refused as refused:
                assert refused.reason is Reason.TASK_TAKEN
        else:  # survivors re-register into the current generation, as agents do when theirs ended
            for t, r in list(refs.items()):
                if r.generation != state.generation and t not in dead:
                    try:
                        refs[t] = state.register(
                            registration(t, r.incarnation, generation=r.generation, previous_credential=r.credential),
                            now=now,
                        ).task
                    except Refused as refused:
                        assert refused.reason in (Reason.TASK_TAKEN, Reason.OLD_GENERATION)
        check()
        if state.formed:
            event(
                f"formed with {len(state.plan)} slices, plan {'changed' if state.plan.runs != ((0, 4),) else 'identity'}"
            )
