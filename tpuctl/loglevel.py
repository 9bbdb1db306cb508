"""Log levels as users name them: ``--log-level LEVEL``, ``-v``/``-vv``, ``TPUCTL_LOG_LEVEL``.

One reading for every command and the agent: a name (``debug``, ``info``, ``warning``, ``error``,
``critical``; any case; ``warn`` too) or a number (the ``logging`` module's). The command line wins over
the variable; a command sets the variable for what it starts (the agent ``init`` forks, the hosts ``sim
up`` starts), so the agent logs at the level its ``init`` was given. Defaults: ``warning`` for a
command's own messages on stderr, ``info`` for the agent's log. Pure: the caller hands the variable's
value in; no ``logging`` import (``tpuctl status`` parses ``-v`` on the light path).
"""

# No `from __future__ import annotations` here: that statement imports the __future__ module, about
# 0.15 ms before the light path's request. Annotations naming what only the type checker imports are quoted.
LOG_LEVEL_ENV = "TPUCTL_LOG_LEVEL"
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
"""The ``logging`` module's numbers, without importing it."""
ALIASES = {"warn": "warning", "fatal": "critical"}
COMMAND_DEFAULT = LEVELS["warning"]
AGENT_DEFAULT = LEVELS["info"]


def parse_level(text: str, what: str = "--log-level") -> int:
    """``debug`` -> 10, ``20`` -> 20; InputError (exit 2) naming ``what`` and the closest level."""
    name = text.strip().lower()
    name = ALIASES.get(name, name)
    if name in LEVELS:
        return LEVELS[name]
    if name.isascii() and name.isdigit() and 0 < int(name) <= 50:
        return int(name)
    from tpuctl.errors import InputError  # a wrong level's alone: not on the light path
    from tpuctl.messages import did_you_mean

    raise InputError(
        f"{what} {text!r} is not a log level",
        hint=did_you_mean(name, [*LEVELS, *ALIASES], otherwise="levels: " + ", ".join(LEVELS)),
    )


def verbosity(count: int) -> int:
    """``-v`` -> info, ``-vv`` (or more) -> debug."""
    return LEVELS["info"] if count == 1 else LEVELS["debug"]


def level_name(level: int) -> str:
    """``10`` -> ``debug``; a number between levels stays a number."""
    return next((name for name, number in LEVELS.items() if number == level), str(level))


def chosen_level(option: str | None, verbose: int, environ_value: str | None) -> int | None:
    """``--log-level`` over ``-v`` over ``TPUCTL_LOG_LEVEL``; None when none says anything."""
    if option is not None:
        return parse_level(option)
    if verbose:
        return verbosity(verbose)
    if environ_value:
        return parse_level(environ_value, what=LOG_LEVEL_ENV)
    return None


__all__ = [
    "AGENT_DEFAULT",
    "COMMAND_DEFAULT",
    "LEVELS",
    "LOG_LEVEL_ENV",
    "chosen_level",
    "level_name",
    "parse_level",
    "verbosity",
]
