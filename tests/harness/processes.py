"""Real processes for a test: started here, logged to files, awaited with deadlines, ended here by PID.

Modelled on JAX's multi-process test harness (``jax/_src/test_multiprocess.py``): every process writes its
stdout and stderr to its own files in the test's tmp dir; when a test fails, pytest shows every open
harness's logs (the hook in ``tests/conftest.py``); a process is ended with SIGTERM, then SIGKILL after a
grace period; every wait has a deadline, and a condition is awaited by polling it, not by sleeping.

Only processes this harness started (``start``/``run``), or pids it was handed (``stop_pids``, and
``stop_recorded`` for agents and jobs that write their pids to files), are ever signalled, each by its pid.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

from tpuctl.processes import pid_alive

T = TypeVar("T")

TERM_GRACE_S = 5.0  # SIGTERM, then SIGKILL after this long
KILL_WAIT_S = 10.0  # how long a SIGKILLed process may take to go
POLL_S = 0.02
LOG_TAIL = 8000  # characters of each log file shown on failure


@dataclass(frozen=True)
class Finished:
    """A process that was awaited: its exit code (None: still running at the deadline) and its output."""

    label: str
    code: int | None
    out: str
    err: str
    seconds: float  # from its start to the end of the wait


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (tpuctl's own rule: :func:`tpuctl.processes.pid_alive`)."""
    return pid_alive(pid)


def state(pid: int) -> str | None:
    """The state letter of ``/proc/PID/stat``: R running, S sleeping, T stopped, Z zombie; None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def wait_until(
    condition: Callable[[], T],
    timeout: float,
    what: str,
    *,
    interval: float = POLL_S,
    logs: Callable[[], str] | None = None,
) -> T:
    """Poll ``condition`` until it returns a true value (returned) or ``timeout`` s pass (AssertionError)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            shown = f"\n{logs()}" if logs is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {value!r}){shown}")
        time.sleep(interval)


def stop_pids(pids: Iterable[int], grace: float = TERM_GRACE_S) -> list[int]:
    """SIGTERM each live pid, SIGKILL those still alive after ``grace`` s; returns the pids that needed SIGKILL."""
    live = [pid for pid in pids if alive(pid)]
    for pid in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline:
        time.sleep(POLL_S)
        live = [pid for pid in live if alive(pid)]
    for pid in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while any(alive(pid) for pid in live) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return live


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise OSError("no btime in /proc/stat")


