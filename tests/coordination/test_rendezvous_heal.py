"""Barriers and gathers that heal (issue 24, item 1), on the pure state machine with explicit times.

A failed instance (timed out, or a host left while it waited) is over for every host: each host's next call
to the name joins a later instance, so the next round in which every host calls the name passes, whatever
happened before, and no host is ever told that it is itself missing. The report's sequence on a 2-host
cluster, drawn by instance (``0`` and ``1`` are the hosts' arrivals, ``x`` a failure):

    #1   0 ......x  (host 0 alone, 2 s: timed out, host 1 missing)
    #2   0 1        (both, 6 s: passes; before the fix host 1 joined #1 and heard its timeout)
    #3   0 1        (both again: passes)
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_coordination_state import new_state, refusal, register, registration

from tpuctl.coordination.state import CoordinationState
from tpuctl.coordination.values import (
    RECENT_FAILURES_KEPT,
    BarrierId,
    Gathered,
    Pending,
    Reason,
    Refused,
    RestartPolicy,
    TaskRef,
)


def timed_out(state: CoordinationState, barrier: BarrierId, now: float) -> str:
    with pytest.raises(Refused) as excinfo:
        state.rendezvous_outcome(barrier, now=now)
    reason, message = refusal(excinfo)
    assert reason is Reason.TIMED_OUT, message
    return message


def round_(state: CoordinationState, refs: list[TaskRef], name: str, now: float, timeout: float = 6.0) -> int:
    """Every host calls barrier ``name`` (0.5 s apart, host 0 first); the instance they all joined, which passed."""
    joined = {state.barrier_arrive(ref, name, timeout, now=now + 0.5 * i) for i, ref in enumerate(refs)}
    assert len(joined) == 1, f"the hosts joined different instances: {sorted(b.instance for b in joined)}"
    (barrier,) = joined
    assert state.barrier_outcome(barrier, now=now + 0.5 * len(refs)) == barrier.instance
    return barrier.instance


def test_the_reported_sequence_heals_host_0_alone_then_both_twice() -> None:
    state = new_state(2)
    refs = register(state, range(2))
    alone = state.barrier_arrive(refs[0], "sync", 2.0, now=0.0)
    assert timed_out(state, alone, now=2.0) == (
        "barrier 'sync' #1 timed out after 2.0 s: 1 of 2 hosts arrived; missing: task 1 (127.0.0.2)"
    )
    assert round_(state, refs, "sync", now=10.0) == 2
    assert round_(state, refs, "sync", now=20.0) == 3
    assert state.failure is None


def test_a_late_arrival_before_anyone_asked_the_outcome_joins_the_next_instance() -> None:
    """Host 1 comes after #1's deadline but before host 0 was told: #1 is decided first (host 1 is not
    counted into it, nor told it is missing), host 1 opens #2, and host 0's retry meets it there."""
    state = new_state(2)
    t0, t1 = register(state, range(2))
    first = state.barrier_arrive(t0, "sync", 2.0, now=0.0)
    late = state.barrier_arrive(t1, "sync", 6.0, now=3.0)
    assert late == BarrierId("sync", 2)
    assert state.barrier_outcome(late, now=3.0) == Pending(9.0)
    assert "missing: task 1 (127.0.0.2)" in timed_out(state, first, now=3.1)
    retry = state.barrier_arrive(t0, "sync", 6.0, now=3.5)  # a shell script's retry
    assert retry == late
    assert state.barrier_outcome(late, now=3.5) == 2


