"""The coordination service's series: the cluster as task 0 sees it, in a number of series that does not
grow with the cluster.

Every series is an aggregate (hosts by state, the heartbeat ages as a gauge histogram, the watchdog's step
range, counters) or a bounded ranking: the ``TOP_K`` slowest heartbeats and the hosts furthest behind, each
by ``rank`` (1..K) with the task as the *value* of a series of its own (``tpuctl_slowest_heartbeat_task``),
never as a label. A task label would create a new series each time another host entered the ranking, and
over a job's life one per host; a rank label keeps K series, and the task they hold is read beside them.

Each group of series is one *source*: a function ``(service, now) -> families`` in :data:`SOURCES`. A new
figure of the service (the goodput ledger's) is a source added there; the collector asks every source on
every scrape, on the service's event loop (no lock: nothing else runs meanwhile).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from tpuctl.coordination.figures import RENDEZVOUS_KINDS, TOP_K, Histogram
from tpuctl.coordination.watch import VERDICT_KINDS

if TYPE_CHECKING:
    from tpuctl.coordination.service import CoordinationServicer

Source = Callable[["CoordinationServicer", float], Iterable[Metric]]
"""A group of series: the servicer and ``now`` (its clock) -> metric families."""


def buckets(histogram: Histogram) -> list[tuple[str, float]]:
    """Cumulative ``(le, count)`` pairs as the exposition writes them, ``+Inf`` last."""
    return [("+Inf" if math.isinf(bound) else repr(float(bound)), float(n)) for bound, n in histogram.cumulative()]


def cluster(service: CoordinationServicer, now: float) -> Iterator[Metric]:
    state = service.state
    info = InfoMetricFamily("tpuctl_coordinator", "The coordination service: its cluster and incarnation.")
    info.add_metric([], {"cluster": state.config.cluster, "incarnation": str(state.service_incarnation)})
    yield info
    yield GaugeMetricFamily("tpuctl_cluster_generation", "The cluster's current generation (1, then one more per restart).", state.generation)
    forming = state.failure is None and not state.registration_complete
    yield GaugeMetricFamily("tpuctl_cluster_forming", "1 while the current generation waits for hosts to register.", float(forming))
    yield GaugeMetricFamily("tpuctl_cluster_failed", "1 once the cluster is in error for good (no restart follows).", float(state.failure is not None))
    yield CounterMetricFamily("tpuctl_cluster_restarts", "Generations that ended and re-formed (restart.policy rejoin).", state.generations.restarts)


def hosts(service: CoordinationServicer, now: float) -> Iterator[Metric]:
    figures = service.state.host_figures(now=now)
    by_state = GaugeMetricFamily("tpuctl_cluster_hosts", "Hosts by state, as `tpuctl status` shows them.", labels=["state"])
    for name, count in figures.by_state.items():
        by_state.add_metric([name], count)
    yield by_state
    ages = GaugeHistogramMetricFamily(
        "tpuctl_heartbeat_age_seconds", "Connected hosts by seconds since last heard from (0 while a session is open).", unit="seconds"
    )
    ages.add_metric([], buckets(figures.heartbeat_ages), figures.heartbeat_ages.sum)
    yield ages
    age = GaugeMetricFamily(
        "tpuctl_slowest_heartbeat_age_seconds", f"Heartbeat age of the connected host at each rank 1..{TOP_K} (oldest first).",
        labels=["rank"], unit="seconds",
    )  # fmt: skip
    task = GaugeMetricFamily("tpuctl_slowest_heartbeat_task", "The task id at each rank of tpuctl_slowest_heartbeat_age_seconds.", labels=["rank"])
    for rank, (task_id, seconds) in enumerate(figures.slowest, 1):
        age.add_metric([str(rank)], seconds)
        task.add_metric([str(rank)], task_id)
    yield age
    yield task


def barriers(service: CoordinationServicer, now: float) -> Iterator[Metric]:
    waits = service.state.barrier_waits
    passed = HistogramMetricFamily(
        "tpuctl_barrier_wait_seconds", "The job's passed barriers and gathers: seconds from the first host's arrival to the last's.",
        labels=["kind"], unit="seconds",
    )  # fmt: skip
    failed = CounterMetricFamily("tpuctl_barrier_failures", "The job's barriers and gathers that timed out or could not pass.", labels=["kind"])
    for kind in RENDEZVOUS_KINDS:
        passed.add_metric([kind], buckets(waits.waits[kind]), waits.waits[kind].sum)
        failed.add_metric([kind], waits.failed[kind])
    yield passed
    yield failed


def watchdog(service: CoordinationServicer, now: float) -> Iterator[Metric]:
    watch = service.watch
    verdicts = CounterMetricFamily("tpuctl_watchdog_verdicts", "The watchdog's findings, by kind (all generations).", labels=["kind"])
    for kind in VERDICT_KINDS:
        verdicts.add_metric([kind], watch.verdicts.get(kind, 0))
    yield verdicts
    yield CounterMetricFamily("tpuctl_watchdog_reports", "Pace reports the hosts' agents sent (about one per host per report interval).", watch.reports)
    view = watch.view(now, service.state.generation)
    yield GaugeMetricFamily("tpuctl_watchdog_hosts_reporting", "Hosts whose job reported progress this generation.", view.armed if view else 0)
    if view is None:
        return
    yield GaugeMetricFamily("tpuctl_watchdog_hosts_stalled", "Reporting hosts whose job made no step for its stall time.", view.stalled)
    yield GaugeMetricFamily("tpuctl_watchdog_hung", "1 while a hang is declared.", float(any(v.kind == "hang" for v in view.verdicts)))
    steps = GaugeMetricFamily("tpuctl_watchdog_step", "The reporting hosts' steps: lowest (0), median (0.5), highest (1).", labels=["quantile"])
    for quantile, value in (("0", view.low), ("0.5", view.median), ("1", view.high)):
        steps.add_metric([quantile], value)
    yield steps
    step = GaugeMetricFamily("tpuctl_furthest_behind_step", f"The step of the host at each rank 1..{TOP_K} furthest behind.", labels=["rank"])
    task = GaugeMetricFamily("tpuctl_furthest_behind_task", "The task id at each rank of tpuctl_furthest_behind_step.", labels=["rank"])
    age = GaugeMetricFamily(
        "tpuctl_furthest_behind_step_age_seconds", "Seconds since the host at each rank reached its step.", labels=["rank"], unit="seconds"
    )
    for rank, host in enumerate(view.slowest[:TOP_K], 1):
        step.add_metric([str(rank)], host.step)
        task.add_metric([str(rank)], host.task)
        age.add_metric([str(rank)], host.step_age)
    yield step
    yield task
    yield age


def service_work(service: CoordinationServicer, now: float) -> Iterator[Metric]:
    counters = service.counters
    yield CounterMetricFamily("tpuctl_coordinator_calls", "Calls and session-stream messages the service handled.", counters.calls)
    yield CounterMetricFamily("tpuctl_coordinator_sent_bytes", "Bytes of answers the service sent.", counters.sent_bytes, unit="bytes")


SOURCES: tuple[Source, ...] = (cluster, hosts, barriers, watchdog, service_work)
"""Every group of the service's series, in the order they are exposed."""


class CoordinatorCollector(Collector):
    """The service's series for a ``prometheus_client`` registry. ``service``: returns the servicer, or None
    while there is none (task 0's agent before its service starts: no series)."""

    def __init__(
        self,
        service: Callable[[], CoordinationServicer | None],
        *,
        clock: Callable[[], float] = time.monotonic,
        sources: tuple[Source, ...] = SOURCES,
    ) -> None:
        self._service = service
        self._clock = clock
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        service = self._service()
        if service is None:
            return
        now = self._clock()
        for source in self.sources:
            yield from source(service, now)


__all__ = ["SOURCES", "CoordinatorCollector", "Source", "buckets"]
