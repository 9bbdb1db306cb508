"""Durations as people write them: ``250ms``, ``5s``, ``10m``, ``1h30m``, ``2d``, or a plain number of seconds.

Every duration tpuctl takes has bounds (:class:`Bounds`, the constants below; docs/reference/spec.md's
limits table lists them): a spec's waits are checked by ``tpuctl validate`` with the same bounds ``init``
relies on, and the command-line durations (``--timeout``, ``--grace``) are refused outside theirs with exit 2.

Parsed by hand, and :class:`Bounds` is a record (:mod:`tpuctl.records`), not a dataclass: ``tpuctl barrier
--timeout 5m`` imports this module, and ``re`` plus ``dataclasses`` (which brings ``inspect``) cost that
command more than the rest of its imports together.
"""

from __future__ import annotations

from tpuctl.errors import InputError

TYPE_CHECKING = False  # typing is not imported on the light path (a Record is tpuctl.records' at run time)
if TYPE_CHECKING:
    from typing import NamedTuple as Record
else:
    from tpuctl.records import Record

DAY = 86400.0


class Bounds(Record):
    """The shortest and longest value a duration may take (seconds, both inclusive)."""

    low: float
    high: float
    why_low: str = ""
    """Why nothing shorter is useful, said when a value is below ``low``."""

    def span(self) -> str:
        """``from 100ms to 1h``; days spelt out (``from 1s to 168h (7 days)``)."""
        days = self.high / DAY
        note = f" ({days:g} day{'s' if days != 1 else ''})" if days >= 1 and days == int(days) else ""
        return f"from {format_duration(self.low)} to {format_duration(self.high)}{note}"

    def problem(self, seconds: float, shown: str) -> str | None:
        """``'1ms' is shorter than 100ms; expected a duration from 100ms to 1h``, or None within bounds."""
        if seconds < self.low:
            why = f" ({self.why_low})" if self.why_low else ""
            return f"{shown} is shorter than {format_duration(self.low)}{why}; expected a duration {self.span()}"
        if seconds > self.high:
            return f"{shown} is longer than {format_duration(self.high)}; expected a duration {self.span()}"
        return None


HEARTBEAT_INTERVAL = Bounds(0.1, 3600.0, "more often only burns CPU and network")
"""``coordinator.heartbeat_interval`` (and shorter than ``heartbeat_timeout``)."""
HEARTBEAT_TIMEOUT = Bounds(1.0, DAY, "a busy host would be declared dead")
"""``coordinator.heartbeat_timeout``: how long a silent host lives."""
REGISTER_TIMEOUT = Bounds(1.0, 7 * DAY, "hosts need time to start")
"""``coordinator.register_timeout``."""
BARRIER_TIMEOUT = Bounds(1.0, 7 * DAY, "hosts need time to arrive")
"""``barrier_timeout``, and ``tpuctl barrier --timeout``."""
RESTART_TIMEOUT = Bounds(1.0, 7 * DAY, "a host needs time to come back")
"""``restart.timeout``: how long a new generation may take to form after a failure."""
GRACE = Bounds(0.1, 3600.0, "a job needs time to exit")
"""``tpuctl run --grace``: SIGTERM to SIGKILL."""
NOTICE = Bounds(1.0, 7 * DAY, "the hosts need time to agree on a step and save it")
"""``tpuctl preempt --in``: how long until this host goes."""
OPTION_BOUNDS = {"--timeout": BARRIER_TIMEOUT, "--grace": GRACE, "--in": NOTICE}
"""The command-line durations' bounds, by option name."""
MAX_DURATION_CHARS = 100
"""Longest duration text read; longer text is refused before it is parsed."""

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY}
_DIGITS = "0123456789"
SYNTAX = "e.g. 90s, 10m, 1h30m, 2d, 250ms, or seconds as a number"
"""The grammar in one example line, for hints."""


def parse_duration(text: str, *, what: str = "duration", bounds: Bounds | None = None) -> float:
    """Seconds in ``text``; InputError naming ``what`` when it is not a positive duration within ``bounds``.

    A leading ``-`` is read as a sign, so ``-5`` and ``-5s`` are both refused as negative (one message);
    digits are ASCII only (``float`` alone would take ``\u0665`` for 5)."""
    if len(text) > MAX_DURATION_CHARS:
        raise InputError(
            f"{what}: {text[:20]!r}... ({len(text):,} characters) is not a duration",
            hint=f"write {SYNTAX}",
        )
    value = text.strip().lower()
    body = value[1:] if value[:1] in ("-", "+") else value
    seconds = _seconds(body)
    if seconds is None:
        raise InputError(f"{what}: {text!r} is not a duration", hint=f"write {SYNTAX}")
    if value.startswith("-") and seconds > 0:
        raise InputError(f"{what}: {negative(repr(text))}", hint="e.g. 90s or 10m")
    if seconds <= 0 or seconds != seconds or seconds == float("inf"):
        raise InputError(f"{what}: {text!r} must be a positive, finite duration", hint="e.g. 90s or 10m")
    if bounds is not None and (problem := bounds.problem(seconds, repr(text))):
        raise InputError(f"{what}: {problem}", hint=f"e.g. {what} {_example(bounds)}")
    return seconds


def negative(shown: str) -> str:
    """The one message for a negative duration, however written (``-5``, ``'-5s'``, ``-1h30m``)."""
    return f"{shown} is negative; a duration must be positive"


def _seconds(body: str) -> float | None:
    """Seconds in an unsigned duration (a plain number, or number-unit pairs); None when it is neither."""
    if not body.isascii() or body[:1] in ("-", "+"):
        return None
    try:
        return float(body)
    except ValueError:
        pass
    parts = _parts(body)
    return sum(float(n) * _UNITS[u] for n, u in parts) if parts else None


def _parts(value: str) -> list[tuple[str, str]]:
    """``1h30m`` -> ``[("1", "h"), ("30", "m")]``: the text as number-unit pairs (a number: ASCII digits,
    maybe a ``.`` and digits; a unit: ms, s, m, h, d); empty unless all of it is such pairs."""
    parts: list[tuple[str, str]] = []
    i, n = 0, len(value)
    while i < n:
        start = i
        while i < n and value[i] in _DIGITS:
            i += 1
        if i == start:
            return []
        if i + 1 < n and value[i] == "." and value[i + 1] in _DIGITS:
            i += 1
            while i < n and value[i] in _DIGITS:
                i += 1
        number = value[start:i]
        unit = "ms" if value.startswith("ms", i) else value[i : i + 1]
        if unit not in _UNITS:
            return []
        parts.append((number, unit))
        i += len(unit)
    return parts


def _example(bounds: Bounds) -> str:
    """A round value inside ``bounds`` for a hint."""
    for seconds, text in ((90.0, "90s"), (10.0, "10s"), (1.0, "1s"), (600.0, "10m")):
        if bounds.low <= seconds <= bounds.high:
            return text
    return format_duration(bounds.low)


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