def test_a_late_hosts_first_call_completes_the_instance_the_others_wait_at() -> None:
    """The rule the fault soak's seed 30063 met (it had reported it as a round passing without a host):
    a host's k-th call joins the k-th instance, whichever round its caller meant. Tasks 0-2 and 4-7 wait at
    #1 (2 s); tasks 1, 3, 5, 6 call again at 0.5 s: task 3's first call completes #1 (it passes on all
    eight), the others' second calls open #2, which times out without tasks 0, 2, 3, 4 and 7."""
    state = new_state(8)
    refs = register(state, range(8))
    first = {state.barrier_arrive(refs[t], "step", 2.0, now=0.01 * t) for t in (0, 1, 2, 4, 5, 6, 7)}
    assert first == {BarrierId("step", 1)}
    second = {t: state.barrier_arrive(refs[t], "step", 2.4, now=0.5) for t in (1, 3, 5, 6)}
    assert second[3] == BarrierId("step", 1)
    assert {second[t] for t in (1, 5, 6)} == {BarrierId("step", 2)}
    assert state.barrier_outcome(BarrierId("step", 1), now=0.6) == 1
    assert timed_out(state, second[5], now=2.9).endswith("3 of 8 hosts arrived; missing: " + ", ".join(
        f"task {t} (127.0.0.{t + 1})" for t in (0, 2, 3, 4, 7)))  # fmt: skip
    assert round_(state, refs, "step", now=10.0) == 3  # every host's next call: the round heals


def test_a_host_is_never_told_it_is_itself_missing() -> None:
    """Before the fix host 1's first call joined #1 after it timed out and heard `missing: task 1`."""
    state = new_state(2)
    t0, t1 = register(state, range(2))
    timed_out(state, state.barrier_arrive(t0, "sync", 2.0, now=0.0), now=2.0)
    own = state.barrier_arrive(t1, "sync", 2.0, now=5.0)
    assert state.barrier_outcome(own, now=5.0) == Pending(7.0)
    assert timed_out(state, own, now=7.0) == (
        "barrier 'sync' #2 timed out after 2.0 s: 1 of 2 hosts arrived; missing: task 0 (127.0.0.1)"
    )


def test_several_consecutive_timeouts_then_one_full_round_passes() -> None:
    state = new_state(3)
    refs = register(state, range(3))
    now = 0.0
    for caller in (0, 0, 1, 2, 1, 0):  # each alone, each timing out
        barrier = state.barrier_arrive(refs[caller], "sync", 1.0, now=now)
        assert f"task {caller} (" not in timed_out(state, barrier, now=now + 1.0).split("missing: ")[1]
        now += 2.0
    assert round_(state, refs, "sync", now=now) == 7
    assert round_(state, refs, "sync", now=now + 10) == 8


def test_two_hosts_of_three_time_out_together_and_the_round_after_passes() -> None:
    state = new_state(3)
    refs = register(state, range(3))
    pair = {state.barrier_arrive(refs[i], "sync", 2.0, now=0.1 * i) for i in (0, 1)}
    (first,) = pair
    assert timed_out(state, first, now=2.0).endswith("2 of 3 hosts arrived; missing: task 2 (127.0.0.3)")
    assert round_(state, refs, "sync", now=5.0) == 2


def test_passed_rounds_are_unchanged_and_counted_per_host() -> None:
    state = new_state(2)
    t0, t1 = register(state, range(2))
    ahead = state.barrier_arrive(t0, "step", 5.0, now=0.0)
    assert state.barrier_arrive(t1, "step", 5.0, now=0.1) == ahead
    assert state.barrier_outcome(ahead, now=0.1) == 1
    assert round_(state, [t0, t1], "step", now=1.0) == 2
    assert round_(state, [t0, t1], "other", now=1.0) == 1  # names count separately


def test_a_gather_that_timed_out_leaks_no_value_into_the_next() -> None:
    state = new_state(3)
    refs = register(state, range(3))
    old = [state.gather_arrive(refs[i], "ids", b"old-%d" % i, 2.0, now=0.0) for i in (0, 1)]
    late = state.gather_arrive(refs[2], "ids", b"new-2", 6.0, now=2.5)  # after #1's deadline, undecided
    assert old[0] == old[1] == BarrierId("ids", 1, "gather") and late == BarrierId("ids", 2, "gather")
    assert "missing: task 2 (127.0.0.3)" in timed_out(state, old[0], now=2.5)
    for i in (0, 1):
        assert state.gather_arrive(refs[i], "ids", b"new-%d" % i, 6.0, now=3.0) == late
    assert state.gather_outcome(late, now=3.0) == Gathered(2, (b"new-0", b"new-1", b"new-2"))


