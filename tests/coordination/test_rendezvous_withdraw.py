"""Abandoned calls do not count (issue 24, item 1, left open): a call that gives up withdraws its arrival.

The pure state machine, with explicit times. A withdrawn arrival is as if the call had never been made: the
instance waits for that host again (it cannot pass with a host that is not there) and the host's next call
joins it again. The pass wins a race with a withdrawal (the withdrawing call is answered that it passed, as
every host is); a failure too. The reported sequence on 3 hosts (``w`` a withdrawal, ``+`` the pass):

    #1   1 ............................     (task 1 arrives, 60 s)
    #1   1 0 w                              (task 0 with 2 s, gives up at 2 s: withdrawn)
    #1   1     2                            (task 2 at 10 s: still waits, for task 0; before: it passed)
    #1   1     2 0 +                        (task 0's retry joins #1 again, and it passes for all three)
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_coordination_state import new_state, refusal, register

from tpuctl.coordination.state import CoordinationState
from tpuctl.coordination.values import BarrierId, Gathered, Pending, Reason, Refused, RendezvousProgress, TaskRef


def withdrawn(state: CoordinationState, ref: TaskRef, barrier: BarrierId, now: float) -> RendezvousProgress:
    found = state.withdraw(ref, barrier, now=now)
    assert isinstance(found, RendezvousProgress), found
    return found


def test_a_withdrawn_arrival_does_not_count_and_the_retry_joins_the_same_instance() -> None:
    state = new_state(3)
    t0, t1, t2 = register(state, range(3))
    first = state.barrier_arrive(t1, "sync", 60.0, now=0.0)
    assert state.barrier_arrive(t0, "sync", 2.0, now=1.0) == first
    gave_up = withdrawn(state, t0, first, now=3.0)  # task 0's own 2 s ran out
    assert (gave_up.instance, gave_up.arrived, gave_up.total, [t.task_id for t in gave_up.missing]) == (1, 2, 3, [2])
    assert gave_up.seconds_left == 57.0 and not gave_up.done
    assert state.barrier_arrive(t2, "sync", 60.0, now=10.0) == first
    assert state.barrier_outcome(first, now=10.0) == Pending(60.0)  # before the fix: passed without task 0
    waiting = state.rendezvous_progress(t1, "sync", now=10.0)
    assert waiting is not None and [t.task_id for t in waiting.missing] == [0]
    assert state.rendezvous_progress(t0, "sync", now=10.0) is None  # its only call was taken back
    assert state.barrier_arrive(t0, "sync", 60.0, now=11.0) == first  # the retry: not #2
    assert state.barrier_outcome(first, now=11.0) == 1
    both = {state.barrier_arrive(ref, "sync", 5.0, now=12.0) for ref in (t0, t1, t2)}
    assert both == {BarrierId("sync", 2)}  # the counts stayed in step


def test_a_withdrawal_after_the_pass_is_answered_that_it_passed() -> None:
    """The race: the last arrival reached the service before the withdrawal. The pass wins; the host
    that meant to withdraw is told it passed, as every host is, and its next call joins #2."""
    state = new_state(3)
    refs = register(state, range(3))
    barrier = {state.barrier_arrive(ref, "sync", 60.0, now=0.1 * i) for i, ref in enumerate(refs)}.pop()
    assert state.withdraw(refs[0], barrier, now=2.0) == 1
    assert state.barrier_outcome(barrier, now=2.0) == 1  # unchanged for the others
    assert state.barrier_arrive(refs[0], "sync", 60.0, now=3.0) == BarrierId("sync", 2)


def test_a_withdrawal_after_a_failure_hears_the_failure_every_host_hears() -> None:
    state = new_state(3)
    t0, t1, _ = register(state, range(3))
    barrier = state.barrier_arrive(t0, "sync", 2.0, now=0.0)
    state.barrier_arrive(t1, "sync", 60.0, now=0.5)
    with pytest.raises(Refused) as late:  # past the deadline, undecided: the withdrawal decides it
        state.withdraw(t1, barrier, now=2.5)
    reason, message = refusal(late)
    assert reason is Reason.TIMED_OUT
    assert message == "barrier 'sync' #1 timed out after 2.0 s: 2 of 3 hosts arrived; missing: task 2 (127.0.0.3)"
    with pytest.raises(Refused) as others:
        state.barrier_outcome(barrier, now=2.5)
    assert refusal(others) == (reason, message)