def started_at(pid: int) -> float | None:
    """When the process started (seconds since the epoch, to the clock tick), or None when gone."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None
    return _boot_time() + ticks / os.sysconf("SC_CLK_TCK")


class Proc:
    """One process started by a :class:`Processes`; its stdout and stderr are the files ``out_path``/``err_path``."""

    def __init__(self, label: str, popen: subprocess.Popen[bytes], out_path: Path, err_path: Path) -> None:
        self.label = label
        self.popen = popen
        self.out_path = out_path
        self.err_path = err_path
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def send_signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    def err(self) -> str:
        return self.err_path.read_text(errors="replace")


class Processes:
    """The processes of one test (or one module's fixture), their log files under ``folder``.

    ``start`` a process in the background, ``wait`` for it with a deadline, ``run`` one to completion;
    ``close`` stops whatever still runs (SIGTERM, then SIGKILL after ``grace``). While open, a failing
    test shows :meth:`logs` (``tests/conftest.py``).
    """

    open_now: ClassVar[list[Processes]] = []

    def __init__(self, folder: Path, *, name: str = "processes", grace: float = TERM_GRACE_S) -> None:
        self.folder = folder
        self.name = name
        self.grace = grace
        self.procs: dict[str, Proc] = {}
        self.extra_logs: list[tuple[Path, str]] = []
        self.created = time.time()
        folder.mkdir(parents=True, exist_ok=True)
        Processes.open_now.append(self)

    def __getitem__(self, label: str) -> Proc:
        return self.procs[label]

    def _label(self, label: str) -> str:
        if label not in self.procs:
            return label
        n = 2
        while f"{label}-{n}" in self.procs:
            n += 1
        return f"{label}-{n}"

    def start(
        self,
        label: str,
        command: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path | str | None = None,
    ) -> Proc:
        """Start ``command`` (stdin from /dev/null, ``env`` added to this process's environment)."""
        label = self._label(label)
        out_path, err_path = self.folder / f"{label}.out", self.folder / f"{label}.err"
        with out_path.open("wb") as out, err_path.open("wb") as err:
            popen = subprocess.Popen(
                list(command),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                env={**os.environ, **env} if env is not None else None,
            )
        proc = Proc(label, popen, out_path, err_path)
        self.procs[label] = proc
        return proc

    def _proc(self, proc: Proc | str) -> Proc:
        return self.procs[proc] if isinstance(proc, str) else proc

    def wait(self, proc: Proc | str, timeout: float) -> Finished:
        """Wait up to ``timeout`` s for the process to end; ``code`` is None if it did not (it keeps running)."""
        proc = self._proc(proc)
        try:
            code: int | None = proc.popen.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            code = None
        return Finished(proc.label, code, proc.out(), proc.err(), time.monotonic() - proc.started)

    def wait_all(self, procs: Iterable[Proc | str], timeout: float) -> list[Finished]:
        """Wait for each of ``procs``, all within one deadline ``timeout`` s from now."""
        deadline = time.monotonic() + timeout
        return [self.wait(proc, deadline - time.monotonic() + 0.01) for proc in procs]

    def run(
        self,
        label: str,
        command: Sequence[str],
        *,
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
        cwd: Path | str | None = None,
    ) -> Finished:
        """Start ``command`` and wait for it; one still running after ``timeout`` s is stopped (``code`` None)."""
        proc = self.start(label, command, env=env, cwd=cwd)
        finished = self.wait(proc, timeout)
        if finished.code is None:
            self.stop(proc)
        return finished

    def wait_for_output(
        self, proc: Proc | str, needle: str, *, timeout: float, count: int = 1, stream: str = "err"
    ) -> str:
        """Wait until the process has written ``needle`` ``count`` times to its ``stream`` ("out" or "err")."""
        proc = self._proc(proc)
        path = proc.err_path if stream == "err" else proc.out_path

        def seen() -> str:
            text = path.read_text(errors="replace")
            return text if text.count(needle) >= count else ""

        return wait_until(seen, timeout, f"{proc.label} to print {needle!r} ({count}x)", logs=self.logs)

    def stop(self, *procs: Proc | str) -> None:
        """SIGTERM the given processes (all of this harness's when none), SIGKILL after the grace; reap them."""
        chosen = [self._proc(p) for p in procs] if procs else list(self.procs.values())
        running = [p for p in chosen if p.poll() is None]
        stop_pids([p.pid for p in running], self.grace)
        for proc in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=KILL_WAIT_S)

    def ours(self, pid: int) -> bool:
        """``pid`` is alive and started after this harness (a pid read from a stale file could be reused)."""
        started = started_at(pid)
        return alive(pid) and started is not None and started >= self.created - 1.0

    def include_logs(self, folder: Path, pattern: str) -> None:
        """Show the files matching ``folder.glob(pattern)`` (agent logs) with the processes' logs."""
        self.extra_logs.append((folder, pattern))

    def logs(self) -> str:
        parts = []
        for proc in self.procs.values():
            code = proc.poll()
            status = "running" if code is None else f"exit {code}"
            command = shlex.join(str(arg) for arg in proc.popen.args)  # type: ignore[union-attr]
            parts.append(f"=== {proc.label} (pid {proc.pid}, {status}): {command}")
            for name, path in (("stdout", proc.out_path), ("stderr", proc.err_path)):
                text = path.read_text(errors="replace") if path.exists() else ""
                if text:
                    parts.append(f"--- {name}\n{_tail(text)}")
        for folder, pattern in self.extra_logs:
            for path in sorted(folder.glob(pattern)):
                parts.append(f"=== {path.relative_to(folder)}\n{_tail(path.read_text(errors='replace'))}")
        return "\n".join(parts)

    def stop_recorded(self, pid_files: Iterable[Path]) -> None:
        """Stop the processes whose pids these files hold (agents, jobs: not started here, but by what was)."""
        pids = []
        for path in pid_files:
            with contextlib.suppress(OSError, ValueError):
                pids += [int(word) for word in path.read_text().split()]
        stop_pids([pid for pid in pids if self.ours(pid)], self.grace)

    def close(self) -> None:
        """Stop every process started here that still runs. Bounded in time."""
        try:
            self.stop()
        finally:
            if self in Processes.open_now:
                Processes.open_now.remove(self)


def _tail(text: str) -> str:
    return text if len(text) <= LOG_TAIL else f"[... {len(text) - LOG_TAIL} characters]\n{text[-LOG_TAIL:]}"


TPUCTL = [sys.executable, "-m", "tpuctl"]
