"""The ledger's arithmetic, pure: every instant of the wall in exactly one bucket, per generation and in total,
to the millisecond; golden timelines for each bucket; preemption events fed directly."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuctl.goodput.ledger import BUCKETS, Ledger, account, fold, layout
from tpuctl.goodput.timeline import (
    KEEP_GENERATIONS,
    MAX_NAMED,
    MAX_PAUSES,
    CheckpointAgreed,
    CheckpointSaved,
    Generation,
    HostMark,
    PreemptionNotice,
    StepsLost,
    Timeline,
)

T0 = 1_700_000_000.0  # a wall clock (seconds since the epoch)


def seconds(ledger: Ledger, generation: int | None = None) -> dict[str, float]:
    """The buckets in seconds, those with time only: of one generation, or the total."""
    if generation is None:
        totals = ledger.totals
    else:
        totals = next(a for a in ledger.generations if a.gen.number == generation).totals
    return {b: v / 1000 for b, v in totals.items() if v}


def check_exact(ledger: Ledger) -> None:
    """Every millisecond from ``since`` to ``until`` in exactly one segment; sums equal the walls exactly."""
    cursor = ledger.generations[0].start
    for account_ in ledger.generations:
        assert account_.start == cursor
        at = account_.start
        for segment in account_.segments:
            assert segment.start == at and segment.end > segment.start and segment.bucket in BUCKETS
            at = segment.end
        assert at == account_.end
        assert sum(account_.totals.values()) == account_.end - account_.start
        cursor = account_.end
    assert cursor == ledger.until
    assert sum(ledger.totals.values()) == ledger.wall == ledger.until - ledger.since


def failed_run(lost_steps: int | None = None) -> Timeline:
    """Generation 1: bring-up 2 s, start-up 1 s, steps (0.1 s each) from T0+3 to a failure at T0+9 with the
    last checkpoint reached at T0+5; the generation ends 1 s after the failure. Generation 2: the failed
    host back 3 s later, formed 0.5 s after, first progress 1.5 s after that."""
    t = Timeline("pod", T0)
    t.registered(T0 + 1.0)
    t.formed(T0 + 2.0)
    t.progress(0, 1, T0 + 3.0, step_time=0.1, at=T0 + 3.1)
    t.progress(1, 30, T0 + 6.0, step_time=0.1, checkpointed=20, at=T0 + 6.2)  # step 20 reached at 6.0 - 1.0
    t.progress(0, 55, T0 + 8.5, step_time=0.1, at=T0 + 8.6)
    if lost_steps is not None:
        t.record(StepsLost(2, lost_steps, T0 + 8.9))
    t.ended(T0 + 10.0, failed_at=T0 + 9.0, cause="task 2 failed", failures=[HostMark(2, T0 + 9.0, "killed")], total=1)
    t.next_generation(2, T0 + 10.0)
    t.returned(2, T0 + 12.8)
    t.registered(T0 + 13.0)
    t.formed(T0 + 13.5)
    t.progress(1, 21, T0 + 15.0, step_time=0.1, at=T0 + 15.1)
    return t


def test_a_failure_its_detection_the_wait_for_the_host_and_the_restart() -> None:
    ledger = account(failed_run(), T0 + 20.0)
    check_exact(ledger)
    assert seconds(ledger, 1) == {"bring_up": 2.0, "startup": 1.0, "productive": 2.0, "lost": 4.0, "restart": 1.0}
    assert seconds(ledger, 2) == {"waiting": 3.0, "restart": 0.5, "startup": 1.5, "productive": 5.0}
    assert seconds(ledger) == {"bring_up": 2.0, "waiting": 3.0, "startup": 2.5, "productive": 7.0, "restart": 1.5, "lost": 4.0}
    assert ledger.fraction == pytest.approx(7.0 / 20.0)
    assert ledger.current == "productive"
    doc = ledger.to_json()
    assert doc["generations"][1]["returns"] == [{"task": 2, "address": None, "at": T0 + 12.8}]
    assert doc["generations"][0]["segments"] == [
        [0.0, 2.0, "bring_up"], [2.0, 3.0, "startup"], [3.0, 5.0, "productive"], [5.0, 9.0, "lost"], [9.0, 10.0, "restart"],
    ]  # fmt: skip


def test_a_job_that_reports_no_checkpoint_loses_nothing_the_ledger_can_tell_and_says_so() -> None:
    t = Timeline("pod", T0)
    t.formed(T0 + 1.0)
    t.progress(0, 1, T0 + 2.0, step_time=0.1, at=T0 + 2.0)
    t.ended(T0 + 5.0, failed_at=T0 + 4.0, cause="x", failures=[], total=1)
    t.next_generation(2, T0 + 5.0)
    ledger = account(t, T0 + 6.0)
    check_exact(ledger)
    assert seconds(ledger, 1) == {"bring_up": 1.0, "startup": 1.0, "productive": 2.0, "restart": 1.0}
    assert any("reported no checkpoint" in note for note in ledger.to_json()["notes"])


def test_once_the_job_checkpoints_a_generation_without_a_checkpoint_of_its_own_lost_all_its_progress() -> None:
    t = failed_run()
    t.ended(T0 + 20.0, failed_at=T0 + 19.0, cause="again", failures=[], total=1)
    ledger = account(t, T0 + 20.0)
    check_exact(ledger)
    assert seconds(ledger, 2) == {"waiting": 3.0, "restart": 1.5, "startup": 1.5, "lost": 4.0}


def test_a_declared_hang_is_hung_from_the_last_progress_until_progress_again() -> None:
    t = Timeline("pod", T0)
    t.formed(T0 + 1.0)
    t.progress(0, 10, T0 + 2.0, step_time=0.1, at=T0 + 2.0)
    t.progress(0, 20, T0 + 3.0, step_time=0.1, at=T0 + 3.0)
    t.hang(T0 + 13.0)  # the watchdog's verdict, hang_timeout after the last step
    t.progress(0, 20, T0 + 3.0, at=T0 + 14.0)  # the same step again: still hung
    t.progress(0, 21, T0 + 15.0, step_time=0.1, at=T0 + 15.2)  # it moves again
    ledger = account(t, T0 + 16.0)
    check_exact(ledger)
    assert seconds(ledger) == {"bring_up": 1.0, "startup": 1.0, "productive": 2.0, "hung": 12.0}
    t.progress(0, 30, T0 + 17.0, step_time=0.1, at=T0 + 17.0)
    t.hang(T0 + 27.0)  # hung again; the job is restarted from an earlier step: progress again all the same
    t.progress(0, 5, T0 + 28.0, step_time=0.1, at=T0 + 28.0)
    assert seconds(account(t, T0 + 29.0))["hung"] == 12.0 + 11.0


def test_a_hang_that_restarts_the_generation_is_hung_up_to_the_verdict_and_its_progress_since_the_checkpoint_lost() -> None:
    t = Timeline("pod", T0)
    t.formed(T0 + 1.0)
    t.progress(0, 1, T0 + 2.0, step_time=0.1, at=T0 + 2.0)
    t.progress(0, 30, T0 + 5.0, step_time=0.1, checkpointed=20, at=T0 + 5.0)  # step 20 at T0+4
    t.hang(T0 + 15.0)
    t.ended(T0 + 15.0, failed_at=T0 + 15.0, cause="hung", failures=[HostMark(1, T0 + 15.0, "hung")], total=1)
    t.next_generation(2, T0 + 15.0)
    ledger = account(t, T0 + 15.0)
    check_exact(ledger)
    assert seconds(ledger, 1) == {"bring_up": 1.0, "startup": 1.0, "productive": 2.0, "lost": 1.0, "hung": 10.0}


def test_between_jobs_the_cluster_is_waiting_for_a_job_to_progress() -> None:
    t = Timeline("pod", T0)
    t.formed(T0 + 1.0)
    t.progress(0, 5, T0 + 2.0, step_time=0.1, at=T0 + 2.0)
    t.progress(1, 5, T0 + 3.0, step_time=0.1, at=T0 + 3.0)
    t.progress(0, 5, T0 + 3.0, ended=True, at=T0 + 4.0)
    t.progress(1, 5, T0 + 3.0, ended=True, at=T0 + 4.5)  # every job ended: idle from the last progress
    t.progress(0, 1, T0 + 9.0, step_time=0.1, at=T0 + 9.0)  # the next job's first step
    ledger = account(t, T0 + 10.0)
    check_exact(ledger)
    assert seconds(ledger) == {"bring_up": 1.0, "startup": 7.0, "productive": 2.0}


def test_a_shutdown_loses_nothing_and_ends_the_ledger() -> None:
    t = Timeline("pod", T0)
    t.formed(T0 + 1.0)
    t.progress(0, 50, T0 + 2.0, step_time=0.1, checkpointed=10, at=T0 + 2.0)
    t.ended(T0 + 6.0, failed_at=None, cause="shut down", failures=[], total=0, final=True, shutdown=True)
    ledger = account(t, T0 + 100.0)
    check_exact(ledger)
    assert ledger.until == round((T0 + 6.0) * 1000) and ledger.current == ""
    assert seconds(ledger) == {"bring_up": 1.0, "startup": 1.0, "productive": 4.0}


def test_a_generation_that_never_formed_is_waiting_and_restart_until_it_ends() -> None:
    t = failed_run()
    t.generations[-1] = Generation(2, T0 + 10.0, bring_up=False, registered=T0 + 12.0)
    t.ended(T0 + 30.0, failed_at=None, cause="did not rejoin", failures=[], total=1, final=True)
    ledger = account(t, T0 + 40.0)
    check_exact(ledger)
    assert seconds(ledger, 2) == {"waiting": 2.0, "restart": 18.0}


def test_times_out_of_order_are_clamped_forward_never_counted_twice() -> None:
    t = Timeline("pod", T0)
    t.registered(T0 - 5.0)  # before init: the wall clock stepped back
    t.formed(T0 + 3.0)
    t.progress(0, 1, T0 + 1.0, step_time=0.1, at=T0 + 2.0)  # "reached" before formed
    t.ended(T0 + 2.5, failed_at=T0 + 10.0, cause="x", failures=[], total=1)  # a failure "after" its end
    t.next_generation(2, T0 + 2.5)
    ledger = account(t, T0 + 1.0)  # "now" before the last end
    check_exact(ledger)
    assert ledger.wall == 2500 and ledger.generations[1].end == ledger.generations[1].start


@pytest.mark.parametrize("lost", [None, 12])
def test_a_preemption_checkpointed_at_the_agreed_step_loses_nothing(lost: int | None) -> None:
    """The notices' side feeds its events as plain records: a notice, the agreed step, its save. Productive
    time ends when the cluster reached the agreed step; its save and the host's departure are restart."""
    t = Timeline("pod", T0)
    t.formed(T0 + 1.0)
    t.progress(0, 1, T0 + 2.0, step_time=0.1, at=T0 + 2.0)
    t.record(PreemptionNotice(2, "metadata: preempted", T0 + 40.0, T0 + 6.0))
    t.record(CheckpointAgreed(45, T0 + 6.1))
    t.progress(0, 45, T0 + 6.4, step_time=0.1, at=T0 + 6.5)  # the agreed step reached
    t.record(CheckpointSaved(45, T0 + 8.0))
    t.ended(T0 + 9.0, failed_at=T0 + 9.0, cause="task 2 left", failures=[HostMark(2, T0 + 9.0, "left")], total=1)
    t.next_generation(2, T0 + 9.0)
    ledger = account(t, T0 + 9.0)
    check_exact(ledger)
    assert seconds(ledger, 1) == {"bring_up": 1.0, "startup": 1.0, "productive": 4.4, "restart": 2.6}
    gen = ledger.to_json()["generations"][0]
    assert gen["notices"] == [{"task": 2, "source": "metadata: preempted", "deadline": T0 + 40.0, "at": T0 + 6.0}]
    assert gen["steps"]["agreed"] == 45 and gen["steps"]["saved"] == 45 and gen["steps"]["lost_steps"] is None


