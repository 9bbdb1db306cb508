"""``tpuctl doctor``'s checks on fake hosts: a ``/dev``, ``/proc``, ``/sys`` and ``/tmp`` written under
``tmp_path`` (``/proc/PID/fd/N`` symlinks to a fake ``/dev/accel0``, ``cmdline`` files, ``/proc/locks``,
``/proc/net/tcp``), loopback sockets (127.0.0.0/8 only) for the port and peer checks, stand-ins where a
real network would be needed (a name that does not resolve, a peer that never answers).

Each seeded fault must be named by the check that finds it, with its evidence and a fix."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuctl.agent.statedir import StateDir
from tpuctl.doctor import probes
from tpuctl.doctor.checks import (
    FAIL,
    OK,
    SCHEMA,
    SKIP,
    WARN,
    Check,
    Target,
    check_clock,
    check_coordinator_port,
    check_devices,
    check_hugepages,
    check_lockfile,
    check_peers,
    check_state_dir,
    document,
    render,
    run_checks,
)
from tpuctl.doctor.host import FdScan, Host, scan_fds, tpu_device_nodes

LOOPBACK_NAMES = {"host-a": "127.0.0.1", "host-b": "127.0.0.2", "host-c": "127.0.0.3", "host-d": "127.0.0.4"}


def loopback_resolve(name: str, timeout: float) -> list[str]:
    """A resolver for the tests' names (127.0.0.x); anything else does not resolve."""
    if name in LOOPBACK_NAMES:
        return [LOOPBACK_NAMES[name]]
    raise OSError(-2, "Name or service not known")


