"""Starting a host's agent: resolve what ``tpuctl init`` was asked, fork the agent, relay its progress.

``launch`` forks the agent (it keeps the spec already loaded: no second interpreter start), detaches
it into its own session with its output in the state dir's log, and relays its JSON-line events from a
pipe until it reports ready or failed, within deadlines derived from the spec: the whole of init, the
phase the agent is in, and the agent's liveness (an agent silent for the heartbeat timeout, frozen by
SIGSTOP or stuck, is named as such and sent SIGTERM). ``run_foreground``
runs it attached instead. Callable without click; ``tpuctl init`` is a thin command over it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tpuctl.agent.options import AgentOptions
from tpuctl.agent.reporter import INIT_INTERRUPTED, Reporter
from tpuctl.agent.statedir import StateDir
from tpuctl.errors import DeadlineError, InterruptError, StateError, TpuctlError, error_from_payload
from tpuctl.logformat import JSON

if TYPE_CHECKING:
    from tpuctl.agent.logfile import LogContext

# Time init waits for its background agent beyond the spec's own deadlines (process start, imports).
STARTUP_SLACK_S = 30.0
INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What ends a waiting ``init`` (Ctrl-C, ``kill``, a lost ssh session), taking its agent with it."""
STOP_WAIT_S = 10.0
"""How long an interrupted init waits for its agent's answer (it tells the cluster within 2 s, then stops
its service within a second), then kills it."""
KILL_WAIT_S = 5.0
# Beyond a phase's own timeout (the service's verdict comes back within the client's RPC slack of 10 s).
PHASE_SLACK_S = 15.0
LOG_TAIL_LINES = 20


def refuse_if_running(state: StateDir) -> None:
    pid = state.live_pid()
    if pid is None:
        return
    try:
        info = state.read_info()
        what = f"cluster {info.cluster!r} as task {info.task}"
    except TpuctlError:
        what = "starting up"
    raise StateError(
        f"this host is already up: a tpuctl agent (pid {pid}) runs for state dir {state.path}, {what}",
        hint="`tpuctl status` shows the cluster; `tpuctl down` stops this host's agent first",
    )


def agent_log_level() -> int:
    """The agent's log level: ``TPUCTL_LOG_LEVEL`` (which ``--log-level`` and ``-v`` set), else info."""
    from tpuctl.errors import InputError
    from tpuctl.loglevel import AGENT_DEFAULT, LOG_LEVEL_ENV, chosen_level

    try:
        return chosen_level(None, 0, os.environ.get(LOG_LEVEL_ENV)) or AGENT_DEFAULT
    except InputError:  # the command checked it already; a child started otherwise keeps the default
        return AGENT_DEFAULT


def run_foreground(options: AgentOptions, reporter: Reporter) -> int:
    """``init --foreground``: run the agent in this process, logging to stderr, until it stops."""
    import asyncio

    from tpuctl.agent.bringup import Agent

    context = _configure_logging(options, None)
    agent = Agent(options, reporter)
    context.generation = lambda: agent.generation
    return asyncio.run(agent.run())


def _configure_logging(options: AgentOptions, path: Path | None) -> LogContext:
    """The agent's log at ``agent_log_level()``, in the spec's ``log_format`` (``init`` put its options and
    the environment's over it); the returned context names the cluster and task on JSON lines."""
    from tpuctl.agent.logfile import LogContext, configure_logging

    context = LogContext(options.spec.cluster, options.task)
    configure_logging(path, agent_log_level(), options.spec.log_format, context)
    return context


