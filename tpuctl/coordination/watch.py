"""The watchdog inside the coordination service: one :class:`~tpuctl.watchdog.judge.Watchdog` per
generation, fed by the sessions' pace reports and the barriers' last arrivals, asked about once a second
for its verdicts.

The servicer pushes each verdict to every session that watches the cluster's error (a few events in a
job's life: each costs one small write per host), logs it, and acts on a hang as the spec's ``on_hang``
says: ``warn`` reports only, ``restart`` ends the generation with the stuck hosts failed (the cluster
re-forms and ``tpuctl run --max-restarts`` restarts the job), ``fail`` fails the cluster for good.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from tpuctl.watchdog.judge import Verdict, Watchdog, WatchdogView
from tpuctl.watchdog.pace import PaceReport
from tpuctl.watchdog.settings import WatchdogSettings

log = logging.getLogger("tpuctl.coordination")

MAX_TRANSIT_S = 10.0
"""The most a report's time on its way (by the two hosts' wall clocks) counts, and at most half the hang
timeout. A pod's burst of stalled reports is read within seconds; a host clock skewed by more than this
can make a hang be declared that much early, never one whose hosts have not all stalled (each agent judges
its own job's stall by its own clock)."""
VERDICT_KINDS = ("hang", "behind", "straggler", "recovered")
TICK_S = 0.5
"""How often the service asks the watchdog (a hang is declared within this of its timeout)."""


@dataclass(frozen=True)
class Hang:
    """A hang to act on (``on_hang`` restart or fail): the hosts to fail and the cause they fail with."""

    tasks: tuple[int, ...]
    cause: str
    final: bool


class ClusterWatch:
    """``report`` and ``barrier_passed`` as they come; ``tick(now, generation)`` returns the verdicts to
    push and the hang to act on, if any. ``describe(task)`` names a host (``task 17 (10.0.0.9)``)."""

    def __init__(self, settings: WatchdogSettings, hosts: int, describe: Callable[[int], str]) -> None:
        self.settings = settings
        self.hosts = hosts
        self.describe = describe
        self.generation = 0
        self.watchdog = Watchdog(settings, hosts, describe)
        self.reports = 0
        """Pace reports taken, all generations (for tests and the bench: O(1) per host per interval)."""
        self.verdicts = dict.fromkeys(VERDICT_KINDS, 0)
        """Verdicts given, by kind, all generations (for metrics)."""

    def _current(self, generation: int) -> Watchdog:
        if generation != self.generation:  # a new generation: the job restarts, its steps with it
            self.generation = generation
            self.watchdog = Watchdog(self.settings, self.hosts, self.describe)
        return self.watchdog

    def report(self, task: int, report: PaceReport, *, generation: int, now: float, wall: float) -> None:
        """``wall``: this service's wall clock, against the report's ``sent_at`` for its time on the way
        (at most ``MAX_TRANSIT_S``: a skewed clock cannot move a host's step by more)."""
        self.reports += 1
        self._current(generation).report(task, report, now, self.transit(report, wall))

    def transit(self, report: PaceReport, wall: float) -> float:
        """How long ``report`` was on its way by the two wall clocks (0.0 unknown), at most ``MAX_TRANSIT_S``
        and half the hang timeout."""
        cap = min(MAX_TRANSIT_S, self.settings.hang_timeout / 2)
        return min(cap, max(0.0, wall - report.sent_at)) if report.sent_at else 0.0

    def barrier_passed(self, last_task: int, lag: float, *, generation: int, now: float) -> None:
        self._current(generation).barrier_passed(last_task, lag, now)

    def tick(self, now: float, generation: int) -> tuple[list[Verdict], Hang | None]:
        verdicts = self._current(generation).tick(now)
        hang = None
        for verdict in verdicts:
            self.verdicts[verdict.kind] = self.verdicts.get(verdict.kind, 0) + 1
            log.log(logging.INFO if verdict.kind == "recovered" else logging.WARNING, "watchdog: %s", verdict.message)
            if verdict.kind == "hang" and self.settings.on_hang != "warn":
                hang = Hang(verdict.tasks, verdict.message, final=self.settings.on_hang == "fail")
        return verdicts, hang

    def view(self, now: float, generation: int) -> WatchdogView | None:
        return self._current(generation).view(now)
