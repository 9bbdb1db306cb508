"""What ``bench/scale.py`` reports: the results (:class:`PhaseResult`, :class:`RunResult`), the table
printed per size (tpuctl beside XLA with their ratios, then each run's notes and the floor's), py-spy's
top functions, and the document ``--json`` writes."""

from __future__ import annotations

import argparse
import os
import platform
from dataclasses import asdict, dataclass, field
from typing import Any

from scale_common import MAX_ERRORS_KEPT, PHASES

HEARTBEAT_INTERVAL_S = 5.0  # tpuctl's spec default (coordinator.heartbeat_interval)


@dataclass
class PhaseResult:
    phase: str
    wall_s: float | None
    service_cpu_s: float
    service_rss_peak_mb: float
    service_sent_bytes: int
    connections: int
    barrier_p50_s: float | None
    barrier_p99_s: float | None
    barrier_calls: int
    client_cpu_s: float
    error_count: int
    errors: list[str]
    tcp: dict[str, int] = field(default_factory=dict)
    """How much each of ``scale_phases.TCP_COUNTERS`` grew during the phase (all hosts: the bench's namespace)."""
    release_p50_s: float | None = None
    """Last barrier only: from the last host's arrival to each host's return, p50 and p99."""
    release_p99_s: float | None = None
    arrival_spread_s: float | None = None
    """Last barrier only: from the first host's arrival to the last one's (the drivers start thousands of
    calls on two cores: this is how long that took)."""
    told_p50_s: float | None = None
    """Dead host only: from the host's death to each other host's error watch naming it, p50 and the last."""
    told_max_s: float | None = None
    told_hosts: int = 0
    dead_cause: str = ""
    """Dead host only: the failure as the first host told was told it."""
    told_p99_s: float | None = None
    """Hang only: from each host's job's last step to its session being pushed the hang verdict: p50
    (``told_p50_s``), p99 and the last (``told_max_s``), of ``told_hosts`` told out of ``hosts``."""
    hosts: int = 0
    length_s: float | None = None
    """Steady and progress: the phase's seconds (with ``--progress`` both last the progress window)."""
    pace_reports: int = 0
    """Progress and hang: pace reports the hosts sent (``session.report_pace`` returned True)."""
    pace_unsent: int = 0
    """... that did not leave (sent again later, as the agent does)."""
    pace_stalled: int = 0
    """... of them saying stalled."""
    service_reports: int | None = None
    """... that the service took (its watch's counter), in the phase."""
    verdicts: dict[str, int] = field(default_factory=dict)
    last_advance_wall: float = 0.0
    """Hang only: the wall time of the jobs' last step (the drivers')."""
    declared_s: float | None = None
    """Hang only: from the last step to the service logging the hang (its declaration, before the push)."""
    dump: dict[str, Any] = field(default_factory=dict)
    """Dump only: the black box's figures (``scale_phases.dump_figures``)."""
    """Progress and hang: the watchdog's verdicts the hosts were pushed, by kind (summed over hosts)."""


@dataclass
class RunResult:
    impl: str
    hosts: int
    workers: int
    netns: bool
    merge: str = ""
    idle_rss_mb: float = 0.0
    phases: list[PhaseResult] = field(default_factory=list)
    error: str | None = None
    skipped: str | None = None
    profiles: dict[str, Any] = field(default_factory=dict)
    heartbeat_s: float = HEARTBEAT_INTERVAL_S
    load_average: tuple[float, float] = (0.0, 0.0)
    """The machine's 1-minute load average at the start and the end of the run: other work competes."""
    unpaced_error: str | None = None
    """XLA with ``--xla-retry-paced``: why the run with every host listing at once failed (this one is paced)."""

    @property
    def failed(self) -> bool:
        # The dead-host phase runs last: its verdict is its own row, not a reason to skip larger sizes.
        # So is the hang phase's (a verdict late at one size says nothing about XLA at the next).
        return self.error is not None or any(p.error_count for p in self.phases if p.phase not in ("dead_host", "hang", "dump"))