def test_a_gather_alone_then_every_host_gathers_only_the_new_values() -> None:
    state = new_state(2)
    t0, t1 = register(state, range(2))
    timed_out(state, state.gather_arrive(t0, "ids", b"stale", 1.0, now=0.0), now=1.0)
    joined = {state.gather_arrive(t, "ids", b"v%d" % t.task_id, 6.0, now=2.0) for t in (t0, t1)}
    (gather,) = joined
    assert state.gather_outcome(gather, now=2.0) == Gathered(2, (b"v0", b"v1"))


def test_a_host_that_left_and_came_back_is_not_blamed_by_an_old_instance() -> None:
    """Under policy fail a host may leave (`tpuctl down` on it) and register again: the instances that
    failed while it was gone are over, and the next full round passes. While it is gone, an arrival is
    refused at once, naming it, and opens no instance."""
    state = new_state(3)
    refs = register(state, range(3))
    waiting = state.barrier_arrive(refs[0], "sync", 30.0, now=0.0)
    state.disconnect(refs[2], now=1.0)
    left = "task 2 (127.0.0.3) left the cluster: it disconnected (tpuctl down, or its agent stopped)"
    with pytest.raises(Refused) as in_flight:
        state.barrier_outcome(waiting, now=1.0)
    assert refusal(in_flight) == (Reason.CLUSTER_FAILED, f"barrier 'sync' #1 cannot pass: {left}")
    with pytest.raises(Refused) as while_gone:
        state.barrier_arrive(refs[1], "sync", 30.0, now=2.0)
    assert refusal(while_gone) == (Reason.CLUSTER_FAILED, f"barrier 'sync' #2 cannot pass: {left}")
    back = state.register(registration(2, incarnation=5002), now=3.0).task
    assert round_(state, [refs[0], refs[1], back], "sync", now=4.0) == 2
    (failed,) = state.status(now=5.0).failed_barriers
    assert (failed.instance, failed.reason, [t.task_id for t in failed.missing]) == (1, "host left", [1, 2])


def test_every_generation_starts_its_series_over() -> None:
    state = new_state(2, restart=RestartPolicy(rejoin=True, timeout=30.0, max_restarts=2))
    refs = register(state, range(2))
    timed_out(state, state.barrier_arrive(refs[0], "sync", 1.0, now=0.0), now=1.0)
    assert len(state.status(now=1.0).failed_barriers) == 1
    state.report_error(refs[1], "gone", now=2.0)
    survivor = refs[0]
    again = [
        state.register(registration(0, survivor.incarnation, generation=1, previous_credential=survivor.credential), now=2.5).task,
        state.register(registration(1, 77), now=2.5).task,  # the failed host's new process
    ]
    joined = {state.barrier_arrive(ref, "sync", 5.0, now=3.0) for ref in again}
    assert joined == {BarrierId("sync", 1, "barrier", 2)}  # generation 2's #1: its own series
    assert state.barrier_outcome(BarrierId("sync", 1, "barrier", 2), now=3.0) == 1
    assert state.status(now=3.0).failed_barriers == ()  # generation 1's are history with it


def test_the_watchdog_hears_no_straggler_from_the_round_that_healed() -> None:
    """The last arrival of the round right after a failure is the host that retried, not a slow one."""
    state = new_state(2)
    refs = register(state, range(2))
    timed_out(state, state.barrier_arrive(refs[0], "sync", 1.0, now=0.0), now=1.0)
    round_(state, refs, "sync", now=2.0)
    assert state.take_last_arrivals() == []
    round_(state, refs, "sync", now=10.0)
    assert state.take_last_arrivals() == [(1, 0.5)]


def test_progress_follows_the_instance_the_host_joined() -> None:
    state = new_state(2)
    t0, t1 = register(state, range(2))
    state.barrier_arrive(t0, "sync", 2.0, now=0.0)
    state.barrier_arrive(t1, "sync", 6.0, now=3.0)  # #1 is past its deadline: host 1 opens #2
    mine = state.rendezvous_progress(t1, "sync", now=3.5)
    assert mine is not None and not mine.done
    assert (mine.instance, mine.arrived, [t.task_id for t in mine.missing]) == (2, 1, [0])
    assert mine.seconds_left == 5.5
    theirs = state.rendezvous_progress(t0, "sync", now=3.5)
    assert theirs is not None and (theirs.instance, theirs.done) == (1, True)


