"""The checks of ``tpuctl doctor``: each looks at one thing on this host and says ok, warn, fail or skip,
what it saw, and how to fix it; :func:`run_checks` runs them all, :func:`document` and :func:`render`
report them.

Everything a check reads comes through a :class:`~tpuctl.doctor.host.Host` and the scanners of
:mod:`tpuctl.doctor.host` (fake ``/dev``, ``/proc``, ``/sys`` and ``/tmp`` trees in tests), and the network
and clock probes the ``Host`` carries (tests use loopback sockets or stand-ins). No click, grpc or asyncio
here.

Bounds: the peer checks probe at most :data:`MAX_PEERS` names with :data:`PEER_WORKERS` threads, each
lookup and connection bounded, the whole within ``Host.peer_budget``.
"""

from __future__ import annotations

import errno
import os
import queue
import stat
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tpuctl.agent.statedir import StateDir, lock_holder
from tpuctl.doctor import probes
from tpuctl.doctor.host import (
    TPU_PCI_VENDOR,
    FdScan,
    Host,
    cmdline,
    listening_inodes,
    posix_lock_holders,
    scan_fds,
    tpu_device_nodes,
    tpu_pci_devices,
)
from tpuctl.errors import StateError
from tpuctl.messages import plural, sample

SCHEMA = "tpuctl.doctor/v1"
OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
VERDICTS = (OK, WARN, FAIL, SKIP)

LOCKFILE = "libtpu_lockfile"
THP_FILE = "kernel/mm/transparent_hugepage/enabled"
THP_FIX = 'sudo sh -c "echo always > /sys/kernel/mm/transparent_hugepage/enabled" (or set it in the VM image)'

MAX_PEERS = 1024
PEER_WORKERS = 32
DNS_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 1.0
LISTED = 10  # names listed per problem; the rest are counted

# Ports TPU software takes (docs/reference/ports.md); a coordinator port among them collides sooner or later.
TPU_PORTS: dict[int, str] = {
    8476: "TPU_PROCESS_PORT of LeaderWorkerSet / torch_xla, JAX's coordinator up to 0.8.0",
    8482: "JAX's coordinator since 0.8.1",
    8471: "libtpu's slice builder",
    8080: "megascale",
    8081: "megascale (Ray's MEGASCALE_PORT)",
    **{port: "libtpu runtime metrics (TPU_RUNTIME_METRICS_PORTS)" for port in range(8431, 8439)},
}


@dataclass(frozen=True)
class Check:
    """One check's outcome: ``saw`` is what it found (one line), ``details`` the evidence, ``fix`` what to do."""

    name: str
    verdict: str
    saw: str
    fix: str | None = None
    details: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Every field under its name, in field order; ``details`` as a list."""
        return {**asdict(self), "details": list(self.details)}


@dataclass(frozen=True)
class Target:
    """What doctor knows of the cluster: its hosts in task order, this host's task, the coordinator."""

    hosts: tuple[str, ...]
    task: int | None
    coordinator: str
    """The coordinator's host (``hosts[0]`` unless the spec names another address)."""
    port: int
    backend: str | None = None
    """``sim`` needs no TPU; None when unknown (from a running agent's description)."""
    source: str = "<spec>"


def _names(paths: Sequence[Path]) -> str:
    return sample([str(p) for p in paths], limit=LISTED)