def launch(options: AgentOptions, progress: Callable[[str], None]) -> dict[str, object]:
    """Fork the agent (it keeps the spec already loaded here: no second interpreter start), detach it
    into its own session with its output in the state dir's log, and relay its progress until it
    reports ready or failed: the agent's summary (an ``InitSummary`` as the agent sent it).

    Interrupted (SIGINT, SIGTERM, SIGHUP: ``INTERRUPTS``) while it waits, init sends the agent
    ``INIT_INTERRUPTED`` and waits ``STOP_WAIT_S`` at most for its answer: it left (the cluster had not
    formed on this host) or it formed first and stays; ``InterruptError`` (exit 128 + the signal's
    number) says which. An agent that does not answer in time is killed."""
    state = options.state
    state.ensure()
    with _Interrupts() as interrupts:  # from before the fork: no moment where Ctrl-C leaves an agent behind
        read_fd, write_fd = os.pipe()
        # What the process writes to its stdout and stderr itself (a C library's messages) joins the text log;
        # a JSON log keeps only its JSON lines, and those go to agent.out beside it.
        output = state.log_file if options.spec.log_format != JSON else state.output_file
        log_fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the agent
            code = 1
            try:
                interrupts.forget()
                os.close(read_fd)
                os.setsid()
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(log_fd, 1)
                os.dup2(log_fd, 2)
                code = _agent_child(options, write_fd)
            finally:
                os._exit(code)
        os.close(write_fd)
        os.close(log_fd)
        wait = _Wait(options, pid)
        return _relay(options, pid, _events(read_fd, wait.until, interrupts.fd), wait, progress)


def _relay(
    options: AgentOptions, pid: int, events: Iterator[dict[str, object]], wait: _Wait, progress: Callable[[str], None]
) -> dict[str, object]:
    """The agent's events to ``progress`` until its outcome (see ``launch``)."""
    for message in events:
        event = message.get("event")
        if event == "interrupted":
            if wait.interrupted is None:
                wait.interrupt(int(str(message.get("signal"))))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, INIT_INTERRUPTED)
            continue
        wait.heard()
        if event == "progress":
            progress(str(message.get("text", "")))
        elif event == "phase":
            wait.enter(str(message.get("phase", "")), message.get("limit"))
        elif event == "ready":
            summary = message.get("summary")
            if wait.interrupted is not None:
                raise wait.formed_first()
            return dict(summary) if isinstance(summary, dict) else {}
        elif event == "failed":
            if wait.interrupted is not None:
                raise _stopped_agent(pid, wait)
            _reap(pid, wait.deadline)
            error = message.get("error")
            raise error_from_payload(error if isinstance(error, dict) else {})
    if wait.interrupted is not None:
        raise _stopped_agent(pid, wait)
    exit_code = _reap(pid, time.monotonic() + 0.1)  # the pipe closed as it exited, or it is silent
    if exit_code is None and wait.until() <= time.monotonic():  # still there, but silent or out of time
        os.kill(pid, signal.SIGTERM)  # it leaves the cluster cleanly (a stopped agent: once continued)
        raise wait.overrun()
    if exit_code is None:
        exit_code = _reap(pid, wait.deadline)
    raise StateError(
        f"task {options.task}: the tpuctl agent exited (code {exit_code}) before the cluster was up",
        hint=f"its log {options.state.log_file} ends with:\n" + _tail(Path(options.state.log_file)),
    )


def _stopped_agent(pid: int, wait: _Wait) -> InterruptError:
    """Init was interrupted and its agent answered that it leaves (or said nothing): reap it within what is
    left of ``STOP_WAIT_S``, killing it if it is still there; the error to exit with."""
    if _reap(pid, max(wait.until(), time.monotonic() + 0.1)) is not None:
        return wait.stopped()
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _reap(pid, time.monotonic() + KILL_WAIT_S)
    return wait.stopped(killed=True)


