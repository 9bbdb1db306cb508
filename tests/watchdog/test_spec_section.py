"""The spec's ``watchdog:`` section: defaults, every key, and each mistake named where it was written."""

from __future__ import annotations

import pytest

from tpuctl.spec.yamlfile import check_spec_text, load_spec_text
from tpuctl.watchdog.settings import StragglerSettings, WatchdogSettings

BASE = "cluster: pod-a\naccelerator: v4-32\nbackend: sim\nhosts: [h0, h1, h2, h3]\n"


def test_without_the_section_the_defaults_hold() -> None:
    spec = load_spec_text(BASE)
    assert spec.watchdog == WatchdogSettings(600.0, "warn", 10.0, StragglerSettings(1.25, 50))


def test_every_key_is_read() -> None:
    text = BASE + (
        "restart: {policy: rejoin}\n"
        "watchdog: {hang_timeout: 90s, on_hang: restart, report_every: 2s, straggler: {ratio: 1.5, steps: 20}}\n"
    )
    assert load_spec_text(text).watchdog == WatchdogSettings(90.0, "restart", 2.0, StragglerSettings(1.5, 20))


@pytest.mark.parametrize("off", ["off", "false", "'off'"])
def test_straggler_detection_can_be_turned_off(off: str) -> None:
    assert load_spec_text(BASE + f"watchdog: {{straggler: {off}}}\n").watchdog.straggler is None


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        (
            "watchdog: {hang_timeout: 1s}",
            "c.yaml:5:26: watchdog.hang_timeout: '1s' is shorter than 5s (a step, a checkpoint or an evaluation may "
            "take that long); expected a duration from 5s to 168h (7 days)",
        ),
        ("watchdog: {on_hang: kill}", "c.yaml:5:21: watchdog.on_hang: 'kill' is not an action; expected one of warn, restart, fail"),
        ("watchdog: {on_hang: restrat}", "c.yaml:5:21: watchdog.on_hang: 'restrat' is not an action; did you mean 'restart'?"),
        (
            "watchdog: {on_hang: restart}",
            "c.yaml:5:21: watchdog.on_hang: restart needs the cluster to re-form after a generation ends; expected "
            "restart: {policy: rejoin} beside it, or on_hang: warn or fail",
        ),
        (
            "watchdog: {straggler: {ratio: 1}}",
            "c.yaml:5:31: watchdog.straggler.ratio: 1 is out of range; expected a number from 1.05 to 10 (1.25: 25 % "
            "slower than the cluster's median)",
        ),
        (
            "watchdog: {straggler: {ratio: fast}}",
            "c.yaml:5:31: watchdog.straggler.ratio: got string 'fast'; expected a number from 1.05 to 10 (1.25: 25 % "
            "slower than the cluster's median)",
        ),
        ("watchdog: {straggler: {steps: 3}}", "c.yaml:5:31: watchdog.straggler.steps: 3 is out of range; expected an integer from 10 to 10000"),
        ("watchdog: {hang_timout: 10m}", "c.yaml:5:12: watchdog.hang_timout: unknown key; did you mean 'hang_timeout'?"),
        ("on_hang: warn", "c.yaml:5:1: on_hang: unknown key; it belongs under watchdog: (watchdog: {on_hang: warn})"),
    ],
)
def test_mistakes_are_named_where_they_were_written(section: str, expected: str) -> None:
    check = check_spec_text(BASE + section + "\n", "c.yaml")
    assert check.formatted() == [expected]