def check_devices(host: Host, target: Target | None, nodes: list[Path]) -> Check:
    name = "tpu-devices"
    if not nodes:
        chips = tpu_pci_devices(host.sys_root)
        if chips:
            return Check(
                name,
                FAIL,
                f"{plural(len(chips), 'TPU chip')} on the PCI bus ({sample(chips, limit=LISTED)}) but no "
                f"{host.dev_root}/accel* or {host.dev_root}/vfio/* device node",
                fix="in a container, pass the devices (GKE: request google.com/tpu; docker: --privileged or "
                "--device /dev/accel0 ...); on a VM, check the TPU driver is loaded",
            )
        if target is not None and target.backend == "sim":
            return Check(name, SKIP, f"no TPU device nodes; backend sim (from {target.source}) needs none")
        verdict = FAIL if target is not None and target.backend in ("jax", "tensorflow") else WARN
        return Check(
            name,
            verdict,
            f"no TPU here: no {host.dev_root}/accel*, no {host.dev_root}/vfio/<group>, no PCI device of vendor "
            f"{TPU_PCI_VENDOR}",
            fix="run doctor on a TPU host (a Cloud TPU VM or a GKE TPU pod); for a simulated cluster use backend sim",
        )
    denied = [p for p in nodes if not os.access(p, os.R_OK | os.W_OK)]
    if denied:
        modes = []
        for p in denied[:LISTED]:
            try:
                st = os.stat(p)
                modes.append(f"{p}: mode {stat.S_IMODE(st.st_mode):04o}, uid {st.st_uid}, gid {st.st_gid}")
            except OSError as exc:
                modes.append(f"{p}: {exc.strerror or exc}")
        return Check(
            name,
            FAIL,
            f"{plural(len(nodes), 'TPU device')}; this user (uid {os.geteuid()}) cannot open "
            f"{len(denied)} of them read-write: {_names(denied)}",
            fix="run as root or as a member of the devices' group (PERMISSION_DENIED open(/dev/accel0) otherwise)",
            details=tuple(modes),
        )
    return Check(name, OK, f"{plural(len(nodes), 'TPU device')}: {_names(nodes)}")


def check_holders(host: Host, nodes: list[Path], scan: FdScan) -> Check:
    name = "tpu-holders"
    if not nodes:
        return Check(name, SKIP, "no TPU device nodes to look for")
    held = {str(p): scan.holders.get(str(p), []) for p in nodes}
    lines = [f"{dev} held by {', '.join(scan.who(pid) for pid in pids)}" for dev, pids in held.items() if pids]
    unseen = (
        f"; {plural(scan.unreadable, 'process')} of other users not inspected (sudo tpuctl doctor sees them)"
        if scan.unreadable
        else ""
    )
    if lines:
        pids = sorted({pid for ps in held.values() for pid in ps})
        return Check(
            name,
            FAIL,
            f"the TPU is in use: {len(lines)} of {plural(len(nodes), 'device')} held by "
            f"{sample([scan.who(p) for p in pids], limit=LISTED)}{unseen}",
            fix=f"stop {'it' if len(pids) == 1 else 'them'} (kill {' '.join(map(str, pids[:LISTED]))}) or wait for "
            "it to finish; one process at a time may use a TPU (a tpuctl job: tpuctl down)",
            details=tuple(lines),
        )
    if scan.partial:
        return Check(name, WARN, f"no holder found, but the scan of {host.proc_root} was cut short: {scan.partial}")
    return Check(name, OK, f"no process holds the TPU devices ({plural(scan.scanned, 'process')} inspected{unseen})")


def check_lockfile(host: Host, target: Target | None, nodes: list[Path], scan: FdScan) -> Check:
    name = "libtpu-lockfile"
    path = host.tmp_root / LOCKFILE
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Check(name, OK, f"{path} absent")
    except OSError as exc:
        return Check(name, WARN, f"cannot inspect {path}: {exc.strerror or exc}")
    pids = posix_lock_holders(host.proc_root, path) + scan.holders.get(str(path), [])
    if not pids and lock_holder(path) is not None:
        pids = [0]  # locked, by a process /proc/locks does not name
    pids = [p for p in dict.fromkeys(pids) if p != host.own_pid]
    age = max(0.0, time.time() - st.st_mtime)
    whose = f"owner uid {st.st_uid}, last written {_ago(age)}"
    if pids:
        for pid in pids:
            if pid and pid not in scan.cmdlines:
                scan.cmdlines[pid] = cmdline(host.proc_root, pid)
        holders = sample([scan.who(p) if p else "a process this user cannot name" for p in pids], limit=LISTED)
        return Check(
            name,
            FAIL,
            f"{path} is held by {holders}: libtpu is loaded in that process ({whose})",
            fix="a second TPU program on this host will be refused until it exits; stop it or wait for it",
        )
    tpu_host = bool(nodes) or (target is not None and target.backend in ("jax", "tensorflow"))
    return Check(
        name,
        FAIL if tpu_host else WARN,
        f"stale {path}: it exists ({whose}) but no process holds it; libtpu refuses the TPU while it is there"
        + ("" if tpu_host else " (no TPU on this host)"),
        fix=f"remove it: rm {path}" + (" (with sudo: another user made it)" if st.st_uid != os.geteuid() else ""),
    )


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} days ago"