# --- the table -----------------------------------------------------------------------------------------


def fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_phase(p: PhaseResult | None) -> str:
    if p is None:
        return f"{'-':>8} {'-':>8} {'-':>7} {'-':>8} {'-':>15} {'-':>4}"
    bar = f"{fmt_s(p.barrier_p50_s)}/{fmt_s(p.barrier_p99_s)}" if p.barrier_calls else "-"
    return (
        f"{fmt_s(p.wall_s):>8} {fmt_s(p.service_cpu_s):>8} {p.service_rss_peak_mb:>4.0f} MB "
        f"{fmt_bytes(p.service_sent_bytes):>8} {bar:>15} {p.error_count:>4}"
    )


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b <= 0:
        return "-"
    return f"{a / b:.2f}"


def init_total(run: RunResult) -> PhaseResult | None:
    """register + merge + last barrier as one row: the whole of `tpuctl init`'s coordination."""
    init = [p for p in run.phases if p.phase in PHASES[:3]]
    if len(init) < 3:
        return None
    last = init[-1]
    walls = [p.wall_s for p in init]
    return PhaseResult(
        "init (1-3)",
        None if None in walls else sum(w for w in walls if w is not None),
        sum(p.service_cpu_s for p in init),
        last.service_rss_peak_mb,
        sum(p.service_sent_bytes for p in init),
        last.connections,
        last.barrier_p50_s,
        last.barrier_p99_s,
        last.barrier_calls,
        sum(p.client_cpu_s for p in init),
        sum(p.error_count for p in init),
        [e for p in init for e in p.errors][:MAX_ERRORS_KEPT],
    )


def rows(run: RunResult | None) -> dict[str, PhaseResult]:
    if run is None:
        return {}
    out = {p.phase: p for p in run.phases}
    total = init_total(run)
    if total is not None:
        out[total.phase] = total
    return out


def table(runs: list[RunResult]) -> str:
    lines: list[str] = []
    head = f"{'wall':>8} {'svc CPU':>8} {'peakRSS':>7} {'sent':>8} {'barrier p50/p99':>15} {'err':>4}"
    for hosts in sorted({r.hosts for r in runs}):
        ours = next((r for r in runs if r.hosts == hosts and r.impl == "tpuctl"), None)
        peer = next((r for r in runs if r.hosts == hosts and r.impl == "xla"), None)
        lines += ["", size_header(hosts, ours, peer)]
        lines.append(f"{'phase':12} | tpuctl {head} | XLA    {head} | tpuctl/XLA: wall   CPU  sent")
        a, b = rows(ours), rows(peer)
        extra = [phase for phase in ("progress", "hang", "dead_host") if phase in a]
        for phase in (*PHASES[:3], "init (1-3)", "steady", *extra):
            pa, pb = a.get(phase), b.get(phase)
            ra = ratio(pa.wall_s if pa else None, pb.wall_s if pb else None) if phase != "steady" else "-"
            rc = ratio(pa.service_cpu_s if pa else None, pb.service_cpu_s if pb else None)
            rs = ratio(pa.service_sent_bytes if pa else None, pb.service_sent_bytes if pb else None)
            lines.append(f"{phase:12} |        {fmt_phase(pa)} |        {fmt_phase(pb)} |   {ra:>13} {rc:>5} {rs:>5}")
        for run in (ours, peer):
            lines += run_notes(run)
        lines += floor_notes(next((r for r in runs if r.hosts == hosts and r.impl == "floor"), None), ours)
    return "\n".join(lines)


