"""``tpuctl run [--] CMD ...``: run a job with the cluster's environment, and stop it when the cluster fails.

The job runs in its own process group with this host's job environment (``tpuctl env``) on top of ours.
A thread long-polls this host's agent (``wait_error``); when a host fails, the cluster is shut down, or
the agent itself disappears, the job's process group gets SIGTERM, then SIGKILL after ``--grace``, and
``tpuctl run`` exits 3 with a root-cause table on stderr. Otherwise it returns the job's exit code
(128 + N when the job died of signal N). SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to
``tpuctl run`` are forwarded to the job's process group; after a forwarded SIGTERM the job also gets
SIGKILL when it is still running ``--grace`` later (TensorFlow catches SIGTERM and keeps going).

On a terminal, the job's group becomes the terminal's foreground group, so the job reads the terminal
and Ctrl-C / Ctrl-Z reach it as they would without tpuctl.

Imports neither grpc, tensorflow, jax nor numpy (a test checks it): the agent does the cluster work.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import click

from tpuctl.agent.statedir import StateDir, resolve_state_dir
from tpuctl.cli.common import parse_duration_option, say, state_dir_option
from tpuctl.errors import EXIT_CLUSTER, TpuctlError

POLL_S = 10.0  # one wait_error long-poll; a new one starts at once
CALL_MARGIN_S = 10.0  # beyond the long-poll, before an unanswered call counts as a failure
RETRIES = 3  # consecutive failed calls to a live agent before it counts as gone
RETRY_DELAY_S = 0.5
STATUS_TIMEOUT_S = 5.0
STRAGGLER_KILL_WAIT_S = 10.0
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127


@click.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option(
    "--grace",
    metavar="DURATION",
    default="10s",
    show_default=True,
    help="After SIGTERM, how long the job may take to exit before SIGKILL.",
)
@state_dir_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED, metavar="[--] CMD [ARGS]...")
def run(grace: str, state_dir: str | None, command: tuple[str, ...]) -> int:
    """Run CMD with this host's job environment (see `tpuctl env`) and watch the cluster.

    \b
      tpuctl run -- python train.py --steps 1000
      tpuctl run --state-dir /tmp/tpuctl-sim-$UID/host-1 -- python job.py
    When any host fails (or the cluster is shut down, or this host's agent disappears), the job gets
    SIGTERM, then SIGKILL after --grace, and the exit code is 3 with a root-cause table on stderr:
    which host failed first, when, why; then every other host. Otherwise the exit code is the job's
    (128+N for signal N; 127 command not found, 126 not executable). Signals are forwarded to the job.
    """
    seconds = parse_duration_option(grace, "--grace")
    assert seconds is not None
    state = resolve_state_dir(state_dir)
    return JobRunner(list(command), state, grace=seconds).run()


# --- what the watcher found ------------------------------------------------------------------------


@dataclass
class ClusterDown:
    """Why the job must stop: the agent's ``wait_error`` report, or the agent being gone."""

    report: dict[str, Any]
    agent_gone: str | None = None
    noticed_at: float = field(default_factory=time.time)


def _process_alive(pid: int) -> bool:
    """Alive and not a zombie (a killed agent nobody reaped yet still answers kill -0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


class Watcher(threading.Thread):
    """Long-polls the agent until the cluster errs, shuts down, or the agent goes away."""

    def __init__(self, state: StateDir, agent_pid: int | None, on_down: Callable[[ClusterDown], None]) -> None:
        super().__init__(name="tpuctl-run-watcher", daemon=True)
        self.state = state
        self.agent_pid = agent_pid
        self.on_down = on_down
        self.stopped = threading.Event()

    def run(self) -> None:
        from tpuctl.agent.control import call

        failures = 0
        while not self.stopped.is_set():
            try:
                report = call(self.state, "wait_error", {"timeout": POLL_S}, timeout=POLL_S + CALL_MARGIN_S)
            except TpuctlError as exc:
                if self.stopped.is_set():
                    return
                failures += 1
                alive = self.agent_pid is not None and _process_alive(self.agent_pid)
                if alive and failures < RETRIES:
                    self.stopped.wait(RETRY_DELAY_S)
                    continue
                pid = f" (pid {self.agent_pid})" if self.agent_pid else ""
                what = "is not answering" if alive else "is gone"
                self.on_down(ClusterDown({}, agent_gone=f"this host's tpuctl agent{pid} {what}: {exc.message}"))
                return
            failures = 0
            if report.get("error") or report.get("shutdown") or report.get("stopping"):
                self.on_down(ClusterDown(report))
                return


# --- the root-cause table --------------------------------------------------------------------------


def _clock(when: float | None) -> str:
    if when is None:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(when)) + f".{int(when * 1000) % 1000:03d}"


def headline(down: ClusterDown, info: dict[str, Any]) -> str:
    """One line: what happened to the cluster, naming the host that failed first."""
    report = down.report
    cluster = info.get("cluster", "?")
    when = _clock(report.get("detected_at") or down.noticed_at)
    if down.agent_gone:
        return f"cluster {cluster!r}: task {info.get('task')}: {down.agent_gone}, detected at {when}"
    failures = report.get("failures") or []
    if failures:
        first = failures[0]
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        return (
            f"cluster {cluster!r} failed: task {first.get('task')} ({first.get('address')}) failed first{more}, "
            f"detected at {when}: {first.get('cause')}"
        )
    if report.get("error"):
        return f"cluster {cluster!r} failed, detected at {when}: {report['error']}"
    if report.get("shutdown"):
        return f"cluster {cluster!r} was shut down (tpuctl down --all), at {when}"
    return f"cluster {cluster!r}: this host's agent is stopping (tpuctl down), at {when}"


def root_cause_rows(
    down: ClusterDown, info: dict[str, Any], status: dict[str, Any] | None, status_at: float
) -> list[tuple[str, ...]]:
    """Rows of the table: the failed hosts in the order the service declared them, then every other host."""
    report = down.report
    me = info.get("task")
    hosts = list(info.get("hosts") or [])
    known = {int(t["task"]): t for t in (status or {}).get("tasks", []) if isinstance(t.get("task"), int)}
    failed: list[tuple[int, str, str, str]] = []  # task, address, state, cause
    for failure in report.get("failures") or []:
        task = int(failure.get("task", -1))
        state = str(known.get(task, {}).get("state") or "failed")
        failed.append((task, str(failure.get("address", "?")), state, str(failure.get("cause", ""))))
    if not failed and down.agent_gone and isinstance(me, int):
        pid = f" (pid {info['pid']})" if info.get("pid") else ""
        failed.append((me, str(info.get("address", "?")), "agent gone", f"its tpuctl agent{pid} is gone (this host)"))
    if not failed and report.get("error_type") == "CoordinatorUnreachable" and hosts:
        failed.append((0, hosts[0], "unreachable", "its coordinator stopped answering this host"))

    def last_heartbeat(task: int) -> str:
        age = known.get(task, {}).get("heartbeat_age")
        return "-" if age is None else _clock(status_at - float(age))

    rows: list[tuple[str, ...]] = [("#", "TASK", "ADDRESS", "STATE", "LAST HEARTBEAT", "CAUSE")]
    for order, (task, address, state, cause) in enumerate(failed, 1):
        rows.append((str(order), str(task), address, state, last_heartbeat(task), _short(cause)))
    listed = {entry[0] for entry in failed}
    for task, address in enumerate(hosts):
        if task in listed:
            continue
        entry = known.get(task, {})
        state = str(entry.get("state") or "unknown")
        cause = str(entry.get("cause") or "")
        if task == me:
            cause = (cause + "; " if cause else "") + "this host"
        rows.append(("", str(task), address, state, last_heartbeat(task), _short(cause)))
    return rows


def format_rows(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  " + "  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def _short(text: str, limit: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def root_cause_table(down: ClusterDown, info: dict[str, Any], status: dict[str, Any] | None, status_at: float) -> str:
    return headline(down, info) + "\n" + format_rows(root_cause_rows(down, info, status, status_at))


# --- running the job -------------------------------------------------------------------------------


class JobRunner:
    """One job under ``tpuctl run``: start, watch, forward signals, stop, report."""

    def __init__(self, command: list[str], state: StateDir, *, grace: float) -> None:
        self.command = command
        self.state = state
        self.grace = grace
        self.wake = threading.Event()
        self.exited = threading.Event()
        self.down: ClusterDown | None = None
        self.status: int | None = None  # the job's wait status
        self.proc: subprocess.Popen[bytes] | None = None
        self.tty: int | None = None
        self.pending: list[int] = []
        self.term_deadline: float | None = None

    # --- entry ----------------------------------------------------------------------------------

    def run(self) -> int:
        from tpuctl.agent.control import call
        from tpuctl.cli.env import INFO_TIMEOUT_S, cluster_job_env
        from tpuctl.spec import hostenv

        info = call(self.state, "info", timeout=INFO_TIMEOUT_S)
        self.info = info
        report = call(self.state, "wait_error", {"timeout": 0}, timeout=INFO_TIMEOUT_S)
        if report.get("error") or report.get("shutdown") or report.get("stopping"):
            down = ClusterDown(report)
            say("tpuctl: error: " + self._table(down))
            say("tpuctl: the job was not started")
            return EXIT_CLUSTER
        environ = cluster_job_env(self.state, info=info).apply(hostenv.environ())
        agent_pid = info.get("pid") if isinstance(info.get("pid"), int) else self.state.live_pid()
        previous = {sig: signal.signal(sig, self._on_signal) for sig in FORWARDED}
        try:
            try:
                self.proc = self._spawn(environ)
            except OSError as exc:
                code = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOT_EXECUTABLE
                say(f"tpuctl: error: cannot run {self.command[0]!r}: {exc.strerror or exc}")
                return code
            for sig in self.pending:
                self._forward(sig)
            waiter = threading.Thread(target=self._reap, name="tpuctl-run-reaper", daemon=True)
            waiter.start()
            watcher = Watcher(self.state, agent_pid, self._on_down)
            watcher.start()
            try:
                return self._supervise()
            finally:
                watcher.stopped.set()
        finally:
            self._take_terminal_back()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _supervise(self) -> int:
        while True:
            self.wake.wait(timeout=1.0)
            self.wake.clear()
            if self.exited.is_set():
                return self._finished()
            if self.down is not None:
                return self._stop_for(self.down)
            if self.term_deadline is not None and time.monotonic() >= self.term_deadline:
                self.term_deadline = None
                self._kill_group(signal.SIGKILL)

    # --- the job process ------------------------------------------------------------------------

    def _spawn(self, environ: dict[str, str]) -> subprocess.Popen[bytes]:
        self.tty = _foreground_tty()
        tty = self.tty

        def child_setup() -> None:  # runs in the child between fork and exec
            os.setpgid(0, 0)
            if tty is not None:
                old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
                try:
                    os.tcsetpgrp(tty, os.getpgrp())
                finally:
                    signal.signal(signal.SIGTTOU, old)

        return subprocess.Popen(self.command, env=environ, preexec_fn=child_setup)

    def _reap(self) -> None:
        """Wait for the job (and follow it through Ctrl-Z on a terminal); runs in its own thread."""
        assert self.proc is not None
        pid = self.proc.pid
        while True:
            try:
                _, status = os.waitpid(pid, os.WUNTRACED)
            except ChildProcessError:
                status = 0
            except InterruptedError:  # pragma: no cover - PEP 475 retries
                continue
            if os.WIFSTOPPED(status):
                self._job_stopped(os.WSTOPSIG(status))
                continue
            self.status = status
            self.proc.returncode = os.waitstatus_to_exitcode(status)
            self.exited.set()
            self.wake.set()
            return

    def _job_stopped(self, stopsig: int) -> None:
        """The job stopped for its terminal (Ctrl-Z, or reading it from the background): stop too, so the
        shell sees this job stopped and gets its terminal back. When continued (``fg`` or ``bg``), give
        the job the terminal if this process is in the foreground again, and continue it."""
        job_control = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
        if self.proc is None or stopsig not in job_control or not _stdin_is_tty():
            return  # stopped by someone else (SIGSTOP): theirs to continue
        self._take_terminal_back()
        # SIGSTOP stops the whole process; sent to this thread, it also stops this thread before it goes on
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        self.tty = _foreground_tty()
        if self.tty is not None:
            with contextlib.suppress(OSError):
                _set_foreground(self.tty, self.proc.pid)
        self._kill_group(signal.SIGCONT)

    def _take_terminal_back(self) -> None:
        if self.tty is not None:
            with contextlib.suppress(OSError):
                _set_foreground(self.tty, os.getpgrp())

    def _kill_group(self, sig: int) -> bool:
        """Signal the job's process group; False when it has no process left."""
        if self.proc is None:
            return False
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:  # pragma: no cover - a member changed its credentials
            return True
        return True

    def _group_alive(self) -> bool:
        return self._kill_group(0)

    # --- signals --------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.proc is None:
            self.pending.append(signum)
            return
        self._forward(signum)

    def _forward(self, signum: int) -> None:
        self._kill_group(signum)
        if signum == signal.SIGTERM and self.term_deadline is None:
            self.term_deadline = time.monotonic() + self.grace
            self.wake.set()

    # --- outcomes -------------------------------------------------------------------------------

    def _on_down(self, down: ClusterDown) -> None:
        self.down = down
        self.wake.set()

    def _exit_code(self) -> int:
        assert self.proc is not None and self.proc.returncode is not None
        code = self.proc.returncode
        return 128 - code if code < 0 else code

    def _finished(self) -> int:
        code = self._exit_code()
        if code == 0 or self.down is not None:
            return code if self.down is None else self._report(self.down, f"the job exited with code {code}")
        # The job failed on its own: was it because the cluster did? Say so if the agent knows.
        from tpuctl.agent.control import call

        try:
            report = call(self.state, "wait_error", {"timeout": 0}, timeout=STATUS_TIMEOUT_S)
        except TpuctlError:
            return code
        if report.get("error"):
            return self._report(ClusterDown(report), f"the job exited with code {code}")
        return code

    def _stop_for(self, down: ClusterDown) -> int:
        assert self.proc is not None
        started = time.monotonic()
        self._kill_group(signal.SIGTERM)
        how = "SIGTERM"
        if not self.exited.wait(self.grace):
            self._kill_group(signal.SIGKILL)
            how = f"SIGTERM, then SIGKILL after {self.grace:g} s"
            self.exited.wait(STRAGGLER_KILL_WAIT_S)
        # what is left of the job's process group (children the job started) goes too
        deadline = started + self.grace
        while self._group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._kill_group(signal.SIGKILL) and how == "SIGTERM":
            how = "SIGTERM (leftover processes of its group: SIGKILL)"
        took = time.monotonic() - started
        if self.exited.is_set():
            stopped = (
                f"stopped the job (pid {self.proc.pid}) with {how}: exited in {took:.1f} s, code {self._exit_code()}"
            )
        else:  # pragma: no cover - SIGKILL did not end it (uninterruptible sleep)
            stopped = f"could not stop the job (pid {self.proc.pid}) with {how} within {took:.1f} s"
        return self._report(down, stopped)

    def _report(self, down: ClusterDown, stopped: str) -> int:
        say("tpuctl: error: " + self._table(down))
        say(f"tpuctl: task {self.info.get('task')}: {stopped}")
        return EXIT_CLUSTER

    def _table(self, down: ClusterDown) -> str:
        from tpuctl.agent.control import call

        status: dict[str, Any] | None = None
        if not down.agent_gone:
            with contextlib.suppress(TpuctlError):
                status = call(self.state, "status", timeout=STATUS_TIMEOUT_S)
        return root_cause_table(down, self.info, status, time.time())


def _stdin_is_tty() -> bool:
    try:
        return os.isatty(0)
    except OSError:  # pragma: no cover - stdin closed
        return False


def _foreground_tty() -> int | None:
    """stdin's terminal when this process group is its foreground group (an interactive shell), else None."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None


def _set_foreground(fd: int, pgid: int) -> None:
    if threading.current_thread() is threading.main_thread():
        old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            os.tcsetpgrp(fd, pgid)
        finally:
            signal.signal(signal.SIGTTOU, old)
    else:
        # signal.signal works only in the main thread; block SIGTTOU in this thread instead
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
        try:
            os.tcsetpgrp(fd, pgid)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTTOU})
