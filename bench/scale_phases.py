"""One run of ``bench/scale.py`` (:func:`run_one`: one implementation at one size): the service and the
drivers as child processes (:class:`Child`, each killed by PID), every phase started on all drivers at
once with a deadline, the service sampled around it (CPU and peak RSS from /proc, bytes acknowledged from
``ss``, the kernel's TCP counters) into a :class:`~scale_report.PhaseResult`; ``--dead-host``'s phase
with its ``ip rule`` blackhole; ``--profile``'s py-spy."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from scale_common import MAX_ERRORS_KEPT, PHASES, PY, REPO, SCRIPT, host_address
from scale_report import PhaseResult, RunResult, fmt_phase


def heartbeat_interval(args: argparse.Namespace) -> float:
    """tpuctl's hosts' heartbeat (keepalive) interval: a sixth of the timeout, as the spec's defaults (5 s, 30 s)."""
    return float(args.heartbeat_timeout) / 6


def watchdog_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``--progress``: the watchdog's settings (``WatchdogSettings``' fields) for the service and the agents."""
    return {"hang_timeout": args.hang_timeout, "report_every": args.report_every}


def progress_window(args: argparse.Namespace, hosts: int) -> float:
    """``--progress``: how long the progress phase (and so the steady one) lasts: ``--steady``, or one
    report interval if that is longer (every host then reports at least once in it)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from tpuctl.watchdog.settings import WatchdogSettings

    return max(float(args.steady), WatchdogSettings(**watchdog_settings(args)).report_interval(hosts))


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# --- the orchestrator: child processes, samples of the service -----------------------------------------


