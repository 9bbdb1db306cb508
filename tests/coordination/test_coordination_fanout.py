"""A session's writes and a fan-out's writers (``fanout.SessionStream``, ``FanOut``), with a fake call
context whose writes take time: one write at a time per session and in order, a gather's copies within
its byte budget however many sessions are busy, and a host that takes no bytes holding up no one."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import pytest

from tpuctl.coordination import fanout as fanout_module
from tpuctl.coordination.fanout import Fanned, FanOut, SessionStream
from tpuctl.coordination.values import Counters

pytestmark = pytest.mark.timeout(30)


class Context:
    """A call context: writes take ``delay`` s (``stuck``: until cancelled), recorded in order."""

    in_flight = 0
    peak_fanned = 0

    def __init__(self, delay: float = 0.005, stuck: bool = False) -> None:
        self.delay, self.stuck = delay, stuck
        self.written: list[bytes] = []
        self.writing = 0

    async def write(self, data: Any) -> None:
        self.writing += 1
        assert self.writing == 1, "two writes at once on one call"
        fanned = isinstance(data, Fanned)
        if fanned:
            Context.in_flight += 1
            Context.peak_fanned = max(Context.peak_fanned, Context.in_flight)
        try:
            await asyncio.sleep(3600 if self.stuck else self.delay)
            self.written.append(data.join() if fanned else data)
        finally:
            self.writing -= 1
            if fanned:
                Context.in_flight -= 1


def sessions(contexts: list[Context]) -> list[SessionStream]:
    return [SessionStream(c, Counters(), i) for i, c in enumerate(contexts)]


async def settle(opened: list[SessionStream]) -> None:
    for _ in range(1000):
        if not any(s._writer or s._busy or s._queue for s in opened):
            return
        await asyncio.sleep(0.005)
    raise AssertionError("writes did not settle")


def test_a_gathers_copies_stay_within_its_budget_when_sessions_are_busy() -> None:
    async def body() -> None:
        Context.in_flight = Context.peak_fanned = 0
        contexts = [Context() for _ in range(40)]
        opened = sessions(contexts)
        busy = [asyncio.create_task(s.write(b"ack")) for s in opened[::2]]  # their handlers are writing
        await asyncio.sleep(0)
        gate = asyncio.Semaphore(4)
        writers: set[asyncio.Task[None]] = set()
        fan = FanOut(deque((s, Fanned(b"\x10\x01", b"table", gate)) for s in opened), writers)
        for _ in range(4):
            fan.add_writer()
        await asyncio.gather(*busy)
        await settle(opened)
        assert Context.peak_fanned <= 4
        for i, context in enumerate(contexts):  # each got its table once, after its own ack
            assert context.written == ([b"ack"] if i % 2 == 0 else []) + [b"\x10\x01table"]

    asyncio.run(body())


def test_writes_on_one_session_are_one_at_a_time_and_in_order() -> None:
    async def body() -> None:
        (session,) = opened = sessions([Context()])
        handler = asyncio.create_task(session.write(b"1"))  # the handler's own write
        await asyncio.sleep(0)
        session.send(b"2")  # another handler's, while it is being written
        fan = FanOut(deque([(session, b"3")]), set())
        fan.add_writer()
        await asyncio.sleep(0)
        session.send(b"4")
        await handler
        await settle(opened)
        assert session.context.written == [b"1", b"2", b"3", b"4"]
        assert session._queue is None  # an idle session holds no outbox

    asyncio.run(body())


def test_a_host_that_takes_no_bytes_holds_up_no_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fanout_module, "STUCK_S", 0.05)

    async def body() -> None:
        contexts = [Context(stuck=True), *(Context() for _ in range(9))]
        opened = sessions(contexts)
        writers: set[asyncio.Task[None]] = set()
        fan = FanOut(deque((s, b"passed") for s in opened), writers)
        fan.add_writer()  # one writer, and the first host is frozen
        for _ in range(200):
            if all(c.written == [b"passed"] for c in contexts[1:]):
                break
            await asyncio.sleep(0.01)
        assert all(c.written == [b"passed"] for c in contexts[1:])
        assert contexts[0].written == [] and len(writers) == 1  # only the stuck write's writer is left
        for writer in writers:
            writer.cancel()
        await asyncio.gather(*writers, return_exceptions=True)

    asyncio.run(body())