def test_a_preemption_whose_deadline_came_first_counts_the_lost_steps_at_the_step_time() -> None:
    ledger = account(failed_run(lost_steps=12), T0 + 20.0)  # 12 steps of 0.1 s before the failure at T0+9
    check_exact(ledger)
    assert seconds(ledger, 1) == {"bring_up": 2.0, "startup": 1.0, "productive": 4.8, "lost": 1.2, "restart": 1.0}
    assert ledger.to_json()["generations"][0]["steps"]["lost_steps"] == 12


def test_notices_name_at_most_a_few_hosts_and_count_the_rest() -> None:
    t = Timeline("pod", T0)
    t.formed(T0 + 1.0)
    for task in range(10_000):
        t.record(PreemptionNotice(task, "sigterm", 0.0, T0 + 2.0))
    gen = account(t, T0 + 3.0).to_json()["generations"][0]
    assert len(gen["notices"]) == MAX_NAMED and gen["notices_total"] == 10_000


def test_a_failure_storm_names_a_sample_and_counts_every_host() -> None:
    t = Timeline("pod", T0)
    t.formed(T0 + 1.0)
    storm = [HostMark(task, T0 + 2.0, "no heartbeat") for task in range(10_000)]
    t.ended(T0 + 3.0, failed_at=T0 + 2.0, cause="10,000 tasks failed", failures=storm, total=10_000)
    t.next_generation(2, T0 + 3.0)
    for task in range(10_000):
        t.returned(task, T0 + 4.0)
    doc = account(t, T0 + 5.0).to_json()
    assert len(doc["generations"][0]["failures"]) == MAX_NAMED and doc["generations"][0]["failed_hosts"] == 10_000
    assert len(doc["generations"][1]["returns"]) == MAX_NAMED


