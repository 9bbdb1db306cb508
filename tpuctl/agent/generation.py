"""One generation of this host's membership, and how it ends: the records the agent keeps of it.

A generation (the spec's ``restart: {policy: rejoin}``) is this host's session with the coordinator of
that generation and the work that runs for it (the session's heartbeats, the cluster's error watch),
until it ends: :class:`Generation`. How it ended, and what follows (re-form or fail for good), is a
:class:`GenerationEnd`; :func:`failure_end` decides it from the cluster's error as the service sent it.
Each generation this agent took part in leaves a :class:`HistoryRow` (``tpuctl status``, ``tpuctl run``).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from tpuctl.agent.protocol import Failure
from tpuctl.errors import ClusterError, TpuctlError

if TYPE_CHECKING:
    from tpuctl.coordination.session import Session
    from tpuctl.coordination.values import ClusterFailure, Membership


@dataclass(frozen=True)
class GenerationEnd:
    """Why this host's generation ended: re-form (``rejoin``) or fail for good (``error``)."""

    generation: int
    rejoin: bool
    error: TpuctlError
    """What to report: the cause of the end (rejoin) or the cluster's error (final)."""
    failures: tuple[Failure, ...] = ()
    shutdown: bool = False
    again: bool = False
    """Not an end of the generation: the service dropped this host's registration while the generation
    formed (silent for the heartbeat timeout), and the host registers into it again (``rejoin`` too)."""


class HistoryRow(TypedDict):
    """One generation this agent took part in: when it formed (epoch s), when and why it ended."""

    generation: int
    formed: float
    ended: float | None
    cause: str | None


@dataclass(eq=False)
class Generation:
    """This host's part in one generation: its session (heartbeats, barriers, the error watch), the tasks
    that run for it, the mapping it wrote and has not committed yet, and its end, once known."""

    session: Session
    ended: asyncio.Future[GenerationEnd]
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    pending: Path | None = None
    """The mapping written but not yet committed (the generation has not formed)."""
    complete: bool = False
    """Every host registered (this host's wait for all passed): from here on a failure ends the generation."""

    @property
    def membership(self) -> Membership:
        return self.session.membership

    @property
    def number(self) -> int:
        return self.membership.generation

    def end(self, end: GenerationEnd) -> None:
        """The generation ended (the first word on it counts)."""
        if not self.ended.done():
            self.ended.set_result(end)

    async def stop(self) -> None:
        """Cancel the generation's tasks and wait until they are gone."""
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(BaseException):
                await task
        self.tasks = []


def failure_end(failure: ClusterFailure, cluster: str) -> GenerationEnd:
    """The end the cluster's error ``failure`` (as the service pushed it) means for cluster ``cluster``:
    a shutdown (``tpuctl down --all`` somewhere: the flag, never the cause's text), a re-form, or a final
    error."""
    text = str(failure)
    failures = tuple(Failure(task=f.task.task_id, address=f.task.address, cause=f.cause) for f in failure.failures)
    if failure.shutdown:
        return GenerationEnd(failure.generation, False, ClusterError(text), failures, shutdown=True)
    if failure.rejoin:
        return GenerationEnd(failure.generation, True, ClusterError(text), failures)
    return GenerationEnd(failure.generation, False, ClusterError(f"cluster {cluster!r} is in error: {text}"), failures)


__all__ = ["Generation", "GenerationEnd", "HistoryRow", "failure_end"]
