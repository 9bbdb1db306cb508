"""The black box inside the coordination service: a dump order pushed to every host, their digests
collected until every host answered or the order's deadline passed, one bounded report.

One dump at a time: an order while one is being collected joins it (every asker gets the same report).
Nothing here is on any per-step path: an order costs one small push per host, an answer O(1), the report
O(hosts) once (:func:`tpuctl.watchdog.blackbox.assemble`, the entry point a bench measures).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Callable

from tpuctl.proto import coordination_pb2 as pb
from tpuctl.watchdog.blackbox import Digest, assemble, digest, render_text

log = logging.getLogger("tpuctl.coordination")

DEFAULT_TIMEOUT_S = 10.0
"""How long the hosts have to answer an order, unless the asker says otherwise."""
MAX_TIMEOUT_S = 120.0
MIN_TIMEOUT_S = 1.0
MAX_LOGGED_CHARS = 16 * 1024
"""The most of a report the service's log takes (the rest is in ``tpuctl dump``)."""

Push = Callable[[bytes], "set[int]"]
"""Pushes one encoded ``HeartbeatResponse`` to every session watching the cluster's error; the tasks reached."""


def digest_of(message: pb.StackDigest) -> Digest:
    """A host's digest as it arrived, every field clipped to its bound."""
    return digest(message.signature, message.state, message.method, message.path, message.note,
                  message.no_ptrace, message.processes)  # fmt: skip


class _Dump:
    __slots__ = ("answered", "digests", "expected", "future", "id", "reason", "started", "timer")

    def __init__(self, dump_id: int, hosts: int, reason: str, future: asyncio.Future[dict[str, object]]) -> None:
        self.id = dump_id
        self.reason = reason
        self.digests: list[Digest | None] = [None] * hosts
        self.expected: set[int] = set()
        self.answered = 0
        self.future = future
        self.started = time.monotonic()
        self.timer: asyncio.TimerHandle | None = None


class BlackBox:
    """``order(timeout, reason)`` returns the future report; ``answer(task, message)`` as digests arrive."""

    def __init__(self, hosts: int, describe: Callable[[int], str], push: Push) -> None:
        self.hosts = hosts
        self.describe = describe
        self._push = push
        self._ids = itertools.count(1)
        self._current: _Dump | None = None
        self.reports = 0
        """Reports assembled (for tests and the bench)."""

    def order(self, timeout: float = 0.0, reason: str = "") -> asyncio.Future[dict[str, object]]:
        current = self._current
        if current is not None:
            return current.future  # joins the dump being collected
        timeout = min(MAX_TIMEOUT_S, max(MIN_TIMEOUT_S, timeout or DEFAULT_TIMEOUT_S))
        loop = asyncio.get_running_loop()
        dump = self._current = _Dump(next(self._ids), self.hosts, reason[:200], loop.create_future())
        order = pb.DumpOrder(dump_id=dump.id, deadline_seconds=timeout, reason=dump.reason)
        dump.expected = self._push(pb.HeartbeatResponse(dump_order=order).SerializeToString())
        log.info("black box: dump %d ordered (%s) from %d hosts", dump.id, dump.reason or "asked", len(dump.expected))
        dump.timer = loop.call_later(timeout, self._finish, dump)
        if not dump.expected:
            self._finish(dump)
        return dump.future

    def answer(self, task: int, message: pb.StackDigest) -> None:
        dump = self._current
        if dump is None or message.dump_id != dump.id or not 0 <= task < self.hosts or dump.digests[task] is not None:
            return  # late, of another dump, or said twice: not counted
        dump.digests[task] = digest_of(message)
        if task in dump.expected:
            dump.answered += 1
            if dump.answered >= len(dump.expected):
                self._finish(dump)

    def _finish(self, dump: _Dump) -> None:
        if self._current is not dump:
            return
        self._current = None
        if dump.timer is not None:
            dump.timer.cancel()
        report = assemble(
            dump.digests, self.describe, dump_id=dump.id, reason=dump.reason, waited=time.monotonic() - dump.started
        )
        self.reports += 1
        if not dump.future.done():
            dump.future.set_result(report)

    def log_report(self, report: dict[str, object]) -> None:
        """The report in the service's log (task 0's agent log), bounded."""
        text = render_text(report)
        if len(text) > MAX_LOGGED_CHARS:
            text = text[:MAX_LOGGED_CHARS] + "\n... (cut; `tpuctl dump` shows the whole report)"
        log.warning("black box:\n%s", text)


def report_document(report: dict[str, object]) -> str:
    return json.dumps(report, ensure_ascii=False, separators=(",", ":"))
