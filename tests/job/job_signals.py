"""A job for the signal tests: writes its pid to argv[1] once its handlers are in place, records every
signal it gets (one name per line) in argv[1] + ".signals", and exits 40 + the signal number on
SIGTERM, SIGINT or SIGHUP (SIGUSR1 is only recorded). With argv[2] == "ignore-term" it ignores SIGTERM.

Run as: ``tpuctl run -- python job_signals.py PID_FILE [ignore-term]``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from types import FrameType

pid_file = sys.argv[1]
ignore_term = sys.argv[2:] == ["ignore-term"]


def record(signum: int, frame: FrameType | None) -> None:
    with open(pid_file + ".signals", "a") as handle:
        handle.write(signal.Signals(signum).name + "\n")
    if signum == signal.SIGTERM and ignore_term:
        return
    if signum != signal.SIGUSR1:
        sys.exit(40 + signum)


for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
    signal.signal(sig, record)
with open(pid_file + ".tmp", "w") as handle:
    handle.write(f"{os.getpid()} {os.getpgrp()}\n")
os.replace(pid_file + ".tmp", pid_file)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(99)