class _Interrupts:
    """While ``init`` waits for its agent: SIGINT, SIGTERM and SIGHUP are caught (not raised where they
    strike: the wait goes on, to stop the agent) and their numbers written to a pipe, ``fd``, that the wait
    selects on beside the agent's (``signal.set_wakeup_fd``). Only the main thread can catch signals:
    elsewhere ``fd`` is None and nothing changes."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self._write_fd = -1
        self._previous: dict[int, object] = {}
        self._previous_wakeup = -1

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is not threading.main_thread():
            return self
        self.fd, self._write_fd = os.pipe()
        for fd in (self.fd, self._write_fd):
            os.set_blocking(fd, False)
        self._previous_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._previous = {sig: signal.signal(sig, _noted) for sig in INTERRUPTS}
        return self

    def forget(self) -> None:
        """In the forked agent: the default handlers (until its own), no wakeup pipe."""
        if self.fd is None:
            return
        signal.set_wakeup_fd(-1)
        for sig in INTERRUPTS:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        for fd in (self.fd, self._write_fd):
            os.close(fd)
        self.fd = None

    def __exit__(self, *exc: object) -> None:
        if self.fd is None:
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]  # what signal.signal returned
        signal.set_wakeup_fd(self._previous_wakeup)
        for fd in (self.fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fd = None


def _noted(signum: int, frame: object) -> None:
    """A caught interruption: its number is on the wakeup pipe already; nothing to do here."""


class _Wait:
    """How long ``init`` waits for its agent: the whole of init (``_init_limit``), the phase the agent
    says it is in (its own timeout + ``PHASE_SLACK_S``), and the agent's liveness: an agent silent for
    longer than the heartbeat timeout is frozen or stuck (its peers have declared it failed by then)."""

    def __init__(self, options: AgentOptions, pid: int) -> None:
        self.options = options
        self.pid = pid
        now = time.monotonic()
        self.deadline = now + _init_limit(options)
        self.phase = "starting"
        self.phase_limit = STARTUP_SLACK_S
        self.phase_deadline = now + STARTUP_SLACK_S
        self.silence = options.spec.coordinator.heartbeat_timeout
        self.last_heard = now + STARTUP_SLACK_S - self.silence  # the first word may take the start-up
        self.interrupted: signal.Signals | None = None
        self.stop_by = 0.0

    def heard(self) -> None:
        self.last_heard = time.monotonic()

    def interrupt(self, signum: int) -> None:
        """Init was interrupted: from now on the wait is for the agent's answer, ``STOP_WAIT_S`` at most."""
        self.interrupted = signal.Signals(signum)
        self.stop_by = time.monotonic() + STOP_WAIT_S

    def stopped(self, *, killed: bool = False) -> InterruptError:
        assert self.interrupted is not None
        said = f"interrupted; stopped this host's agent (pid {self.pid}) before the cluster formed"
        if killed:
            said = (
                f"interrupted before the cluster formed; killed this host's agent (pid {self.pid}): it did not "
                f"stop within {STOP_WAIT_S:g} s"
            )
        return InterruptError(
            said,
            signal_number=self.interrupted,
            hint=f"its log: {self.options.state.log_file}" if killed else None,
        )

    def formed_first(self) -> InterruptError:
        assert self.interrupted is not None
        return InterruptError(
            f"interrupted after the cluster formed: this host's agent (pid {self.pid}) stays in it",
            signal_number=self.interrupted,
            hint="`tpuctl status` shows the cluster; `tpuctl down` stops this host's agent",
        )

    def enter(self, phase: str, limit: object) -> None:
        seconds = float(limit) if isinstance(limit, (int, float)) and 0 <= limit < 1e9 else 0.0
        self.phase, self.phase_limit = phase or "?", seconds + PHASE_SLACK_S
        self.phase_deadline = time.monotonic() + self.phase_limit

    def until(self) -> float:
        """When to stop waiting unless the agent says something first (interrupted: for its answer)."""
        if self.interrupted is not None:
            return self.stop_by
        return min(self.deadline, self.phase_deadline, self.last_heard + self.silence)

    def overrun(self) -> TpuctlError:
        """Why the wait ended without an outcome (the agent was sent SIGTERM)."""
        task, state = self.options.task, self.options.state
        tail = f"its log {state.log_file} ends with:\n" + _tail(Path(state.log_file))
        now = time.monotonic()
        if now >= self.last_heard + self.silence and now < min(self.deadline, self.phase_deadline):
            stopped = _stopped(self.pid)
            how = "frozen (stopped by a signal: SIGSTOP, a debugger or job control)" if stopped else "stuck"
            return StateError(
                f"task {task}: this host's tpuctl agent (pid {self.pid}) is {how}: no word from it for "
                f"{now - self.last_heard:.1f} s during {self.phase}, more than the heartbeat timeout "
                f"({self.silence:g} s), so the cluster counts this host as failed; sent it SIGTERM "
                + ("(it leaves when continued)" if stopped else "(it leaves the cluster)"),
                hint="`kill -CONT` a stopped agent, or check this host's load; " + tail,
            )
        if self.phase_deadline < self.deadline:
            return DeadlineError(
                f"task {task}: {self.phase} did not end within {self.phase_limit:.0f} s (its timeout and "
                f"{PHASE_SLACK_S:.0f} s slack); stopped this host's agent",
                hint=tail,
            )
        return DeadlineError(
            f"task {task}: the cluster was not up within {_init_limit(self.options):.0f} s; stopped this host's agent",
            hint=tail,
        )


