"""A training job's step reports to its own host's agent: ``tpuctl.job.progress(step)`` and
``tpuctl.job.checkpointed(step)``; and whether to checkpoint now: ``tpuctl.job.should_checkpoint(step)``.

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

``should_checkpoint(step)`` is True on every host at the same step after a preemption notice (the agreed
step, :mod:`tpuctl.preemption.agreement`), else False. Without a notice it costs a lock taken and given
back: no system call. Its first call starts a listener thread that holds a connection of its own to the
agent (``S 0 GEN PID``); on a notice (``N SECONDS``) the thread answers at once where this process stands
(``Q NEXT GEN PID``: one past the last step it answered) and holds the process's next call until the
agreed step (``A STEP``) or that there is none (``X``) comes, at most SECONDS and a margin. The thread
answers even while the job waits in a collective for a host that is behind, so no host waits for another
to ask (JAX's ``PreemptionSyncManager`` works the same way, with its own thread). One agreement per
process: after it, and after a ``X``, every call is False.

Imports only what starting Python already loaded (``_socket``, ``_thread``, ``os``, ``sys``, ``time``): no
grpc, click, asyncio or numpy.
"""

import _socket
import _thread
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

ANSWER_MARGIN_S = 2.0
"""Beyond the notice's SECONDS, how long the listener waits for the agreement before it takes "no step"."""


class _Checkpoints:
    """This process's side of the agreement (``_CHECKPOINTS``); the listener thread starts on first use.

    ``lock`` is held by ``ask`` for a moment each call, and by the listener from a notice until the
    agreement (bounded): while it waits, the process's step stays where it said it was."""

    def __init__(self) -> None:
        self.lock = _thread.allocate_lock()
        self.last = -1
        """The last step this process was answered (False) for."""
        self.agreed = -1
        """The agreed step, once known (-1: none yet)."""
        self.done = False
        """True was answered, or there will be no agreement: False from now on."""
        self.started = False
        self.warned: set[str] = set()

    def ask(self, step: object) -> bool:
        if type(step) is not int or step < 0 or not self.last <= step <= MAX_STEP:
            checked = self._check(step)
            if checked is None:
                return False
            step = checked
        with self.lock:
            self.last = step
            agreed = self.agreed
            if agreed >= 0 and step >= agreed and not self.done:
                self.done = True
                return True
            if self.started:
                return False
            self.started = True
        self._start()
        return False

    def _start(self) -> None:
        state_dir = os.environ.get("TPUCTL_STATE_DIR", "").strip()
        if not state_dir:
            return  # not under tpuctl: never a notice
        generation = os.environ.get("TPUCTL_GENERATION", "0").strip()
        gen = int(generation) if generation.isdigit() and len(generation) < 10 else 0
        path = os.path.join(state_dir, SOCKET_NAME)
        with _GUARD:
            if not _AT_FORK:
                _AT_FORK.append(True)
                os.register_at_fork(after_in_child=_forget_in_child)
        _thread.start_new_thread(self._listen, (path, gen, os.getpid()))

    def _listen(self, path: str, gen: int, pid: int) -> None:
        """The listener thread: connect (again after the agent went away), say what it is, answer notices."""
        while True:
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            try:
                sock.settimeout(RECONNECT_S)
                sock.connect(path)
                sock.settimeout(None)  # a notice may come in an hour or never: the thread just waits
                sock.sendall(b"S 0 %d %d\n" % (gen, pid))
                self._serve(sock, gen, pid)
            except OSError:
                pass
            finally:
                sock.close()
            if self.done:
                return  # decided: nothing more to hear
            time.sleep(RECONNECT_S)

    def _serve(self, sock: "Any", gen: int, pid: int) -> None:
        lines = _Lines(sock)
        while True:
            line = lines.next()
            if line is None:
                return
            if line.startswith(b"N "):
                seconds = _seconds(line[2:])
                with self.lock:  # the process's next call waits here until the agreement
                    if self.done or self.agreed >= 0:
                        continue
                    sock.sendall(b"Q %d %d %d\n" % (self.last + 1, gen, pid))
                    sock.settimeout(seconds + ANSWER_MARGIN_S)
                    try:
                        answer = lines.next()
                    except OSError:
                        answer = None
                    sock.settimeout(None)
                    self._decided(answer)
                if answer is None:
                    return
            elif line.startswith((b"A ", b"X")):
                with self.lock:
                    self._decided(line)

    def _decided(self, line: "bytes | None") -> None:
        """The agreement (``A STEP``), or none: ``X``, a timeout, a closed connection (lock held)."""
        if line is not None and line.startswith(b"A ") and line[2:].isdigit():
            self.agreed = int(line[2:])
        else:
            self.done = True

    def _check(self, step: object) -> "int | None":
        """``step`` as an int, or None after saying once what is wrong with it."""
        import contextlib  # here: off the per-step path

        if type(step) is not int and type(step) is not bool and hasattr(type(step), "__index__"):
            with contextlib.suppress(Exception):  # a foreign object's conversion: what it gave is reported below
                step = step.__index__()  # type: ignore[attr-defined]
        if type(step) is int and step >= 0 and self.last <= step <= MAX_STEP:
            return step
        if type(step) is not int:
            mistake, text = "type", f"a step must be an int, got {step!r:.60} ({type(step).__name__})"
        elif step < 0 or step > MAX_STEP:
            mistake, text = "range", f"a step must be between 0 and {MAX_STEP:,}, got {step:,}"
        else:
            mistake, text = "backwards", f"step {step:,} is below step {self.last:,}, asked before"
        if mistake not in self.warned:
            self.warned.add(mistake)
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(f"tpuctl.job.should_checkpoint: {text}; answered False (said once)\n")
        return None


