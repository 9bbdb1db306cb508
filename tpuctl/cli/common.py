"""Options and helpers shared by the commands that talk to this host's agent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from tpuctl.agent.statedir import STATE_DIR_ENV

F = TypeVar("F", bound=Callable[..., Any])

state_dir_option = click.option(
    "--state-dir",
    metavar="DIR",
    envvar=STATE_DIR_ENV,
    help=f"This host's agent state (socket, pid, log). Default: ${STATE_DIR_ENV}, /run/tpuctl for root, "
    "else $XDG_RUNTIME_DIR/tpuctl or /tmp/tpuctl-UID. Use the same value as `tpuctl init`.",
)


def parse_duration_option(text: str | None, option: str) -> float | None:
    """``--timeout 90s`` -> 90.0 (same syntax as the spec's durations); InputError (exit 2) outside the
    option's bounds (:data:`tpuctl.durations.OPTION_BOUNDS`)."""
    if text is None:
        return None
    from tpuctl.durations import OPTION_BOUNDS, parse_duration

    return parse_duration(text, what=option, bounds=OPTION_BOUNDS.get(option))


def say(text: str) -> None:
    """Chatter for people: stderr, so stdout stays data."""
    click.echo(text, err=True)