def test_pauses_beyond_the_bound_merge_into_the_last_and_say_so() -> None:
    t = Timeline("pod", T0)
    t.formed(T0 + 1.0)
    at = T0 + 2.0
    for step in range(1, 3 * MAX_PAUSES):
        t.progress(0, step, at, step_time=1.0, at=at)
        t.hang(at + 0.5)
        at += 1.0
    assert len(t.current.pauses) == MAX_PAUSES and t.current.pauses_merged > 0
    ledger = account(t, at)
    check_exact(ledger)
    assert any("pauses" in note for note in ledger.notes)


def test_folding_keeps_the_totals_exact_and_the_timeline_bounded() -> None:
    t = Timeline("pod", T0)
    at = T0
    for number in range(1, 3 * KEEP_GENERATIONS):
        t.registered(at + 1.0)
        t.formed(at + 2.0)
        t.progress(0, 10, at + 3.0, step_time=0.1, checkpointed=5, at=at + 3.0)
        t.ended(at + 5.0, failed_at=at + 4.0, cause="x", failures=[HostMark(1, at + 4.0, "x")], total=1)
        t.next_generation(number + 1, at + 5.0)
        at += 5.0
    before = account(t, at + 1.0)
    assert fold(t) and len(t.generations) == KEEP_GENERATIONS
    after = account(t, at + 1.0)
    check_exact(after)
    assert after.totals == before.totals and after.since == before.since and after.until == before.until
    assert after.earlier is not None and after.earlier.count == 2 * KEEP_GENERATIONS and after.earlier.failed_hosts == 2 * KEEP_GENERATIONS
    assert fold(t) is False


