"""Finding the coordinator when it may have moved: probes of the hosts that may serve this cluster.

Under ``restart: {policy: rejoin}`` the coordination service is task 0's until its host is lost; then a
successor (``coordinator.successors``, :mod:`tpuctl.spec.successors`) serves the next generation. Two
questions follow, both answered with a brief ``GetStatus`` (O(1) bytes; a host with nothing listening
refuses the connection at once):

* ``discover``: a host starting ``tpuctl init`` (a returning old coordinator, a replaced host) asks
  ``hosts[0]`` and every successor at once, each for at most ``PROBE_S``, and joins the service of this
  cluster with the highest generation; none: the cluster is fresh (task 0 starts the service).
* ``wait_for_any``: a survivor of a lost coordinator asks one candidate again and again, for a bounded
  time (the heartbeat timeout), before moving to the next of the succession order, and asks the lost
  coordinator each time too (one that only froze and came back is found again at once).
* ``superseded``: a host serving a generation that has not formed yet asks the other candidates, every
  ``WATCH_EVERY_S``, whether one serves the cluster in its place: a returning task 0 whose discovery ran
  before the survivors' successor was up, or a coordinator frozen past the heartbeat timeout. Two services
  would each wait for the hosts registered with the other; ``yields_to`` decides, the same way on both
  sides, which one steps down (its host joins the other as a worker), so one service is left to form.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tpuctl.agent.coordinator import connect
from tpuctl.errors import TpuctlError
from tpuctl.spec.model import ClusterSpec

log = logging.getLogger("tpuctl.agent.succession")

PROBE_S = 1.0
"""The longest one probe waits for an answer (a refused connection answers at once; a host that drops
packets costs this much, in parallel with the others)."""
PROBE_EVERY_S = 0.25
"""How often a survivor asks a candidate that has not answered yet (about the channel's reconnect pace)."""
WATCH_EVERY_S = 0.5
"""How often a service whose generation forms asks the other candidates whether one took over."""


@dataclass(frozen=True)
class Found:
    """A live coordination service of this cluster: which task's host serves it, where, at which generation."""

    task: int
    target: str
    generation: int


def candidates(spec: ClusterSpec) -> tuple[int, ...]:
    """The tasks whose hosts may serve this cluster: task 0, then the successors (each once)."""
    return candidates_of(spec.successors)


def candidates_of(successors: Sequence[int]) -> tuple[int, ...]:
    """Task 0, then ``successors``, each once."""
    return tuple(dict.fromkeys((0, *successors)))


async def probe(spec: ClusterSpec, token: str | None, task: int, timeout: float = PROBE_S) -> Found | None:
    """Task ``task``'s host serves this cluster (answered within ``timeout``), or None."""
    target = spec.coordinator_target_at(task)
    client = connect(spec, token, target=target)
    try:
        status = await asyncio.wait_for(client.status(brief=True, timeout=timeout), timeout + 0.5)
    except (TpuctlError, OSError, asyncio.TimeoutError):
        return None
    finally:
        with contextlib.suppress(BaseException):
            await client.close()
    if status.cluster != spec.cluster:
        log.warning("task %d's address %s serves cluster %r, not %r: not this cluster's coordinator", task, target,
                    status.cluster, spec.cluster)  # fmt: skip
        return None
    if status.failure is not None and status.failure.moved is not None:
        return None  # it stepped down (it answers only until it stops): another candidate serves (soak seed 110470)
    return Found(task, target, status.generation)


async def discover(spec: ClusterSpec, token: str | None, *, timeout: float = PROBE_S) -> Found | None:
    """The live service of this cluster at the highest generation among ``candidates`` (the earliest in
    that order on a tie), or None when none answers. At most ``timeout`` (+ a margin), whatever the count."""
    return await _highest(spec, token, candidates(spec), timeout)


async def _highest(spec: ClusterSpec, token: str | None, tasks: Sequence[int], timeout: float) -> Found | None:
    """One round of probes of ``tasks``, in parallel: the live service at the highest generation (the
    earliest in ``tasks`` on a tie), or None."""
    answers = await asyncio.gather(*(probe(spec, token, task, timeout) for task in tasks))
    found = [(answer.generation, -index, answer) for index, answer in enumerate(answers) if answer is not None]
    return max(found, key=lambda item: (item[0], item[1]))[2] if found else None


def yields_to(
    successors: Sequence[int],
    task: int,
    took_over_from: int | None,
    own_generation: int,
    other: Found,
    own_hosts: int | None = None,
    other_hosts: int | None = None,
) -> bool:
    """Whether task ``task``'s service (started to take over from task ``took_over_from``; None: task 0's
    own start, not a succession) steps down for ``other``, another candidate's live service.
    ``own_hosts``/``other_hosts``: how many hosts each has registered (None: unknown).

    Never for a lower generation (a service frozen, then resumed, is at the generation it had: its
    registrations are stale until it ends it), always for a higher one. At the same generation the service
    more hosts registered with wins (each host registers with one service at a time: the same decision on
    both sides; a returning task 0 alone yields to the survivors' successor, a successor cut off and
    serving itself alone to the others' service, two coordinators that each replaced the other settle);
    as many hosts each, the one earlier in the spec's list of candidates. With the counts unknown, by
    history: task 0's own service yields to any successor's (a successor serves only after
    the survivors judged the coordinator lost); a successor's never to the coordinator it replaced (that
    one yields), and to another successor earlier in the succession order after ``took_over_from`` (the
    order every survivor tried). Antisymmetric: of two services, at most one yields to the other.
    """
    from tpuctl.spec.successors import succession_order

    if other.task == task or other.generation < own_generation:
        return False
    if other.generation > own_generation:
        return True
    if own_hosts is not None and other_hosts is not None:
        if own_hosts != other_hosts:
            return other_hosts > own_hosts
        # As many hosts each: the candidate earlier in the spec's list (task 0, then the successors) wins.
        # Only what both sides see decides: by history, two services that each replaced the other both
        # stayed (soak seed 90453: tasks 0 and 2, 4 hosts each, until a host's init gave up 28 s later).
        order = candidates_of(successors)
        return order.index(other.task) < order.index(task) if other.task in order and task in order else other.task < task
    if took_over_from is None:
        return True
    if other.task == took_over_from:
        return False
    order = succession_order(successors, took_over_from)
    rank = {t: i for i, t in enumerate(order)}
    return rank.get(other.task, len(order)) < rank.get(task, len(order))


async def registered(spec: ClusterSpec, token: str | None, task: int, timeout: float = PROBE_S) -> int | None:
    """How many hosts are registered with task ``task``'s service and heard from within the heartbeat
    timeout (None: no answer). A full status call,
    O(hosts): asked only of a competing service, while two serve the cluster."""
    from tpuctl.coordination.values import TaskState

    client = connect(spec, token, target=spec.coordinator_target_at(task))
    try:
        status = await asyncio.wait_for(client.status(timeout=timeout), timeout + 0.5)
    except (TpuctlError, OSError, asyncio.TimeoutError):
        return None
    finally:
        with contextlib.suppress(BaseException):
            await client.close()
    # A service frozen, then resumed, still lists the hosts that left it meanwhile as connected: only a
    # heartbeat within the heartbeat timeout (by its clock) counts.
    fresh = spec.coordinator.heartbeat_timeout
    return sum(
        1 for t in status.tasks
        if t.state is TaskState.CONNECTED and t.seconds_since_heartbeat is not None and t.seconds_since_heartbeat <= fresh
    )  # fmt: skip


async def superseded(
    spec: ClusterSpec, token: str | None, task: int, took_over_from: int | None, own_generation: int
) -> Found | None:
    """The live service of another candidate that task ``task``'s service yields to (``yields_to``), or
    None. One round of brief probes, in parallel (at most ``PROBE_S`` + a margin; O(successors)); only when
    another candidate serves, how many hosts each service has (one full status call each)."""
    others = [t for t in candidates(spec) if t != task]
    live = [a for a in await asyncio.gather(*(probe(spec, token, t) for t in others)) if a is not None]
    if not live:
        return None
    own, *counts = await asyncio.gather(registered(spec, token, task), *(registered(spec, token, a.task) for a in live))
    winners = [
        (count, a) for a, count in zip(live, counts, strict=True)
        if yields_to(spec.successors, task, took_over_from, own_generation, a, own, count)
    ]  # fmt: skip
    if not winners:
        return None
    return max(winners, key=lambda w: (w[0] or 0, w[1].generation, -others.index(w[1].task)))[1]


async def wait_for_any(spec: ClusterSpec, token: str | None, tasks: Sequence[int], within: float) -> Found | None:
    """Ask the hosts of ``tasks`` at once, again and again, until one serves this cluster, for ``within``
    seconds at most: the one at the highest generation, the earliest in ``tasks`` on a tie. A survivor asks
    the next successor and the lost coordinator together: one that only froze and came back is found again
    at once, not after every successor before it was given the heartbeat timeout."""
    deadline = time.monotonic() + within
    while True:
        left = deadline - time.monotonic()
        found = await _highest(spec, token, tasks, max(0.1, min(PROBE_S, left)))
        if found is not None:
            return found
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        await asyncio.sleep(min(PROBE_EVERY_S, left))


__all__ = [
    "PROBE_S", "WATCH_EVERY_S", "Found", "candidates", "candidates_of", "discover", "probe", "registered", "superseded", "wait_for_any",
    "yields_to",
]
