"""Writing answers to session streams: each session's outbox, and the fan-out writers.

gRPC allows one write at a time on a call, and a session's answers come from many handlers (its own
calls, a barrier another host passed, the cluster's error): ``SessionStream`` queues them and writes
them in order. An answer for many hosts at once (a passed barrier, a gather's table, the error, the end
of registration) is written by a few writer tasks taking the answers in turn (``FanOuts.send``), not by a
task per host, and the copies of a large answer in flight are bounded in bytes (``fanout_width``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from tpuctl.coordination.values import Counters, TaskRef

if TYPE_CHECKING:
    from tpuctl.coordination.stream_answers import WaitForAll
    from tpuctl.proto import coordination_pb2 as pb

log = logging.getLogger("tpuctl.coordination")

FANOUT_BYTES = 4 * 1024 * 1024
"""At most this many bytes of gather answers are being written at once (the rest wait their turn): every
copy in flight is service memory, and a few MiB already keep a fast link busy ..."""
FANOUT_MIN = 16
"""... but at least this many answers."""
STUCK_S = 0.5
"""A fan-out's write that has not completed after this long (its host takes no bytes) gets a writer
started beside it, so the other hosts are not held up."""
FLUSH_S = 1.0
"""How long a session's end waits for its queued writes."""
STOP_WRITES_S = 0.25
"""How long ``FanOuts.stop`` lets the writers' writes in progress finish (one message each; a host that
takes no bytes would hold its writer until cancelled)."""

class Fanned:
    """One host's copy of an answer shared by every host (a passed gather's table on the session stream):
    its own request-id prefix and the shared tail, joined only by the serializer as it is written, so
    the service never holds a copy per host (a table per host of a pod), and at most ``gate``'s worth of
    them are being written at once."""

    __slots__ = ("gate", "prefix", "tail")

    def __init__(self, prefix: bytes, tail: bytes, gate: asyncio.Semaphore) -> None:
        self.prefix = prefix
        self.tail = tail
        self.gate = gate

    def __len__(self) -> int:
        return len(self.prefix) + len(self.tail)

    def join(self) -> bytes:
        return self.prefix + self.tail


class FanOut:
    """One answer for many sessions, written by a few writer tasks taking the answers in turn."""

    __slots__ = ("answers", "fans", "writers")

    def __init__(
        self,
        answers: Answers,
        writers: set[asyncio.Task[None]],
        fans: set[FanOut] | None = None,
    ) -> None:
        self.answers = answers
        self.writers = writers
        self.fans = fans
        """The service's fan-outs with answers left (``FanOuts.stop`` hands those over)."""
        if fans is not None:
            fans.add(self)

    def add_writer(self) -> None:
        if self.answers:
            writer = asyncio.get_running_loop().create_task(write_answers(self))
            self.writers.add(writer)
            writer.add_done_callback(self.writers.discard)


async def write_answers(fan: FanOut) -> None:
    """Write answers until none is left. A write to a host that takes no bytes (frozen, cut off: until
    its keepalive closes the call) must not hold up the others: one that takes longer than ``STUCK_S``
    starts another writer for the rest (a gather's copies still count against its byte budget)."""
    loop = asyncio.get_running_loop()
    answers = fan.answers
    while answers:
        session, data = answers.popleft()
        stuck = loop.call_later(STUCK_S, fan.add_writer)
        try:
            await session.write(data)
        finally:
            stuck.cancel()
    if fan.fans is not None:
        fan.fans.discard(fan)