def _stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP, SIGTSTP, a tracer): state T or t in /proc (False where unknown)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat_line = handle.read(4096)
    except OSError:
        return False
    # "PID (COMM) STATE ...": COMM may hold spaces and parentheses, so read after the last ")"
    fields = stat_line[stat_line.rfind(b")") + 1 :].split()
    return bool(fields) and fields[0] in (b"T", b"t")


def _init_limit(options: AgentOptions) -> float:
    """The longest init can take: registration, three cluster-wide waits (core IDs, creation time, the
    final barrier), a real backend's probe, and slack for process start-up."""
    from tpuctl.backends.probe import PROBE_TIMEOUT_S

    spec = options.spec
    probe = PROBE_TIMEOUT_S if spec.backend != "sim" else 0.0
    return spec.coordinator.register_timeout + 3 * spec.barrier_timeout + probe + STARTUP_SLACK_S


def _events(fd: int, until: Callable[[], float], interrupts: int | None = None) -> Iterator[dict[str, object]]:
    """The agent's JSON-line events until it closes the pipe or ``until()`` (asked again after every
    event) passes; with ``interrupts`` (``_Interrupts.fd``), ``{"event": "interrupted", "signal": N}`` for
    each interruption caught meanwhile."""
    buffer = b""
    watched = [fd] if interrupts is None else [fd, interrupts]
    try:
        while True:
            left = until() - time.monotonic()
            if left <= 0:
                return
            ready = select.select(watched, [], [], left)[0]
            if interrupts in ready:
                for signum in os.read(interrupts, 64):
                    if signum in INTERRUPTS:
                        yield {"event": "interrupted", "signal": signum}
                continue
            if not ready:
                return
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                event = json.loads(line)
                if isinstance(event, dict):  # the agent sends objects only
                    yield event
    finally:
        os.close(fd)


def _agent_child(options: AgentOptions, write_fd: int) -> int:
    import asyncio

    from tpuctl.agent.bringup import Agent
    from tpuctl.agent.reporter import PipeReporter

    context = _configure_logging(options, Path(options.state.log_file))
    reporter = PipeReporter(os.fdopen(write_fd, "w"))
    try:
        agent = Agent(options, reporter)
        context.generation = lambda: agent.generation
        reporter.on_gone = lambda: agent.init_gone("its tpuctl init went away")
        return asyncio.run(agent.run())
    except TpuctlError as exc:  # before the bring-up (the state dir's lock or pid file)
        reporter.failed(exc)
        return exc.exit_code
    except BaseException as exc:  # never let the child fall back into click's code
        import logging

        logging.getLogger("tpuctl.agent.bringup").exception("agent crashed: %s", exc)
        reporter.failed(StateError(f"task {options.task}: the tpuctl agent crashed: {exc!r}"))
        return 1


def _reap(pid: int, deadline: float) -> int | None:
    """The agent's exit code once it has exited (it exits right after reporting a failure)."""
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    return None


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-LOG_TAIL_LINES:]) or "(empty log)"
