"""This host as ``tpuctl doctor`` reads it: the :class:`Host` (the roots standing for ``/dev``, ``/proc``,
``/sys`` and ``/tmp``, and the network and clock probes) and the scanners that read those trees: which
processes hold which files and sockets open (``/proc/PID/fd``, ``/proc/locks``, ``/proc/net/tcp``), and
which TPU device nodes and chips there are (``/dev/accel*``, ``/dev/vfio``, the PCI bus under ``/sys``).

They report what they find and judge nothing: :mod:`tpuctl.doctor.checks` turns it into verdicts. Tests
build fake trees under a temporary folder (a ``/proc/PID/fd/N`` symlink to a fake ``/dev/accel0``, a
``cmdline``, a ``locks`` file) and pass their roots in a :class:`Host`.

Bounds: the ``/proc`` scan stops after :data:`MAX_PROCESSES` processes, :data:`MAX_FDS` descriptors per
process or ``Host.scan_budget`` seconds (:data:`SCAN_BUDGET_S` unless given).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tpuctl.agent.statedir import StateDir
from tpuctl.doctor import probes

TPU_PCI_VENDOR = "0x1ae0"  # Google: how tpu-info finds TPU chips on the PCI bus

MAX_PROCESSES = 100_000
MAX_FDS = 65_536
SCAN_BUDGET_S = 5.0
PEER_BUDGET_S = 8.0  # the peer checks' bound in all (tpuctl.doctor.checks.probe_peers)

Resolver = Callable[[str, float], list[str]]
Connector = Callable[[str, int, float], tuple[str, str]]
Binder = Callable[[str, int], OSError | None]
AgentPing = Callable[[StateDir, float], str | None]


@dataclass(frozen=True)
class Host:
    """This host as the checks see it: the file system roots and the probes, all replaceable by tests."""

    dev_root: Path = Path("/dev")
    proc_root: Path = Path("/proc")
    sys_root: Path = Path("/sys")
    tmp_root: Path = Path("/tmp")
    resolve: Resolver = probes.resolve
    connect: Connector = probes.connect
    bind: Binder = probes.bind
    clock: Callable[[], probes.ClockState | None] = probes.clock_state
    ping_agent: AgentPing = probes.agent_answers
    """Ask the agent of a state dir one question: None when it answers, else what went wrong."""
    own_pid: int = field(default_factory=os.getpid)
    scan_budget: float = SCAN_BUDGET_S
    peer_budget: float = PEER_BUDGET_S


# --- /proc: who holds what -------------------------------------------------------------------------


@dataclass
class FdScan:
    """Which processes hold which of the wanted targets open (from ``/proc/*/fd``)."""

    holders: dict[str, list[int]] = field(default_factory=dict)
    cmdlines: dict[int, str] = field(default_factory=dict)
    scanned: int = 0
    unreadable: int = 0
    partial: str | None = None

    def who(self, pid: int) -> str:
        return f"pid {pid} ({self.cmdlines.get(pid) or '?'})"


def cmdline(proc_root: Path, pid: int) -> str:
    """``/proc/PID/cmdline`` as a shell-like line (NULs to spaces, at most 200 characters)."""
    try:
        raw = (proc_root / str(pid) / "cmdline").read_bytes()[:4096]
    except OSError:
        return ""
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
    if not text:  # a kernel thread or a zombie: the command name, as ps shows it
        try:
            text = "[" + (proc_root / str(pid) / "comm").read_text().strip() + "]"
        except OSError:
            return ""
    return text if len(text) <= 200 else text[:197] + "..."


def scan_fds(host: Host, wanted: Iterable[str]) -> FdScan:
    """Every process holding one of ``wanted`` (``/dev/accel0``, ``socket:[1234]``) open, as tpu-info and
    lsof find them: reading the ``/proc/PID/fd/*`` symlinks. This process is left out. Bounded in process
    count, descriptors per process and time; ``partial`` says when a bound cut the scan short."""
    targets = set(wanted)
    scan = FdScan()
    if not targets:
        return scan
    deadline = time.monotonic() + host.scan_budget
    try:
        entries = [e for e in os.listdir(host.proc_root) if e.isdigit()]
    except OSError as exc:
        scan.partial = f"cannot list {host.proc_root}: {exc.strerror or exc}"
        return scan
    entries.sort(key=int)
    for count, entry in enumerate(entries):
        if count >= MAX_PROCESSES:
            scan.partial = f"stopped after {MAX_PROCESSES:,} processes"
            break
        if time.monotonic() > deadline:
            scan.partial = f"stopped after {host.scan_budget:g} s ({count:,} of {len(entries):,} processes)"
            break
        pid = int(entry)
        if pid == host.own_pid:
            continue
        fd_dir = host.proc_root / entry / "fd"
        try:
            fds = os.listdir(fd_dir)
        except FileNotFoundError:
            continue  # it exited
        except OSError:
            scan.unreadable += 1
            continue
        scan.scanned += 1
        for fd in fds[:MAX_FDS]:
            try:
                target = os.readlink(fd_dir / fd)
            except OSError:
                continue
            if target in targets:
                pids = scan.holders.setdefault(target, [])
                if pid not in pids:
                    pids.append(pid)
                    scan.cmdlines.setdefault(pid, cmdline(host.proc_root, pid))
    return scan


def posix_lock_holders(proc_root: Path, path: Path) -> list[int]:
    """Pids ``/proc/locks`` names as holding any lock (flock, POSIX, OFD) on ``path``'s inode; waiters
    (``->`` lines) are left out."""
    try:
        st = os.stat(path)
        lines = (proc_root / "locks").read_text().splitlines()
    except OSError:
        return []
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids: list[int] = []
    for line in lines[:100_000]:
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->":
            continue
        if fields[5] == want and fields[4].isdigit() and int(fields[4]) not in pids:
            pids.append(int(fields[4]))
    return pids


def listening_inodes(proc_root: Path, port: int) -> set[str]:
    """``socket:[INODE]`` of every TCP socket listening on ``port`` (``/proc/net/tcp`` and ``tcp6``)."""
    found = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc_root / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines[:200_000]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":  # 0A: LISTEN
                continue
            local_port = fields[1].rpartition(":")[2]
            try:
                if int(local_port, 16) == port:
                    found.add(f"socket:[{fields[9]}]")
            except ValueError:
                continue
    return found


# --- TPU devices ------------------------------------------------------------------------------------


def _natural(path: Path) -> tuple[str, int]:
    digits = "".join(ch for ch in path.name if ch.isdigit())
    return (path.name.rstrip("0123456789"), int(digits) if digits else -1)


def tpu_pci_devices(sys_root: Path) -> list[str]:
    """PCI addresses of the TPU chips (vendor 0x1ae0), as tpu-info finds them."""
    found = []
    try:
        devices = sorted(os.listdir(sys_root / "bus" / "pci" / "devices"))
    except OSError:
        return []
    for address in devices[:4096]:
        try:
            vendor = (sys_root / "bus" / "pci" / "devices" / address / "vendor").read_text().strip()
        except OSError:
            continue
        if vendor.lower() == TPU_PCI_VENDOR:
            found.append(address)
    return found


def _vfio_group_is_tpu(sys_root: Path, group: str) -> bool:
    """A VFIO group is a TPU's when its IOMMU group holds a Google device; unknown groups count as TPU."""
    devices = sys_root / "kernel" / "iommu_groups" / group / "devices"
    try:
        members = os.listdir(devices)
    except OSError:
        return True
    for member in members[:64]:
        try:
            if (devices / member / "vendor").read_text().strip().lower() == TPU_PCI_VENDOR:
                return True
        except OSError:
            continue
    return False


def tpu_device_nodes(host: Host) -> list[Path]:
    """``/dev/accel*`` (v2-v4, v5e, v6e with the accel driver) and the TPU's ``/dev/vfio/N`` groups (v5p and
    later; ``/dev/vfio/vfio`` is the container node, not a device)."""
    nodes: list[Path] = []
    with contextlib.suppress(OSError):
        nodes += sorted((host.dev_root / n for n in os.listdir(host.dev_root) if n.startswith("accel")), key=_natural)
    vfio = host.dev_root / "vfio"
    try:
        groups = sorted((n for n in os.listdir(vfio) if n != "vfio"), key=lambda n: (not n.isdigit(), n.zfill(8)))
    except OSError:
        groups = []
    nodes += [vfio / g for g in groups if _vfio_group_is_tpu(host.sys_root, g)]
    return nodes
