"""Options and helpers shared by the commands that talk to this host's agent."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from tpuctl.agent.statedir import STATE_DIR_ENV
from tpuctl.loglevel import LOG_LEVEL_ENV, level_name, parse_level, verbosity

F = TypeVar("F", bound=Callable[..., Any])

state_dir_option = click.option(
    "--state-dir",
    metavar="DIR",
    envvar=STATE_DIR_ENV,
    help=f"This host's agent state (socket, pid, log). Default: ${STATE_DIR_ENV}, /run/tpuctl for root, "
    "else $XDG_RUNTIME_DIR/tpuctl or /tmp/tpuctl-UID. Use the same value as `tpuctl init`; an empty one is refused.",
)


class WholeNumber(click.IntRange):
    """An integer option (``--task-id``, ``--lines``) in ASCII digits only, optionally within a range.

    click's INT calls ``int()``, which reads ``'\u0661'`` (ARABIC-INDIC DIGIT ONE) as 1 and ``'1_0'`` as
    10: a task id no one typed. Anything but an optional sign and 0-9 is a usage error (exit 2)."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            digits = value.strip()
            digits = digits[1:] if digits[:1] in ("-", "+") else digits
            if not (digits.isascii() and digits.isdigit()):
                self.fail(f"{value!r} is not a whole number (digits 0-9)", param, ctx)
        return super().convert(value, param, ctx)


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


# --- the log level: --log-level LEVEL, -v/-vv, TPUCTL_LOG_LEVEL (tpuctl.loglevel) -------------------------

_EXPLICIT = "tpuctl.log_level"  # ctx.meta (shared by a command and its group): --log-level was given


def apply_log_level(level: int) -> None:
    """This process's ``tpuctl`` loggers to stderr at ``level``, and the variable set for what it starts
    (the agent ``init`` forks, ``sim up``'s hosts, a job under ``run``)."""
    import logging

    os.environ[LOG_LEVEL_ENV] = level_name(level)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("tpuctl: %(levelname)s: %(name)s: %(message)s"))
    root = logging.getLogger("tpuctl")
    root.handlers[:] = [handler]
    root.setLevel(level)


def _log_level(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta[_EXPLICIT] = True
        apply_log_level(parse_level(value))


def _verbose(ctx: click.Context, param: click.Parameter, value: int) -> None:
    if value and not ctx.meta.get(_EXPLICIT):
        apply_log_level(verbosity(value))


def log_options() -> list[click.Option]:
    """``--log-level LEVEL`` and ``-v/--verbose``, for the group and every command (added by the group)."""
    return [
        click.Option(
            ["--log-level"], metavar="LEVEL", expose_value=False, is_eager=True, callback=_log_level,
            help=f"debug, info, warning (default), error or critical; else ${LOG_LEVEL_ENV}. The agent logs at it too.",
        ),
        click.Option(
            ["-v", "--verbose"], count=True, expose_value=False, is_eager=True, callback=_verbose,
            help="-v: info, -vv: debug (--log-level wins).",
        ),
    ]  # fmt: skip


def with_log_options(command: click.Command) -> click.Command:
    """Give ``command`` (and a group's subcommands) the log options once."""
    if not any(p.name == "log_level" for p in command.params):
        command.params.extend(log_options())
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            with_log_options(sub)
    return command
