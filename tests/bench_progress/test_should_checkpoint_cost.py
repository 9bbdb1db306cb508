"""``tpuctl.job.should_checkpoint(step)`` without a notice costs less than ``tpuctl.job.progress(step)``: counted
in system calls under strace (none per call, where ``progress`` makes one ``sendto`` per call), and timed."""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
CALLS = 2000

JOB = """
import os, time
import tpuctl.job
tpuctl.job.should_checkpoint(0)   # starts the listener thread (it connects and waits for a notice)
tpuctl.job.progress(0)            # connects the reporter
time.sleep(0.5)
os.write(2, b"MARK-ASK\\n")
started = time.perf_counter_ns()
for i in range(1, CALLS + 1):
    tpuctl.job.should_checkpoint(i)
asked = time.perf_counter_ns() - started
os.write(2, b"MARK-PROGRESS\\n")
started = time.perf_counter_ns()
for i in range(1, CALLS + 1):
    tpuctl.job.progress(i)
reported = time.perf_counter_ns() - started
os.write(2, b"MARK-END\\n")
print(asked // CALLS, reported // CALLS)
""".replace("CALLS", str(CALLS))


def test_should_checkpoint_makes_no_system_call_per_step_where_progress_makes_one(tmp_path: Path) -> None:
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(tmp_path / "progress.sock"))
    server.listen(8)
    server.settimeout(30)
    stop = threading.Event()

    def agent() -> None:  # takes both connections and reads what comes (never a notice)
        conns = []
        try:
            while not stop.is_set() and len(conns) < 2:
                conns.append(server.accept()[0])
            for conn in conns:
                conn.settimeout(0.05)
            while not stop.is_set():
                for conn in conns:
                    with contextlib.suppress(TimeoutError):
                        conn.recv(65536)
        except OSError:
            pass
        finally:
            for conn in conns:
                conn.close()

    thread = threading.Thread(target=agent, daemon=True)
    thread.start()
    trace = tmp_path / "trace.txt"
    try:
        proc = subprocess.run(
            [strace, "-f", "-qq", "-o", str(trace), sys.executable, "-c", JOB],
            capture_output=True, text=True, timeout=120,
            env={"TPUCTL_STATE_DIR": str(tmp_path), "TPUCTL_GENERATION": "1", "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
    finally:
        stop.set()
        server.close()
        thread.join(5)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = trace.read_text().splitlines()
    marks = {name: next(i for i, line in enumerate(lines) if f"MARK-{name}" in line) for name in ("ASK", "PROGRESS", "END")}
    main = lines[marks["ASK"]].split()[0]  # the main thread's id
    asking = [line for line in lines[marks["ASK"] + 1 : marks["PROGRESS"]] if line.split()[0] == main]
    reporting = [line for line in lines[marks["PROGRESS"] + 1 : marks["END"]] if line.split()[0] == main]
    sends = [line for line in reporting if re.match(r"\d+\s+(sendto|send|write)\(", line)]
    assert len(asking) <= 5, asking[:20]  # no system call per step (a stray one at most: the allocator, a signal)
    assert len(sends) >= CALLS  # progress: one per step
    ask_ns, progress_ns = (int(x) for x in proc.stdout.split())
    print(f"should_checkpoint {ask_ns} ns/call, progress {progress_ns} ns/call (under strace)")
