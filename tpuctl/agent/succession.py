"""Finding the coordinator when it may have moved: probes of the hosts that may serve this cluster.

Under ``restart: {policy: rejoin}`` the coordination service is task 0's until its host is lost; then a
successor (``coordinator.successors``, :mod:`tpuctl.spec.successors`) serves the next generation. Two
questions follow, both answered with a brief ``GetStatus`` (O(1) bytes; a host with nothing listening
refuses the connection at once):

* ``discover``: a host starting ``tpuctl init`` (a returning old coordinator, a replaced host) asks
  ``hosts[0]`` and every successor at once, each for at most ``PROBE_S``, and joins the service of this
  cluster with the highest generation; none: the cluster is fresh (task 0 starts the service).
* ``wait_for_service``: a survivor of a lost coordinator asks one candidate again and again, for a bounded
  time (the heartbeat timeout), before moving to the next of the succession order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
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


@dataclass(frozen=True)
class Found:
    """A live coordination service of this cluster: which task's host serves it, where, at which generation."""

    task: int
    target: str
    generation: int


def candidates(spec: ClusterSpec) -> tuple[int, ...]:
    """The tasks whose hosts may serve this cluster: task 0, then the successors (each once)."""
    return tuple(dict.fromkeys((0, *spec.successors)))


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
    return Found(task, target, status.generation)


async def discover(spec: ClusterSpec, token: str | None, *, timeout: float = PROBE_S) -> Found | None:
    """The live service of this cluster at the highest generation among ``candidates`` (the earliest in
    that order on a tie), or None when none answers. At most ``timeout`` (+ a margin), whatever the count."""
    tasks = candidates(spec)
    answers = await asyncio.gather(*(probe(spec, token, task, timeout) for task in tasks))
    found = [(answer.generation, -index, answer) for index, answer in enumerate(answers) if answer is not None]
    if not found:
        return None
    return max(found, key=lambda item: (item[0], item[1]))[2]


async def wait_for_service(spec: ClusterSpec, token: str | None, task: int, within: float) -> Found | None:
    """Ask task ``task``'s host until it serves this cluster, for ``within`` seconds at most."""
    deadline = time.monotonic() + within
    while True:
        left = deadline - time.monotonic()
        found = await probe(spec, token, task, max(0.1, min(PROBE_S, left)))
        if found is not None:
            return found
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        await asyncio.sleep(min(PROBE_EVERY_S, left))


__all__ = ["PROBE_S", "Found", "candidates", "discover", "probe", "wait_for_service"]