def floor_notes(floor: RunResult | None, ours: RunResult | None) -> list[str]:
    """``--floor``: the bare grpc.aio service's phases, and tpuctl's last barrier against it."""
    if floor is None:
        return []
    notes = ["  floor (bare grpc.aio, no tpuctl code; merge: two barriers, no table):"]
    for p in floor.phases:
        if p.phase == "steady":
            continue
        bar = f", barrier p50/p99 {fmt_s(p.barrier_p50_s)}/{fmt_s(p.barrier_p99_s)}" if p.barrier_calls else ""
        notes.append(
            f"    {p.phase:12} wall {fmt_s(p.wall_s)}, service CPU {fmt_s(p.service_cpu_s)}{bar}, "
            f"errors {p.error_count}" + (f" ({p.errors[0]})" if p.errors else "")
        )
    last = next((p for p in floor.phases if p.phase == "last_barrier"), None)
    mine = next((p for p in ours.phases if p.phase == "last_barrier"), None) if ours else None
    if last is not None and last.release_p50_s is not None:
        notes.append(
            f"    last barrier: arrivals spread over {fmt_s(last.arrival_spread_s)}; released "
            f"{fmt_s(last.release_p50_s)} (p50) / {fmt_s(last.release_p99_s)} (p99) after the last arrival"
        )
    if last is not None and mine is not None:
        notes.append(
            f"    tpuctl/floor, last barrier: p50 {ratio(mine.barrier_p50_s, last.barrier_p50_s)}, "
            f"service CPU {ratio(mine.service_cpu_s, last.service_cpu_s)}, "
            f"release p50 {ratio(mine.release_p50_s, last.release_p50_s)}"
        )
    if floor.error:
        notes.append(f"    floor error: {floor.error}")
    return notes


def size_header(hosts: int, ours: RunResult | None, peer: RunResult | None) -> str:
    any_run = ours or peer
    conns = max((p.connections for r in (ours, peer) if r for p in r.phases), default=0)
    mode = "own network namespace, a connection per host" if any_run and any_run.netns else "127.0.0.1, shared"
    workers = any_run.workers if any_run else 0
    return f"## {hosts:,} hosts, {workers} client processes, {conns:,} service connections ({mode})"


def run_notes(run: RunResult | None) -> list[str]:
    if run is None:
        return []
    notes = []
    if run.skipped:
        notes.append(f"  {run.impl}: skipped: {run.skipped}")
    if run.unpaced_error:
        notes.append(
            f"  {run.impl}: with every host listing at once it failed ({run.unpaced_error[:300]}); these figures are paced"
        )
    steady = next((p for p in run.phases if p.phase == "steady"), None)
    if steady is not None:
        steady_s = steady.length_s or 1.0
        notes.append(
            f"  {run.impl}: steady {steady_s:g} s: service {steady.service_cpu_s / steady_s:.3f} CPU s/s "
            f"({100 * steady.service_cpu_s / steady_s:.1f}% of a core), {fmt_bytes(steady.service_sent_bytes / steady_s)}/s; "
            f"idle RSS {run.idle_rss_mb:.0f} MB; merge via {run.merge or '-'}; heartbeat every {run.heartbeat_s:g} s; "
            f"load average {run.load_average[0]:.1f} -> {run.load_average[1]:.1f}"
        )
    notes += progress_notes(run, steady)
    dead = next((p for p in run.phases if p.phase == "dead_host"), None)
    if dead is not None and dead.told_max_s is not None:
        notes.append(
            f"  {run.impl}: dead host: {dead.told_hosts:,} hosts told, p50 {fmt_s(dead.told_p50_s)}, the last "
            f"{fmt_s(dead.told_max_s)} after it died; {dead.dead_cause[:200]}"
        )
    last = next((p for p in run.phases if p.phase == "last_barrier"), None)
    if last is not None and last.release_p50_s is not None:
        notes.append(
            f"  {run.impl}: last barrier: arrivals spread over {fmt_s(last.arrival_spread_s)} (the drivers' own "
            f"pace); released {fmt_s(last.release_p50_s)} (p50) / {fmt_s(last.release_p99_s)} (p99) after the "
            "last arrival"
        )
    errors = [e for p in run.phases for e in p.errors] + ([run.error] if run.error else [])
    for text in dict.fromkeys(errors[:MAX_ERRORS_KEPT]):
        notes.append(f"  {run.impl} error: {text}")
    return notes


