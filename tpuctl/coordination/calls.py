"""What the client's calls and its sessions share: retry delays, deadlines, progress pacing, the status
of an ended call."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypedDict, TypeVar

import grpc

from tpuctl.coordination.values import RendezvousProgress

_T = TypeVar("_T")

CONFIRM_GRACE_S = 0.5
"""How long past the heartbeat timeout a heartbeat confirmation may still arrive before the coordinator
counts as unreachable or frozen. After a short cut TCP retransmits with backoff (0.2, 0.4, 0.8, 1.6 s), so
a heartbeat sent as a 2 s cut begins is answered about 3.4 s later (the sum of those retransmissions);
confirmations asked at least every third of the timeout leave a host with a 5 s timeout room for that
(1 s heartbeats, each confirmed: 1 + 3.4 < 5 + 0.5)."""
WITHDRAW_GRACE_S = 1.0
"""How long past its own timeout a barrier or gather arrival waits before withdrawing: an instance it opened
times out in the service at that moment, and that verdict (the same for every host) should reach it first."""
WITHDRAW_ANSWER_S = 5.0
"""How long a withdrawn arrival waits for the service's answer (well within the margin a local command
gives its agent past the barrier's timeout: 10 s, ``tpuctl.agent.control.DEADLINE_MARGIN_S``)."""
RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.25)
"""Backoff between retries of an unreachable coordinator (the last repeats)."""
PROGRESS_POLLS_PER_S = 100.0
"""Progress polls per second the whole cluster may send the service (each host polls less often in a
bigger cluster: every 2 s up to 200 hosts, and hosts / 100 s beyond). A poll is cheap for the service but
not free: the cluster's rate, not each host's, is what must stay a small share of its core."""
STATUS_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}
"""gRPC status codes by their number, as a refusal on the session stream carries them."""
PROGRESS_EVERY_S = 5.0
"""Default seconds between a barrier's or gather's progress reports."""


class Waiting(TypedDict, total=False):
    """How a barrier or gather waits (``CoordinationClient.barrier`` and ``gather``, and a session's)."""

    timeout: float | None
    """Seconds to wait (None, the default: the service's default barrier timeout)."""
    progress: Callable[[RendezvousProgress], Awaitable[None] | None] | None
    """Called (or awaited) with a ``RendezvousProgress`` about every ``progress_every`` s still waiting."""
    progress_every: float
    """Default ``PROGRESS_EVERY_S``."""


async def report(outcome: Awaitable[None] | None) -> None:
    """A progress callback may be a plain function or a coroutine function."""
    if outcome is not None:
        await outcome


if sys.version_info >= (3, 11):

    async def within(awaitable: Awaitable[_T], timeout: float) -> _T:
        """``asyncio.wait_for`` without its task per call (Python 3.11's ``asyncio.timeout``): a host's
        every barrier and gather waits twice (its write, its answer), and a driver of the scale bench
        simulates thousands of hosts on one event loop."""
        async with asyncio.timeout(timeout):
            return await awaitable

else:  # pragma: no cover - Python 3.10
    within = asyncio.wait_for


def seconds_until(deadline: float, cap: float) -> float:
    """Seconds until ``deadline`` (at least a few milliseconds: an immediate timeout still gets asked), at most ``cap``."""
    return max(0.01, min(cap, deadline - time.monotonic()))


def progress_interval(requested: float, hosts: int) -> float:
    return max(requested, 0.05, hosts / PROGRESS_POLLS_PER_S)


async def finished(call: Any) -> grpc.aio.AioRpcError:
    """The status of a call that ended, as the error ``call.read`` would have raised."""
    return grpc.aio.AioRpcError(
        await call.code(), await call.initial_metadata(), await call.trailing_metadata(), await call.details()
    )
