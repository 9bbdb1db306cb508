"""One host's series, on its agent's endpoint: the agent (its generation and state) and its job's steps.

Labels: only ``tpuctl_agent_info`` carries the cluster, the task and the address (an info series, one per
agent); every other series is the host's alone, told apart from the other hosts' by the target labels
Prometheus adds (``instance``), and joined to the task with ``* on(instance) group_left(task)
tpuctl_agent_info``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from tpuctl import __version__

if TYPE_CHECKING:
    from tpuctl.agent.options import AgentOptions
    from tpuctl.agent.progress import JobProgress
    from tpuctl.agent.protocol import ErrorReport
    from tpuctl.coordination.service import CoordinationServicer
    from tpuctl.metrics.endpoint import MetricsEndpoint
    from tpuctl.watchdog.pace import StepPace

AGENT_STATES = ("starting", "up", "reforming", "failed", "stopping")
"""``starting``: forming its first generation; ``up``: its generation formed; ``reforming``: a generation
ended and the next one forms (restart policy rejoin); ``failed``: the cluster is in error for good (or was
shut down); ``stopping``: leaving (``tpuctl down``, a signal)."""


def agent_state(report: ErrorReport) -> str:
    if report.stopping:
        return "stopping"
    if report.error or report.shutdown:
        return "failed"
    if report.rejoining:
        return "reforming"
    return "up" if report.formed else "starting"


class AgentCollector(Collector):
    """``report``: the agent's :class:`~tpuctl.agent.protocol.ErrorReport` now; ``pace``: its job's steps
    (None between generations)."""

    def __init__(
        self,
        *,
        cluster: str,
        task: int,
        address: str,
        report: Callable[[], ErrorReport],
        pace: Callable[[], StepPace | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.labels = {"cluster": cluster, "task": str(task), "address": address, "version": __version__}
        self._report = report
        self._pace = pace
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        info = InfoMetricFamily("tpuctl_agent", "This host's agent: its cluster, task, address and tpuctl version.")
        info.add_metric([], self.labels)
        yield info
        report = self._report()
        yield GaugeMetricFamily("tpuctl_agent_generation", "The generation this host is in (while re-forming: the one that ended).", report.generation)
        current = agent_state(report)
        state = GaugeMetricFamily("tpuctl_agent_state", "1 for the state this host's agent is in, 0 for the others.", labels=["state"])
        for name in AGENT_STATES:
            state.add_metric([name], float(name == current))
        yield state
        formed = [row for row in report.history if row.get("generation") == report.generation and row.get("ended") is None]
        when = formed[-1].get("formed") if formed else None
        if isinstance(when, int | float) and current == "up":
            yield GaugeMetricFamily("tpuctl_agent_formed_timestamp_seconds", "When this host's generation formed (Unix time).", when, unit="seconds")
        yield from self._job()

    def _job(self) -> Iterator[Metric]:
        pace = self._pace()
        if pace is None or not pace.armed:
            return  # no job reports progress: nothing to say (absent, not 0)
        now = self._clock()
        yield GaugeMetricFamily("tpuctl_job_step", "The last step this host's job reported (the lowest of its processes').", pace.step)
        yield GaugeMetricFamily(
            "tpuctl_job_step_age_seconds", "Seconds since this host's job reached its step.", max(0.0, now - pace.reached_at), unit="seconds"
        )
        if pace.step_time is not None:
            yield GaugeMetricFamily("tpuctl_job_step_time_seconds", "Median seconds per step over the last steps.", pace.step_time, unit="seconds")
        if pace.checkpointed >= 0:
            yield GaugeMetricFamily("tpuctl_job_checkpoint_step", "The last step this host's job reported checkpointed.", pace.checkpointed)
        yield GaugeMetricFamily("tpuctl_job_stalled", "1 while this host's job made no step for its stall time.", float(pace.stalled(now)))


class MeasuredAgent(Protocol):
    """What the endpoint reads of a host's agent (:class:`tpuctl.agent.bringup.Agent`)."""

    options: AgentOptions
    progress: JobProgress

    def error_report(self) -> ErrorReport: ...

    @property
    def service(self) -> CoordinationServicer | None:
        """Task 0's coordination service, once started."""


async def serve_agent_metrics(agent: MeasuredAgent) -> MetricsEndpoint:
    """The host's endpoint where the spec's ``metrics:`` says: the agent's series, and on task 0 the
    coordination service's once it runs. StateError when it cannot listen there."""
    from tpuctl.metrics.coordinator import CoordinatorCollector
    from tpuctl.metrics.endpoint import open_endpoint, registry_of

    options = agent.options
    spec = options.spec
    assert spec.metrics is not None
    registry = registry_of(
        AgentCollector(
            cluster=spec.cluster, task=options.task, address=options.address,
            report=agent.error_report, pace=lambda: agent.progress.pace,
        ),
        CoordinatorCollector(lambda: agent.service),
    )  # fmt: skip
    return await open_endpoint(spec.metrics, registry, task=options.task, hosts=spec.hosts, state_dir=options.state.path)


__all__ = ["AGENT_STATES", "AgentCollector", "MeasuredAgent", "agent_state", "serve_agent_metrics"]