class Child:
    """A child process speaking JSON lines on stdin/stdout; stderr goes to ``log``. Killed by PID only."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        with open(log, "w") as err:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
            )
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.reports_seen = 0
        """tpuctl's service with ``--progress``: its count of pace reports taken, at the last ask."""
        self.log_path: str | None = None
        """tpuctl's service: its log file (the watchdog's findings are read from it)."""
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self, stream: TextIO) -> None:
        for line in stream:
            with contextlib.suppress(json.JSONDecodeError):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def read(self, deadline: float) -> dict[str, Any]:
        """The next message; raises ``TimeoutError`` at ``deadline``, ``ChildDied`` when the child exits."""
        try:
            message = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError from None
        if message is None:
            self.lines.put(None)
            raise ChildDied(f"pid {self.pid} exited (rc {self.proc.wait(5)}): {self.tail()}")
        return message

    def tail(self, lines: int = 3) -> str:
        """Why the child ended: its first fatal log line (absl's ``F...``: a jaxlib client terminating its
        process, whose stack trace follows) if any, else its last ``lines`` lines."""
        text = self.log.read_text(errors="replace").strip().splitlines()
        fatal = next((i for i, line in enumerate(text) if re.match(r"F\d{4} ", line)), None)
        if fatal is not None:  # with the last error logged before it: the fatal line often hides the cause
            cause = next((line for line in reversed(text[:fatal]) if re.match(r"E\d{4} ", line)), None)
            return " | ".join(line.strip()[:400] for line in (cause, text[fatal]) if line)
        return " | ".join(line.strip()[:300] for line in text[-lines:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


class ChildDied(RuntimeError):
    pass


@dataclass
class Sample:
    cpu_s: float
    rss_peak_mb: float
    sent_bytes: int
    connections: int
    tcp: dict[str, int] = field(default_factory=dict)


TCP_COUNTERS = ("ListenOverflows", "ListenDrops", "TCPReqQFullDrop", "TCPReqQFullDoCookies", "TCPSynRetrans")
"""The kernel's TcpExt counters (/proc/net/netstat, this network namespace's) that show connections the
service's listening socket did not take in time: an accept queue that overflowed drops the handshake's
last ACK or the SYN, and the host's kernel retransmits its SYN after 1, 3, 7, 15 s."""


def tcp_counters() -> dict[str, int]:
    """``TCP_COUNTERS`` now, from /proc/net/netstat (empty where it cannot be read)."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return {}
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            row = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            return {name: int(row.get(name, 0)) for name in TCP_COUNTERS}
    return {}


_BYTES_ACKED = re.compile(r"\bbytes_acked:(\d+)")


def sample_service(pid: int, port: int) -> Sample:
    """CPU and peak RSS of ``pid`` from /proc; bytes sent over its established sockets from ``ss``."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    status = Path(f"/proc/{pid}/status").read_text()
    hwm = re.search(r"VmHWM:\s+(\d+) kB", status)
    out = subprocess.run(
        ["ss", "-tinH", "state", "established", f"( sport = :{port} )"], capture_output=True, text=True, timeout=60
    ).stdout
    sent = sum(int(m) for m in _BYTES_ACKED.findall(out))
    sockets = sum(1 for line in out.splitlines() if line and not line[0].isspace())
    return Sample(cpu, int(hwm.group(1)) / 1024 if hwm else 0.0, sent, sockets, tcp_counters())


# --- a run: its processes, its phases ----------------------------------------------------------------


def free_port(bind: str) -> int:
    with socket.socket() as probe:
        probe.bind((bind, 0))
        return int(probe.getsockname()[1])


def start_service(impl: str, hosts: int, args: argparse.Namespace, tmp: Path) -> tuple[Child, int]:
    cfg: dict[str, Any] = {"hosts": hosts, "bind": args.bind, "timeout": args.phase_timeout}
    if impl in ("tpuctl", "floor"):
        cfg["heartbeat_timeout"] = args.heartbeat_timeout
    if impl == "tpuctl":
        cfg["log"] = str(tmp / f"service-{impl}-{hosts}.log")
        if args.progress:
            cfg["watchdog"] = watchdog_settings(args)
    elif impl == "xla":  # never shorter than tpuctl's, nor than the clients' (jax.distributed gives both one value)
        cfg["port"] = free_port(args.bind)
        cfg["heartbeat_timeout"] = max(args.heartbeat_timeout, args.xla_heartbeat_timeout)
    child = Child([PY, str(SCRIPT), "_serve", impl, json.dumps(cfg)], tmp / f"service-{impl}-{hosts}.stderr")
    child.log_path = cfg.get("log")
    port = int(child.read(time.monotonic() + 120)["port"])
    return child, port


def start_drivers(impl: str, hosts: int, port: int, args: argparse.Namespace, tmp: Path) -> list[Child]:
    workers = min(args.workers, hosts)
    drivers = []
    for w in range(workers):
        first, last = hosts * w // workers, hosts * (w + 1) // workers
        cfg = {
            "hosts": hosts,
            "first": first,
            "count": last - first,
            "port": port,
            "netns": args.netns,
            "timeout": args.phase_timeout,
            "xla_heartbeat_timeout": args.xla_heartbeat_timeout,
            "xla_merge_pace": args.xla_merge_pace,
            "nice": args.driver_nice,
            "heartbeat_interval": heartbeat_interval(args),
        }
        if args.progress:
            cfg["watchdog"] = watchdog_settings(args)
        argv = [PY, str(SCRIPT), "_drive", impl, json.dumps(cfg)]
        drivers.append(Child(argv, tmp / f"driver-{impl}-{hosts}-{w}.stderr"))
    return drivers


def run_phase(
    phase: str,
    service: Child,
    port: int,
    drivers: list[Child],
    args: argparse.Namespace,
    dead: dict[str, Any] | None = None,
    length: float | None = None,
) -> tuple[PhaseResult, str | None]:
    """Start ``phase`` on every driver at once, wait for all (bounded), measure the service around it.
    ``length``: the steady and progress phases' seconds (default ``--steady``)."""
    length = args.steady if length is None else length
    before = sample_service(service.pid, port)
    start = time.monotonic()
    for driver in drivers:
        driver.send({"phase": phase, "steady": length, **({"dead": dead} if dead else {})})
    deadline = start + args.phase_timeout + (length if phase in ("steady", "progress") else 0) + 30
    if phase == "hang":
        deadline = start + args.hang_timeout + 60
    if dead is not None:
        deadline = dead["until"] + 30
    reports, problem = [], None
    for driver in drivers:
        try:
            reports.append(driver.read(deadline))
        except TimeoutError:
            problem = (
                f"{phase}: not done after {deadline - start:.0f} s ({len(reports)} of {len(drivers)} drivers answered)"
            )
            break
        except ChildDied as exc:
            problem = f"{phase}: a driver died: {exc}"
            break
    if service.proc.poll() is not None:
        problem = problem or f"{phase}: the service exited: {service.tail()}"
    after = sample_service(service.pid, port) if service.proc.poll() is None else before
    result = summarize(phase, start, before, after, reports, problem)
    if phase in ("steady", "progress"):
        result.length_s = length
    if phase in ("progress", "hang"):
        pace_figures(result, service, reports, args.hang_timeout if phase == "hang" else None)
    if dead is not None and not problem:
        told_about(result, dead, reports, args.heartbeat_timeout)
    if phase == "dump":
        dump_figures(result, reports)
    return result, problem


DUMP_LIMIT_S = 10.0
DUMP_LIMIT_BYTES = 64 * 1024


def dump_figures(result: PhaseResult, reports: list[dict[str, Any]]) -> None:
    """``dump``: how long the black box took from the order to the report at task 0, its size, who
    answered; over 10 s or 64 KiB, or a host missing, is an error."""
    found = next((r for r in reports if "dump_s" in r), None)
    if found is None:
        result.error_count += 1
        result.errors.insert(0, "dump: no driver asked for the black box")
        return
    result.dump = {k: found[k] for k in ("dump_s", "dump_bytes", "dump_hosts", "dump_answered", "dump_groups", "dump_first")}
    result.wall_s = found["dump_s"]
    problems = []
    if found["dump_s"] > DUMP_LIMIT_S:
        problems.append(f"took {found['dump_s']:.1f} s (limit {DUMP_LIMIT_S:g} s)")
    if found["dump_bytes"] > DUMP_LIMIT_BYTES:
        problems.append(f"{found['dump_bytes']:,} bytes (limit {DUMP_LIMIT_BYTES:,})")
    if found["dump_answered"] != found["dump_hosts"]:
        problems.append(f"{found['dump_answered']} of {found['dump_hosts']} hosts answered")
    if problems:
        result.error_count += 1
        result.errors.insert(0, "dump: " + "; ".join(problems))


def pace_figures(
    result: PhaseResult, service: Child, reports: list[dict[str, Any]], hang_timeout: float | None
) -> None:
    """``--progress``: the reports the hosts sent and the service took in the phase, the verdicts pushed;
    for ``hang`` (``hang_timeout`` given), how long after its job's last step each host was pushed the
    hang verdict, against the requirement (``hang_timeout`` + 2 s): a late or missing one is an error."""
    result.pace_reports = sum(r.get("reports", 0) for r in reports)
    result.pace_unsent = sum(r.get("unsent", 0) for r in reports)
    result.pace_stalled = sum(r.get("stalled_reports", 0) for r in reports)
    for r in reports:
        for kind, n in r.get("verdicts", {}).items():
            result.verdicts[kind] = result.verdicts.get(kind, 0) + n
    if service.proc.poll() is None:
        service.send({"stats": True})
        with contextlib.suppress(TimeoutError, ChildDied):
            taken = service.read(time.monotonic() + 30).get("reports")
            if taken is not None:
                result.service_reports, service.reports_seen = taken - service.reports_seen, taken
    if hang_timeout is None:
        return
    delays = sorted(d for r in reports for d in r.get("hang_delays", []))
    result.told_hosts = len(delays)
    result.hosts = sum(r.get("hosts", 0) for r in reports)
    result.told_p50_s = percentile(delays, 0.5)
    result.told_p99_s = percentile(delays, 0.99)
    result.told_max_s = delays[-1] if delays else None
    result.wall_s = result.told_max_s
    result.last_advance_wall = max((r.get("last_advance_wall", 0.0) for r in reports), default=0.0)
    declared = service_hang_logged(service)
    if declared and result.last_advance_wall:
        result.declared_s = declared - result.last_advance_wall
    limit = hang_timeout + 2.0
    if delays and delays[-1] > limit:
        result.error_count += 1
        result.errors.insert(
            0,
            f"hang: the last host was pushed the hang verdict {delays[-1]:.1f} s after its last step (required: {limit:g} s)",
        )


def service_hang_logged(service: Child) -> float | None:
    """When the service logged "cluster hung" (its log's wall clock), if it did: the declaration alone,
    apart from the verdict's way to every host."""
    import datetime

    log = service.log_path
    if log is None or not os.path.exists(log):
        return None
    with open(log, errors="replace") as handle:
        for line in handle:
            if "watchdog: cluster hung at step" in line:
                stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                return stamp.timestamp()
    return None


def told_about(result: PhaseResult, dead: dict[str, Any], reports: list[dict[str, Any]], timeout: float) -> None:
    """The dead-host phase's figures: how long after the death every other host was told, against the
    requirement (heartbeat timeout + 2 s); a late or missing word is an error."""
    died = dead.get("t0") or min((r["killed_at"] for r in reports if "killed_at" in r), default=None)
    if died is None:
        result.error_count += 1
        result.errors.insert(0, "dead_host: no driver held the host to kill")
        return
    told = sorted(e - died for r in reports for e in r["ends"])
    result.told_hosts = len(told)
    result.told_p50_s = percentile(told, 0.5)
    result.told_max_s = told[-1] if told else None
    result.wall_s = result.told_max_s
    result.dead_cause = next((r["cause"] for r in reports if r.get("cause")), "")
    limit = timeout + 2.0
    if told and told[-1] > limit:
        result.error_count += 1
        result.errors.insert(
            0, f"dead_host: the last host was told {told[-1]:.1f} s after the death (required: {limit:g} s)"
        )


def blackhole(address: str) -> list[list[str]]:
    """Drop every packet from and to ``address`` in this network namespace (``ip rule`` blackholes, no
    netfilter needed); the rules added, for :func:`unblackhole`, even when adding the next one failed.
    The namespace's local routing rule moves behind them once (left so: it routes as before)."""
    rules = subprocess.run(["ip", "rule", "show"], capture_output=True, text=True, timeout=30, check=True).stdout
    if not re.search(r"^100:\s+from all lookup local", rules, re.M):
        subprocess.run(["ip", "rule", "add", "pref", "100", "lookup", "local"], check=True, timeout=30)
        subprocess.run(["ip", "rule", "del", "pref", "0"], check=True, timeout=30)
    added: list[list[str]] = []
    for pref, direction in ((10, "from"), (11, "to")):
        rule = ["pref", str(pref), direction, address, "blackhole"]
        try:
            subprocess.run(["ip", "rule", "add", *rule], check=True, timeout=30)
        except subprocess.SubprocessError:
            unblackhole(added)
            raise
        added.append(rule)
    return added


def unblackhole(added: list[list[str]]) -> None:
    for rule in added:
        subprocess.run(["ip", "rule", "del", *rule], capture_output=True, timeout=30, check=False)


def run_dead_host(
    service: Child, port: int, drivers: list[Child], hosts: int, args: argparse.Namespace
) -> tuple[PhaseResult, str | None]:
    """``--dead-host``: the last host dies; every other host must be told, naming it, in time."""
    victim = hosts - 1
    dead: dict[str, Any] = {"victim": victim, "mode": args.dead_host}
    added: list[list[str]] = []
    try:
        if args.dead_host == "vanish":
            added = blackhole(host_address(victim, args.netns))
            dead["t0"] = time.monotonic()
        dead["until"] = time.monotonic() + args.heartbeat_timeout + 2 + 15
        return run_phase("dead_host", service, port, drivers, args, dead)
    finally:
        unblackhole(added)


def summarize(
    phase: str, start: float, before: Sample, after: Sample, reports: list[dict[str, Any]], problem: str | None
) -> PhaseResult:
    ends = [e for r in reports for e in r["ends"]]
    spans = [tuple(b) for r in reports for b in r["barriers"]]
    barriers = [end - start for start, end in spans]
    # One barrier per host (the last barrier phase): how long after the last host arrived each one was
    # released. The calls' own latency also holds how far apart the drivers could start them.
    last_arrival = max((start for start, _ in spans), default=0.0)
    released = [end - last_arrival for _, end in spans] if phase == "last_barrier" else []
    errors = [e for r in reports for e in r["errors"]]
    count = sum(r["error_count"] for r in reports)
    if problem:
        errors, count = [problem, *errors], count + 1
    return PhaseResult(
        phase=phase,
        wall_s=None if problem or not ends else max(ends) - start,
        service_cpu_s=after.cpu_s - before.cpu_s,
        service_rss_peak_mb=after.rss_peak_mb,
        service_sent_bytes=after.sent_bytes - before.sent_bytes,
        connections=after.connections,
        barrier_p50_s=percentile(barriers, 0.5),
        barrier_p99_s=percentile(barriers, 0.99),
        barrier_calls=len(barriers),
        release_p50_s=percentile(released, 0.5),
        release_p99_s=percentile(released, 0.99),
        arrival_spread_s=(last_arrival - min(start for start, _ in spans)) if released else None,
        client_cpu_s=sum(r["cpu"] for r in reports),
        error_count=count,
        errors=errors[:MAX_ERRORS_KEPT],
        tcp={name: after.tcp.get(name, 0) - before.tcp.get(name, 0) for name in after.tcp},
    )


def run_one(impl: str, hosts: int, args: argparse.Namespace, tmp: Path) -> RunResult:
    result = RunResult(impl, hosts, min(args.workers, hosts), args.netns)
    result.heartbeat_s = args.xla_heartbeat_timeout / 2 if impl == "xla" else heartbeat_interval(args)
    load_start = os.getloadavg()[0]
    children: list[Child] = []
    try:
        service, port = start_service(impl, hosts, args, tmp)
        children.append(service)
        result.idle_rss_mb = sample_service(service.pid, port).rss_peak_mb
        children += start_drivers(impl, hosts, port, args, tmp)
        ready_by = time.monotonic() + 120 + hosts / 100
        result.merge = {child.read(ready_by)["merge"] for child in children[1:]}.pop()
        for phase in PHASES:
            with contextlib.ExitStack() as spies:
                spies.enter_context(profiling(args, impl, hosts, phase, service.pid, result))
                if args.profile_driver:
                    spies.enter_context(profiling(args, impl, hosts, phase, children[1].pid, result, who="driver 0"))
                length = progress_window(args, hosts) if args.progress and phase == "steady" else None
                outcome, problem = run_phase(phase, service, port, children[1:], args, length=length)
            result.phases.append(outcome)
            tcp = ", ".join(f"{name} {n:,}" for name, n in outcome.tcp.items() if n)
            print(
                f"  {impl:6} {hosts:6} {phase:12} {fmt_phase(outcome)}" + (f"  tcp: {tcp}" if tcp else ""),
                file=sys.stderr,
                flush=True,
            )
            if problem:
                result.error = problem
                break
            if outcome.error_count:  # the later phases would only time out on the failed hosts
                break
        else:
            if args.progress and impl == "tpuctl":
                window = progress_window(args, hosts)
                for phase in ("progress", "hang", "dump"):
                    outcome, problem = run_phase(phase, service, port, children[1:], args, length=window)
                    result.phases.append(outcome)
                    print(f"  {impl:6} {hosts:6} {phase:12} {fmt_phase(outcome)}", file=sys.stderr, flush=True)
                    if problem or (phase == "progress" and outcome.error_count):
                        result.error = result.error or problem or outcome.errors[0]
                        break
            if args.dead_host and impl == "tpuctl" and result.error is None:
                # A problem is the first of the phase's errors (summarize); it does not end the run, and
                # the larger sizes still run (``RunResult.failed``).
                outcome, _ = run_dead_host(service, port, children[1:], hosts, args)
                result.phases.append(outcome)
                print(f"  {impl:6} {hosts:6} {'dead_host':12} {fmt_phase(outcome)}", file=sys.stderr, flush=True)
    except (TimeoutError, ChildDied, OSError, subprocess.SubprocessError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        for child in reversed(children):  # drivers first: a jaxlib client aborts when its service goes
            child.kill()
        result.load_average = (load_start, os.getloadavg()[0])
    return result


# --- py-spy --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def profiling(
    args: argparse.Namespace, impl: str, hosts: int, phase: str, pid: int, result: RunResult, *, who: str = ""
) -> Iterator[None]:
    """With ``--profile DIR``: py-spy samples tpuctl's service (``who`` empty) or a driver (``who``: its
    label) during the phase; its top functions go into the result."""
    spy = shutil.which("py-spy") or str(Path(PY).parent / "py-spy")
    if not args.profile or impl != "tpuctl" or not Path(spy).exists():
        yield
        return
    out = Path(args.profile) / f"tpuctl-{hosts}-{phase}{'-' + who.replace(' ', '-') if who else ''}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "100", "--nonblocking", "-o", str(out)]
    if args.profile_native:  # also C frames (gRPC's Cython and C core); pauses the service per sample
        cmd = [c for c in cmd if c != "--nonblocking"] + ["--native"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(0.5)  # attached before the phase starts
        yield
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
        if out.exists():
            result.profiles[f"{phase} ({who})" if who else phase] = summarize_profile(out)


_GENERIC_FRAME = re.compile(r"\((asyncio/|threading\.py|selectors\.py|scale(_\w+)?\.py)")
"""Frames every stack shares (the event loop, this bench's own: ``_serve``, ``_drive`` and the drivers'
steps): left out of the inclusive list."""


def summarize_profile(path: Path, top: int = 12) -> dict[str, Any]:
    """Self and inclusive share of samples per function, from py-spy's collapsed ("raw") stacks."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for frame in set(frames):
            if not _GENERIC_FRAME.search(frame):
                inclusive[frame] = inclusive.get(frame, 0) + count

    def share(table: dict[str, int]) -> list[tuple[str, float]]:
        ranked = sorted(table.items(), key=lambda kv: -kv[1])[:top]
        return [(name, round(100 * n / total, 1)) for name, n in ranked]

    return {"samples": total, "self_pct": share(own), "inclusive_pct": share(inclusive), "file": str(path)}
