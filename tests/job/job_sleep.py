"""A long-running job for the failure tests: it starts a helper process in its own process group (which
ignores SIGTERM, so stopping the job must also SIGKILL what is left of the group), writes both pids to
argv[1], and sleeps.

Run as: ``tpuctl run --state-dir ROOT/host-N -- python job_sleep.py PIDS_FILE``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

pids_file = sys.argv[1]
helper = subprocess.Popen(
    [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"]
)
with open(pids_file + ".tmp", "w") as handle:
    handle.write(f"{os.getpid()} {helper.pid}\n")
os.replace(pids_file + ".tmp", pids_file)
print(f"job {os.getpid()} running as task {os.environ['TPUCTL_TASK_ID']}", flush=True)
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
time.sleep(600)
