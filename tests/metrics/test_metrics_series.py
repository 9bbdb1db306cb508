"""The series the coordinator and an agent expose: bounded in number at any cluster size, named as
Prometheus names them, with the values the state holds. In-process (a real servicer and state, no gRPC
server): 10,000-host clusters are cheap here. Series are counted, never timed (bench/metrics.py times them).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from tpuctl.agent.protocol import ErrorReport
from tpuctl.coordination.figures import BARRIER_WAIT_BOUNDS, TOP_K, Histogram, host_figures
from tpuctl.coordination.service import CoordinationServicer
from tpuctl.coordination.state import CoordinationState
from tpuctl.coordination.tasks import TaskRecord
from tpuctl.coordination.values import (
    PROTOCOL_VERSION,
    Refused,
    Registration,
    RestartPolicy,
    ServiceConfig,
    TaskInfo,
    TaskRef,
    TaskSpec,
    TaskState,
)
from tpuctl.metrics.agent import AGENT_STATES, AgentCollector, agent_state
from tpuctl.metrics.coordinator import CoordinatorCollector
from tpuctl.metrics.endpoint import registry_of, render
from tpuctl.watchdog.pace import PaceReport, StepPace
from tpuctl.watchdog.settings import WatchdogSettings


def make_config(hosts: int, **overrides: Any) -> ServiceConfig:
    tasks = tuple(TaskSpec(f"10.0.{i // 256}.{i % 256}") for i in range(hosts))
    waits: dict[str, Any] = {"heartbeat_timeout": 1.0, "register_timeout": 5.0, "barrier_timeout": 5.0}
    return ServiceConfig(cluster="test", tasks=tasks, **{**waits, **overrides})


SERIES_BUDGET = 150
"""The coordinator's series at any cluster size (docs/reference/metrics.md; bench/metrics.py: "a few hundred")."""
NAME = re.compile(r"^tpuctl_[a-z_]+$")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def busy_service(hosts: int, clock: Clock) -> CoordinationServicer:
    """A cluster of ``hosts`` with every figure non-trivial: registered hosts with varied heartbeat ages, a
    failed one, a passed and a timed-out barrier, a gather, every host's job reporting progress."""
    config = make_config(hosts, restart=RestartPolicy(rejoin=True, timeout=60.0, max_restarts=3), barrier_timeout=30.0)
    state = CoordinationState(config, service_incarnation=77)
    service = CoordinationServicer(state, clock=clock, check_interval=0.25)
    refs: list[TaskRef] = []
    for i in range(hosts):
        registration = Registration(PROTOCOL_VERSION, "test", i, 1000 + i, f"h{i}", f"ipv4:127.0.0.1:{i}", retry_secret=b"r" * 16)
        refs.append(state.register(registration, now=clock.now + i * 1e-4).task)  # heard from at different times
    for i, ref in enumerate(refs):
        state.barrier_arrive(ref, "step", 0, now=clock.now + 0.5 + i * 1e-5)  # the last arrives hosts x 10 us late
    for ref in refs:
        state.gather_arrive(ref, "values", b"x", 0, now=clock.now + 0.6)
    never = state.barrier_arrive(refs[0], "never", 1.0, now=clock.now + 1)
    with pytest.raises(Refused):
        state.barrier_outcome(never, now=clock.now + 3)
    for i in range(hosts):
        report = PaceReport(step=1000 - (i % 7), step_age=0.5, step_time=1.0, window=10, stalled=False)
        service.watch.report(i, report, generation=state.generation, now=clock.now + 4, wall=0.0)
    clock.now += 5
    return service


def exposition(service: CoordinationServicer, clock: Clock, accept: str = "") -> str:
    return render(registry_of(CoordinatorCollector(lambda: service, clock=clock)), accept)[0].decode()