def check_hugepages(host: Host, target: Target | None, nodes: list[Path]) -> Check:
    name = "transparent-hugepages"
    path = host.sys_root / THP_FILE
    try:
        text = path.read_text().strip()
    except OSError:
        return Check(name, SKIP, f"{path} absent: a kernel without transparent hugepages")
    chosen = next((w[1:-1] for w in text.split() if w.startswith("[") and w.endswith("]")), text)
    if chosen == "always":
        return Check(name, OK, f"{path}: always")
    if not nodes and target is not None and target.backend == "sim":
        return Check(name, SKIP, f"{path}: {chosen}; backend sim does not care")
    return Check(
        name,
        WARN,
        f"{path}: {chosen} (JAX warns unless it is 'always': TPU runtime start-up and shutdown are much slower "
        "on v5e and newer without it)",
        fix=THP_FIX,
    )


# --- the state dir ----------------------------------------------------------------------------------


def check_state_dir(host: Host, state: StateDir) -> Check:
    name = "state-dir"
    try:
        state.check()
    except StateError as exc:
        return Check(name, FAIL, exc.message, fix=exc.hint)
    try:
        st = os.stat(state.path)
    except FileNotFoundError:
        return Check(name, OK, f"{state.path} absent: tpuctl init creates it (mode 0700)")
    except OSError as exc:
        return Check(name, FAIL, f"cannot inspect {state.path}: {exc.strerror or exc}")
    mode = stat.S_IMODE(st.st_mode)
    mode_note = f"mode {mode:04o}" + (" (tpuctl init closes it to 0700)" if mode & 0o077 else "")
    holder = lock_holder(state.lock_file)
    pid_file = state.read_pid()
    if holder is not None:
        pid = holder if holder > 0 else pid_file
        who = f"pid {pid}" if pid else "a process this user cannot name"
        problem = host.ping_agent(state, 2.0)
        if problem is None:
            return Check(
                name, OK, f"{state.path} ({mode_note}): agent {who} holds the lock and answers on {os.path.basename(state.socket)}"
            )
        return Check(
            name,
            FAIL,
            f"{state.path}: agent {who} holds the lock but {state.socket} does not answer: {problem}",
            fix=f"tpuctl down --state-dir {state.path}; if it hangs, kill {pid or 'the agent'} and run tpuctl init again",
        )
    stale = [os.path.basename(f) for f in (state.pid_file, state.socket) if os.path.lexists(f)]
    if stale:
        pid_note = f" (agent.pid names pid {pid_file}, which holds no lock)" if pid_file is not None else ""
        return Check(
            name,
            WARN,
            f"{state.path}: no agent runs, but {' and '.join(stale)} remain{pid_note}: an agent died without "
            "cleaning up",
            fix=f"tpuctl init replaces them; to tidy up: rm {' '.join(os.path.join(state.path, f) for f in stale)}",
        )
    return Check(name, OK, f"{state.path} ({mode_note}): ours, no agent running")


# --- the network ------------------------------------------------------------------------------------


