"""Whether a process is alive: the one answer shared by the agent's pid file, ``tpuctl run`` and ``sim``.

Why one module: three copies disagreed about zombies. ``kill -0`` succeeds on a process that has exited
but was not reaped yet (a killed agent whose parent is busy), so a dead agent looked alive to one and
dead to another. Here a zombie is dead, and a process we may not signal (EPERM: another user's) is
alive. Standard library only; the zombie check reads ``/proc`` where there is one.
"""

from __future__ import annotations

import os
import time

__all__ = ["pid_alive", "started_at"]


def pid_alive(pid: int) -> bool:
    """True when ``pid`` names a running process (a zombie or a dying one, Z or X, counts as gone; EPERM as
    alive).

    Non-positive pids are never alive: ``kill(0, 0)`` and ``kill(-1, 0)`` would test process groups.
    Without ``/proc`` (not Linux) a process that answers ``kill -0`` is taken as alive.
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    state = _state(pid)
    if state is None:  # it exited between the two looks, or there is no /proc to ask
        return not os.path.exists("/proc/self/stat")
    return state not in ("Z", "X")


def started_at(pid: int) -> float | None:
    """When process ``pid`` started, in wall seconds since the epoch (to 10 ms: the kernel's clock ticks),
    or None where ``/proc`` cannot tell. From its age (``/proc/uptime`` less its start in ticks since boot),
    not the boot time's whole seconds."""
    try:
        fields = _read_stat(pid).rsplit(")", 1)[-1].split()
        with open("/proc/uptime") as handle:
            uptime = float(handle.read().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - max(0.0, age)


def _state(pid: int) -> str | None:
    """The one-letter state from ``/proc/PID/stat`` (R, S, D, Z, ...), or None when it cannot be read.

    The command name in parentheses may itself hold spaces or parentheses, so the state is the first
    field after the last ``)``.
    """
    try:
        text = _read_stat(pid)
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    return fields[0] if fields else None


def _read_stat(pid: int) -> str:
    """``/proc/PID/stat``'s text (os and open: pathlib is not imported on ``tpuctl barrier``'s path)."""
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read()
