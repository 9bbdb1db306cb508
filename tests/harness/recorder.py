"""What an in-process agent reports (``tpuctl.agent.reporter.Reporter``), for tests that run agents in their
own event loop: every progress line, and its outcome (the summary, or the error) to await."""

from __future__ import annotations

import asyncio
from typing import Any

from tpuctl.agent.reporter import Reporter
from tpuctl.errors import TpuctlError


class Recorder(Reporter):
    """Collects what an agent reports, and lets a test await its outcome."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.outcome: asyncio.Future[dict[str, Any] | TpuctlError] = asyncio.get_running_loop().create_future()

    def progress(self, text: str) -> None:
        self.lines.append(text)

    def ready(self, summary: dict[str, Any]) -> None:
        self.outcome.set_result(summary)

    def failed(self, exc: TpuctlError) -> None:
        if not self.outcome.done():
            self.outcome.set_result(exc)
