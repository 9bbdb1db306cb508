"""Preemption notices as one host's agent handles them: raising one for this host (``tpuctl preempt``,
``tpuctl run`` or the agent getting SIGTERM, the GCE metadata watch), hearing every host's from the
coordinator, and letting this host go once its job saved the agreed step.

Every source ends in :meth:`Notices.raise_notice`: one message on this host's session, which the
coordinator records and pushes to every host. Each agent hands the pushed notice and the decision to its
job's processes (:mod:`tpuctl.agent.checkpoints`). The host the notice is for then leaves the cluster
(as ``tpuctl down`` does) at the first of: its job has stopped asking (every process that asked exited,
after saving the agreed step), there is no agreement (the generation ends now, so every job gets SIGTERM
and its grace at once, as it would without tpuctl's help), or the notice's deadline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Protocol

from tpuctl.errors import StateError, TpuctlError
from tpuctl.preemption.notice import AgreementHeard, NoticeHeard

if TYPE_CHECKING:
    from tpuctl.agent.checkpoints import JobCheckpoints
    from tpuctl.agent.generation import Generation

log = logging.getLogger("tpuctl.agent.bringup")

RELEASE_POLL_S = 0.2
"""How often the host going away looks whether its job's processes are gone (a shell loop has no
connection to close)."""


class NoticeAgent(Protocol):
    """What notices need of the agent."""

    @property
    def task(self) -> int: ...

    def up(self) -> Generation | None:
        """The generation this host is in, when it formed and is neither re-forming nor failed."""
        ...

    def go_away(self, why: str) -> None:
        """Leave the cluster now (as ``tpuctl down``)."""
        ...

    def notify(self) -> None: ...


class Notices:
    """This host's view of the notices of its generation. ``record`` is what ``tpuctl run`` reads (the
    agent's error report carries it)."""

    def __init__(self, agent: NoticeAgent, checkpoints: JobCheckpoints) -> None:
        self.agent = agent
        self.checkpoints = checkpoints
        self.record: dict[str, object] | None = None
        """The latest notice this host heard and the agreement: ``generation``, ``task``, ``source``,
        ``reason``, ``deadline`` (wall clock), ``state`` (pending, agreed, none), ``step``, ``why``."""
        self._own: int = 0
        """The generation this host raised a notice in (0: none): one per generation."""
        self._release: asyncio.Task[None] | None = None

    # --- the coordinator's word ---------------------------------------------------------------------

    def heard(self, heard: NoticeHeard) -> None:
        """A notice the coordinator pushed (any host's)."""
        log.warning("preemption notice for task %d: %s%s, deadline in %.0f s", heard.task, heard.source,
                    f" ({heard.reason})" if heard.reason else "", heard.deadline_in)  # fmt: skip
        record = self.record
        if record is None or record.get("generation") != heard.generation:
            self.record = {
                "generation": heard.generation, "task": heard.task, "source": heard.source, "reason": heard.reason,
                "deadline": time.time() + heard.deadline_in, "state": "pending", "step": None, "why": None,
            }  # fmt: skip
        self.checkpoints.notice(heard)
        self.agent.notify()

    def decided(self, heard: AgreementHeard) -> None:
        if heard.step >= 0:
            log.warning("preemption: every host checkpoints at step %d", heard.step)
        else:
            log.warning("preemption: no agreed checkpoint step: %s", heard.reason)
        record = self.record
        if record is None or record.get("generation") != heard.generation:
            record = self.record = {"generation": heard.generation, "task": None, "source": None, "reason": None,
                                    "deadline": time.time() + heard.deadline_in}  # fmt: skip
        record.update(state="agreed" if heard.step >= 0 else "none", step=heard.step if heard.step >= 0 else None,
                      why=heard.reason)  # fmt: skip
        self.checkpoints.decided(heard)
        self.agent.notify()

    # --- this host's own notice ---------------------------------------------------------------------

    async def raise_notice(self, source: str, reason: str, seconds: float) -> dict[str, object]:
        """This host is going away in ``seconds``: tell the coordinator (which tells every host), then let
        the host go once its job saved the agreed step. Raises when no generation is up here, or the
        coordinator refuses (this host is no longer live)."""
        gen = self.agent.up()
        if gen is None:
            raise StateError(
                f"task {self.agent.task}: no generation of the cluster is up on this host: no job to checkpoint",
                hint="`tpuctl status` shows what the cluster is doing",
            )
        number = gen.number
        heard = await gen.session.send_notice(source, reason, seconds)
        if self._own != number:
            self._own = number
            deadline = time.monotonic() + heard.deadline_in
            self._release = asyncio.create_task(self._let_go(gen, deadline, source), name="preemption-release")
        return {
            "task": heard.task,
            "source": heard.source,
            "reason": heard.reason or None,
            "deadline_in": round(heard.deadline_in, 1),
            "notice": heard.notice_id,
            "generation": heard.generation,
            "taking_part": self.checkpoints.taking_part,
        }

    async def raise_or_leave(self, source: str, reason: str, seconds: float) -> None:
        """A notice from a source that does not wait for an answer (a signal, the metadata watch): raised,
        or, when it cannot be (no generation up, the coordinator unreachable), this host leaves at once."""
        try:
            await self.raise_notice(source, reason, seconds)
        except TpuctlError as exc:
            self.agent.go_away(f"{source}: could not raise a notice ({exc.message}): leaving now")

    async def _let_go(self, gen: Generation, deadline: float, source: str) -> None:
        checkpoints = self.checkpoints
        why = f"the notice's deadline ({source}) passed"
        while time.monotonic() < deadline and self.agent.up() is gen:
            round_ = checkpoints.round
            if round_ is not None and round_.step is not None:
                if round_.step < 0:
                    why = "there is no agreed checkpoint step: every job stops now"
                    break
                if checkpoints.job_done():
                    why = f"its job stopped after the agreed step {round_.step}"
                    break
            changed = asyncio.ensure_future(checkpoints.changed.wait())
            try:
                await asyncio.wait({changed}, timeout=min(RELEASE_POLL_S, max(0.0, deadline - time.monotonic())))
            finally:
                changed.cancel()
        else:
            if self.agent.up() is not gen:
                return  # the generation ended meanwhile: the agent already re-forms or fails
        self.agent.go_away(f"going away ({source}): {why}")

    def stop(self) -> None:
        if self._release is not None:
            self._release.cancel()
            self._release = None
