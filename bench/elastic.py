"""The restart path beside torchrun elastic's: from a host's kill -9 to the job running again without it.

Both sides run the same job (``bench/elastic_job.py``: torch.distributed over gloo, an all-reduce a step) on
three hosts of this machine (loopback), and both may go on with two:

* **torchrun**: three ``torchrun --nnodes=2:3 --nproc-per-node=1 --max-restarts=3`` agents with the c10d
  rendezvous hosted by the first; ``last_call_timeout`` 1 s (the default, 30 s, would wait that long for a
  third node that is dead) and ``--monitor-interval 0.5``. A dead peer breaks the survivors' all-reduce at
  once (gloo sees the socket close), their agents restart the workers and re-rendezvous with two nodes.
* **tpuctl**: three single-host slices (sim ``v4-8``, ``num_slices: 3``) under ``restart: {policy: elastic,
  min_slices: 2}``, heartbeat timeout ``--heartbeat-timeout``; a ``tpuctl run --max-restarts 3`` per host.
  The lost slice's agent and job die; the survivors' agents form the next generation with two slices and
  ``tpuctl run`` restarts the job there (``WORLD_SIZE=2``).

The host killed is never the one hosting torchrun's store or tpuctl's coordinator (each side's special host;
issue 26's successor covers tpuctl's). Measured: kill -9 to the moment every survivor's new job process has its
process group up (the job's ``started 2`` line), ``--rounds`` times, alternated; the median and min of each
side and their ratio. Nothing here is asserted about speed (``make bench`` prints it; the suite's
tests/restart cover correctness).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

PYTHON = sys.executable
JOB = Path(__file__).resolve().parent / "elastic_job.py"
HOSTS = 3
ADDRESSES = [f"127.0.0.{10 + i}" for i in range(HOSTS)]
DEADLINE_S = 120.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def started(log: Path, world: int, after: float) -> float | None:
    """When the job in ``log`` last started with ``world`` processes after ``after`` (None: not yet)."""
    if not log.exists():
        return None
    times = [
        float(p[2]) for p in (line.split() for line in log.read_text().splitlines()) if p[:2] == ["started", str(world)]
    ]
    times = [t for t in times if t > after]
    return times[0] if times else None


def wait(what: str, check: Callable[[], float | None], deadline: float = DEADLINE_S) -> float:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        got = check()
        if got is not None:
            return got
        time.sleep(0.05)
    raise SystemExit(f"bench/elastic: {what} did not happen within {deadline:g} s")


class Group:
    """Processes this bench started, each in a session of its own (killed by process group, ours only)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        """kill -9 the process and everything it started (torchrun's workers have sessions of their own)."""
        for pid in [proc.pid, *descendants(proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(10)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill(proc)


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc), read before any is killed."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo and len(out) < 10_000:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def job_env(folder: Path, host: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(BENCH_LOG=str(folder / f"job-{host}.log"), BENCH_CKPT=str(folder / "ckpt"), OMP_NUM_THREADS="1")
    env.pop("TORCHELASTIC_RUN_ID", None)
    return env


def torchrun_round(folder: Path) -> float:
    group = Group()
    port = free_port()
    try:
        procs = []
        for host in range(HOSTS):
            argv = [PYTHON, "-m", "torch.distributed.run", "--nnodes=2:3", "--nproc-per-node=1", "--max-restarts=3",
                    "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=bench",
                    "--rdzv-conf=last_call_timeout=1,join_timeout=60", "--monitor-interval=0.5",
                    f"--local-addr={ADDRESSES[host]}", str(JOB)]  # fmt: skip
            procs.append(group.start(argv, job_env(folder, host), folder / f"agent-{host}.out"))
            if host == 0:
                time.sleep(1.0)  # the first agent hosts the rendezvous store
        for host in range(HOSTS):
            wait(f"torchrun host {host}'s job to start", lambda h=host: started(folder / f"job-{h}.log", 3, 0.0))
        time.sleep(1.0)
        killed = time.time()
        group.kill(procs[2])
        return (
            max(
                wait(
                    f"torchrun host {h}'s job to restart on 2", lambda h=h: started(folder / f"job-{h}.log", 2, killed)
                )
                for h in (0, 1)
            )
            - killed
        )
    finally:
        group.close()


def tpuctl_spec(heartbeat_timeout: float, port: int) -> str:
    hosts = "".join(f"  - {a}\n" for a in ADDRESSES)
    return (
        f"cluster: bench-elastic\naccelerator: v4-8\nnum_slices: {HOSTS}\nbackend: sim\nhosts:\n{hosts}"
        f"coordinator: {{port: {port}, heartbeat_interval: {heartbeat_timeout / 6:g}s, "
        f"heartbeat_timeout: {heartbeat_timeout:g}s, register_timeout: 60s}}\n"
        "restart: {policy: elastic, min_slices: 2, timeout: 60s, max: 5}\n"
    )


def tpuctl_round(folder: Path, heartbeat_timeout: float) -> float:
    group = Group()
    spec = folder / "cluster.yaml"
    spec.write_text(tpuctl_spec(heartbeat_timeout, free_port(ADDRESSES[0])))
    tpuctl = [PYTHON, "-m", "tpuctl"]
    try:
        inits = [group.start([*tpuctl, "init", "--config", str(spec), "--task-id", str(h), "--state-dir",
                              str(folder / f"state-{h}"), "--out", str(folder / f"mapping-{h}.json")],
                             dict(os.environ), folder / f"init-{h}.out") for h in range(HOSTS)]  # fmt: skip
        for h, proc in enumerate(inits):
            if proc.wait(90) != 0:
                raise SystemExit(
                    f"bench/elastic: tpuctl init of host {h} failed: {(folder / f'init-{h}.out').read_text()}"
                )
        runs = [group.start([*tpuctl, "run", "--max-restarts", "3", "--grace", "2s", "--state-dir",
                             str(folder / f"state-{h}"), "--", PYTHON, str(JOB)], job_env(folder, h),
                            folder / f"run-{h}.out") for h in range(HOSTS)]  # fmt: skip
        for host in range(HOSTS):
            wait(f"tpuctl host {host}'s job to start", lambda h=host: started(folder / f"job-{h}.log", 3, 0.0))
        time.sleep(1.0)
        agent = int((folder / "state-2" / "agent.pid").read_text().split()[0])
        killed = time.time()
        os.kill(agent, signal.SIGKILL)  # the host is gone: its agent, its tpuctl run and its job
        group.kill(runs[2])
        return (
            max(
                wait(f"tpuctl host {h}'s job to restart on 2", lambda h=h: started(folder / f"job-{h}.log", 2, killed))
                for h in (0, 1)
            )
            - killed
        )
    finally:
        for h in range(HOSTS):
            subprocess.run(
                [*tpuctl, "down", "--state-dir", str(folder / f"state-{h}")],
                capture_output=True,
                timeout=60,
                check=False,
            )
        group.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--heartbeat-timeout", type=float, default=3.0, metavar="SECONDS")
    parser.add_argument("--sides", default="torchrun,tpuctl", help="which sides to run (default: both)")
    parser.add_argument("--keep", action="store_true", help="keep the logs (printed folder)")
    args = parser.parse_args(argv)
    sides = args.sides.split(",")
    if args.keep:
        print("logs are kept under the folder named on the last line", flush=True)
    figures: dict[str, list[float]] = {side: [] for side in sides}
    with contextlib.ExitStack() as stack:
        tmp = tempfile.mkdtemp(prefix="tpuctl-bench-elastic-")
        if not args.keep:
            stack.callback(shutil.rmtree, tmp, True)
        for r in range(args.rounds):
            for side in sides:
                folder = Path(tmp) / f"{side}-{r}"
                folder.mkdir()
                took = torchrun_round(folder) if side == "torchrun" else tpuctl_round(folder, args.heartbeat_timeout)
                figures[side].append(took)
                print(f"round {r + 1}: {side}: kill -9 to the job running on 2 hosts: {took:.2f} s", flush=True)
    for side, values in figures.items():
        print(f"{side}: median {statistics.median(values):.2f} s, min {min(values):.2f} s over {len(values)} rounds")
    if len(sides) == 2:
        a, b = (statistics.median(figures[s]) for s in sides)
        print(f"ratio {sides[1]} / {sides[0]}: {b / a:.2f} (heartbeat timeout {args.heartbeat_timeout:g} s)")
    if args.keep:
        print(f"logs: {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
