"""The agent's side of the black box on the session: a dump order answered with this host's digest
(:func:`tpuctl.agent.stacks.take`, in a thread: the event loop and the heartbeats go on), and where the full
dump lies said in this host's log. One order at a time; a second one while a dump is being taken is
answered by that dump.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from tpuctl.agent.stacks import take
from tpuctl.proto import coordination_pb2 as pb
from tpuctl.watchdog.blackbox import NONE, Digest, digest

if TYPE_CHECKING:
    from tpuctl.coordination.session import Session

log = logging.getLogger("tpuctl.agent.blackbox")

BUDGET_SHARE = 0.6
"""The share of an order's deadline this host spends taking stacks (the rest: the answer's way back)."""
MAX_BUDGET_S = 20.0


class DumpTaker:
    """Answers the dump orders pushed on ``session`` (its ``on_dump``), for the job of ``state_dir``."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._taking: asyncio.Task[None] | None = None

    def on_order(self, session: Session, order: pb.DumpOrder) -> None:
        if self._taking is not None and not self._taking.done():
            log.info("black box: dump %d ordered while one is being taken: not taken twice", order.dump_id)
            return
        self._taking = asyncio.create_task(self._answer(session, order), name=f"black-box-{order.dump_id}")

    async def _answer(self, session: Session, order: pb.DumpOrder) -> None:
        budget = min(MAX_BUDGET_S, max(0.5, order.deadline_seconds * BUDGET_SHARE))
        try:
            found = await asyncio.to_thread(take, self.state_dir, order.dump_id, budget, order.reason)
        except Exception as exc:  # never the agent's end: say so instead
            log.exception("black box: taking this host's stacks failed")
            found = digest("", "failed", NONE, note=f"taking the stacks failed: {type(exc).__name__}: {exc}")
        where = found.path or "nowhere (not written)"
        log.warning("black box: dump %d (%s): this host's full dump is %s; %s%s", order.dump_id,
                    order.reason or "asked", where, found.state, f": {found.signature}" if found.signature else "")  # fmt: skip
        await session.answer_dump(message(order.dump_id, found))


def message(dump_id: int, found: Digest) -> pb.StackDigest:
    return pb.StackDigest(
        dump_id=dump_id, signature=found.signature, state=found.state, method=found.method, path=found.path,
        note=found.note, no_ptrace=found.no_ptrace, processes=found.processes,
    )  # fmt: skip
