"""Durations as people write them: ``250ms``, ``5s``, ``10m``, ``1h30m``, or a plain number of seconds."""

from __future__ import annotations

import re

from tpuctl.errors import InputError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_WHOLE = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|s|m|h))+$")


def parse_duration(text: str, *, what: str = "duration") -> float:
    """Seconds in ``text``; InputError naming ``what`` when it is not a positive duration."""
    value = text.strip().lower()
    try:
        seconds = float(value)
    except ValueError:
        if not _WHOLE.match(value):
            raise InputError(
                f"{what}: {text!r} is not a duration", hint="write e.g. 90s, 10m, 1h30m, 250ms, or seconds as a number"
            ) from None
        seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(value))
    if seconds <= 0 or seconds != seconds or seconds == float("inf"):
        raise InputError(f"{what}: {text!r} must be a positive, finite duration", hint="e.g. 90s or 10m")
    return seconds


def format_duration(seconds: float) -> str:
    """90.0 -> ``1m30s``; 0.25 -> ``250ms``; 1234.567 -> ``20m34.567s``. Parses back exactly."""
    from decimal import Decimal

    exact = Decimal(repr(seconds))
    if exact < 1:
        millis = exact * 1000
        if millis == millis.to_integral_value():
            return f"{int(millis)}ms"
        return f"{_plain(exact)}s"
    whole = int(exact)
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    tail = exact - whole + s
    parts = [f"{v}{u}" for v, u in ((h, "h"), (m, "m")) if v]
    if tail or not parts:
        parts.append(f"{_plain(tail)}s")
    return "".join(parts)


def _plain(value: object) -> str:
    """A Decimal in positional notation without trailing zeros (never ``1E+6``)."""
    text = format(value, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text
