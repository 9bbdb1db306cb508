"""The watchdog's judgement on simulated clusters: every host's agent (``StepPace``) fed its job's step
reports at simulated times, its reports handed to the coordinator's ``Watchdog`` as they fall due.

Jobs run in lockstep (every step ends with a collective: every host waits for the slowest, then all start
the next step together, and each host reports its step when its own work is done) or independently. A
straggler does more work per step; a frozen job stops reporting and, in lockstep, stops everyone one step
later. Time is simulated: each test runs thousands of steps in milliseconds, with a seeded jitter.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

import pytest

from tpuctl.watchdog.judge import Verdict, Watchdog
from tpuctl.watchdog.pace import PaceReport, StepPace
from tpuctl.watchdog.settings import StragglerSettings, WatchdogSettings

TICK_S = 0.25  # how often each agent and the coordinator look at their clocks


def describe(task: int) -> str:
    return f"task {task} (10.0.0.{task + 1})"


@dataclass
class Run:
    verdicts: list[tuple[float, int, Verdict]] = field(default_factory=list)
    """(time, the step the cluster had reached, verdict)"""
    reports: dict[int, int] = field(default_factory=dict)
    """task -> reports its agent sent"""
    watchdog: Watchdog | None = None

    def kinds(self) -> list[str]:
        return [v.kind for _, _, v in self.verdicts]

    def first(self, kind: str) -> tuple[float, int, Verdict]:
        return next(item for item in self.verdicts if item[2].kind == kind)


def simulate(
    hosts: int,
    steps: int,
    *,
    settings: WatchdogSettings,
    base: float = 0.2,
    jitter: float = 0.1,
    lockstep: bool = True,
    slow: dict[int, tuple[int, float]] | None = None,
    frozen: dict[int, int] | None = None,
    silent: frozenset[int] = frozenset(),
    seed: int = 0,
    collective: float = 0.01,
    until: float | None = None,
) -> Run:
    """``slow``: task -> (from step, work factor); ``frozen``: task -> the last step it reports (its job then
    stops: in lockstep every host stops one step later); ``silent``: hosts whose jobs never report."""
    rng = random.Random(seed)
    slow, frozen = slow or {}, frozen or {}
    events: list[tuple[float, int, int]] = []  # (time, task, step) of each progress report
    clocks = [0.0] * hosts
    start = 0.0
    stopped_at: int | None = None
    for step in range(steps):
        work = []
        for task in range(hosts):
            factor = slow[task][1] if task in slow and step >= slow[task][0] else 1.0
            work.append(base * factor * (1 + rng.uniform(-jitter, jitter)))
        for task in range(hosts):
            if task in frozen and step > frozen[task]:
                continue
            if stopped_at is not None and step > stopped_at:
                continue
            at = (start if lockstep else clocks[task]) + work[task]
            clocks[task] = at
            if task not in silent:
                heapq.heappush(events, (at, task, step))
        if any(step >= last for last in frozen.values()) and lockstep and stopped_at is None:
            stopped_at = step + 1  # everyone reports the next step, then waits for the frozen host forever
        start += max(work) + collective
    end = until if until is not None else max((e[0] for e in events), default=0.0) + 1.0
    paces = [StepPace(settings, hosts) for _ in range(hosts)]
    watchdog = Watchdog(settings, hosts, describe)
    run = Run(reports=dict.fromkeys(range(hosts), 0), watchdog=watchdog)
    now = 0.0
    top = -1
    while now <= end:
        while events and events[0][0] <= now:
            at, task, step = heapq.heappop(events)
            assert paces[task].record("P", step, 1000 + task, at) is None
            top = max(top, step)
        for task, pace in enumerate(paces):
            report = pace.due(now)
            if report is not None:
                run.reports[task] += 1
                watchdog.report(task, report, now)
        for verdict in watchdog.tick(now):
            run.verdicts.append((now, top, verdict))
        now += TICK_S
    return run


SETTINGS = WatchdogSettings(hang_timeout=30.0, report_every=1.0, straggler=StragglerSettings(ratio=1.25, steps=50))


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("lockstep", [True, False], ids=["lockstep", "independent"])
def test_a_healthy_run_of_600_steps_with_jitter_raises_no_alarm(seed: int, lockstep: bool) -> None:
    run = simulate(8, 600, settings=SETTINGS, jitter=0.15, lockstep=lockstep, seed=seed, until=600 * 0.2 + 5)
    assert run.verdicts == []


@pytest.mark.parametrize("seed", range(6))
def test_a_host_1_4x_slower_in_lockstep_is_named_within_50_steps(seed: int) -> None:
    run = simulate(8, 400, settings=SETTINGS, slow={5: (100, 1.4)}, seed=seed)
    stragglers = [(t, top, v) for t, top, v in run.verdicts if v.kind == "straggler"]
    assert [v.tasks for _, _, v in stragglers] == [(5,)], run.verdicts
    _, top, verdict = stragglers[0]
    assert top < 150, f"named at step {top}, slowed from step 100"
    assert verdict.message.startswith("task 5 (10.0.0.6) is a straggler: reaches each step")
    assert "after the median host" in verdict.message


@pytest.mark.parametrize("seed", range(6))
def test_a_host_1_4x_slower_on_its_own_is_named_by_its_step_time(seed: int) -> None:
    run = simulate(8, 400, settings=SETTINGS, slow={2: (100, 1.4)}, lockstep=False, seed=seed)
    stragglers = [(t, top, v) for t, top, v in run.verdicts if v.kind == "straggler"]
    assert [v.tasks for _, _, v in stragglers] == [(2,)], run.verdicts
    assert "x the median step time over the last 50 steps" in stragglers[0][2].message
    figure = float(stragglers[0][2].message.split(": ")[1].split("x")[0])
    assert 1.25 <= figure <= 1.5  # the window's median crosses 1.25 once half of its 50 steps are slow


def test_a_straggler_that_recovers_is_said_to_keep_pace_again() -> None:
    run = simulate(8, 600, settings=SETTINGS, slow={3: (100, 1.5)}, lockstep=False)
    assert run.kinds() == ["straggler"]
    run = simulate(8, 600, settings=SETTINGS, slow={3: (100, 1.5)}, lockstep=False, seed=1)
    assert run.first("straggler")[2].tasks == (3,)


def test_a_frozen_host_is_named_behind_early_then_the_hang_at_the_timeout() -> None:
    settings = WatchdogSettings(hang_timeout=30.0, report_every=1.0)
    run = simulate(8, 1000, settings=settings, frozen={6: 299}, until=300 * 0.21 + 60)
    assert run.kinds() == ["behind", "hang"], run.verdicts
    behind_at, _, behind = run.first("behind")
    hang_at, _, hang = run.first("hang")
    assert behind.tasks == (6,) and behind.step == 300
    assert behind.message.startswith("task 6 (10.0.0.7) at step 299 (no step for ")
    assert behind.message.endswith("is behind: 7 hosts reached 300")
    assert hang.message.startswith("cluster hung at step 300 for 30 s: task 6 (10.0.0.7) at 299; 7 hosts at 300")
    assert hang.tasks == (6,)
    assert behind_at < hang_at
    last_step_at = max(run.watchdog._hosts[t].reached_at for t in range(8))  # type: ignore[union-attr]
    assert settings.hang_timeout <= hang_at - last_step_at <= settings.hang_timeout + 2 * TICK_S


def test_a_hang_is_declared_once_and_a_step_afterwards_clears_it() -> None:
    settings = WatchdogSettings(hang_timeout=10.0, report_every=1.0)
    watchdog = Watchdog(settings, 2, describe)
    for task in (0, 1):
        watchdog.report(task, PaceReport(step=5, step_age=0.0, step_time=0.2, window=5, stalled=False), 0.0)
    for task in (0, 1):
        watchdog.report(task, PaceReport(step=5, step_age=5.0, step_time=0.2, window=5, stalled=True), 5.0)
    assert [v.kind for v in watchdog.tick(9.9)] == []
    hang = watchdog.tick(10.0)
    assert [v.kind for v in hang] == ["hang"]
    assert hang[0].message == "cluster hung at step 5 for 10 s: 2 hosts at 5"
    assert watchdog.tick(20.0) == [] and watchdog.hang is not None
    watchdog.report(1, PaceReport(step=6, step_age=0.0, step_time=0.2, window=5, stalled=False), 21.0)
    assert watchdog.hang is None


def test_a_job_that_never_reports_is_never_judged() -> None:
    run = simulate(4, 300, settings=SETTINGS, silent=frozenset(range(4)), until=200.0)
    assert run.verdicts == [] and sum(run.reports.values()) == 0


def test_a_host_whose_job_never_reports_is_not_counted_among_the_stuck() -> None:
    run = simulate(4, 300, settings=WatchdogSettings(hang_timeout=20.0, report_every=1.0), silent=frozenset({3}))
    assert run.verdicts == []


def test_reports_are_a_few_per_interval_whatever_the_step_rate() -> None:
    """O(1) per host per interval: 1,000 steps a second for 60 s send about 60 reports, not 60,000."""
    run = simulate(4, 60_000, settings=SETTINGS, base=0.001, jitter=0.05, until=62.0)
    for task, sent in run.reports.items():
        assert 55 <= sent <= 65, (task, sent)


def test_in_a_big_cluster_each_host_reports_less_often() -> None:
    settings = WatchdogSettings(report_every=1.0)
    assert settings.report_interval(4) == 1.0
    assert settings.report_interval(10_000) == 100.0  # the coordinator takes 100 summaries a second in all
    pace = StepPace(settings, 10_000)
    sent = 0
    for i in range(10_000):  # 1,000 s at 10 steps a second
        pace.record("P", i, 1, i / 10)
        sent += pace.due(i / 10) is not None
    assert 9 <= sent <= 11


def test_a_verdict_names_a_bounded_sample_at_10000_hosts() -> None:
    settings = WatchdogSettings(hang_timeout=10.0, report_every=1.0)
    watchdog = Watchdog(settings, 10_000, describe)
    for task in range(10_000):
        step = 1_000 - (task % 7 == 0) - (task % 11 == 0)
        watchdog.report(task, PaceReport(step=step, step_age=5.0, step_time=0.5, window=50, stalled=True), 5.0)
    verdicts = watchdog.tick(20.0)
    assert [v.kind for v in verdicts] == ["behind", "hang"]
    for verdict in verdicts:
        assert len(verdict.message) < 600, verdict.message
        assert len(verdict.tasks) <= 5
    assert "more" in verdicts[1].message and "at 1,000" in verdicts[1].message


def test_a_host_last_at_every_barrier_by_a_margin_is_a_straggler_and_random_order_is_not() -> None:
    settings = WatchdogSettings(report_every=1.0)
    watchdog = Watchdog(settings, 4, describe)
    rng = random.Random(3)
    verdicts: list[Verdict] = []
    for i in range(500):  # random last arrival, small gaps: healthy
        watchdog.barrier_passed(rng.randrange(4), rng.uniform(0.0, 0.02), i * 1.0)
        verdicts += watchdog.tick(i * 1.0)
    assert verdicts == []
    for i in range(500, 520):  # task 2 last every time, 0.4 s after the one before it
        watchdog.barrier_passed(2, 0.4, i * 1.0)
        verdicts += watchdog.tick(i * 1.0)
    assert [(v.kind, v.tasks) for v in verdicts] == [("straggler", (2,))]
    assert verdicts[0].message == "task 2 (10.0.0.3) is a straggler: last at 8 of the last 10 barriers"


def test_step_pace_takes_the_slowest_process_and_refuses_steps_going_backwards() -> None:
    pace = StepPace(WatchdogSettings(), 1)
    assert not pace.armed and pace.due(0.0) is None
    assert pace.record("P", 10, 1, 0.0) is None
    assert pace.record("P", 8, 2, 0.1) is None  # a second process, further behind: the host waits for it
    assert pace.step == 10
    assert pace.record("P", 9, 1, 0.2) == "process 1 reported step 9 after step 10"
    assert pace.record("P", 12, 2, 0.6) is None
    assert pace.step == 10  # process 1 is still at 10
    assert pace.record("P", 11, 1, 1.0) is None
    assert pace.step == 11
    assert pace.record("C", 5, 1, 1.2) is None and pace.record("C", 4, 1, 1.3) is not None
    report = pace.report(1.5)
    assert (report.step, report.checkpointed, report.stalled) == (11, 5, False)
    assert report.step_age == pytest.approx(0.5)
    assert report.step_time == pytest.approx(1.0)  # 10 -> 11 in 1.0 s


def test_the_view_for_status_has_the_step_range_the_slowest_hosts_and_the_standing_verdicts() -> None:
    settings = WatchdogSettings(hang_timeout=10.0, report_every=1.0)
    watchdog = Watchdog(settings, 10_000, describe)
    assert watchdog.view(0.0) is None
    for task in range(10_000):
        step = 500 if task != 42 else 480
        watchdog.report(task, PaceReport(step=step, step_age=1.0, step_time=0.5, window=50, stalled=True), 2.0)
    watchdog.tick(30.0)
    view = watchdog.view(30.0)
    assert view is not None
    assert (view.armed, view.low, view.median, view.high, view.stalled) == (10_000, 480, 500, 500, 10_000)
    assert view.slowest[0].task == 42 and view.slowest[0].step_age == pytest.approx(29.0)
    assert len(view.slowest) == 5 and [v.kind for v in view.verdicts] == ["hang"]
    document = view.to_dict()
    assert document["steps"] == {"low": 480, "median": 500, "high": 500}
    assert len(str(document)) < 2000  # O(1) whatever the cluster's size


def test_a_host_whose_job_ended_is_no_longer_judged_and_a_late_read_report_does_not_delay_a_hang() -> None:
    settings = WatchdogSettings(hang_timeout=10.0, report_every=1.0)
    watchdog = Watchdog(settings, 3, describe)
    for task in range(3):
        watchdog.report(task, PaceReport(step=500, step_age=6.0, step_time=0.1, window=50, stalled=True), 6.0)
    watchdog.report(2, PaceReport(step=500, step_age=0.0, step_time=0.0, window=0, stalled=False, ended=True), 7.0)
    assert watchdog.view(7.0).armed == 2  # type: ignore[union-attr]
    for task in range(2):  # the two others ended too: a finished job is not a hang
        watchdog.report(task, PaceReport(step=500, step_age=0.0, step_time=0.0, window=0, stalled=False, ended=True), 7.0)
    assert watchdog.tick(60.0) == [] and watchdog.view(60.0) is None
    # A stalled report read 2.5 s late (queued behind a pod's worth of others) still dates its step right.
    watchdog.report(0, PaceReport(step=7, step_age=5.0, step_time=0.1, window=50, stalled=True), 7.5, transit=2.5)
    assert [v.kind for v in watchdog.tick(10.0)] == ["hang"]  # the step was reached at 0.0, not 2.5