def test_a_gather_forgets_a_withdrawn_value() -> None:
    state = new_state(3)
    t0, t1, t2 = register(state, range(3))
    gather = state.gather_arrive(t0, "ids", b"stale-0", 60.0, now=0.0)
    state.gather_arrive(t1, "ids", b"v1", 60.0, now=0.5)
    assert withdrawn(state, t0, gather, now=1.0).arrived == 2
    state.gather_arrive(t2, "ids", b"v2", 60.0, now=2.0)
    assert state.gather_outcome(gather, now=2.0) == Pending(60.0)
    assert state.gather_arrive(t0, "ids", b"fresh-0", 60.0, now=3.0) == gather
    assert state.gather_outcome(gather, now=3.0) == Gathered(1, (b"fresh-0", b"v1", b"v2"))


def test_a_gather_that_was_never_republished_passes_without_the_withdrawn_value() -> None:
    """The withdrawn value is gone for good: the table of an instance the host left is never built with it."""
    state = new_state(2)
    t0, t1 = register(state, range(2))
    gather = state.gather_arrive(t0, "ids", b"secret", 60.0, now=0.0)
    withdrawn(state, t0, gather, now=1.0)
    state.gather_arrive(t1, "ids", b"v1", 60.0, now=2.0)
    assert state.gather_arrive(t0, "ids", b"", 60.0, now=3.0) == gather
    outcome = state.gather_outcome(gather, now=3.0)
    assert isinstance(outcome, Gathered) and b"secret" not in outcome.values


def test_a_later_shorter_timeout_does_not_shorten_the_instance_for_everyone() -> None:
    """The deadline rule: the first arrival's (as TSL's coordination service). A host that will not
    wait as long withdraws when its own timeout runs out; the others keep waiting, for it, until theirs."""
    state = new_state(3)
    t0, t1, _ = register(state, range(3))
    barrier = state.barrier_arrive(t1, "sync", 60.0, now=0.0)
    state.barrier_arrive(t0, "sync", 2.0, now=1.0)
    assert state.barrier_outcome(barrier, now=5.0) == Pending(60.0)
    withdrawn(state, t0, barrier, now=3.0)
    assert state.barrier_outcome(barrier, now=30.0) == Pending(60.0)
    with pytest.raises(Refused) as excinfo:
        state.barrier_outcome(barrier, now=60.0)
    assert refusal(excinfo)[1].endswith("1 of 3 hosts arrived; missing: task 0 (127.0.0.1), task 2 (127.0.0.3)")


def test_an_instance_every_arrival_left_is_opened_afresh_with_its_next_arrivals_deadline() -> None:
    """Task 0 opened #1 with 2 s and was interrupted: task 1 then gets the 60 s it asked for, not the
    rest of task 0's 2 s, and no failure is recorded."""
    state = new_state(2)
    t0, t1 = register(state, range(2))
    opened = state.barrier_arrive(t0, "sync", 2.0, now=0.0)
    withdrawn(state, t0, opened, now=0.5)
    again = state.barrier_arrive(t1, "sync", 60.0, now=1.0)
    assert again == opened
    assert state.barrier_outcome(again, now=3.0) == Pending(61.0)
    assert state.status(now=3.0).failed_barriers == ()
    assert state.barrier_arrive(t0, "sync", 60.0, now=4.0) == again
    assert state.barrier_outcome(again, now=4.0) == 1


def test_the_first_arrivals_deadline_stays_while_others_are_in_the_instance() -> None:
    state = new_state(3)
    t0, t1, _ = register(state, range(3))
    barrier = state.barrier_arrive(t0, "sync", 10.0, now=0.0)
    state.barrier_arrive(t1, "sync", 60.0, now=1.0)
    withdrawn(state, t0, barrier, now=2.0)
    assert state.barrier_outcome(barrier, now=2.0) == Pending(10.0)  # as task 1 was told it would end


def test_a_host_is_not_told_it_is_itself_missing_when_it_withdraws() -> None:
    state = new_state(4)
    refs = register(state, range(4))
    barrier = state.barrier_arrive(refs[2], "sync", 60.0, now=0.0)
    gave_up = withdrawn(state, refs[2], barrier, now=1.0)
    assert (gave_up.arrived, [t.task_id for t in gave_up.missing]) == (1, [0, 1, 3])
    assert gave_up.missing_count == 3


