"""This host's black box on real processes: a Python job started as ``tpuctl run`` starts it (its start-up
hook on ``PYTHONPATH``, ``TPUCTL_STATE_DIR`` set), its stacks taken by py-spy and by the signal handler, a
stopped job said to be stopped, a non-Python job said to be one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuctl.agent import stacks
from tpuctl.job.runner import _mark_job, with_python_startup
from tpuctl.watchdog.blackbox import NOT_PYTHON, PY_SPY, SIGNAL, STOPPED

# "ready" is printed from inside wait_for_batch, on the line that blocks: a job stopped right after it
# said so is already in the frame the tests look for (printed before main(), a loaded machine could stop
# it at module level).
JOB = """
import threading, time
lock = threading.Lock()
lock.acquire()
threading.Thread(target=lambda: time.sleep(3600), name="idle", daemon=True).start()
def wait_for_batch():
    print("ready", flush=True); lock.acquire()
def main():
    wait_for_batch()
main()
"""


@pytest.fixture
def state(tmp_path: Path) -> Path:
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    return folder


def start(state: Path, command: list[str]) -> subprocess.Popen[bytes]:
    env = with_python_startup({**os.environ, "TPUCTL_STATE_DIR": str(state)})
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, start_new_session=True)
    _mark_job(str(state), proc.pid)
    return proc


@pytest.fixture
def job(state: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = start(state, [sys.executable, "-c", JOB])
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    yield proc
    proc.kill()
    proc.wait()


def test_the_signal_handler_takes_every_thread(state: Path, job: subprocess.Popen[bytes], monkeypatch) -> None:
    monkeypatch.setattr(stacks, "py_spy", lambda: None)
    started = time.monotonic()
    found = stacks.take(state, 1, 5.0)
    assert time.monotonic() - started < 3
    assert found.method == SIGNAL and found.processes == 1
    assert found.signature.startswith("wait_for_batch (<string>:7) <- main (<string>:9)"), found
    dump = Path(found.path).read_text()
    assert dump.count("  thread 0x") == 2 and "wait_for_batch" in dump and f"process {job.pid}" in dump
    assert job.poll() is None  # the job goes on


def test_py_spy_takes_a_stopped_job(state: Path, job: subprocess.Popen[bytes]) -> None:
    if stacks.py_spy() is None:
        pytest.skip("py-spy is not installed")
    os.kill(job.pid, signal.SIGSTOP)
    try:
        time.sleep(0.1)
        found = stacks.take(state, 2, 5.0)
    finally:
        os.kill(job.pid, signal.SIGCONT)
    assert (found.method, found.state) == (PY_SPY, STOPPED), found
    assert "wait_for_batch" in found.signature


def test_a_stopped_job_without_py_spy_says_so(state: Path, job: subprocess.Popen[bytes], monkeypatch) -> None:
    monkeypatch.setattr(stacks, "py_spy", lambda: None)
    os.kill(job.pid, signal.SIGSTOP)
    try:
        time.sleep(0.1)
        found = stacks.take(state, 3, 5.0)
    finally:
        os.kill(job.pid, signal.SIGCONT)
    assert found.state == STOPPED and "runs no handler" in found.note, found
    assert found.signature.startswith("[python"), found  # the wait channel at least


def test_a_job_that_is_not_python_says_so(state: Path, monkeypatch) -> None:
    monkeypatch.setattr(stacks, "py_spy", lambda: None)
    proc = start(state, ["sleep", "60"])
    try:
        time.sleep(0.1)
        found = stacks.take(state, 4, 5.0)
    finally:
        proc.kill()
        proc.wait()
    assert found.state == NOT_PYTHON and "sleep" in found.note, found


def test_no_job_is_said(state: Path) -> None:
    assert stacks.take(state, 5, 1.0).state == "no job"
