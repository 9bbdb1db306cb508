"""This host's job's progress, as its agent hears it: the stream socket the job reports on, a line per
report (``STATE_DIR/progress.sock``, written to by :mod:`tpuctl.job.steps` and ``tpuctl progress``), the pace of
the job's steps (:class:`~tpuctl.watchdog.pace.StepPace`), and the reports that go to the coordinator: one
per report interval while the job advances, one at once when it stalls or resumes, nothing while it has
not reported at all.

A report is ``KIND STEP GENERATION PID`` in ASCII (``P 1203 2 4567``). Anything else on the socket, a
report of another generation's job, or a step going backwards is not counted and is logged once per kind
of mistake (the socket is the owner's alone, in the owner-only state dir; the job's own side already told
the job).

The same socket carries the job's side of the agreement on a checkpoint step (kinds ``S``, ``Q``, ``K``:
:mod:`tpuctl.agent.checkpoints`, which answers on the same connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from tpuctl.agent.checkpoints import JobCheckpoints, Writer
from tpuctl.processes import pid_alive
from tpuctl.watchdog.pace import MAX_PROCESSES, MAX_STEP, PaceReport, StepPace
from tpuctl.watchdog.settings import WatchdogSettings

log = logging.getLogger("tpuctl.agent.progress")

MAX_REPORT_BYTES = 64
MAX_CONNECTIONS = 1024
"""Reporting connections held at once (a job's processes keep one each; ``tpuctl progress`` one per call)."""
CHECK_EVERY_S = 0.25
"""How often the agent looks at its job's pace (a stall is noticed within this of its threshold)."""

Send = Callable[[PaceReport], Awaitable[bool]]
"""Sends a report to the coordinator; False when it could not (the session is reconnecting)."""


KINDS = (b"P", b"C", b"S", b"Q", b"K")
"""``P`` progress, ``C`` checkpointed; ``S`` a listener for the agreed checkpoint step, ``Q`` where it stands,
``K`` progress from a shell loop that waits for whether to checkpoint (:mod:`tpuctl.agent.checkpoints`)."""


def parse_report(data: bytes) -> tuple[str, int, int, int] | str:
    """``(kind, step, generation, pid)``, or what is wrong with ``data``."""
    if len(data) > MAX_REPORT_BYTES:
        return f"a report of {len(data)} bytes (at most {MAX_REPORT_BYTES})"
    fields = data.split(b" ")
    if len(fields) != 4 or fields[0] not in KINDS or not all(f.isdigit() for f in fields[1:]):
        return f"a report that is not 'P|C|S|Q|K STEP GENERATION PID': {data[:MAX_REPORT_BYTES]!r}"
    step, generation, pid = (int(f) for f in fields[1:])
    if step > MAX_STEP:
        return f"step {step:,} (at most {MAX_STEP:,})"
    return fields[0].decode(), step, generation, pid


class JobProgress:
    """The agent's record of its job's progress across generations. ``open`` the socket once; call
    ``start(generation, hosts, send)`` when a generation forms (a new pace: steps restart with the job)
    and ``stop()`` when it ends; ``receive`` takes one report."""

    def __init__(self, settings: WatchdogSettings, path: Path) -> None:
        """``path``: the progress socket (``StateDir.progress_socket``)."""
        self.settings = settings
        self.path = path
        self.pace: StepPace | None = None
        self.generation = 0
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Transport] = set()
        self._reporter: asyncio.Task[None] | None = None
        self._said: set[str] = set()
        self._seen: set[int] = set()  # reporting pids that were alive in this agent's view when first heard
        self.checkpoints = JobCheckpoints()
        """The job's processes that ask whether to checkpoint, and the agreement as this host sees it."""

    async def open(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Reports(self), path=str(self.path), backlog=128)
        os.chmod(self.path, 0o600)

    def close(self) -> None:
        self.stop()
        if self._server is not None:
            self._server.close()
            self._server = None
        for connection in list(self._connections):
            connection.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def start(self, generation: int, hosts: int, send: Send) -> None:
        self.stop()
        self.generation = generation
        self.pace = StepPace(self.settings, hosts)
        self._seen.clear()
        self._reporter = asyncio.create_task(self._report(self.pace, send), name=f"progress-{generation}")

    def stop(self) -> None:
        if self._reporter is not None:
            self._reporter.cancel()
            self._reporter = None
        self.pace = None
        self.checkpoints.stop()

    def receive(self, data: bytes, now: float, writer: Writer | None = None) -> None:
        """One line from the job; ``writer``: its connection (the agreement's answers go there)."""
        parsed = parse_report(data.rstrip(b"\n"))
        if isinstance(parsed, str):
            self._once("malformed", f"ignored on {self.path}: {parsed}")
            return
        kind, step, generation, pid = parsed
        pace = self.pace
        if kind in "SQK" and writer is not None:
            self._checkpoint_line(kind, step, generation, pid, writer, now)
            if kind != "K":
                return
            kind = "P"  # a shell loop's step is its progress too
        if pace is None:
            return  # between generations: the job is being stopped
        if generation not in (0, self.generation):
            self._once(
                f"generation {generation}",
                f"ignored reports of a job of generation {generation} (pid {pid}): this host is at generation "
                f"{self.generation}",
            )
            return
        if pid not in self._seen and len(self._seen) < 4 * MAX_PROCESSES and pid_alive(pid):
            self._seen.add(pid)  # a process this agent can see (another pid namespace's it cannot)
        problem = pace.record(kind, step, pid, now)
        if problem is not None:
            self._once(f"{kind} backwards", f"not counted: {problem} (said once)")
        elif kind == "C":
            self.checkpoints.checkpointed(step)

    def _checkpoint_line(self, kind: str, step: int, generation: int, pid: int, writer: Writer, now: float) -> None:
        checkpoints = self.checkpoints
        if kind == "S":
            checkpoints.subscribe(writer, pid, generation)
        elif kind == "Q":
            checkpoints.answer(writer, step)
        elif generation not in (0, self.generation):
            writer.write(b"G\n")  # another generation's job: nothing to agree on
        else:
            checkpoints.ask(writer, step, pid)  # after the generation ended too: its agreement stands

    def _job_gone(self, pace: StepPace) -> bool:
        """Every reporting process this agent could see has exited (a job that ended, not one that hangs).
        Processes it never saw (a job in another pid namespace) never count as gone."""
        seen = [pid for pid in pace.pids if pid in self._seen]
        return bool(seen) and not any(pid_alive(pid) for pid in seen)

    def _once(self, key: str, text: str) -> None:
        if key not in self._said and len(self._said) < 64:
            self._said.add(key)
            log.warning("job progress: %s", text)

    async def _report(self, pace: StepPace, send: Send) -> None:
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            now = time.monotonic()
            if pace.armed and pace.stalled(now) and self._job_gone(pace):
                if await send(pace.ended(time.time())):
                    log.info("job progress: the job's processes are gone at step %d: not judged until a job reports", pace.step)
                    pace.start_over()
                continue
            report = pace.due(now, time.time())
            if report is None:
                continue
            if report.stalled:
                log.warning("job progress: no step for %.0f s at step %d", report.step_age, report.step)
            if not await send(report):
                pace.unsent()



class _Reports(asyncio.Protocol):
    """One reporting connection: lines in, each a report; a line longer than a report ends the connection."""

    def __init__(self, progress: JobProgress) -> None:
        self.progress = progress
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        connections = self.progress._connections
        if len(connections) >= MAX_CONNECTIONS:
            transport.close()
            return
        self.transport = transport
        connections.add(transport)

    def data_received(self, data: bytes) -> None:
        lines = (self.buffer + data).split(b"\n")
        self.buffer = lines.pop()
        now = time.monotonic()
        for line in lines:
            self.progress.receive(line, now, self.transport)
        if len(self.buffer) > MAX_REPORT_BYTES and self.transport is not None:
            self.progress.receive(self.buffer, now)  # said once as malformed
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.progress._connections.discard(self.transport)
            self.progress.checkpoints.left(self.transport)