def series(text: str, prefix: str = "tpuctl_") -> dict[str, float]:
    """Every sample of ``text`` named ``prefix...``, by its line's name and labels."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(prefix):
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                found[f"{sample.name}{{{labels}}}"] = sample.value
    return found


def test_the_coordinators_series_do_not_grow_with_the_cluster() -> None:
    """The guard: a 10,000-host cluster exposes exactly as many series as a 40-host one (aggregates, and
    rankings of TOP_K), under the budget; never a series per host."""
    small, big = (series(exposition(busy_service(n, clock := Clock()), clock)) for n in (40, 10_000))
    assert len(big) == len(small) <= SERIES_BUDGET, (len(small), len(big))
    assert set(big) == set(small)
    assert not any("task=" in key for key in big), "a task label grows with the cluster: use rank"
    assert big["tpuctl_cluster_hosts{state=connected}"] == 10_000
    assert max(int(key.split("rank=")[1].rstrip("}")) for key in big if "rank=" in key) == TOP_K


def test_series_names_follow_prometheus_conventions() -> None:
    """``tpuctl_<name>_<unit>``, base units, counters ``_total``; every family documented (OpenMetrics keeps
    each family's own name and unit, so the check reads that format)."""
    clock = Clock()
    service = busy_service(12, clock)
    agent = AgentCollector(cluster="c", task=3, address="10.0.0.4", report=lambda: ErrorReport(generation=2, formed=True),
                           pace=lambda: armed_pace(5))  # fmt: skip
    registry = registry_of(CoordinatorCollector(lambda: service, clock=clock), agent)
    text = render(registry, "application/openmetrics-text;version=1.0.0")[0].decode()
    families = [f for f in openmetrics_families(text) if f.name.startswith("tpuctl_")]
    assert len(families) > 25
    for family in families:
        assert NAME.match(family.name), family.name
        assert family.documentation, family.name
        if family.type == "counter":
            assert all(s.name == family.name + "_total" for s in family.samples), family.name
        for unit in ("seconds", "bytes"):
            if unit in family.name.split("_"):
                assert family.name.endswith(f"_{unit}") and family.unit == unit, family.name
        assert not set(family.name.split("_")) & {"ms", "milliseconds", "minutes", "kb", "mb"}, family.name


def test_the_coordinators_figures_are_the_states() -> None:
    clock = Clock()
    service = busy_service(40, clock)
    got = series(exposition(service, clock))
    status = service.state.status(now=clock.now)
    assert got["tpuctl_cluster_generation{}"] == status.generation == 1
    assert got["tpuctl_cluster_forming{}"] == 0 and got["tpuctl_cluster_failed{}"] == 0
    assert got["tpuctl_cluster_restarts_total{}"] == 0
    assert got["tpuctl_cluster_hosts{state=connected}"] == 40 and got["tpuctl_cluster_hosts{state=waiting}"] == 0
    # heartbeat ages: every host heard from at registration (no session), task 0 first
    ages = sorted(((t.seconds_since_heartbeat or 0.0), -t.task.task_id) for t in status.tasks)[::-1][:TOP_K]
    for rank, (age, task) in enumerate(ages, 1):
        assert got[f"tpuctl_slowest_heartbeat_task{{rank={rank}}}"] == -task
        assert got[f"tpuctl_slowest_heartbeat_age_seconds{{rank={rank}}}"] == pytest.approx(age)
    assert got["tpuctl_slowest_heartbeat_task{rank=1}"] == 0
    assert got["tpuctl_heartbeat_age_seconds_gcount{}"] == 40
    assert got["tpuctl_heartbeat_age_seconds_bucket{le=2.0}"] == 0 and got["tpuctl_heartbeat_age_seconds_bucket{le=5.0}"] == 40
    # barriers: "step" passed 39 x 10 us after its first arrival; "never" timed out; a gather passed
    assert got["tpuctl_barrier_wait_seconds_count{kind=barrier}"] == 1
    assert got["tpuctl_barrier_wait_seconds_sum{kind=barrier}"] == pytest.approx(39 * 1e-5, abs=1e-9)
    assert got["tpuctl_barrier_wait_seconds_bucket{kind=barrier,le=0.001}"] == 1
    assert got["tpuctl_barrier_failures_total{kind=barrier}"] == 1
    assert got["tpuctl_barrier_wait_seconds_count{kind=gather}"] == 1
    assert got["tpuctl_barrier_failures_total{kind=gather}"] == 0
    # the watchdog: every host reported, steps 994..1000; the furthest behind are at 994
    view = service.watch.view(clock.now, 1)
    assert view is not None
    assert got["tpuctl_watchdog_hosts_reporting{}"] == view.armed == 40
    assert (got["tpuctl_watchdog_step{quantile=0}"], got["tpuctl_watchdog_step{quantile=1}"]) == (view.low, view.high) == (994, 1000)
    assert got["tpuctl_watchdog_step{quantile=0.5}"] == view.median
    for rank, host in enumerate(view.slowest, 1):
        assert got[f"tpuctl_furthest_behind_task{{rank={rank}}}"] == host.task
        assert got[f"tpuctl_furthest_behind_step{{rank={rank}}}"] == host.step == 994
    assert got["tpuctl_watchdog_reports_total{}"] == 40


def test_a_restart_and_a_failure_show() -> None:
    clock = Clock()
    service = busy_service(6, clock)
    state = service.state
    state.report_error(_ref(state, 2), "boom", now=clock.now)
    got = series(exposition(service, clock))
    assert got["tpuctl_cluster_generation{}"] == 2 and got["tpuctl_cluster_restarts_total{}"] == 1
    assert got["tpuctl_cluster_forming{}"] == 1
    assert got["tpuctl_cluster_hosts{state=waiting}"] == 6  # everyone registers again
    assert "tpuctl_watchdog_step{quantile=0}" not in got  # a new generation's job has not reported yet


def _ref(state: CoordinationState, task: int) -> TaskRef:
    record = state._table.records[task]
    return TaskRef(task, record.incarnation, record.credential)


def test_host_figures_rank_the_oldest_first_ties_by_task() -> None:
    state = CoordinationState(make_config(8), service_incarnation=1)
    for i, at in enumerate([5.0, 1.0, 1.0, 7.0, 3.0, 1.0, 2.0, 6.0]):
        registration = Registration(PROTOCOL_VERSION, "test", i, 10 + i, "h", "p", retry_secret=b"r" * 16)
        state.register(registration, now=at)
    figures = host_figures(state._table.records, now=10.0, top=4)
    assert figures.slowest == ((1, 9.0), (2, 9.0), (5, 9.0), (6, 8.0))
    assert figures.by_state == {"waiting": 0, "connected": 8, "failed": 0, "disconnected": 0}
    assert figures.heartbeat_ages.count == 8 and figures.heartbeat_ages.sum == pytest.approx(80 - 26)


@settings(max_examples=200, deadline=None)
@given(
    hosts=st.lists(
        st.tuples(st.sampled_from(list(TaskState)), st.booleans(), st.floats(min_value=0, max_value=400)), max_size=30
    ),
    top=st.integers(min_value=1, max_value=6),
)
def test_host_figures_agree_with_sorting_every_host(hosts: list[tuple[TaskState, bool, float]], top: int) -> None:
    """The one pass (which skips hosts with a session once ``top`` are ranked) against the obvious way."""
    records = [
        TaskRecord(TaskInfo(i, f"h{i}"), state=state, last_heartbeat=100.0 - age, sessions={1} if session else set())
        for i, (state, session, age) in enumerate(hosts)
    ]
    figures = host_figures(records, now=100.0, top=top)
    ages = {r.info.task_id: (0.0 if r.sessions else 100.0 - r.last_heartbeat) for r in records if r.state is TaskState.CONNECTED}
    assert figures.slowest == tuple(sorted(ages.items(), key=lambda item: (-item[1], item[0]))[:top])
    assert figures.by_state == {s.value: sum(1 for r in records if r.state is s) for s in TaskState}
    assert figures.heartbeat_ages.count == len(ages) and figures.heartbeat_ages.sum == pytest.approx(sum(ages.values()))
    assert dict(figures.heartbeat_ages.cumulative())[0.5] == sum(1 for a in ages.values() if a <= 0.5)


def test_histogram_buckets_are_upper_bounds() -> None:
    histogram = Histogram(BARRIER_WAIT_BOUNDS)
    for value in (0.001, 0.0011, 5.0, 1e6):
        histogram.observe(value)
    cumulative = dict(histogram.cumulative())
    assert cumulative[0.001] == 1 and cumulative[0.01] == 2 and cumulative[5.0] == 3 and cumulative[float("inf")] == 4


def armed_pace(step: int) -> StepPace:
    pace = StepPace(WatchdogSettings(), 4)
    pace.record("P", step - 1, 42, now=1.0)
    pace.record("P", step, 42, now=2.0)
    pace.record("C", step - 1, 42, now=2.0)
    return pace


@pytest.mark.parametrize(
    ("report", "state"),
    [
        (ErrorReport(), "starting"),
        (ErrorReport(generation=1, formed=True), "up"),
        (ErrorReport(generation=1, rejoining=True, ended="task 3 failed"), "reforming"),
        (ErrorReport(generation=1, error="task 3 failed"), "failed"),
        (ErrorReport(generation=1, formed=True, stopping=True), "stopping"),
    ],
)
def test_the_agent_says_its_state_and_its_jobs_steps(report: ErrorReport, state: str) -> None:
    assert agent_state(report) == state
    pace: list[StepPace | None] = [None]
    agent = AgentCollector(cluster="pod-a", task=3, address="10.0.0.4", report=lambda: report, pace=lambda: pace[0], clock=lambda: 5.0)
    got = series(render(registry_of(agent), "")[0].decode())
    assert got["tpuctl_agent_info{address=10.0.0.4,cluster=pod-a,task=3,version=0.1.0}"] == 1
    assert {name for name in AGENT_STATES if got[f"tpuctl_agent_state{{state={name}}}"] == 1} == {state}
    assert got["tpuctl_agent_generation{}"] == report.generation
    assert not any(key.startswith("tpuctl_job_") for key in got)  # no job reported: absent, not 0
    pace[0] = armed_pace(12)
    got = series(render(registry_of(agent), "")[0].decode())
    assert got["tpuctl_job_step{}"] == 12 and got["tpuctl_job_checkpoint_step{}"] == 11
    assert got["tpuctl_job_step_age_seconds{}"] == 3.0 and got["tpuctl_job_step_time_seconds{}"] == 1.0
    assert got["tpuctl_job_stalled{}"] == 0


def test_openmetrics_when_asked() -> None:
    clock = Clock()
    service = busy_service(3, clock)
    body, content_type = render(registry_of(CoordinatorCollector(lambda: service, clock=clock)), "application/openmetrics-text;version=1.0.0,text/plain;q=0.5")
    assert content_type.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
    assert b"# TYPE tpuctl_heartbeat_age_seconds gaugehistogram" in body
    assert b"# UNIT tpuctl_barrier_wait_seconds seconds" in body
    body, content_type = render(registry_of(CoordinatorCollector(lambda: None)), "")
    assert content_type.startswith("text/plain") and b"tpuctl_" not in body  # before task 0's service starts