def fanout_width(answer_bytes: int) -> int:
    """How many copies of an answer this large may be being written at once."""
    return max(FANOUT_MIN, FANOUT_BYTES // max(1, answer_bytes))


class SessionStream:
    """The service's side of one host's session stream (``HeartbeatStream``): whose it is, and its outbox. gRPC allows one write at a time on a call, and barrier outcomes and the pushed error
    come from other calls' handlers: every write goes through ``send``, which queues it and keeps one
    writer task running while the queue is not empty (none while idle)."""

    __slots__ = (
        "_busy", "_counters", "_queue", "_writer", "closed", "context", "id", "task", "vouched", "wait_for_all",
        "watching", "wire",
    )  # fmt: skip

    def __init__(self, context: Any, counters: Counters, session_id: int) -> None:
        self.context = context
        self.id = session_id
        self.task: TaskRef | None = None
        self.vouched: TaskRef | None = None
        """The task this open stream keeps alive, once its first message proved whose it is."""
        self.wire: pb.TaskRef | None = None
        self.closed = False
        self.watching = False
        self.wait_for_all: WaitForAll | None = None
        self._queue: deque[bytes | Fanned] | None = None
        """Made when a write has to wait and dropped once drained: an idle session holds none (a deque
        per host of a pod adds up)."""
        self._writer: asyncio.Task[None] | None = None
        self._busy = False  # the stream's own handler is writing (``write``)
        self._counters = counters

    def send(self, data: bytes | Fanned) -> None:
        """Queue ``data`` (from any handler); written in order, one write at a time."""
        if self.closed:
            return
        if self._queue is None:
            self._queue = deque()
        self._queue.append(data)
        if self._writer is None and not self._busy:
            self._writer = asyncio.get_running_loop().create_task(self._drain())

    async def write(self, data: bytes | Fanned) -> None:
        """From the stream's own handler or a fan-out's writer: written at once when nothing else is being
        written (no task per write), else queued behind it."""
        if self._writer is not None or self._busy or self._queue or self.closed:
            self.send(data)
            return
        self._busy = True  # first: whatever comes meanwhile queues behind this write, in order
        try:
            await self._put(data)
        except Exception as exc:
            log.debug("session stream write failed: %s", exc)
            self.closed = True
        finally:
            self._busy = False
            if self._queue and self._writer is None and not self.closed:
                self._writer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while self._queue and not self.closed:
                data = self._queue.popleft()
                if not self._queue:
                    self._queue = None
                await self._put(data)
        except Exception as exc:  # the call ended under the write (the host went away): nothing to tell
            log.debug("session stream write failed: %s", exc)
            self.closed = True
        finally:
            self._writer = None

    async def _put(self, data: bytes | Fanned) -> None:
        """One write on the call, counted; a gather's copy within its byte budget (the gate the unary
        ``Gather`` shares), whichever path wrote it."""
        self._counters.stream_out += 1
        self._counters.stream_bytes += len(data)
        if isinstance(data, Fanned):
            async with data.gate:
                await self.context.write(data)
        else:
            await self.context.write(data)

    async def flush(self) -> None:
        """Wait (a bounded time: the host may be frozen) for the queued writes, so that the stream's end
        does not overtake them."""
        writer = self._writer
        if writer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(writer), FLUSH_S)
        # A fan-out writer's write in progress (the handler's own have finished: it awaited them).
        deadline = asyncio.get_running_loop().time() + FLUSH_S
        while self._busy and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)


Answers = deque[tuple[SessionStream, bytes | Fanned]]
"""Each session's answer, for one fan-out."""


class FanOuts:
    """The service's fan-outs: their writer tasks (the loop keeps only weak references to tasks) and the
    fan-outs with answers left."""

    def __init__(self) -> None:
        self.writers: set[asyncio.Task[None]] = set()
        self.fans: set[FanOut] = set()

    def send(self, answers: Answers, width: int) -> None:
        """Write each answer to its session with at most ``width`` writes in flight: that many writer
        tasks take the answers in turn, instead of a task (and its frames) per host for every barrier
        passed. A session busy with another write queues it behind."""
        if len(answers) == 1:
            session, data = answers[0]
            session.send(data)
            return
        fan = FanOut(answers, self.writers, self.fans)
        for _ in range(min(width, len(answers))):
            fan.add_writer()

    async def stop(self) -> None:
        """Answers not written yet (a passed barrier, the cluster's error: task 0's agent stops the
        service right after hearing the error itself) go to their sessions' own outboxes, which the
        streams' handlers flush during the server's grace; the writes in progress get ``STOP_WRITES_S``
        to finish."""
        for fan in list(self.fans):
            while fan.answers:
                session, data = fan.answers.popleft()
                session.send(data)
        self.fans.clear()
        writers = list(self.writers)
        if writers:
            await asyncio.wait(writers, timeout=STOP_WRITES_S)
        for writer in writers:
            writer.cancel()