CPU_TARGET_PCT = 5.0
"""``--progress``: what the progress phase may cost the service above the steady phase, % of one core."""


def progress_notes(run: RunResult, steady: PhaseResult | None) -> list[str]:
    """``--progress``: the service's CPU with progress against without, the reports, the hang verdicts."""
    notes = []
    progress = next((p for p in run.phases if p.phase == "progress"), None)
    if progress is not None and progress.length_s:
        pct = 100 * progress.service_cpu_s / progress.length_s
        base = 100 * steady.service_cpu_s / steady.length_s if steady is not None and steady.length_s else None
        more = "-" if base is None else f"{pct - base:+.2f}"
        verdict = "-" if base is None else ("met" if pct - base <= CPU_TARGET_PCT else "MISSED")
        notes.append(
            f"  {run.impl}: progress {progress.length_s:g} s: service {pct:.2f}% of a core, steady "
            f"{'-' if base is None else f'{base:.2f}%'}: {more} points (target <= {CPU_TARGET_PCT:g}: {verdict}); "
            f"{progress.pace_reports:,} pace reports sent ({progress.pace_reports / progress.length_s:.1f}/s), "
            f"{progress.pace_unsent:,} not, the service took {fmt_count(progress.service_reports)}; "
            f"verdicts pushed {fmt_verdicts(progress.verdicts)}"
        )
    hang = next((p for p in run.phases if p.phase == "hang"), None)
    if hang is not None:
        notes.append(
            f"  {run.impl}: hang: {hang.told_hosts:,} of {hang.hosts:,} hosts pushed the hang verdict, after their "
            f"job's last step p50 {fmt_s(hang.told_p50_s)}, p99 {fmt_s(hang.told_p99_s)}, max {fmt_s(hang.told_max_s)}; "
            f"{hang.pace_reports:,} pace reports sent ({hang.pace_stalled:,} stalled), the service took "
            f"{fmt_count(hang.service_reports)}; "
            f"verdicts pushed {fmt_verdicts(hang.verdicts)}; the service declared it {fmt_s(hang.declared_s)} "
            f"after the last step"
        )
    dump = next((p for p in run.phases if p.phase == "dump"), None)
    if dump is not None and dump.dump:
        d = dump.dump
        notes.append(
            f"  {run.impl}: black box: {d['dump_answered']:,} of {d['dump_hosts']:,} hosts answered; the report at task "
            f"0 {d['dump_s']:.2f} s after the order (target <= 10 s), {d['dump_bytes']:,} bytes (target <= 64 KiB); "
            f"groups {d['dump_groups']}, the odd one out first: {d['dump_first']}"
        )
    return notes


def fmt_count(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def fmt_verdicts(kinds: dict[str, int]) -> str:
    return ", ".join(f"{kind} {n:,}" for kind, n in sorted(kinds.items())) or "none"


def print_profiles(runs: list[RunResult]) -> None:
    for run in runs:
        for phase, prof in run.profiles.items():
            what = "a driver (simulated hosts)" if "driver" in phase else "service"
            print(f"\n## py-spy: tpuctl {what}, {run.hosts:,} hosts, {phase} ({prof['samples']} samples)")
            for name, pct in prof["self_pct"][:8]:
                print(f"  self {pct:5.1f}%  {name}")
            for name, pct in prof["inclusive_pct"][:8]:
                print(f"  incl {pct:5.1f}%  {name}")


# --- the JSON report -----------------------------------------------------------------------------------


def report(runs: list[RunResult], args: argparse.Namespace) -> dict[str, Any]:
    import grpc

    try:
        import jaxlib

        jaxlib_version = jaxlib.__version__
    except ImportError:
        jaxlib_version = None
    machine = {"cpus": os.cpu_count(), "python": platform.python_version(), "grpcio": grpc.__version__}
    config = {k: v for k, v in vars(args).items() if k not in ("json",)}
    return {"machine": {**machine, "jaxlib": jaxlib_version}, "config": config, "runs": [asdict(r) for r in runs]}