class _Lines:
    """Lines from a socket (at most 64 bytes each: the agent's are short)."""

    def __init__(self, sock: "Any") -> None:
        self.sock = sock
        self.buffer = b""

    def next(self) -> "bytes | None":
        while b"\n" not in self.buffer:
            data = self.sock.recv(256)
            if not data or len(self.buffer) > 64:
                return None
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line


def _seconds(text: bytes) -> float:
    try:
        seconds = float(text)
    except ValueError:
        return 1.0
    return seconds if 0 < seconds < 3600 else 1.0


_GUARD = _thread.allocate_lock()
_AT_FORK: list[bool] = []
_CHECKPOINTS = _Checkpoints()


def _forget_in_child() -> None:
    """A forked child has no listener thread (and may hold a copy of a held lock): it starts over."""
    global _CHECKPOINTS
    _CHECKPOINTS = _Checkpoints()


def progress(step: int) -> None:
    """Tell this host's agent the job finished ``step`` (an int that only grows). Never blocks, never
    raises; costs about one ``socket.send``. The watchdog is armed by the first report."""
    _REPORTER.send(b"P", step)


def checkpointed(step: int) -> None:
    """Tell this host's agent a checkpoint of ``step`` is complete (durable): work after it is what a
    failure loses."""
    _REPORTER.send(b"C", step)


def should_checkpoint(step: int) -> bool:
    """Whether to checkpoint now, at ``step``: True exactly once, on every host at the same step, after a
    preemption notice (the first step every host can still reach: the agreed step); False otherwise, and
    always without tpuctl. Call it every step with the step just finished, save when it is True, report
    ``checkpointed(step)`` and exit::

        for step in range(first, steps):
            train_step()
            if tpuctl.job.should_checkpoint(step):
                save(step)
                tpuctl.job.checkpointed(step)
                sys.exit(0)

    Without a notice it costs a lock taken and given back (no system call). After a notice the first
    call waits until every host's job said where it stands (at most the notice's agreement bound: a third
    of its time, at most 10 s); when there is no agreement (a host did not answer in time) it is False,
    and the job gets SIGTERM and ``tpuctl run --grace`` as without it. Never raises; a step that is not
    an ``int``, is negative or goes backwards is said once on stderr and answered False."""
    return _CHECKPOINTS.ask(step)


def _reset_for_tests() -> None:
    """Forget the socket, the last steps and the warnings (a test that changes the environment)."""
    global _REPORTER, _CHECKPOINTS
    _REPORTER._close()
    _REPORTER = _Reporter()
    _CHECKPOINTS = _Checkpoints()
