"""Log formats as users name them: ``--log-format text|json``, ``TPUCTL_LOG_FORMAT``, the spec's ``log_format``.

``text`` (the default) is the agent log as it always was; ``json`` is one JSON object a line
(:mod:`tpuctl.agent.logfile` writes both). The command line wins over the variable, the variable over
the spec. Pure: the caller hands the variable's and the spec's values in.
"""

from __future__ import annotations

LOG_FORMAT_ENV = "TPUCTL_LOG_FORMAT"
TEXT, JSON = "text", "json"
LOG_FORMATS = (TEXT, JSON)
DEFAULT_LOG_FORMAT = TEXT


def parse_log_format(text: str, what: str = "--log-format") -> str:
    """``JSON`` -> ``json``; InputError (exit 2) naming ``what`` and the closest format."""
    name = text.strip().lower()
    if name in LOG_FORMATS:
        return name
    from tpuctl.errors import InputError
    from tpuctl.messages import did_you_mean

    raise InputError(
        f"{what} {text[:40]!r} is not a log format",
        hint=did_you_mean(name, LOG_FORMATS, otherwise="log formats: " + ", ".join(LOG_FORMATS)),
    )


def chosen_log_format(option: str | None, environ_value: str | None, spec_value: str = DEFAULT_LOG_FORMAT) -> str:
    """``--log-format`` over ``TPUCTL_LOG_FORMAT`` over the spec's ``log_format`` (an empty variable is unset)."""
    if option is not None:
        return parse_log_format(option)
    if environ_value:
        return parse_log_format(environ_value, what=LOG_FORMAT_ENV)
    return spec_value


__all__ = ["DEFAULT_LOG_FORMAT", "JSON", "LOG_FORMATS", "LOG_FORMAT_ENV", "TEXT", "chosen_log_format", "parse_log_format"]
