"""Injecting a fault into a real ``tpuctl`` cluster and measuring what every host did about it."""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from harness import TPUCTL, Proc
from harness.clusters import LocalCluster

from . import netns
from .recorder import HostOutcome, first_error

PYTHON = sys.executable
JOB_SLEEP = Path(__file__).resolve().parent.parent / "job" / "job_sleep.py"
SLACK_S = 7.5  # how much longer than the limit a test waits before calling a host hung (long enough to measure
# the 10 s RPC timeout behind some late detections)

HEARTBEAT = "500ms"
HEARTBEAT_TIMEOUT_S = 3.0
DEADLINE_S = HEARTBEAT_TIMEOUT_S + 2.0  # the requirement: every host knows within heartbeat timeout + 2 s
RUN_GRACE_S = 2.0
SPEC = {"heartbeat": HEARTBEAT, "heartbeat_timeout": f"{HEARTBEAT_TIMEOUT_S:g}s", "register_timeout": "30s",
        "barrier_timeout": "30s"}  # fmt: skip


@dataclass(frozen=True)
class Victim:
    task: int

    @property
    def role(self) -> str:
        return "coordinator" if self.task == 0 else "worker"

    def describe(self, c: LocalCluster) -> str:
        return f"task {self.task} ({self.role}, {c.hosts[self.task]})"


@contextlib.contextmanager
def fault(kind: str, pid: int) -> Iterator[float]:
    """``kill``: SIGKILL ``pid``; ``stop``: SIGSTOP it (SIGCONT on the way out). Yields the fault's time."""
    os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
    at = time.monotonic()
    try:
        yield at
    finally:
        if kind == "stop":
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def watch_exits(procs: dict[int, Proc], since: float, timeout: float) -> dict[int, tuple[int | None, float | None]]:
    """Poll every process until all have exited or ``timeout`` s pass: per task, (exit code, seconds after
    ``since`` at which it exited); (None, None) for one still running."""
    deadline = time.monotonic() + timeout
    ended: dict[int, tuple[int | None, float | None]] = {}
    while len(ended) < len(procs) and time.monotonic() < deadline:
        for task, proc in procs.items():
            if task not in ended and (code := proc.poll()) is not None:
                ended[task] = (code, time.monotonic() - since)
        time.sleep(0.02)
    return {task: ended.get(task, (None, None)) for task in procs}


def outcomes(
    procs: dict[int, Proc], exits: dict[int, tuple[int | None, float | None]], victim: int, what: str
) -> list[HostOutcome]:
    out = []
    for task, proc in sorted(procs.items()):
        code, seconds = exits[task]
        text = proc.err() + proc.out()
        out.append(
            HostOutcome(task, "victim" if task == victim else "peer", what, code, first_error(text), seconds, text)
        )
    return out


_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ERROR (.*)$")


def agent_error(c: LocalCluster, task: int, after_wall: float) -> tuple[float, str] | None:
    """The first ERROR line of task's agent log written after ``after_wall`` (epoch s): (its time, text)."""
    log = c.state(task) / "agent.log"
    with contextlib.suppress(OSError):
        for line in log.read_text(errors="replace").splitlines():
            m = _STAMP.match(line)
            if m:
                when = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                if when >= after_wall - 0.01:
                    return when, m.group(2)
    return None


def wait_agent_errors(
    c: LocalCluster, tasks: Iterable[int], after_wall: float, timeout: float
) -> dict[int, tuple[float, str] | None]:
    deadline = time.monotonic() + timeout
    tasks = list(tasks)
    found: dict[int, tuple[float, str] | None] = {}
    while time.monotonic() < deadline and len(found) < len(tasks):
        for task in tasks:
            if task not in found and (hit := agent_error(c, task, after_wall)) is not None:
                found[task] = hit
        time.sleep(0.05)
    return {task: found.get(task) for task in tasks}


def status(c: LocalCluster, task: int, *, env: dict[str, str] | None = None, prefix: list[str] | None = None,
           timeout: float = 30.0) -> tuple[int | None, str]:  # fmt: skip
    """``tpuctl status`` on host ``task``: (exit code, what it printed)."""
    command = [*(prefix or []), *TPUCTL, "status", "--state-dir", str(c.state(task))]
    done = c.processes.run(f"status-{task}", command, timeout=timeout, env=env)
    return done.code, done.err + done.out


def start_runs(c: LocalCluster, tasks: Iterable[int]) -> dict[int, Proc]:
    """``tpuctl run --grace 2s -- python job_sleep.py PIDS`` on each host; waits for every job to start."""
    procs = {}
    for t in tasks:
        pids = c.root / f"sleep-{t}.pids"
        command = [*TPUCTL, "run", "--grace", f"{RUN_GRACE_S:g}s", "--state-dir", str(c.state(t)), "--",
                   PYTHON, str(JOB_SLEEP), str(pids)]  # fmt: skip
        procs[t] = c.start(f"run-{t}", command)
    from harness import wait_until

    wait_until(lambda: all((c.root / f"sleep-{t}.pids").exists() for t in procs), 60, "every job to start", logs=c.logs)
    return procs


