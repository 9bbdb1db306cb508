"""The coordination service's figures for metrics: aggregates whose size does not grow with the cluster.

Pure: no grpc, asyncio or clock (``now`` is handed in). The metrics endpoint (:mod:`tpuctl.metrics`) turns
these into Prometheus series; nothing here knows about Prometheus.

* :class:`Histogram`: counts by fixed upper bounds, a sum and a count (observations, or a snapshot of
  every host's value: a gauge histogram);
* :class:`BarrierWaits`: every barrier and gather instance that passed, how long from its first arrival
  to its last (how long the earliest host waited), and how many failed (timed out, or could not pass);
* :func:`host_figures`: hosts by state, their heartbeat ages as a histogram, and the ``TOP_K`` slowest.

Cost: ``observe`` is O(log buckets); ``host_figures`` is one pass over the tasks, O(tasks + log K) per
task, asked once per scrape (a few milliseconds at 10,000 hosts).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tpuctl.coordination.tasks import TaskRecord
from tpuctl.coordination.values import TaskState

TOP_K = 5
"""Hosts a bounded ranking lists (slowest heartbeats, furthest behind): ranks 1..TOP_K, whatever the
cluster's size."""
HEARTBEAT_AGE_BOUNDS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
"""Seconds. A host with an open session is heard from continuously (age 0); the spec's heartbeat timeout
is 30 s by default, and a host silent longer than its timeout is declared failed."""
BARRIER_WAIT_BOUNDS = (0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0)
"""Seconds from a barrier's first arrival to its last: a step's barrier takes milliseconds, init's
waits for every host to start (minutes at most: the barrier timeout, 10 min by default)."""
RENDEZVOUS_KINDS = ("barrier", "gather")


class Histogram:
    """Observations counted by upper bound (``bounds`` ascending; one more bucket above them all)."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.count += times
        self.sum += value * times

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations at or below it)`` for each bound, then ``(inf, count)``."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


@dataclass
class BarrierWaits:
    """Every passed barrier and gather instance's wait (first arrival to last) and the failed ones, by kind;
    for the service's lifetime (all generations). Fed by :class:`~tpuctl.coordination.rendezvous.Rendezvous`."""

    waits: dict[str, Histogram] = field(default_factory=lambda: {k: Histogram(BARRIER_WAIT_BOUNDS) for k in RENDEZVOUS_KINDS})
    failed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RENDEZVOUS_KINDS, 0))

    def passed(self, kind: str, seconds: float) -> None:
        self.waits[kind].observe(max(0.0, seconds))

    def decided_failed(self, kind: str) -> None:
        self.failed[kind] += 1


@dataclass(frozen=True)
class HostFigures:
    """The hosts as metrics show them: counts and a distribution, and a bounded ranking."""

    by_state: dict[str, int]
    """Every state (``waiting``, ``connected``, ``failed``, ``disconnected``), each with its count (0 too)."""
    heartbeat_ages: Histogram
    """The connected hosts' heartbeat ages now (a snapshot: a gauge histogram)."""
    slowest: tuple[tuple[int, float], ...]
    """``(task, heartbeat age)`` of the ``TOP_K`` connected hosts heard from longest ago, oldest first
    (ties: the lower task first)."""


def host_figures(records: Iterable[TaskRecord], now: float, top: int = TOP_K) -> HostFigures:
    """One pass over the tasks, ``records`` in task order: O(tasks log ``top``). A host with an open session
    (the common case) is age 0 and, coming after the hosts already ranked, ranks below them on a tie: once
    ``top`` are ranked it is only counted."""
    others: list[TaskState] = []  # the states of the hosts not connected (few, while a cluster stands)
    ages = Histogram(HEARTBEAT_AGE_BOUNDS)
    ranked: list[tuple[float, int]] = []  # a min-heap of (age, -task): the ``top`` oldest so far
    connected, vouched, total = TaskState.CONNECTED, 0, 0
    for record in records:
        total += 1
        if record.state is not connected:  # identity, not a dict of enum keys: Enum.__hash__ is Python code
            others.append(record.state)
            continue
        if record.sessions:  # heard from continuously: age 0, below any ranked one once ``top`` are
            vouched += 1
            if len(ranked) >= top:
                continue
            age = 0.0
        else:
            age = now - record.last_heartbeat
            ages.observe(age)
        entry = (age, -record.info.task_id)
        if len(ranked) < top:
            heapq.heappush(ranked, entry)
        elif entry > ranked[0]:
            heapq.heapreplace(ranked, entry)
    ages.observe(0.0, vouched)
    slowest = tuple((-task, age) for age, task in sorted(ranked, reverse=True))
    by_state = dict.fromkeys((state.value for state in TaskState), 0)
    for state in others:
        by_state[state.value] += 1
    by_state[connected.value] = total - len(others)
    return HostFigures(by_state, ages, slowest)


__all__ = [
    "BARRIER_WAIT_BOUNDS",
    "HEARTBEAT_AGE_BOUNDS",
    "TOP_K",
    "BarrierWaits",
    "Histogram",
    "HostFigures",
    "host_figures",
]