def _is_ip(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    return True


def check_coordinator_port(
    host: Host, target: Target | None, scan_holders: Callable[[set[str]], FdScan], agent_pid: int | None
) -> Check:
    name = "coordinator-port"
    if target is None:
        return Check(name, SKIP, "no cluster spec: the coordinator port is unknown", fix="pass --config FILE")
    where = f"{target.coordinator}:{target.port}"
    if target.task is None:
        return Check(
            name, SKIP, f"cannot tell whether this host is task 0 (the coordinator, {where})", fix="pass --task-id N"
        )
    if target.task != 0:
        return Check(name, SKIP, f"this host is task {target.task}; the coordinator runs on task 0 ({where})")
    collision = TPU_PORTS.get(target.port)
    error = host.bind(target.coordinator, target.port)
    if error is None:
        if collision:
            return Check(
                name,
                WARN,
                f"{where} is free, but port {target.port} is also {collision}",
                fix="choose another coordinator.port in the spec (tpuctl's default is 8490)",
            )
        return Check(name, OK, f"{where} is free")
    if error.errno == errno.EADDRINUSE:
        scan = scan_holders(listening_inodes(host.proc_root, target.port))
        pids = sorted({p for ps in scan.holders.values() for p in ps})
        if agent_pid is not None and pids == [agent_pid]:
            return Check(
                name, OK, f"{where} is served by this host's tpuctl agent (pid {agent_pid}): the coordinator is up"
            )
        holder = (
            f"by {sample([scan.who(p) for p in pids], limit=LISTED)}" if pids else "(holder not visible to this user)"
        )
        return Check(
            name,
            FAIL,
            f"{where} is already in use {holder}",
            fix=f"stop it, or choose another coordinator.port in the spec; `ss -ltnp 'sport = :{target.port}'` "
            "shows the holder",
        )
    if error.errno == errno.EADDRNOTAVAIL:
        return Check(
            name,
            FAIL,
            f"{target.coordinator} is not an address of this host, but this host is task 0",
            fix="task 0 serves the coordinator on its own address: check the order of hosts and --task-id",
        )
    return Check(name, FAIL, f"cannot bind {where}: {error.strerror or error}")


@dataclass(frozen=True)
class PeerResult:
    name: str
    addresses: tuple[str, ...] = ()
    dns_error: str | None = None
    outcome: str | None = None
    said: str = ""


def probe_peers(host: Host, names: Sequence[str], port: int) -> tuple[dict[str, PeerResult], int]:
    """Resolve and connect to each name, :data:`PEER_WORKERS` at a time, within ``host.peer_budget``.

    Returns the results by name (names not reached in time are missing) and how many names were left
    out by :data:`MAX_PEERS`."""
    todo: queue.SimpleQueue[str] = queue.SimpleQueue()
    for peer in names[:MAX_PEERS]:
        todo.put(peer)
    results: dict[str, PeerResult] = {}
    lock = threading.Lock()
    deadline = time.monotonic() + host.peer_budget

    def work() -> None:
        while time.monotonic() < deadline:
            try:
                peer = todo.get_nowait()
            except queue.Empty:
                return
            result = _probe_one(host, peer, port, deadline)
            with lock:
                results[peer] = result

    workers = [
        threading.Thread(target=work, name="doctor-peers", daemon=True) for _ in range(min(PEER_WORKERS, len(names)))
    ]
    for w in workers:
        w.start()
    grace = deadline + 0.1  # one grace period in all, not one per worker
    for w in workers:
        w.join(max(0.0, grace - time.monotonic()))
    with lock:
        return dict(results), max(0, len(names) - MAX_PEERS)


def _probe_one(host: Host, peer: str, port: int, deadline: float) -> PeerResult:
    bare = peer.strip("[]")
    if _is_ip(bare):
        addresses = [bare]
    else:
        try:
            addresses = host.resolve(bare, max(0.05, min(DNS_TIMEOUT_S, deadline - time.monotonic())))
        except (OSError, TimeoutError) as exc:
            return PeerResult(peer, dns_error=str(exc.strerror if isinstance(exc, OSError) and exc.strerror else exc))
        if not addresses:
            return PeerResult(peer, dns_error="no address")
    timeout = max(0.05, min(CONNECT_TIMEOUT_S, deadline - time.monotonic()))
    outcome, said = host.connect(addresses[0], port, timeout)
    return PeerResult(peer, tuple(addresses), outcome=outcome, said=said)


def peer_names(target: Target) -> list[str]:
    """The names this host must reach: every other task's host and the coordinator, each once."""
    mine = target.hosts[target.task] if target.task is not None else None
    names = [h for t, h in enumerate(target.hosts) if t != target.task and h != mine]
    if target.task != 0 and target.coordinator != mine:
        names.insert(0, target.coordinator)
    return list(dict.fromkeys(names))


def check_peers(host: Host, target: Target | None) -> list[Check]:
    if target is None:
        why = "no cluster spec: the peers are unknown"
        return [Check("peer-names", SKIP, why, fix="pass --config FILE"), Check("peer-reachable", SKIP, why)]
    names = peer_names(target)
    if not names:
        why = "a one-host cluster: no peer"
        return [Check("peer-names", SKIP, why), Check("peer-reachable", SKIP, why)]
    results, left_out = probe_peers(host, names, target.port)
    considered = names[:MAX_PEERS]
    late = [n for n in considered if n not in results]
    limits = []
    if late:
        limits.append(f"{len(late)} not reached within {host.peer_budget:g} s: {sample(late, limit=LISTED)}")
    if left_out:
        limits.append(f"{left_out:,} more not probed (at most {MAX_PEERS:,})")
    tail = ("; " + "; ".join(limits)) if limits else ""

    bad_dns = [r for r in results.values() if r.dns_error is not None]
    if bad_dns:
        names_check = Check(
            "peer-names",
            FAIL,
            f"{len(bad_dns)} of {plural(len(considered), 'name')} did not resolve: "
            f"{sample([f'{r.name} ({r.dns_error})' for r in bad_dns], limit=LISTED)}{tail}",
            fix=f"check hosts in {target.source}, /etc/hosts and DNS; on GKE a pod's name may not resolve for about "
            "30 s after it starts (headless service, publishNotReadyAddresses)",
        )
    else:
        resolved = len(results)
        names_check = Check(
            "peer-names", WARN if limits else OK, f"{resolved} of {plural(len(considered), 'name')} resolved{tail}"
        )

    probed = [r for r in results.values() if r.outcome is not None]
    if not probed:
        return [names_check, Check("peer-reachable", SKIP, "no peer name resolved" if bad_dns else f"no answer{tail}")]
    port = target.port
    dead = [r for r in probed if r.outcome in (probes.TIMEOUT, probes.UNREACHABLE)]
    coordinator = next((r for r in probed if r.name == target.coordinator and target.task != 0), None)
    details = tuple(_peer_line(r, port) for r in sorted(probed, key=lambda r: r.name)[: LISTED * 10])
    if dead:
        return [
            names_check,
            Check(
                "peer-reachable",
                FAIL,
                f"{len(dead)} of {plural(len(probed), 'peer')} unreachable on TCP port {port}: "
                f"{sample([f'{r.name} ({r.said})' for r in dead], limit=LISTED)}{tail}",
                fix=f"check the host is up and that the firewall lets TCP port {port} through between the hosts "
                "(a refused connection is fine before init: it proves the host answers)",
                details=details,
            ),
        ]
    if coordinator is not None and coordinator.outcome != probes.OPEN:
        return [
            names_check,
            Check(
                "peer-reachable",
                WARN,
                f"every peer is reachable, but nothing listens on the coordinator {target.coordinator}:{port} yet "
                f"({coordinator.said}){tail}",
                fix="task 0 runs the coordinator: run tpuctl init there (before a start this is expected)",
                details=details,
            ),
        ]
    return [
        names_check,
        Check(
            "peer-reachable",
            WARN if limits else OK,
            f"{len(probed)} of {plural(len(probed), 'peer')} reachable on TCP port {port}"
            f"{_reach_breakdown(probed, coordinator, port)}{tail}",
            details=details,
        ),
    ]


def _peer_line(result: PeerResult, port: int) -> str:
    """One peer's detail line: what its answer means, then what the OS said."""
    where = f"{result.name} ({result.addresses[0]})" if result.addresses else result.name
    meaning = {
        probes.OPEN: f"reachable, listening on port {port}",
        probes.REFUSED: f"reachable (the host is up), nothing listens on port {port}",
        probes.TIMEOUT: "unreachable",
        probes.UNREACHABLE: "unreachable",
    }.get(result.outcome or "", result.outcome or "?")
    return f"{where}: {meaning}: {result.said}"


def _reach_breakdown(probed: Sequence[PeerResult], coordinator: PeerResult | None, port: int) -> str:
    """``: 1 listening (the coordinator), 2 up with nothing listening on 8490 (connection refused: ...)``."""
    listening = sum(1 for r in probed if r.outcome == probes.OPEN)
    refused = sum(1 for r in probed if r.outcome == probes.REFUSED)
    parts = []
    if listening:
        parts.append(f"{listening} listening" + (" (the coordinator)" if coordinator is not None else ""))
    if refused:
        parts.append(
            f"{refused} up with nothing listening on {port} (connection refused: only the coordinator, task 0, "
            "listens on it)"
        )
    return ": " + ", ".join(parts) if parts else ""


# --- clocks -----------------------------------------------------------------------------------------

SKEW_NOTE = (
    "skew between hosts is not measured (`chronyc tracking` on each host shows its offset); it only misdates "
    "log lines: tpuctl's timeouts do not use wall clocks"
)


def check_clock(host: Host, target: Target | None) -> Check:
    """This host's NTP state (``adjtimex``): synchronized is ok, not synchronized warns, unknown skips."""
    name = "clock-skew"
    state = host.clock()
    if state is None:
        return Check(name, SKIP, f"this host's clock discipline is unknown (adjtimex not available); {SKEW_NOTE}")
    if not state.synchronized:
        return Check(
            name,
            WARN,
            f"this host's clock is not synchronized (adjtimex: TIME_ERROR); {SKEW_NOTE}",
            fix="start an NTP client (chronyd or systemd-timesyncd); TPU VMs sync to metadata.google.internal",
        )
    return Check(
        name, OK, f"this host's clock is synchronized (estimated error {state.est_error_us / 1000:.1f} ms); {SKEW_NOTE}"
    )


# --- everything -------------------------------------------------------------------------------------


def run_checks(host: Host, state: StateDir, target: Target | None, spec_check: Check | None = None) -> list[Check]:
    """Every check, in order: the spec (when given), devices, holders, lock file, hugepages, state dir,
    coordinator port, peers, clock."""
    checks = [spec_check] if spec_check is not None else []
    nodes = tpu_device_nodes(host)
    lockfile = host.tmp_root / LOCKFILE
    scan = scan_fds(host, [str(p) for p in nodes] + [str(lockfile)])
    checks.append(check_devices(host, target, nodes))
    checks.append(check_holders(host, nodes, scan))
    checks.append(check_lockfile(host, target, nodes, scan))
    checks.append(check_hugepages(host, target, nodes))
    checks.append(check_state_dir(host, state))
    try:
        agent_pid = state.live_pid()
    except StateError:
        agent_pid = None
    checks.append(check_coordinator_port(host, target, lambda wanted: scan_fds(host, wanted), agent_pid))
    checks += check_peers(host, target)
    checks.append(check_clock(host, target))
    return checks


def worst(checks: Iterable[Check]) -> str:
    verdicts = {c.verdict for c in checks}
    return next((v for v in (FAIL, WARN, OK) if v in verdicts), SKIP)


def document(checks: Sequence[Check], *, state: StateDir, target: Target | None) -> dict[str, Any]:
    """The one JSON document of ``tpuctl doctor --json``."""
    counts = {v: sum(1 for c in checks if c.verdict == v) for v in VERDICTS}
    return {
        "schema": SCHEMA,
        "verdict": worst(checks),
        "counts": counts,
        "state_dir": str(state.path),
        "cluster": None
        if target is None
        else {
            "source": target.source,
            "num_hosts": len(target.hosts),
            "hosts": list(target.hosts),
            "task": target.task,
            "coordinator": f"{target.coordinator}:{target.port}",
            "backend": target.backend,
        },
        "checks": [c.to_json() for c in checks],
    }


def render(checks: Sequence[Check]) -> str:
    """The text report: a line per check (verdict, name, what it saw), its details and fix indented."""
    width = max((len(c.name) for c in checks), default=0)
    lines = []
    for c in checks:
        lines.append(f"{c.verdict.upper():<4}  {c.name:<{width}}  {c.saw}")
        pad = " " * (6 + width + 2)
        lines += [f"{pad}{d}" for d in c.details[:LISTED]]
        if len(c.details) > LISTED:
            lines.append(f"{pad}... and {len(c.details) - LISTED} more")
        if c.fix and c.verdict in (WARN, FAIL):
            lines.append(f"{pad}fix: {c.fix}")
    counts = {v: sum(1 for c in checks if c.verdict == v) for v in VERDICTS}
    lines += ["", ", ".join(f"{counts[v]} {v}" for v in VERDICTS)]
    return "\n".join(lines)