def names_victim(text: str, c: LocalCluster, victim: Victim) -> bool:
    """The text names the victim host: its task and address, or for task 0 the coordinator's address."""
    address = c.hosts[victim.task]
    if victim.task == 0:
        return f"task 0 ({address})" in text or (address in text and "coordinator" in text.lower())
    return f"task {victim.task} ({address})" in text


def check(
    hosts: list[HostOutcome], c: LocalCluster, victim: Victim, causes: tuple[str, ...], limit: float,
    *, victim_must_exit: bool = True,
) -> list[str]:  # fmt: skip
    """What the catalogue requires of every host: exit non-zero, in time, never with an internal error; a
    peer names the victim and a cause among ``causes``. Returns the problems found (empty: as required)."""
    problems = []
    for h in hosts:
        who = f"task {h.task} ({h.what})"
        if h.role == "victim" and not victim_must_exit:
            continue
        if h.code is None:
            problems.append(f"{who} still running {limit + SLACK_S:g} s after the fault")
            continue
        if h.role == "peer" and h.seconds is None:
            problems.append(f"{who} noticed nothing within {limit + SLACK_S:g} s of the fault")
            continue
        if h.code == 0:
            problems.append(f"{who} exited 0")
        if "internal error" in h.text.lower():  # exit 1: a bug's traceback instead of a cause
            problems.append(f"{who} hit an internal error: {first_error(h.text)!r}")
        if h.seconds is not None and h.seconds > limit:
            problems.append(f"{who} took {h.seconds:.1f} s (limit {limit:g} s)")
        if h.role == "peer":
            if not names_victim(h.text, c, victim):
                problems.append(f"{who} did not name {victim.describe(c)}: {h.said!r}")
            elif not any(cause in h.text.lower() for cause in causes):
                problems.append(f"{who} named no cause among {list(causes)}: {h.said!r}")
    return problems


def causes(kind: str, victim: Victim) -> tuple[str, ...]:
    if victim.task == 0:
        return ("unreachable", "no heartbeat reached", "did not answer", "did not confirm")
    return ("no heartbeat",) if kind == "stop" else ("no heartbeat", "disconnected", "left the cluster")


def agent_error_outcomes(c: LocalCluster, tasks: list[int], after_wall: float, timeout: float) -> list[HostOutcome]:
    """Steady state: when each host's agent logged the failure (seconds after ``after_wall``), and what
    ``tpuctl status`` there says then (its exit code and its error line; all hosts asked at once)."""
    errors = wait_agent_errors(c, tasks, after_wall, timeout)
    asked = {t: start_status(c, t) for t in tasks}
    out = []
    for task in tasks:
        done = c.processes.wait(asked[task], 20)
        code, text = done.code, done.err + done.out
        hit = errors[task]
        seconds = hit[0] - after_wall if hit else None
        said = hit[1].split(": ", 1)[-1] if hit else first_error(text)
        out.append(
            HostOutcome(task, "peer", "agent+status", code, said, seconds, text + "\n" + (hit[1] if hit else ""))
        )
    return out


def start_status(c: LocalCluster, task: int) -> Proc:
    """``tpuctl status`` on host ``task``, in the background."""
    return c.start(f"status-{task}", [*TPUCTL, "status", "--state-dir", str(c.state(task))])


def park_barriers(c: LocalCluster, peers: list[int], name: str = "step") -> dict[int, Proc]:
    """``tpuctl barrier NAME --timeout 30s`` on each of ``peers``; returns once the service has them all waiting."""
    import json

    from harness import wait_until

    procs = {t: c.start(f"barrier-{t}", [*TPUCTL, "barrier", name, "--timeout", "30s", "--state-dir",
                                         str(c.state(t))]) for t in peers}  # fmt: skip

    def arrived() -> bool:
        doc = json.loads(c.tpuctl("status", "--json", task=peers[0]).out or "{}")
        return any(b["name"] == name and sorted(b["arrived"]) == sorted(peers) for b in doc.get("barriers", []))

    wait_until(arrived, 30, f"{peers} to wait at barrier {name!r}", interval=0.2, logs=c.logs)
    return procs


def init_in_namespaces(c: LocalCluster, net: netns.Network, hosts: int) -> None:
    """``tpuctl init`` of every host inside its own namespace; every one must come up."""
    procs = []
    for t in range(hosts):
        state = c.state(t)
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        command = [*net.exec(t), *TPUCTL, "init", "--config", str(c.spec), "--task-id", str(t),
                   "--state-dir", str(state), "--out", str(state / "mapping.json")]  # fmt: skip
        procs.append(c.start(f"init-{t}", command))
    results = c.processes.wait_all(procs, 90)
    assert [r.code for r in results] == [0] * hosts, c.logs()

