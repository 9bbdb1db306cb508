"""Real multi-process clusters on loopback for the tests: one ``tpuctl init`` process per host.

Every process is started here and ended here by PID (init processes, and the agents by the pids they
write). Per-process output and agent logs go to files under the test's tmp dir; ``logs()`` gathers them
and the fixture prints them (pytest shows them when a test fails).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tpuctl.agent.statedir import StateDir
from tpuctl.sim.cluster import free_port, loopback_hosts, stop_hosts
from tpuctl.tpu.slice import resolve_slice

TPUCTL = [sys.executable, "-m", "tpuctl"]


@dataclass
class Result:
    code: int | None
    out: str
    err: str


def spec_text(
    accelerator: str,
    hosts: list[str],
    port: int,
    *,
    cluster: str = "test-pod",
    heartbeat: str = "500ms",
    heartbeat_timeout: str = "3s",
    register_timeout: str = "30s",
    barrier_timeout: str = "30s",
    job_ports: str = "",
    extra: str = "",
) -> str:
    host_lines = "\n".join(f"  - {h}" for h in hosts)
    return (
        f"cluster: {cluster}\naccelerator: {accelerator}\nbackend: sim\nhosts:\n{host_lines}\n"
        f"coordinator: {{port: {port}, heartbeat_interval: {heartbeat}, heartbeat_timeout: {heartbeat_timeout}, "
        f"register_timeout: {register_timeout}{', job_ports: ' + job_ports if job_ports else ''}}}\n"
        f"barrier_timeout: {barrier_timeout}\n{extra}"
    )


class LocalCluster:
    def __init__(self, root: Path, accelerator: str, **spec_options: str) -> None:
        self.root = root
        self.accelerator = accelerator
        self.num_hosts = resolve_slice(accelerator=accelerator).num_hosts
        self.hosts = loopback_hosts(self.num_hosts)
        self.port = free_port(self.hosts[0])
        self.spec = root / "cluster.yaml"
        self.spec.write_text(spec_text(accelerator, self.hosts, self.port, **spec_options))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def state(self, task: int) -> Path:
        return self.root / f"host-{task}"

    def mapping(self, task: int) -> Path:
        return self.state(task) / "mapping.json"

    def start_init(
        self, task: int, *, spec: Path | None = None, state: Path | None = None, env: dict[str, str] | None = None,
        label: str | None = None,
    ) -> subprocess.Popen[bytes]:  # fmt: skip
        state = state or self.state(task)
        state.mkdir(parents=True, exist_ok=True)
        label = label or f"init-{task}"
        command = [
            *TPUCTL, "init", "--config", str(spec or self.spec), "--task-id", str(task),
            "--state-dir", str(state), "--output", str(state / "mapping.json"),
        ]  # fmt: skip
        proc = subprocess.Popen(
            command,
            stdout=(self.root / f"{label}.out").open("wb"),
            stderr=(self.root / f"{label}.err").open("wb"),
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        self.procs[label] = proc
        return proc

    def wait_init(self, label: str, timeout: float = 60.0) -> Result:
        proc = self.procs[label]
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        return Result(code, (self.root / f"{label}.out").read_text(), (self.root / f"{label}.err").read_text())

    def up(self, timeout: float = 90.0) -> list[Result]:
        for task in range(self.num_hosts):
            self.start_init(task)
        results = [self.wait_init(f"init-{t}", timeout) for t in range(self.num_hosts)]
        bad = [r for r in results if r.code != 0]
        assert not bad, f"{len(bad)} hosts failed to come up:\n{self.logs()}"
        return results

    def tpuctl(self, *args: str, task: int | None = None, timeout: float = 60.0) -> Result:
        command = [*TPUCTL, *args]
        if task is not None:
            command += ["--state-dir", str(self.state(task))]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def spawn(self, *args: str, task: int) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*TPUCTL, *args, "--state-dir", str(self.state(task))],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def agent_pid(self, task: int) -> int:
        pid = StateDir(self.state(task)).live_pid()
        assert pid is not None, f"no live agent for task {task}"
        return pid

    def wait_for_log(self, task: int, needle: str, timeout: float = 30.0) -> None:
        log = self.state(task) / "agent.log"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if log.exists() and needle in log.read_text():
                return
            time.sleep(0.05)
        raise AssertionError(f"task {task} never logged {needle!r}:\n{self.logs()}")

    def logs(self) -> str:
        parts = []
        for path in sorted(self.root.glob("*.out")) + sorted(self.root.glob("*.err")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')}")
        for path in sorted(self.root.glob("*/agent.log")):
            parts.append(f"--- {path.parent.name}/agent.log\n{path.read_text(errors='replace')}")
        return "\n".join(parts)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
        stop_hosts(self.root, grace=5.0)
        # agents started with other state dirs (duplicate-task tests): by the pid they wrote
        for pid_file in self.root.glob("*/agent.pid"):
            pid = StateDir(pid_file.parent).live_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