def test_withdrawn_hosts_are_listed_in_id_order_among_the_missing() -> None:
    state = new_state(4)
    refs = register(state, range(4))
    barrier = state.barrier_arrive(refs[3], "sync", 60.0, now=0.0)
    state.barrier_arrive(refs[1], "sync", 60.0, now=0.1)
    withdrawn(state, refs[3], barrier, now=0.2)
    progress = state.rendezvous_progress(refs[1], "sync", now=0.3)
    assert progress is not None and [t.task_id for t in progress.missing] == [0, 2, 3]
    with pytest.raises(Refused) as excinfo:
        state.barrier_outcome(barrier, now=60.0)
    assert refusal(excinfo)[1].endswith("missing: task 0 (127.0.0.1), task 2 (127.0.0.3), task 3 (127.0.0.4)")


def test_a_withdrawal_costs_the_same_whatever_the_cluster_size() -> None:
    tasks = 10_000
    state = new_state(tasks)
    refs = register(state, range(tasks))
    barrier = state.barrier_arrive(refs[0], "sync", 600.0, now=0.0)
    for ref in refs[1:-1]:
        state.barrier_arrive(ref, "sync", 600.0, now=1.0)
    before = state.counters.touched
    gave_up = withdrawn(state, refs[0], barrier, now=2.0)  # its place is 9,998 arrived hosts before the missing one
    assert state.counters.touched - before < 30
    assert (gave_up.arrived, [t.task_id for t in gave_up.missing]) == (tasks - 1, [tasks - 1])
    assert state.barrier_arrive(refs[0], "sync", 600.0, now=3.0) == barrier
    assert state.barrier_arrive(refs[-1], "sync", 600.0, now=3.0) == barrier
    assert state.barrier_outcome(barrier, now=3.0) == 1


def test_a_withdrawal_of_an_ended_generation_is_refused_as_its_outcome_would_be() -> None:
    state = new_state(2)
    t0, t1 = register(state, range(2))
    barrier = state.barrier_arrive(t0, "sync", 60.0, now=0.0)
    state.report_error(t1, "gone", now=1.0)
    with pytest.raises(Refused) as excinfo:
        state.withdraw(t0, barrier, now=2.0)
    assert refusal(excinfo)[0] is Reason.CLUSTER_FAILED


def test_only_the_tasks_own_process_may_withdraw_its_arrival() -> None:
    state = new_state(2)
    t0, _ = register(state, range(2))
    barrier = state.barrier_arrive(t0, "sync", 60.0, now=0.0)
    for impostor in (TaskRef(0, t0.incarnation, b"\0" * 32), TaskRef(0, 12345, t0.credential)):
        with pytest.raises(Refused) as excinfo:
            state.withdraw(impostor, barrier, now=1.0)
        assert refusal(excinfo)[0] in (Reason.NOT_PERMITTED, Reason.STALE_INCARNATION)
    progress = state.rendezvous_progress(t0, "sync", now=1.0)
    assert progress is not None and progress.arrived == 1  # still counted


def test_a_host_that_left_after_arriving_fails_the_instance_when_its_arrival_is_withdrawn() -> None:
    """`tpuctl down` on a host waiting at a barrier: its session ends after it left. The instance cannot
    pass without it (its arrival is withdrawn), and fails at once as one it had not reached does."""
    state = new_state(3)
    t0, t1, _ = register(state, range(3))
    barrier = state.barrier_arrive(t0, "sync", 60.0, now=0.0)
    state.barrier_arrive(t1, "sync", 60.0, now=0.5)
    state.disconnect(t0, now=1.0)
    assert state.barrier_outcome(barrier, now=1.0) == Pending(60.0)  # it had arrived: not failed by leaving
    with pytest.raises(Refused) as withdrawing:
        state.withdraw(t0, barrier, now=1.5)
    left = "barrier 'sync' #1 cannot pass: task 0 (127.0.0.1) left the cluster: it disconnected (tpuctl down, or its agent stopped)"
    assert refusal(withdrawing) == (Reason.CLUSTER_FAILED, left)
    with pytest.raises(Refused) as others:
        state.barrier_outcome(barrier, now=1.5)
    assert refusal(others) == (Reason.CLUSTER_FAILED, left)
    (failed,) = state.status(now=2.0).failed_barriers
    assert (failed.reason, [t.task_id for t in failed.missing]) == ("host left", [0, 2])


