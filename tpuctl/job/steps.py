"""A training job's step reports to its own host's agent: ``tpuctl.job.progress(step)`` and
``tpuctl.job.checkpointed(step)``.

One line per call on a unix stream socket in the agent's state dir (``progress.sock``; the state dir is the
job's ``TPUCTL_STATE_DIR``, set by ``tpuctl run``): the agent time-stamps what it receives, judges its own
job's pace, and tells the coordinator only what matters (a stall, a summary at a low rate). A report is
``KIND STEP GENERATION PID`` in ASCII, one line (``P 1203 2 4567``: kind ``P`` progress, ``C`` checkpointed).
A stream, not datagrams: the kernel queues about 200 kB of lines for an agent busy for a moment, where a
unix datagram socket holds ``net.unix.max_dgram_qlen`` datagrams (10 by default on some systems), and the
job's last step before it hangs is the one that must not be lost.

Safe to call every step: the socket is non-blocking and every failure is swallowed, so a call never
blocks and never raises (a job runs without tpuctl too: then there is no state dir, and each call costs
a dictionary lookup). The rest of a line the kernel could take only part of goes first with the next
report; a report the kernel took none of is replaced by the next one (the newest step is what counts). A step that is not an ``int``, is negative, goes backwards or is absurdly large gets one
line on stderr (per kind of mistake, not per step) and is not sent. An agent that is not there yet (or
restarted) is looked for again at most every ``RECONNECT_S`` seconds.

Imports only what starting Python already loaded (``_socket``, ``os``, ``sys``, ``time``): no grpc, click,
asyncio or numpy.
"""

import _socket
import os
import sys
import time

SOCKET_NAME = "progress.sock"
"""The agent's progress socket (a unix stream socket) in its state dir."""
RECONNECT_S = 5.0
"""How often a job without an agent looks for one again."""
MAX_STEP = 10**15
"""A step beyond this is a mistake (a timestamp, a token count), not a step."""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class _Reporter:
    """The job's end of the socket; one per process (``_REPORTER``), made on first use. ``path``,
    ``generation`` and ``pid`` are the job environment's unless given (``tpuctl run --progress-regex``
    reports for its job)."""

    def __init__(self, path: str = "", generation: int | None = None, pid: int | None = None) -> None:
        self.sock: Any = None
        self.retry_at = 0.0
        self.last = {b"P": -1, b"C": -1}
        self.warned: set[tuple[bytes, str]] = set()
        self.path = path
        self.tail = b"" if generation is None else b" %d %d\n" % (generation, pid if pid is not None else os.getpid())
        self.cont = b""  # the rest of a line the kernel took part of

    def send(self, kind: bytes, step: object) -> None:
        if type(step) is not int or not self.last[kind] <= step <= MAX_STEP:
            checked = self._check(kind, step)
            if checked is None:
                return
            step = checked
        self.last[kind] = step
        sock = self.sock
        if sock is None:
            sock = self._connect()
            if sock is None:
                return
        # ``cont``: the rest of a line the kernel took only part of; it goes first, then the newest line.
        # Lines the kernel did not take at all are not kept: a newer step replaces them.
        cont = self.cont
        data = cont + b"%s %d%s" % (kind, step, self.tail)
        try:
            sent = sock.send(data)
        except BlockingIOError:  # the agent is behind (its queue is full): try again with the next report
            return
        except OSError:
            self._close()  # the agent went away (or restarted): look for it again later
            return
        if sent == len(data):
            self.cont = b""
        elif sent < len(cont):
            self.cont = cont[sent:]
        else:
            self.cont = data[sent:]

    def _connect(self) -> "Any":
        now = time.monotonic()
        if now < self.retry_at:
            return None
        self.retry_at = now + RECONNECT_S
        if not self.path:
            state_dir = os.environ.get("TPUCTL_STATE_DIR", "").strip()
            if not state_dir:
                self.retry_at = float("inf")  # not under tpuctl: nothing to report to, ever
                return None
            self.path = os.path.join(state_dir, SOCKET_NAME)
        if not self.tail:
            generation = os.environ.get("TPUCTL_GENERATION", "0").strip()
            self.tail = b" %d %d\n" % (int(generation) if generation.isascii() and generation.isdigit() else 0, os.getpid())
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.connect(self.path)  # a unix socket connects at once, or fails (EAGAIN: the agent's backlog is full)
        except OSError:
            sock.close()
            return None
        self.sock, self.cont = sock, b""
        return sock

    def _close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _check(self, kind: bytes, step: object) -> "int | None":
        """``step`` as an int if it is one (numpy and JAX integer scalars included), else None after
        saying once what is wrong with it."""
        import contextlib  # here: off the per-step path

        if type(step) is not int and type(step) is not bool and hasattr(type(step), "__index__"):
            with contextlib.suppress(Exception):  # a foreign object's conversion: what it gave is reported below
                step = step.__index__()  # type: ignore[attr-defined]
        if type(step) is not int:
            mistake, text = "type", f"a step must be an int, got {step!r:.60} ({type(step).__name__})"
        elif step < 0 or step > MAX_STEP:
            mistake, text = "range", f"a step must be between 0 and {MAX_STEP:,}, got {step:,}"
        elif step < self.last[kind]:
            mistake, text = "backwards", f"step {step:,} is below step {self.last[kind]:,}, reported before"
        else:
            return step
        if (kind, mistake) not in self.warned:
            self.warned.add((kind, mistake))
            what = "progress" if kind == b"P" else "checkpointed"
            hint = {
                "type": "pass the loop's step counter as an int",
                "range": "pass the training step, not a timestamp or a token count",
                "backwards": "within one process steps only grow (a restarted job is a new process)",
            }[mistake]
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(f"tpuctl.job.{what}: {text}; not counted (said once)\nhint: {hint}\n")
        return None


_REPORTER = _Reporter()


def progress(step: int) -> None:
    """Tell this host's agent the job finished ``step`` (an int that only grows). Never blocks, never
    raises; costs about one ``socket.send``. The watchdog is armed by the first report."""
    _REPORTER.send(b"P", step)


def checkpointed(step: int) -> None:
    """Tell this host's agent a checkpoint of ``step`` is complete (durable): work after it is what a
    failure loses."""
    _REPORTER.send(b"C", step)


def _reset_for_tests() -> None:
    """Forget the socket, the last steps and the warnings (a test that changes the environment)."""
    global _REPORTER
    _REPORTER._close()
    _REPORTER = _Reporter()
