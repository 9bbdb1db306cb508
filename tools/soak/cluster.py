"""The soak's cluster: 8 simulated hosts, each a real ``tpuctl init`` and its agent, on one network, and
every command the soak starts, each with a deadline.

Two networks: ``netns`` (root and ``ip``: each host in a network namespace of its own, on one bridge,
``tests/faults/netns.py``; a host's port can be taken off the bridge, a partition) and ``loopback``
(127.0.0.x; no partitions: those steps are skipped and counted as such).

Only what this module started is ever signalled, by pid: the commands (``Commands``) and the agents
(the pid holding each state dir's lock, checked to have started after the soak did).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# tools/soak/__init__.py (run first) has put tests/ on sys.path: the harness and the namespace helpers
from faults import netns
from harness.processes import alive, started_at, stop_pids

from tpuctl.agent.control import DEADLINE_MARGIN_S
from tpuctl.agent.statedir import StateDir
from tpuctl.errors import TpuctlError

PYTHON = sys.executable
TPUCTL = [PYTHON, "-m", "tpuctl"]
ACCELERATOR = "v4-64"  # 32 chips, 4 per host: 8 hosts
HOSTS = 8
HEARTBEAT = "500ms"
HEARTBEAT_TIMEOUT_S = 3.0  # as tests/faults: short, so a schedule lasts seconds
REGISTER_TIMEOUT_S = 20.0
RESTART_TIMEOUT_S = 30.0
MAX_RESTARTS = 1000  # the spec's largest; the runner starts the cluster afresh long before
NETNS_PORT = 8476  # nothing else listens inside these namespaces
SLACK_S = 5.0  # how much longer than its own timeout a command may take (a Python start on a loaded machine)
INIT_DEADLINE_S = REGISTER_TIMEOUT_S + 10.0
STATUS_DEADLINE_S = 25.0  # tpuctl status: its own 10 s limits, twice, and the slack
DOWN_DEADLINE_S = 35.0  # tpuctl down: 15 s for the agent to answer, 15 s for it to exit, and the slack


def spec_text(hosts: list[str], port: int) -> str:
    host_lines = "\n".join(f"  - {h}" for h in hosts)
    return (
        f"cluster: soak\naccelerator: {ACCELERATOR}\nbackend: sim\nhosts:\n{host_lines}\n"
        f"coordinator: {{port: {port}, heartbeat_interval: {HEARTBEAT}, heartbeat_timeout: {HEARTBEAT_TIMEOUT_S:g}s, "
        f"register_timeout: {REGISTER_TIMEOUT_S:g}s}}\n"
        f"barrier_timeout: 30s\n"
        f"restart: {{policy: rejoin, timeout: {RESTART_TIMEOUT_S:g}s, max: {MAX_RESTARTS}}}\n"
    )


class Network:
    """Where the hosts live: their addresses, the command prefix that runs a process on host ``task``, and
    (netns only) cutting a host off and healing it."""

    partitions = False

    def __init__(self, addresses: list[str], port: int) -> None:
        self.addresses = addresses
        self.port = port

    def prefix(self, task: int) -> list[str]:
        return []

    def cut(self, task: int) -> None:
        raise RuntimeError("partitions need network namespaces (root and `ip`)")

    def heal(self, task: int) -> None:
        raise RuntimeError("partitions need network namespaces (root and `ip`)")

    def close(self) -> None:
        pass


class Loopback(Network):
    def __init__(self) -> None:
        from tpuctl.sim.cluster import free_port, loopback_hosts

        hosts = loopback_hosts(HOSTS)
        super().__init__(hosts, free_port(hosts[0]))


class Namespaces(Network):
    """One namespace per host on a bridge (``tests/faults/netns.py``); removed by :meth:`close`."""

    partitions = True

    def __init__(self) -> None:
        self.net = netns.Network(HOSTS, "sk")
        self.net.__enter__()
        super().__init__(self.net.addresses, NETNS_PORT)

    def prefix(self, task: int) -> list[str]:
        return self.net.exec(task)

    def cut(self, task: int) -> None:
        self.net.cut(task)

    def heal(self, task: int) -> None:
        self.net.heal(task)

    def close(self) -> None:
        self.net.remove()


def network(kind: str) -> Network:
    """``auto``: namespaces where they can be made, else loopback."""
    if kind == "loopback" or (kind == "auto" and netns.unavailable() is not None):
        return Loopback()
    reason = netns.unavailable()
    if reason is not None:
        raise SystemExit(f"soak: --network netns: {reason}")
    return Namespaces()


@dataclass
class Command:
    """One ``tpuctl`` process the soak started, with the deadline it must end by."""

    label: str
    task: int
    argv: list[str]
    popen: subprocess.Popen[bytes]
    out_path: Path
    err_path: Path
    started: float  # monotonic
    started_wall: float
    limit: float  # seconds it may take
    code: int | None = None
    ended: float | None = None  # monotonic
    overran: bool = False  # killed by the soak at its deadline
    meta: dict[str, object] = field(default_factory=dict)

    @property
    def deadline(self) -> float:
        return self.started + self.limit

    @property
    def seconds(self) -> float | None:
        return None if self.ended is None else self.ended - self.started

    def out(self) -> str:
        return self.out_path.read_text(errors="replace") if self.out_path.exists() else ""

    def err(self) -> str:
        return self.err_path.read_text(errors="replace") if self.err_path.exists() else ""

    def poll(self) -> int | None:
        if self.code is None and (code := self.popen.poll()) is not None:
            self.code, self.ended = code, time.monotonic()
        return self.code


class Commands:
    """Every command of the soak: started here with a deadline, killed (SIGKILL, by pid) at it, reaped."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.running: list[Command] = []
        self.finished: list[Command] = []  # since the last ``take_finished``
        self.count = 0

    def start(self, label: str, task: int, argv: list[str], limit: float, *, prefix: list[str]) -> Command:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.count += 1
        name = f"{self.count:05d}-{label}"
        out_path, err_path = self.folder / f"{name}.out", self.folder / f"{name}.err"
        with out_path.open("wb") as out, err_path.open("wb") as err:
            popen = subprocess.Popen(
                [*prefix, *argv], stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True
            )
        command = Command(label, task, argv, popen, out_path, err_path, time.monotonic(), time.time(), limit)
        self.running.append(command)
        return command

    def poll(self) -> None:
        """Note the ones that ended; kill those past their deadline (each is a violation: ``overran``)."""
        now = time.monotonic()
        for command in list(self.running):
            if command.poll() is None and now > command.deadline:
                command.overran = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(command.popen.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    command.popen.wait(timeout=10)
                command.poll()
            if command.code is not None:
                self.running.remove(command)
                self.finished.append(command)

    def wait(self, commands: list[Command], timeout: float) -> bool:
        """Until every one of ``commands`` ended (True) or ``timeout`` s passed (deadlines enforced meanwhile)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.poll()
            if all(c.code is not None for c in commands):
                return True
            time.sleep(0.05)
        return False

    def wait_running(self, timeout: float) -> bool:
        return self.wait(list(self.running), timeout)

    def take_finished(self) -> list[Command]:
        done, self.finished = self.finished, []
        return done

    def stop_all(self) -> None:
        """Every command still running, SIGTERM then SIGKILL, by pid (Ctrl-C, the end of the soak)."""
        pids = [c.popen.pid for c in self.running if c.poll() is None]
        stop_pids(pids, 2.0)
        for command in self.running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                command.popen.wait(timeout=5)
        self.poll()


class Cluster:
    """The 8 hosts under ``root``: ``root/host-N`` (the state dir; the mapping is ``mapping.json`` in it),
    the spec ``root/cluster.yaml``; a state dir given up for a fresh one moves to ``root/archive/``."""

    def __init__(self, root: Path, net: Network, commands: Commands) -> None:
        self.root = root
        self.net = net
        self.commands = commands
        self.hosts = net.addresses
        self.spec = root / "cluster.yaml"
        self.archive = root / "archive"
        self.born = time.time()  # agents started before this are not ours
        self.archived = 0
        root.mkdir(parents=True, exist_ok=True)
        self.spec.write_text(spec_text(self.hosts, net.port))
        for task in range(HOSTS):
            self.state(task).mkdir(mode=0o700, exist_ok=True)

    def state(self, task: int) -> Path:
        return self.root / f"host-{task}"

    def mapping(self, task: int) -> Path:
        return self.state(task) / "mapping.json"

    def log(self, task: int) -> Path:
        return self.state(task) / "agent.log"

    def victim_names(self, task: int) -> tuple[str, ...]:
        """How a message names host ``task``: ``task N (ADDRESS)``, or its coordination service's address
        (any task may serve: task 0, or a successor once the coordinator moved)."""
        return (f"task {task} ({self.hosts[task]})", f"{self.hosts[task]}:{self.net.port}")

    def targets(self) -> dict[str, int]:
        """Each host's coordination service address (``HOST:PORT``, as the agents log it) to its task."""
        return {f"{host}:{self.net.port}": task for task, host in enumerate(self.hosts)}

    def agent_pid(self, task: int) -> int | None:
        """The live agent holding host ``task``'s state dir (one this soak started), else None."""
        try:
            pid = StateDir(self.state(task)).live_pid()
        except (OSError, ValueError, TpuctlError):  # the state dir is being replaced, or not there yet
            return None
        if pid is None or not alive(pid):
            return None
        started = started_at(pid)
        return pid if started is not None and started >= self.born - 1.0 else None

    def fresh_state(self, task: int) -> None:
        """A new, empty state dir for host ``task`` (a replaced VM); the old one moves to the archive."""
        self.archive.mkdir(exist_ok=True)
        self.archived += 1
        old = self.state(task)
        if old.exists():
            old.rename(self.archive / f"host-{task}.{self.archived}")
        old.mkdir(mode=0o700)

    def init(self, task: int, label: str = "init") -> Command:
        state = self.state(task)
        state.mkdir(mode=0o700, exist_ok=True)
        argv = [*TPUCTL, "init", "-o", "json", "--config", str(self.spec), "--task-id", str(task),
                "--state-dir", str(state), "--out", str(self.mapping(task))]  # fmt: skip
        return self.commands.start(f"{label}-{task}", task, argv, INIT_DEADLINE_S, prefix=self.net.prefix(task))

    def tpuctl(self, task: int, label: str, args: list[str], limit: float) -> Command:
        argv = [*TPUCTL, *args, "--state-dir", str(self.state(task))]
        return self.commands.start(f"{label}-{task}", task, argv, limit, prefix=self.net.prefix(task))

    def barrier(self, task: int, timeout: float, name: str) -> Command:
        # tpuctl barrier waits --timeout plus DEADLINE_MARGIN_S for its agent's answer (who is missing): that
        # is its promise, kept even when the agent is frozen
        limit = timeout + DEADLINE_MARGIN_S + SLACK_S
        return self.tpuctl(task, "barrier", ["barrier", "-q", "--timeout", f"{timeout:g}s", name], limit)

    def status(self, task: int) -> Command:
        return self.tpuctl(task, "status", ["status", "-o", "json"], STATUS_DEADLINE_S)

    def stop_agents(self) -> None:
        """Every agent of this cluster still alive (SIGTERM, then SIGKILL), by the pid holding its lock."""
        pids = [pid for task in range(HOSTS) if (pid := self.agent_pid(task)) is not None]
        for pid in pids:  # a frozen agent cannot act on SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        stop_pids(pids, 3.0)

    def wipe(self) -> None:
        """Every host's state dir to the archive, a fresh one in its place (the cluster starts afresh)."""
        for task in range(HOSTS):
            self.fresh_state(task)

    def remove_archive(self) -> None:
        shutil.rmtree(self.archive, ignore_errors=True)
