"""``tpuctl sim run -- CMD``: CMD under ``tpuctl run`` on every simulated host at once, one output.

One ``tpuctl run --state-dir ROOT/host-N -- CMD`` per host, each in a session of its own with stdin from
``/dev/null`` (so no two of them fight over the terminal, and a Ctrl-C reaches each one once, from here).
Each line a host's job writes is printed as ``[task N] line`` on the same stream (stdout or stderr), whole
lines only, a line longer than :data:`MAX_LINE` split into pieces each prefixed. SIGINT, SIGTERM and
SIGHUP are forwarded to every ``tpuctl run`` (which forwards them to its job); ``grace`` plus
:data:`KILL_MARGIN_S` after the first, any ``tpuctl run`` still running gets SIGKILL. With ``timeout``,
the jobs get SIGTERM when it runs out and the result is exit 4.

The exit code is the highest of the hosts' (0 only when every job exited 0; 3 when the cluster failed
under one of them), 4 on ``timeout``, 130 after Ctrl-C. Every wait has a deadline once a stop began.

A simulated host has no TPU: unless set, ``JAX_PLATFORMS=cpu``, ``JAX_NUM_CPU_DEVICES`` (the host's device
count) and ``JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo`` are set, so a JAX job sees the host's devices as CPU
devices and its cross-process collectives work.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tpuctl.agent.statedir import StateDir, live_pids
from tpuctl.errors import EXIT_DEADLINE, EXIT_INTERRUPTED, StateError
from tpuctl.sim.status import host_dirs, no_sim

MAX_LINE = 64 * 1024  # bytes of one output line before it is split
KILL_MARGIN_S = 10.0  # beyond --grace, for `tpuctl run` to stop its job and exit, before SIGKILL
READER_JOIN_S = 5.0  # after a host's process ended, for its last output to be printed
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True)
class HostResult:
    task: int
    code: int | None  # None: still running when given up on (SIGKILL did not end it)
    seconds: float


def host_environment(state: StateDir, environ: dict[str, str]) -> dict[str, str]:
    """``environ`` for the job on one simulated host: a CPU stand-in for its TPU devices, unless set."""
    env = dict(environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("JAX_CPU_COLLECTIVES_IMPLEMENTATION", "gloo")  # JAX 0.10's default; older ones had none
    if "JAX_NUM_CPU_DEVICES" not in env:
        try:
            info = state.read_info()
            from tpuctl.tpu.slice import resolve_slice

            env["JAX_NUM_CPU_DEVICES"] = str(resolve_slice(accelerator=info.accelerator).devices_per_host)
        except Exception:  # an agent.json from another version, a spec slice: JAX's default then
            pass
    return env


class SimRun:
    """CMD on every host under ``root``; :meth:`run` returns the exit code."""

    def __init__(
        self,
        root: Path,
        command: list[str],
        *,
        grace: float,
        timeout: float | None,
        say: Callable[[str], None],
        tpuctl: list[str] | None = None,
    ) -> None:
        self.root = root
        self.command = command
        self.grace = grace
        self.timeout = timeout
        self.say = say
        self.tpuctl = tpuctl or [sys.executable, "-m", "tpuctl"]
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.signals: list[int] = []
        self.procs: list[tuple[int, subprocess.Popen[bytes]]] = []

    def hosts(self) -> list[tuple[int, StateDir]]:
        dirs = host_dirs(self.root)
        if not dirs:
            raise no_sim(self.root, "it has no host-N state dirs")
        states = [StateDir(path) for _, path in dirs]
        pids = live_pids(states)
        stopped = [task for (task, _), pid in zip(dirs, pids, strict=True) if pid is None]
        if len(stopped) == len(dirs):
            raise no_sim(self.root, f"none of its {len(dirs)} hosts' agents runs")
        if stopped:
            raise StateError(
                f"the agents of task(s) {', '.join(map(str, stopped[:10]))} under {self.root} are not running; "
                f"a job would fail on them",
                hint=f"see `tpuctl sim status --root {self.root}`; bring one back with `tpuctl sim restart TASK "
                f"--root {self.root}` (a cluster with restart policy rejoin), or all with `tpuctl sim down --root "
                f"{self.root}` and `tpuctl sim up`",
            )
        return [(task, state) for (task, _), state in zip(dirs, states, strict=True)]

    def run(self) -> int:
        hosts = self.hosts()
        started = time.monotonic()
        previous = {sig: signal.signal(sig, self._on_signal) for sig in FORWARDED}
        readers: list[threading.Thread] = []
        try:
            for task, state in hosts:
                argv = [*self.tpuctl, "run", "--grace", f"{self.grace:g}s", "--state-dir", str(state.path), "--"]
                proc = subprocess.Popen(
                    [*argv, *self.command],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=host_environment(state, dict(os.environ)),
                    start_new_session=True,
                )
                self.procs.append((task, proc))
                for pipe, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
                    assert pipe is not None
                    reader = threading.Thread(target=self._copy, args=(task, pipe, out), daemon=True)
                    reader.start()
                    readers.append(reader)
                for sig in self.signals:  # arrived while starting: the ones started so far have it
                    self._send(proc, sig)
            self.say(f"tpuctl: running on {len(hosts)} simulated hosts under {self.root}: {shlex.join(self.command)}")
            results, timed_out = self._wait(started)
            took = time.monotonic() - started  # the jobs' time: not the wait below for output left behind
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._kill_left()
        deadline = time.monotonic() + READER_JOIN_S
        for reader in readers:
            reader.join(max(0.0, deadline - time.monotonic()))
        return self._outcome(results, timed_out, took)

    # --- waiting ---------------------------------------------------------------------------------

    def _wait(self, started: float) -> tuple[list[HostResult], bool]:
        """Until every ``tpuctl run`` ended; once a stop began (a signal, ``timeout``), at most ``grace`` +
        :data:`KILL_MARGIN_S` before SIGKILL and :data:`KILL_MARGIN_S` more before giving up on them."""
        ends: dict[int, float] = {}
        timed_out = False
        kill_at: float | None = None
        give_up_at: float | None = None
        while True:
            now = time.monotonic()
            for task, proc in self.procs:
                if task not in ends and proc.poll() is not None:
                    ends[task] = now - started
            if len(ends) == len(self.procs):
                break
            if self.signals and kill_at is None:
                kill_at = now + self.grace + KILL_MARGIN_S
            if self.timeout is not None and not timed_out and now - started >= self.timeout:
                timed_out = True
                self.say(f"tpuctl: --timeout {self.timeout:g}s reached: stopping the jobs (SIGTERM)")
                self._forward(signal.SIGTERM)
                kill_at = min(kill_at or float("inf"), now + self.grace + KILL_MARGIN_S)
            if kill_at is not None and now >= kill_at and give_up_at is None:
                left = len(self.procs) - len(ends)
                self.say(
                    f"tpuctl: {left} hosts' `tpuctl run` still running {self.grace + KILL_MARGIN_S:g} s after the stop: SIGKILL"
                )
                self._kill_left()
                give_up_at = now + KILL_MARGIN_S
            if give_up_at is not None and now >= give_up_at:
                break
            self.wake.wait(0.1)
            self.wake.clear()
        results = [
            HostResult(task, proc.poll(), ends.get(task, time.monotonic() - started)) for task, proc in self.procs
        ]
        return results, timed_out

    def _outcome(self, results: list[HostResult], timed_out: bool, seconds: float) -> int:
        codes = [r.code for r in results]
        failed = [r for r in results if r.code != 0]
        if not failed:
            self.say(f"tpuctl: all {len(results)} tasks exited 0 in {seconds:.1f} s")
            return 0
        listed = ", ".join(
            f"task {r.task}: {'still running' if r.code is None else _code(r.code)}" for r in failed[:10]
        )
        more = f", and {len(failed) - 10} more" if len(failed) > 10 else ""
        self.say(f"tpuctl: {len(failed)} of {len(results)} tasks failed ({listed}{more}) in {seconds:.1f} s")
        if timed_out:
            return EXIT_DEADLINE
        if self.signals and self.signals[0] == signal.SIGINT:
            return EXIT_INTERRUPTED
        return max(_exit_code(c) for c in codes)

    # --- output ----------------------------------------------------------------------------------

    def _copy(self, task: int, pipe: IO[bytes], out: IO[str]) -> None:
        prefix = f"[task {task}] "
        try:
            while True:
                line = pipe.readline(MAX_LINE)
                if not line:
                    return
                text = line.decode(errors="replace").rstrip("\n")
                with self.lock:
                    out.write(prefix + text + "\n")
                    out.flush()
        except (OSError, ValueError):  # our stdout closed (a pipe into `head`): keep draining, print nothing
            while pipe.read(MAX_LINE):
                pass
        finally:
            pipe.close()

    # --- signals ---------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals.append(signum)
        self._forward(signum)
        self.wake.set()

    def _forward(self, signum: int) -> None:
        for _, proc in self.procs:
            self._send(proc, signum)

    @staticmethod
    def _send(proc: subprocess.Popen[bytes], signum: int) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signum)

    def _kill_left(self) -> None:
        for _, proc in self.procs:
            self._send(proc, signal.SIGKILL)


def _exit_code(code: int | None) -> int:
    if code is None:
        return 1
    return 128 - code if code < 0 else code


def _code(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit {code}"