@settings(max_examples=200, deadline=None)
@given(
    tasks=st.integers(min_value=2, max_value=4),
    history=st.lists(
        st.tuples(st.integers(min_value=0, max_value=3), st.booleans(), st.sampled_from([0.0, 0.5, 3.0])),
        max_size=14,
    ),
)
def test_an_instance_passes_only_with_every_host_there_and_the_next_full_round_passes(
    tasks: int, history: list[tuple[int, bool, float]]
) -> None:
    """Any history of calls (each 2 s), some withdrawn at once, the clock moving on by 0 to 3 s: an
    instance passes only when every host's arrival in it stands (a withdrawn one never completes it);
    then every host calls within the first one's timeout, and that round passes."""
    state = new_state(tasks)
    refs = register(state, range(tasks))
    standing: dict[BarrierId, set[int]] = {}
    now = 0.0
    for caller, withdraw, step in history:
        task = caller % tasks
        barrier = state.barrier_arrive(refs[task], "sync", 2.0, now=now)
        standing.setdefault(barrier, set()).add(task)
        if withdraw:
            try:
                found = state.withdraw(refs[task], barrier, now=now)
            except Refused as refused:
                assert refused.reason is Reason.TIMED_OUT
            else:
                if isinstance(found, RendezvousProgress):
                    standing[barrier].discard(task)
                    assert task not in [t.task_id for t in found.missing]
                else:
                    assert found == barrier.instance and standing[barrier] == set(range(tasks))
        try:
            outcome = state.barrier_outcome(barrier, now=now)
        except Refused:
            pass
        else:
            if outcome == barrier.instance:
                assert standing[barrier] == set(range(tasks)), (barrier, standing[barrier])
        now += step
    now += 2.5  # every open instance's deadline has passed
    joined = {state.barrier_arrive(ref, "sync", 60.0, now=now + 0.1 * i) for i, ref in enumerate(refs)}
    assert len(joined) == 1
    (barrier,) = joined
    assert state.barrier_outcome(barrier, now=now + 1.0) == barrier.instance


def test_what_became_of_a_call_whose_answer_was_lost_is_its_instances_outcome_while_it_still_counts() -> None:
    """A host whose session broke before its answer came asks by its request id (and its registration's
    incarnation): passed (the number), failed (raises that failure), open, or no longer counted (withdrawn
    with its stream, or another call of the host's took its place: None)."""
    state = new_state(2)
    t0, t1 = register(state, range(2))
    state.barrier_arrive(t1, "sync", 60.0, now=0.0, request_id=5)
    passed = state.barrier_arrive(t0, "sync", 60.0, now=1.0, request_id=7)
    assert state.call_outcome(t0, "sync", 7, now=2.0) == 1  # passed: the answer the stream lost
    assert state.call_outcome(t0, "sync", 8, now=2.0) is None  # not that call's id
    assert state.call_outcome(t1, "sync", 7, now=2.0) is None  # nor that host's
    assert state.call_outcome(t0, "other", 7, now=2.0) is None  # nor that name's
    assert passed == BarrierId("sync", 1)

    second = state.barrier_arrive(t0, "sync", 60.0, now=3.0, request_id=9)  # #2, open
    assert state.call_outcome(t0, "sync", 7, now=3.0) is None  # a later call took its place
    assert state.call_outcome(t0, "sync", 9, now=3.0) == Pending(63.0)
    withdrawn(state, t0, second, now=4.0)  # its stream ended: withdrawn
    assert state.call_outcome(t0, "sync", 9, now=4.0) is None  # its retry joins #2 again
    assert state.barrier_arrive(t0, "sync", 1.0, now=5.0, request_id=10) == BarrierId("sync", 2)
    with pytest.raises(Refused) as failed:
        state.call_outcome(t0, "sync", 10, now=7.0)  # #2 timed out without task 1
    assert failed.value.reason is Reason.TIMED_OUT
    assert state.call_outcome(t0, "sync", 0, now=7.0) is None  # 0: no request id, never a call's
