"""The agreement on one checkpoint step, pure: every live host reports where its job stands, the step is the
largest; no step when a host cannot say or the bound passes (tpuctl.preemption.agreement)."""

from __future__ import annotations

import pytest

from tpuctl.preemption.agreement import AGREED, NONE, PENDING, Agreement
from tpuctl.preemption.notice import AGREE_MAX_S, AGREE_MIN_S, agree_seconds, source_problem


def opened(hosts: int = 3, agree_by: float = 10.0, deadline: float = 30.0) -> Agreement:
    return Agreement.open(1, range(hosts), agree_by=agree_by, deadline=deadline, describe=lambda t: f"task {t}")


def test_the_worked_example_one_host_ahead_every_host_agrees_on_one_past_its_last_answer() -> None:
    # host 1 answered 42 before the notice (it is ahead); hosts 0 and 2 answered 41
    agreement = opened()
    assert agreement.report(0, 42) is None
    assert agreement.report(2, 42) is None
    decision = agreement.report(1, 43)
    assert decision is not None and (decision.state, decision.step) == (AGREED, 43)
    assert agreement.state == AGREED and agreement.step == 43
    assert agreement.report(0, 99) is None  # decided once: later reports change nothing
    assert agreement.step == 43


@pytest.mark.parametrize(
    ("reports", "state", "step"),
    [
        ([(0, 5), (1, 5), (2, 5)], AGREED, 5),
        ([(0, -1), (1, 7), (2, -1)], AGREED, 7),  # hosts whose jobs do not ask do not hold it back
        ([(0, -1), (1, -1), (2, -1)], NONE, -1),  # nobody asks: nothing to agree on
    ],
)
def test_golden_decisions(reports: list[tuple[int, int]], state: str, step: int) -> None:
    agreement = opened()
    decisions = [agreement.report(task, next_step) for task, next_step in reports]
    assert decisions[:-1] == [None] * (len(reports) - 1)
    last = decisions[-1]
    assert last is not None and (last.state, last.step) == (state, step)


def test_a_host_whose_job_could_not_say_where_it_stands_means_no_step_is_safe() -> None:
    agreement = opened()
    agreement.report(0, 5)
    agreement.report(1, 6, unknown=True)
    decision = agreement.report(2, 5)
    assert decision is not None and decision.state == NONE and decision.step == -1
    assert "task 1" in decision.reason and "did not say where it stands" in decision.reason


def test_the_bound_passing_without_every_report_is_no_agreement_naming_who_is_missing() -> None:
    agreement = opened(hosts=12, agree_by=10.0)
    agreement.report(0, 5)
    assert agreement.tick(9.9) is None and agreement.state == PENDING
    decision = agreement.tick(10.0)
    assert decision is not None and decision.state == NONE
    assert decision.reason.startswith("11 of 12 hosts did not say where their jobs stand in time: task 1, task 2,")
    assert decision.reason.endswith("and 6 more")  # a sample and a count, never every host
    assert agreement.tick(11.0) is None  # once


def test_a_host_that_fails_before_reporting_is_not_waited_for() -> None:
    agreement = opened()
    agreement.report(0, 8)
    agreement.report(1, 9)
    decision = agreement.gone(2)
    assert decision is not None and (decision.state, decision.step) == (AGREED, 9)
    assert opened().gone(0) is None  # others still to report


def test_a_host_may_report_again_before_the_decision_the_step_only_grows() -> None:
    agreement = opened(hosts=2)
    agreement.report(0, -1)  # its job had not asked yet
    agreement.report(0, 12)  # a process started asking: a revision
    decision = agreement.report(1, 10)
    assert decision is not None and decision.step == 12


def test_reports_of_hosts_not_asked_are_not_counted() -> None:
    agreement = Agreement.open(1, [0, 1], agree_by=10.0, deadline=30.0)
    assert agreement.report(5, 100) is None and agreement.high == -1


def test_saves_and_the_deadline_count_the_lost_steps() -> None:
    agreement = opened(hosts=2, deadline=30.0)
    agreement.report(0, 20, checkpointed=10)
    agreement.report(1, 21, checkpointed=10)
    assert agreement.lost_at_deadline(29.0) is None  # not yet
    assert agreement.lost_at_deadline(30.0) == 20 - 10  # nobody saved 21: steps 11..20 are lost
    assert agreement.lost_at_deadline(40.0) is None  # once

    late = opened(hosts=2, deadline=30.0)
    late.report(0, 20, checkpointed=10)
    late.report(1, 21, checkpointed=10)
    assert not late.save(0, 19)  # below the agreed step: not the agreed checkpoint, but a checkpoint all the same
    assert late.lost_at_deadline(30.0) == 20 - 19

    saved = opened(hosts=2, deadline=30.0)
    saved.report(0, 21)
    saved.report(1, 21)
    assert saved.save(1, 21) and not saved.save(0, 21)  # the first save of the agreed step is the event
    assert saved.lost_at_deadline(31.0) is None


def test_no_agreement_and_no_checkpoint_loses_every_step_reported() -> None:
    agreement = opened(hosts=2, agree_by=1.0, deadline=5.0)
    agreement.report(0, 8)
    agreement.tick(1.0)
    assert agreement.lost_at_deadline(5.0) == 7


@pytest.mark.parametrize(("seconds", "bound"), [(0.5, AGREE_MIN_S), (9.0, 3.0), (30.0, AGREE_MAX_S), (600.0, AGREE_MAX_S)])
def test_the_agreement_takes_a_third_of_the_notice_within_its_bounds(seconds: float, bound: float) -> None:
    assert agree_seconds(seconds) == bound


def test_sources_are_checked() -> None:
    assert source_problem("gce-preempted") is None and source_problem("sigterm") is None
    problem = source_problem("bogus")
    assert problem is not None and "gce-preempted" in problem
