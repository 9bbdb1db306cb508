"""Whether a process is alive: the one answer shared by the agent's pid file, ``tpuctl run`` and ``sim``.

Why one module: three copies disagreed about zombies. ``kill -0`` succeeds on a process that has exited
but was not reaped yet (a killed agent whose parent is busy), so a dead agent looked alive to one and
dead to another. Here a zombie is dead, and a process we may not signal (EPERM: another user's) is
alive. Standard library only; the zombie check reads ``/proc`` where there is one.
"""

from __future__ import annotations

import os

__all__ = ["pid_alive"]


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
