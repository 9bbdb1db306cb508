"""A simulated cluster (``tpuctl sim up``) and jobs started on its hosts with ``tpuctl run``, for the tests.

Every process is started here and ended here by PID: the ``tpuctl run`` processes (and their jobs' process
groups) by the pids recorded at start, the agents by ``tpuctl sim down`` and then by the pids they wrote.
Every wait has a deadline. Each process's stdout and stderr go to files under the cluster's root; ``logs()``
gathers them with the agents' logs, and the fixture prints them (pytest shows them when a test fails).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TPUCTL = [sys.executable, "-m", "tpuctl"]
JOBS_DIR = Path(__file__).resolve().parent


@dataclass
class Finished:
    label: str
    code: int | None
    out: str
    err: str
    seconds: float


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return False
    return fields[0] != "Z"


class SimCluster:
    """``tpuctl sim up ACCELERATOR --root ROOT``; ``run(task, ...)`` starts ``tpuctl run`` on host ``task``."""

    def __init__(self, root: Path, accelerator: str) -> None:
        self.root = root
        self.accelerator = accelerator
        self.procs: dict[str, tuple[subprocess.Popen[bytes], float]] = {}
        self.num_hosts = 0

    def up(self, timeout: float = 120.0) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [*TPUCTL, "sim", "up", self.accelerator, "--root", str(self.root)],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        (self.root / "sim-up.out").write_text(done.stdout)
        (self.root / "sim-up.err").write_text(done.stderr)
        assert done.returncode == 0, f"tpuctl sim up {self.accelerator} failed:\n{self.logs()}"
        self.num_hosts = len(list(self.root.glob("host-*")))

    def state(self, task: int) -> Path:
        return self.root / f"host-{task}"

    def info(self, task: int) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state(task) / "agent.json").read_text())
        return data

    def agent_pid(self, task: int) -> int:
        return int((self.state(task) / "agent.pid").read_text())

    def run(
        self, task: int, *command: str, label: str | None = None, grace: str = "5s", env: dict[str, str] | None = None
    ) -> str:
        """Start ``tpuctl run --state-dir ROOT/host-TASK -- COMMAND`` in the background; returns its label."""
        label = label or f"run-{task}"
        proc = subprocess.Popen(
            [*TPUCTL, "run", "--grace", grace, "--state-dir", str(self.state(task)), "--", *command],
            stdout=(self.root / f"{label}.out").open("wb"),
            stderr=(self.root / f"{label}.err").open("wb"),
            stdin=subprocess.DEVNULL,
            cwd=self.root,
            env={**os.environ, **(env or {})},
        )
        self.procs[label] = (proc, time.monotonic())
        return label

    def wait(self, label: str, timeout: float) -> Finished:
        proc, started = self.procs[label]
        try:
            code: int | None = proc.wait(timeout=max(0.0, started + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
        return Finished(
            label,
            code,
            (self.root / f"{label}.out").read_text(errors="replace"),
            (self.root / f"{label}.err").read_text(errors="replace"),
            time.monotonic() - started,
        )

    def wait_all(self, labels: list[str], timeout: float) -> list[Finished]:
        deadline = time.monotonic() + timeout
        return [self.wait(label, max(0.0, deadline - time.monotonic()) + 0.01) for label in labels]

    def logs(self) -> str:
        parts = []
        for path in sorted(self.root.glob("*.out")) + sorted(self.root.glob("*.err")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-6000:]}")
        for path in sorted(self.root.glob("host-*/agent.log")):
            parts.append(f"--- {path.parent.name}/agent.log\n{path.read_text(errors='replace')[-4000:]}")
        return "\n".join(parts)

    def close(self) -> None:
        for proc, _ in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
        # the jobs run in their own process groups, led by the job's pid (kept in ROOT/*.pid by job scripts)
        for pid_file in self.root.glob("*.pids"):
            for pid in (int(p) for p in pid_file.read_text().split()):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(
                [*TPUCTL, "sim", "down", "--root", str(self.root)],
                capture_output=True, timeout=30, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        for pid_file in self.root.glob("host-*/agent.pid"):
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


def result_line(finished: Finished) -> dict[str, Any]:
    """The job's ``RESULT {...}`` line."""
    for line in finished.out.splitlines():
        if line.startswith("RESULT "):
            data: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return data
    raise AssertionError(f"{finished.label} printed no RESULT line (exit {finished.code})")