# --- every timeline: the arithmetic's invariants ---------------------------------------------------------

_OPS = st.one_of(
    st.tuples(st.just("registered")),
    st.tuples(st.just("formed")),
    st.tuples(
        st.just("progress"), st.integers(0, 3), st.integers(0, 200), st.floats(0, 5), st.integers(-1, 200),
        st.floats(0, 1), st.booleans(),
    ),
    st.tuples(st.just("hang")),
    st.tuples(st.just("end"), st.floats(0, 10), st.booleans(), st.booleans()),
    st.tuples(st.just("next")),
    st.tuples(st.just("returned"), st.integers(0, 3)),
    st.tuples(st.just("notice"), st.integers(0, 3)),
    st.tuples(st.just("agreed"), st.integers(0, 200)),
    st.tuples(st.just("saved"), st.integers(0, 200)),
    st.tuples(st.just("lost"), st.integers(0, 50)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(-2.0, 20.0), _OPS), max_size=60), st.floats(-5.0, 50.0))
def test_every_instant_is_in_exactly_one_bucket_and_the_sums_equal_the_wall(ops: list, now_after: float) -> None:
    t = Timeline("pod", T0)
    at = T0
    number = 1
    for step, op in ops:
        at += step  # may step back: a wall clock set back
        kind = op[0]
        if kind == "registered":
            t.registered(at)
        elif kind == "formed":
            t.formed(at)
        elif kind == "progress":
            _, task, s, back, checkpointed, step_time, ended = op
            t.progress(task, s, at - back, checkpointed=checkpointed, step_time=step_time, ended=ended, at=at)
        elif kind == "hang":
            t.hang(at)
        elif kind == "end":
            _, back, final, shutdown = op
            t.ended(at, failed_at=at - back, cause="x", failures=[HostMark(1, at - back, "x")], total=1, final=final, shutdown=shutdown)
        elif kind == "next":
            number += 1
            t.next_generation(number, at)
        elif kind == "returned":
            t.returned(op[1], at)
        elif kind == "notice":
            t.record(PreemptionNotice(op[1], "sigterm", at + 30, at))
        elif kind == "agreed":
            t.record(CheckpointAgreed(op[1], at))
        elif kind == "saved":
            t.record(CheckpointSaved(op[1], at))
        else:
            t.record(StepsLost(1, op[1], at))
        fold(t)
    ledger = account(t, at + now_after)
    check_exact(ledger)
    assert 0.0 <= ledger.fraction <= 1.0 and not math.isnan(ledger.fraction)
    # the journal's lines give the same ledger
    again = Timeline.from_lines([line for line in t.lines()])
    assert account(again, at + now_after).totals == ledger.totals


def test_layout_of_an_empty_span_is_empty() -> None:
    assert layout(Generation(1, T0, True), 5, 5, live=True, checkpointing=False) == ()
