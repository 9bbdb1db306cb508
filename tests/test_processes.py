"""tpuctl.processes.pid_alive against real processes: running, exited, a zombie, another user's."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tpuctl.processes import pid_alive


def wait_for_state(pid: int, state: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[-1].split()[0] == state:
                return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} never reached state {state}")


def test_this_process_is_alive() -> None:
    assert pid_alive(os.getpid())


def test_a_running_child_is_alive_and_a_reaped_one_is_not() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pid_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not pid_alive(child.pid)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
def test_an_unreaped_zombie_is_not_alive() -> None:
    pid = os.fork()
    if pid == 0:  # the child exits at once and stays a zombie until we reap it
        os._exit(0)
    try:
        wait_for_state(pid, "Z")
        os.kill(pid, 0)  # kill -0 still succeeds on the zombie ...
        assert not pid_alive(pid)  # ... but it is gone
    finally:
        os.waitpid(pid, 0)


def test_a_process_we_may_not_signal_counts_as_alive() -> None:
    if os.geteuid() == 0:
        pytest.skip("root may signal every process")
    assert pid_alive(1)  # init belongs to root: kill -0 gives EPERM


def test_pids_that_name_groups_are_never_alive() -> None:
    assert not pid_alive(0)
    assert not pid_alive(-1)


def test_pid_alive_reads_the_state_after_the_last_parenthesis(monkeypatch: pytest.MonkeyPatch) -> None:
    import tpuctl.processes as processes

    pid = os.getpid()
    for state, alive in (("S", True), ("R", True), ("T", True), ("Z", False), ("X", False)):
        text = f"{pid} (a) b) (c) {state} 1 2 3\n"
        monkeypatch.setattr(processes, "_read_stat", lambda pid, text=text: text)
        assert pid_alive(pid) is alive, state
