"""Durations in a spec: the shared grammar of ``tpuctl.durations`` (the same as ``--timeout`` flags).

``250ms``, ``5s``, ``10m``, ``1h``, ``1h30m``, or a number of seconds (YAML number or text). Every spec
duration must be positive and finite.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tpuctl.durations import BARRIER_TIMEOUT, format_duration, parse_duration
from tpuctl.errors import InputError
from tpuctl.spec.model import check_spec, node_from

BASE = {"cluster": "a", "accelerator": "v4-8", "backend": "sim", "hosts": ["h"]}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("250ms", 0.25), ("5s", 5.0), ("10m", 600.0), ("1h", 3600.0), ("1h30m", 5400.0), ("90", 90.0), ("1.5", 1.5),
     ("2m30s", 150.0), ("1h0m1s", 3601.0), ("1d", 86400.0), ("2d12h", 216000.0), ("7d", 604800.0)],
)  # fmt: skip
def test_duration_syntax(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    key = "barrier_timeout" if seconds >= 1 else "coordinator"  # barrier_timeout is at least 1s
    value = text if seconds >= 1 else {"heartbeat_interval": text}
    spec = check_spec(node_from({**BASE, key: value})).unwrap()
    assert (spec.barrier_timeout if seconds >= 1 else spec.coordinator.heartbeat_interval) == seconds


@pytest.mark.parametrize("value", [30, 1.5, 1e3])
def test_yaml_numbers_are_seconds(value: float) -> None:
    assert check_spec(node_from({**BASE, "barrier_timeout": value})).unwrap().barrier_timeout == float(value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "0 is not a positive, finite duration"),
        (-1, "-1 is negative; a duration must be positive"),
        (float("inf"), "inf is not a positive, finite duration"),
        ("0s", "'0s' must be a positive, finite duration"),
        ("-5s", "'-5s' is negative; a duration must be positive"),
        ("-5", "'-5' is negative; a duration must be positive"),
        ("5 sec", "'5 sec' is not a duration"),
        ("1w", "'1w' is not a duration"),
        ("\u0665s", "'\u0665s' is not a duration"),
        ("", "'' is not a duration"),
        (True, "got boolean true"),
        ([5], "got a list"),
    ],
)
def test_bad_durations(value: object, message: str) -> None:
    (problem,) = check_spec(node_from({**BASE, "barrier_timeout": value})).problems
    assert problem.path == "barrier_timeout"
    assert problem.message == f"{message}; expected e.g. 250ms, 5s, 10m, 1h30m, or seconds as a number"


@pytest.mark.parametrize("text", ["-5", "-5s", "-1h30m", "-0.5", "-2d", "-inf"])
def test_a_negative_duration_gets_one_message_however_written(text: str) -> None:
    # issue 24: '-5s' was "not a duration" and '-5' "must be a positive, finite duration"
    with pytest.raises(InputError) as caught:
        parse_duration(text, what="--timeout", bounds=BARRIER_TIMEOUT)
    assert caught.value.message == f"--timeout: {text!r} is negative; a duration must be positive"
    assert caught.value.exit_code == 2


@pytest.mark.parametrize("text", ["\u0665", "\u0665s", "1\u0660m", "\uff15s", "5\u00b2"])
def test_only_ascii_digits_make_a_duration(text: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_duration(text, what="--timeout")
    assert caught.value.message == f"--timeout: {text!r} is not a duration"


def test_days_reach_the_longest_bounds() -> None:
    assert parse_duration("7d", bounds=BARRIER_TIMEOUT) == BARRIER_TIMEOUT.high
    with pytest.raises(InputError, match="is longer than 168h"):
        parse_duration("7d1s", bounds=BARRIER_TIMEOUT)


@given(st.integers(min_value=1, max_value=10**7))
@example(5400)
@example(3601)
def test_whole_seconds_round_trip(seconds: int) -> None:
    text = format_duration(seconds)
    assert parse_duration(text) == seconds
    assert format_duration(parse_duration(text)) == text


@given(st.integers(min_value=1, max_value=999))
def test_milliseconds_round_trip(ms: int) -> None:
    text = format_duration(ms / 1000)
    assert text == f"{ms}ms"
    assert parse_duration(text) == pytest.approx(ms / 1000, rel=1e-15)


@given(
    st.integers(min_value=0, max_value=99),
    st.integers(min_value=0, max_value=59),
    st.integers(min_value=0, max_value=59),
)
def test_composed_units_parse_to_their_sum(h: int, m: int, s: int) -> None:
    text = "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s")) if v) or "1s"
    expected = h * 3600 + m * 60 + s or 1
    assert parse_duration(text) == expected
    assert parse_duration(format_duration(expected)) == expected


@given(st.integers(min_value=1, max_value=10**10))
@example(1_234_567)
def test_any_millisecond_duration_round_trips(ms: int) -> None:
    seconds = ms / 1000
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, rel=1e-12)


def test_the_hand_parser_splits_durations_as_the_regular_expressions_did() -> None:
    import random
    import re

    from tpuctl.durations import _parts

    part = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")
    whole = re.compile(r"^(?:[0-9]+(?:\.[0-9]+)?(?:ms|s|m|h|d))+$")
    rng = random.Random(5)
    for _ in range(20000):
        value = "".join(rng.choice("0123456789.mshdx \u0661\u00b2") for _ in range(rng.randrange(9)))
        assert _parts(value) == (part.findall(value) if whole.match(value) else []), value
