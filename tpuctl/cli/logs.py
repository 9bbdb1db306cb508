"""``tpuctl logs``: this host's agent log (``STATE_DIR/agent.log``), its last lines, and ``--follow``."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import click

from tpuctl.cli.common import WholeNumber, parse_duration_option, state_dir_option
from tpuctl.errors import StateError

FOLLOW_POLL_S = 0.2
READ_CHUNK = 1 << 16  # bytes read at a time: the tail and a follow step cost O(what is printed)
MAX_LINES = 100_000


@click.command("logs")
@click.option(
    "--lines", "-n", type=WholeNumber(0, MAX_LINES), default=50, show_default=True, help="Show the last N lines."
)
@click.option("--follow", is_flag=True, help="Keep printing new lines until the agent exits (or --timeout).")
@click.option("--timeout", metavar="DURATION", help="With --follow: stop after this long (e.g. 30s, 10m).")
@state_dir_option
def logs(lines: int, follow: bool, timeout: str | None, state_dir: str | None) -> int:
    """Show this host's agent log: its last lines, and with --follow what it writes next.

    \b
      tpuctl logs                              # the last 50 lines
      tpuctl logs -n 200 --state-dir /tmp/tpuctl-sim-$UID/host-2
      tpuctl logs --follow --timeout 10m       # until the agent exits, at most 10 minutes
    The agent logs at --log-level (or TPUCTL_LOG_LEVEL) given to `tpuctl init`, info by default.
    An agent started with `init --foreground` logs to its own stderr, not to a file.

    Exit codes: 0 shown, 2 bad option, 5 no agent log in this state dir.
    """
    from tpuctl.agent.statedir import resolve_state_dir

    seconds = parse_duration_option(timeout, "--timeout")
    if seconds is not None and not follow:
        from tpuctl.errors import InputError

        raise InputError("--timeout goes with --follow", hint="e.g. tpuctl logs --follow --timeout 10m")
    state = resolve_state_dir(state_dir)
    path = Path(state.log_file)
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise StateError(
            f"no agent log in state dir {state.path} ({path.name} is missing)",
            hint="an agent started by `tpuctl init` in the background writes it; check --state-dir "
            "(the same as init's); with `init --foreground` the log goes to that process's stderr",
        ) from None
    except OSError as exc:
        raise StateError(f"cannot read the agent log {path}: {exc.strerror or exc}") from exc
    with handle:
        _write(tail(handle, lines))
        if follow:
            _follow(handle, path, state.live_pid, seconds)
    return 0


def tail(handle: BinaryIO, lines: int) -> bytes:
    """The last ``lines`` lines of an open binary file, reading backwards in chunks (O(what is returned))."""
    end = handle.seek(0, os.SEEK_END)
    if lines == 0:
        return b""
    data = b""
    position = end
    while position > 0 and data.count(b"\n") <= lines:
        step = min(READ_CHUNK, position)
        position -= step
        handle.seek(position)
        data = handle.read(step) + data
    handle.seek(end)
    kept = data.splitlines(keepends=True)[-lines:]
    return b"".join(kept)


def _follow(handle: BinaryIO, path: Path, live_pid: Callable[[], int | None], seconds: float | None) -> None:
    """Print what is appended until the agent is gone (then what it wrote last) or ``seconds`` pass.

    A log truncated or replaced (a new agent in the same state dir) is read again from its start.
    """
    deadline = None if seconds is None else time.monotonic() + seconds
    while True:
        alive = live_pid() is not None
        chunk = handle.read(READ_CHUNK)
        if chunk:
            _write(chunk)
            continue
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size < handle.tell():
            handle.seek(0)
            continue
        if not alive:
            return
        if deadline is not None and time.monotonic() >= deadline:
            return
        time.sleep(FOLLOW_POLL_S)


def _write(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