class FakeHost:
    """A host tree under a folder: /dev, /proc, /sys, /tmp, filled by the test."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dev, self.proc, self.sys, self.tmp = (root / n for n in ("dev", "proc", "sys", "tmp"))
        for folder in (self.dev, self.proc / "net", self.sys / "kernel/mm/transparent_hugepage", self.tmp):
            folder.mkdir(parents=True)
        (self.proc / "locks").write_text("")
        header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        (self.proc / "net" / "tcp").write_text(header)
        self.thp("[always] madvise never")

    def accel(self, count: int = 4) -> list[Path]:
        paths = []
        for i in range(count):
            path = self.dev / f"accel{i}"
            path.write_text("")
            path.chmod(0o660)
            paths.append(path)
        return paths

    def thp(self, text: str) -> None:
        (self.sys / "kernel/mm/transparent_hugepage/enabled").write_text(text + "\n")

    def process(self, pid: int, argv: list[str], fds: dict[int, str]) -> None:
        """A fake /proc/PID: its cmdline and fd symlinks (dangling ones are fine: only the link is read)."""
        folder = self.proc / str(pid)
        (folder / "fd").mkdir(parents=True)
        (folder / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
        (folder / "comm").write_text(argv[0][:15] + "\n" if argv else "kworker\n")
        for fd, target in fds.items():
            (folder / "fd" / str(fd)).symlink_to(target)

    def lock_line(self, path: Path, pid: int, kind: str = "POSIX") -> None:
        st = os.stat(path)
        dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        with (self.proc / "locks").open("a") as f:
            f.write(f"1: {kind}  ADVISORY  WRITE {pid} {dev} 0 EOF\n")

    def listening(self, port: int, inode: int) -> None:
        with (self.proc / "net" / "tcp").open("a") as f:
            f.write(
                f"   0: 0100007F:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0  0 {inode} 1\n"
            )

    def host(self, **changes: object) -> Host:
        host = Host(
            dev_root=self.dev,
            proc_root=self.proc,
            sys_root=self.sys,
            tmp_root=self.tmp,
            resolve=loopback_resolve,
            connect=probes.connect,
            bind=probes.bind,
            clock=lambda: probes.ClockState(True, 5000, 300),
            ping_agent=lambda state, timeout: None,
        )
        return dataclasses.replace(host, **changes)  # type: ignore[arg-type]


@pytest.fixture
def fake(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path / "host")


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A listening socket on 127.0.0.1 (the coordinator, or whatever took its port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def cluster(port: int, task: int | None = 0, backend: str | None = "jax") -> Target:
    return Target(
        hosts=("host-a", "host-b", "host-c"),
        task=task,
        coordinator="host-a" if task != 0 else "127.0.0.1",
        port=port,
        backend=backend,
        source="cluster.yaml",
    )


# --- a clean host --------------------------------------------------------------------------------


def test_a_clean_fake_tpu_host_is_all_ok_or_skip(fake: FakeHost, tmp_path: Path, free_port: int) -> None:
    fake.accel(4)
    target = Target(
        hosts=("127.0.0.1", "host-b", "host-c"),
        task=0,
        coordinator="127.0.0.1",
        port=free_port,
        backend="jax",
        source="cluster.yaml",
    )
    checks = run_checks(fake.host(), StateDir(tmp_path / "state"), target)
    verdicts = {c.name: c.verdict for c in checks}
    assert set(verdicts.values()) <= {OK, SKIP}, render(checks)
    assert list(verdicts) == [
        "tpu-devices",
        "tpu-holders",
        "libtpu-lockfile",
        "transparent-hugepages",
        "state-dir",
        "coordinator-port",
        "peer-names",
        "peer-reachable",
        "clock-skew",
    ]
    found = by_name(checks)
    assert "4 TPU devices" in found["tpu-devices"].saw and str(fake.dev / "accel0") in found["tpu-devices"].saw
    assert found["coordinator-port"].saw == f"127.0.0.1:{free_port} is free"
    assert found["peer-reachable"].verdict == OK  # 127.0.0.2/3 refuse: the hosts answer, nothing listens yet
    assert found["clock-skew"].verdict == OK and "synchronized (estimated error 0.3 ms)" in found["clock-skew"].saw


def test_no_spec_skips_the_cluster_checks_with_a_reason(fake: FakeHost, tmp_path: Path) -> None:
    fake.accel(1)
    found = by_name(run_checks(fake.host(), StateDir(tmp_path / "state"), None))
    for name in ("coordinator-port", "peer-names", "peer-reachable"):
        assert found[name].verdict == SKIP and "no cluster spec" in found[name].saw


# --- TPU devices and who holds them ----------------------------------------------------------------


def test_a_device_held_by_a_process_is_named_with_pid_and_command_line(fake: FakeHost, tmp_path: Path) -> None:
    accel = fake.accel(4)
    fake.process(4242, ["python3", "train.py", "--steps", "10"], {0: "/dev/null", 7: str(accel[1]), 8: str(accel[2])})
    fake.process(4300, ["bash"], {0: "/dev/pts/0"})
    found = by_name(run_checks(fake.host(), StateDir(tmp_path / "state"), None))
    held = found["tpu-holders"]
    assert held.verdict == FAIL
    assert "2 of 4 devices held by pid 4242 (python3 train.py --steps 10)" in held.saw
    assert f"{accel[1]} held by pid 4242 (python3 train.py --steps 10)" in held.details
    assert held.fix is not None and "kill 4242" in held.fix
    assert "4300" not in held.saw


def test_this_process_holding_a_device_is_not_a_holder(fake: FakeHost) -> None:
    accel = fake.accel(1)
    fake.process(77, ["python3"], {3: str(accel[0])})
    host = fake.host(own_pid=77)
    scan = scan_fds(host, [str(accel[0])])
    assert scan.holders == {} and scan.scanned == 0


def test_a_kernel_thread_shows_its_command_name(fake: FakeHost) -> None:
    accel = fake.accel(1)
    fake.process(12, [], {3: str(accel[0])})
    scan = scan_fds(fake.host(), [str(accel[0])])
    assert scan.who(12) == "pid 12 ([kworker])"


def test_vfio_groups_count_only_when_their_iommu_group_is_a_tpu(fake: FakeHost) -> None:
    (fake.dev / "vfio").mkdir()
    for name in ("vfio", "0", "1", "2"):
        (fake.dev / "vfio" / name).write_text("")
    for group, vendor in (("0", "0x1ae0"), ("1", "0x10de")):  # group 2: no sysfs entry, counted
        device = fake.sys / "kernel/iommu_groups" / group / "devices/0000:00:04.0"
        device.mkdir(parents=True)
        (device / "vendor").write_text(vendor + "\n")
    assert tpu_device_nodes(fake.host()) == [fake.dev / "vfio/0", fake.dev / "vfio/2"]


def test_chips_on_the_pci_bus_without_device_nodes_fail(fake: FakeHost) -> None:
    device = fake.sys / "bus/pci/devices/0000:00:05.0"
    device.mkdir(parents=True)
    (device / "vendor").write_text("0x1ae0\n")
    check = check_devices(fake.host(), None, [])
    assert check.verdict == FAIL and "1 TPU chip on the PCI bus (0000:00:05.0)" in check.saw


def test_no_tpu_is_a_skip_for_sim_a_failure_for_a_real_backend_a_warning_otherwise(fake: FakeHost) -> None:
    host = fake.host()
    assert check_devices(host, cluster(8490, backend="sim"), []).verdict == SKIP
    assert check_devices(host, cluster(8490, backend="jax"), []).verdict == FAIL
    assert check_devices(host, None, []).verdict == WARN


@pytest.mark.skipif(os.geteuid() == 0, reason="root may open any device node")
def test_a_device_this_user_cannot_open_fails(fake: FakeHost) -> None:
    accel = fake.accel(1)
    accel[0].chmod(0o600)
    os.chmod(accel[0], 0o000)
    check = check_devices(fake.host(), None, accel)
    assert check.verdict == FAIL and "cannot open 1 of them" in check.saw


# --- /tmp/libtpu_lockfile ---------------------------------------------------------------------------


def test_a_stale_libtpu_lockfile_fails_with_the_rm_fix(fake: FakeHost, tmp_path: Path) -> None:
    nodes = fake.accel(4)
    (fake.tmp / "libtpu_lockfile").write_text("")
    check = by_name(run_checks(fake.host(), StateDir(tmp_path / "state"), None))["libtpu-lockfile"]
    assert check.verdict == FAIL
    assert check.saw.startswith(f"stale {fake.tmp / 'libtpu_lockfile'}: it exists")
    assert check.fix == f"remove it: rm {fake.tmp / 'libtpu_lockfile'}"
    assert nodes  # a TPU host: libtpu will refuse the TPU


def test_a_stale_lockfile_on_a_host_without_tpu_only_warns(fake: FakeHost) -> None:
    (fake.tmp / "libtpu_lockfile").write_text("")
    check = check_lockfile(fake.host(), cluster(8490, backend="sim"), [], FdScan())
    assert check.verdict == WARN and "(no TPU on this host)" in check.saw


def test_a_lockfile_locked_by_a_live_process_names_it(fake: FakeHost, tmp_path: Path) -> None:
    fake.accel(1)
    lockfile = fake.tmp / "libtpu_lockfile"
    lockfile.write_text("")
    fake.lock_line(lockfile, 777)
    fake.process(777, ["python3", "serve.py"], {})
    check = by_name(run_checks(fake.host(), StateDir(tmp_path / "state"), None))["libtpu-lockfile"]
    assert check.verdict == FAIL and "held by pid 777 (python3 serve.py)" in check.saw


def test_a_lockfile_open_in_a_process_counts_as_held(fake: FakeHost, tmp_path: Path) -> None:
    fake.accel(1)
    lockfile = fake.tmp / "libtpu_lockfile"
    lockfile.write_text("")
    fake.process(901, ["python3", "-c", "import jax"], {5: str(lockfile)})
    check = by_name(run_checks(fake.host(), StateDir(tmp_path / "state"), None))["libtpu-lockfile"]
    assert check.verdict == FAIL and "pid 901 (python3 -c import jax)" in check.saw


def test_a_lockfile_flocked_for_real_is_held(fake: FakeHost) -> None:
    """No /proc/locks entry (fake /proc), but the kernel says the file is locked: held, holder unnamed."""
    lockfile = fake.tmp / "libtpu_lockfile"
    lockfile.write_text("")
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,sys,time\nf=open(sys.argv[1])\nfcntl.flock(f,fcntl.LOCK_EX)\n"
            "print('locked',flush=True)\ntime.sleep(30)",
            str(lockfile),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        check = check_lockfile(fake.host(), None, [], FdScan())
    finally:
        child.kill()
        child.wait(10)
    assert check.verdict == FAIL and "a process this user cannot name" in check.saw


# --- transparent hugepages ---------------------------------------------------------------------------


def test_hugepages_not_always_warns_with_the_fix_jax_gives(fake: FakeHost) -> None:
    fake.thp("always [madvise] never")
    check = check_hugepages(fake.host(), None, fake.accel(1))
    assert check.verdict == WARN and ": madvise (JAX warns unless it is 'always'" in check.saw
    assert check.fix is not None and "echo always > /sys/kernel/mm/transparent_hugepage/enabled" in check.fix


def test_hugepages_file_missing_skips(fake: FakeHost) -> None:
    (fake.sys / "kernel/mm/transparent_hugepage/enabled").unlink()
    assert check_hugepages(fake.host(), None, []).verdict == SKIP


# --- the coordinator port ----------------------------------------------------------------------------


def test_a_taken_coordinator_port_fails_naming_it(fake: FakeHost, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    check = check_coordinator_port(fake.host(), cluster(port), lambda w: scan_fds(fake.host(), w), None)
    assert check.verdict == FAIL
    assert check.saw.startswith(f"127.0.0.1:{port} is already in use")
    assert check.fix is not None and f"sport = :{port}" in check.fix


def test_the_port_holder_is_named_from_proc_net_tcp(fake: FakeHost, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    fake.listening(port, 55501)
    fake.process(555, ["/usr/bin/python3", "-m", "http.server"], {4: "socket:[55501]"})
    host = fake.host()
    check = check_coordinator_port(host, cluster(port), lambda w: scan_fds(host, w), None)
    assert check.verdict == FAIL and "in use by pid 555 (/usr/bin/python3 -m http.server)" in check.saw


def test_the_port_held_by_this_hosts_agent_is_the_coordinator_up(fake: FakeHost, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    fake.listening(port, 66601)
    fake.process(666, ["tpuctl", "init"], {9: "socket:[66601]"})
    host = fake.host()
    check = check_coordinator_port(host, cluster(port), lambda w: scan_fds(host, w), 666)
    assert check.verdict == OK and "served by this host's tpuctl agent (pid 666)" in check.saw


def test_a_coordinator_port_tpu_software_uses_warns(fake: FakeHost) -> None:
    host = fake.host(bind=lambda h, p: None)
    check = check_coordinator_port(host, cluster(8476), lambda w: scan_fds(host, w), None)
    assert check.verdict == WARN and "TPU_PROCESS_PORT" in check.saw


def test_the_port_check_skips_on_other_tasks_and_unknown_tasks(fake: FakeHost) -> None:
    host = fake.host()
    assert check_coordinator_port(host, cluster(8490, task=2), lambda w: scan_fds(host, w), None).verdict == SKIP
    unknown = check_coordinator_port(host, cluster(8490, task=None), lambda w: scan_fds(host, w), None)
    assert unknown.verdict == SKIP and unknown.fix == "pass --task-id N"


# --- peers --------------------------------------------------------------------------------------------


def test_a_peer_whose_name_does_not_resolve_fails_peer_names(fake: FakeHost, free_port: int) -> None:
    target = Target(hosts=("127.0.0.1", "host-b", "host-gone"), task=0, coordinator="127.0.0.1", port=free_port)
    names, reach = check_peers(fake.host(), target)
    assert names.verdict == FAIL
    assert "1 of 2 names did not resolve: host-gone (Name or service not known)" in names.saw
    assert reach.verdict == OK  # host-b (127.0.0.2) answers


def test_a_peer_that_never_answers_fails_peer_reachable(fake: FakeHost, free_port: int) -> None:
    def connect(address: str, port: int, timeout: float) -> tuple[str, str]:
        if address == "127.0.0.3":
            return probes.TIMEOUT, f"no answer within {timeout:g} s"
        return probes.connect(address, port, timeout)

    target = Target(hosts=("127.0.0.1", "host-b", "host-c"), task=0, coordinator="127.0.0.1", port=free_port)
    names, reach = check_peers(fake.host(connect=connect), target)
    assert names.verdict == OK
    assert reach.verdict == FAIL
    assert "1 of 2 peers unreachable on TCP port" in reach.saw and "host-c (no answer within 1 s)" in reach.saw
    assert reach.fix is not None and "firewall" in reach.fix


def test_a_coordinator_not_listening_yet_warns(fake: FakeHost, free_port: int) -> None:
    target = Target(hosts=("host-a", "host-b"), task=1, coordinator="host-a", port=free_port)
    _, reach = check_peers(fake.host(), target)
    assert reach.verdict == WARN and f"nothing listens on the coordinator host-a:{free_port} yet" in reach.saw


def test_a_listening_coordinator_is_reachable(fake: FakeHost, listener: socket.socket) -> None:
    target = Target(hosts=("host-a", "host-b"), task=1, coordinator="host-a", port=listener.getsockname()[1])
    names, reach = check_peers(fake.host(), target)
    assert names.verdict == OK and reach.verdict == OK
    assert "1 listening (the coordinator)" in reach.saw


def test_a_reachable_verdict_explains_the_refused_peers_its_details_list(
    fake: FakeHost, listener: socket.socket
) -> None:
    # Task 2 of a running cluster: the coordinator (host-a) listens, host-b is up with nothing on the port
    # (a worker). The verdict counts both as reachable and says what each answer means, and no detail line
    # reads as a failure under it (issue 24: "OK 3 of 3 peers answer" above "refused, connection refused").
    port = listener.getsockname()[1]
    target = Target(hosts=("host-a", "host-b", "host-c"), task=2, coordinator="host-a", port=port)
    names, reach = check_peers(fake.host(), target)
    assert names.verdict == OK and names.saw == "2 of 2 names resolved"
    assert reach.verdict == OK
    assert reach.saw == (
        f"2 of 2 peers reachable on TCP port {port}: 1 listening (the coordinator), 1 up with nothing listening on "
        f"{port} (connection refused: only the coordinator, task 0, listens on it)"
    )
    assert reach.details == (
        f"host-a (127.0.0.1): reachable, listening on port {port}: connected",
        f"host-b (127.0.0.2): reachable (the host is up), nothing listens on port {port}: connection refused",
    )


def test_peer_probing_is_bounded_in_time(fake: FakeHost) -> None:
    release = threading.Event()

    def slow_resolve(name: str, timeout: float) -> list[str]:
        release.wait(10)
        raise OSError(-3, "Temporary failure in name resolution")

    hosts = tuple(f"slow-{i}" for i in range(100))
    target = Target(hosts=("127.0.0.1", *hosts), task=0, coordinator="127.0.0.1", port=1)
    started = time.monotonic()
    try:
        names, reach = check_peers(fake.host(resolve=slow_resolve, peer_budget=0.3), target)
    finally:
        release.set()
    assert time.monotonic() - started < 3
    assert names.verdict == WARN and "100 not reached within 0.3 s" in names.saw
    assert reach.verdict == SKIP


def test_the_real_resolver_is_bounded_and_answers_for_an_address() -> None:
    assert probes.resolve("127.0.0.1", 2.0) == ["127.0.0.1"]
    with pytest.raises(OSError):
        probes.resolve("name.invalid.", 2.0)


# --- the state dir -------------------------------------------------------------------------------------


def test_a_foreign_state_dir_fails(fake: FakeHost, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    check = check_state_dir(fake.host(), StateDir(state))
    assert check.verdict == FAIL and "has mode 0777: others may write in it" in check.saw
    assert check.fix is not None and "--state-dir" in check.fix


def test_a_symlinked_state_dir_fails(fake: FakeHost, tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "state").symlink_to(tmp_path / "real")
    check = check_state_dir(fake.host(), StateDir(tmp_path / "state"))
    assert check.verdict == FAIL and "is a symbolic link" in check.saw


def test_a_stale_pid_file_warns(fake: FakeHost, tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    os.mkdir(state.path, mode=0o700)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(30)
    Path(state.pid_file).write_text(f"{dead.pid}\n")
    Path(state.socket).write_text("")
    check = check_state_dir(fake.host(), state)
    assert check.verdict == WARN
    assert "no agent runs, but agent.pid and agent.sock remain" in check.saw
    assert f"names pid {dead.pid}, which holds no lock" in check.saw


def test_a_live_agent_that_does_not_answer_fails(fake: FakeHost, tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    os.mkdir(state.path, mode=0o700)
    Path(state.pid_file).write_text(f"{os.getpid()}\n")
    with open(state.lock_file, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stuck = check_state_dir(fake.host(ping_agent=lambda s, t: "no answer within 2 s"), state)
        fine = check_state_dir(fake.host(), state)
    assert stuck.verdict == FAIL and "holds the lock but" in stuck.saw and "no answer within 2 s" in stuck.saw
    assert stuck.fix is not None and "tpuctl down --state-dir" in stuck.fix
    assert fine.verdict == OK and "holds the lock and answers on agent.sock" in fine.saw


def test_the_real_ping_reports_a_missing_socket(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    os.mkdir(state.path, mode=0o700)
    assert probes.agent_answers(state, 1.0) is not None


# --- the clock ---------------------------------------------------------------------------------------------


def test_the_clock_verdict_follows_ntp_and_skew_is_never_claimed(fake: FakeHost) -> None:
    note = (
        "skew between hosts is not measured (`chronyc tracking` on each host shows its offset); it only misdates "
        "log lines: tpuctl's timeouts do not use wall clocks"
    )
    unsynced = check_clock(fake.host(clock=lambda: probes.ClockState(False, 16_000_000, 16_000_000)), None)
    assert unsynced.verdict == WARN
    assert unsynced.saw == f"this host's clock is not synchronized (adjtimex: TIME_ERROR); {note}"
    unknown = check_clock(fake.host(clock=lambda: None), None)
    assert unknown.verdict == SKIP
    assert unknown.saw == f"this host's clock discipline is unknown (adjtimex not available); {note}"
    synced = check_clock(fake.host(), None)
    assert synced.verdict == OK
    assert synced.saw == f"this host's clock is synchronized (estimated error 0.3 ms); {note}"


# --- the document --------------------------------------------------------------------------------------------


def test_the_json_document_has_a_schema_and_every_check(fake: FakeHost, tmp_path: Path) -> None:
    fake.accel(1)
    (fake.tmp / "libtpu_lockfile").write_text("")
    state = StateDir(tmp_path / "state")
    checks = run_checks(fake.host(), state, None)
    doc = document(checks, state=state, target=None)
    assert doc["schema"] == SCHEMA and doc["verdict"] == FAIL and doc["cluster"] is None
    assert doc["counts"][FAIL] == 1
    lock = next(c for c in doc["checks"] if c["name"] == "libtpu-lockfile")
    assert set(lock) == {"name", "verdict", "saw", "fix", "details"} and lock["verdict"] == FAIL
    text = render(checks)
    assert "FAIL  libtpu-lockfile" in text and "fix: remove it: rm" in text
