"""A job that leaves orphans behind, for ``tpuctl run`` to adopt and reap.

``job_orphans.py CODE [N]``: double-forks N (default 3) grandchildren that outlive their parent by 0.3 s,
checks each was re-parented to the process that started this job (``tpuctl run``, a subreaper, or PID 1
in a container), waits (up to 10 s) until every one of them is gone from ``/proc`` (reaped, not a
zombie), prints one JSON line and exits CODE when all were reaped, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def stat(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) of ``pid``; None when it is gone (reaped)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1])


def orphan(seconds: float) -> int:
    """A grandchild whose parent exits at once: the pid of the orphan, which exits ``seconds`` later."""
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(read)
        grandchild = os.fork()
        if grandchild == 0:
            os.close(write)
            time.sleep(seconds)
            os._exit(0)
        os.write(write, str(grandchild).encode())
        os._exit(0)
    os.close(write)
    pid = int(os.read(read, 64))
    os.close(read)
    os.waitpid(middle, 0)
    return pid


def main() -> int:
    code = int(sys.argv[1])
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    runner = os.getppid()
    pids = [orphan(0.3) for _ in range(count)]
    parents = {pid: (stat(pid) or ("gone", 0))[1] for pid in pids}
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and any(stat(pid) is not None for pid in pids):
        time.sleep(0.05)
    left = {pid: stat(pid) for pid in pids if stat(pid) is not None}
    adopted = all(parent in (runner, 0) for parent in parents.values())
    print(
        json.dumps(
            {"runner": runner, "parents": list(parents.values()), "adopted": adopted, "left": list(left.values())}
        )
    )
    return code if adopted and not left else 1


if __name__ == "__main__":
    sys.exit(main())