def test_status_lists_open_and_recently_failed_instances_with_who_was_missing() -> None:
    state = new_state(3)
    refs = register(state, range(3))
    timed_out(state, state.barrier_arrive(refs[0], "sync", 2.0, now=0.0), now=2.0)
    state.gather_arrive(refs[1], "ids", b"v", 1.0, now=3.0)  # past its deadline at 5.0, asked by nobody
    state.barrier_arrive(refs[2], "sync", 10.0, now=4.0)
    status = state.status(now=5.0)
    assert [(b.kind, b.name, b.instance, b.arrived, b.seconds_left) for b in status.barriers] == [
        ("barrier", "sync", 2, (2,), 9.0)
    ]  # the gather is decided by status itself, not listed open with 0 s left
    old, gather = status.failed_barriers
    assert (old.kind, old.name, old.instance, old.reason, old.seconds_ago, old.arrived, old.missing_count) == (
        "barrier", "sync", 1, "timed out", 3.0, 1, 2,
    )  # fmt: skip
    assert [t.task_id for t in old.missing] == [1, 2]
    assert old.message == (
        "barrier 'sync' #1 timed out after 2.0 s: 1 of 3 hosts arrived; missing: task 1 (127.0.0.2), task 2 (127.0.0.3)"
    )
    assert (gather.kind, gather.name, gather.instance, gather.seconds_ago) == ("gather", "ids", 1, 1.0)
    document = status.as_dict()
    assert document["failed_barriers"][0] == {
        "name": "sync", "instance": 1, "kind": "barrier", "reason": "timed out", "seconds_ago": 3.0,
        "message": old.message, "arrived": 1, "missing": [1, 2], "missing_count": 2,
    }  # fmt: skip


def test_failures_kept_are_bounded_and_so_is_who_was_missing() -> None:
    tasks = 1000
    state = new_state(tasks)
    refs = register(state, range(tasks))
    now = 0.0
    for round_number in range(RECENT_FAILURES_KEPT + 4):
        barrier = state.barrier_arrive(refs[round_number % 3], "sync", 1.0, now=now)
        before = state.counters.touched
        timed_out(state, barrier, now=now + 1.0)
        assert state.counters.touched - before < 30  # a sample, not a walk over 1,000 hosts
        now += 2.0
    failed = state.status(now=now).failed_barriers
    assert [f.instance for f in failed] == list(range(5, RECENT_FAILURES_KEPT + 5))
    assert all(len(f.missing) == 10 and f.missing_count == tasks - 1 for f in failed)
    assert all(len(f.message) < 1000 for f in failed)


@settings(max_examples=200, deadline=None)
@given(
    tasks=st.integers(min_value=1, max_value=4),
    history=st.lists(
        st.tuples(st.integers(min_value=0, max_value=3), st.sampled_from([0.0, 0.5, 3.0]), st.booleans()),
        max_size=12,
    ),
)
def test_the_next_round_of_every_host_passes_whatever_happened_before(
    tasks: int, history: list[tuple[int, float, bool]]
) -> None:
    """Any history of lone calls (each 1 s timeout, its outcome asked or not, the clock moving on by 0 to 3
    s), then every host calls within the first one's timeout: they all join one instance, and it passes.
    A lone call of a 1-host cluster passes at once; that is history too."""
    state = new_state(tasks)
    refs = register(state, range(tasks))
    now = 0.0
    for caller, step, asked in history:
        barrier = state.barrier_arrive(refs[caller % tasks], "sync", 1.0, now=now)
        now += step
        if asked:
            try:
                outcome = state.barrier_outcome(barrier, now=now)
            except Refused as refused:
                assert refused.reason is Reason.TIMED_OUT
                assert f"task {caller % tasks} (" not in refused.message.split("missing: ")[1]
            else:
                assert outcome == barrier.instance or isinstance(outcome, Pending)
    now += 1.5  # every lone call's deadline has passed
    round_(state, refs, "sync", now=now, timeout=60.0)
    round_(state, refs, "sync", now=now + 5.0, timeout=60.0)
