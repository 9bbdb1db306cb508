"""The spec's ``preemption:`` section: defaults, every key, and each mistake named where it was written."""

from __future__ import annotations

import pytest

from tpuctl.preemption.settings import PreemptionSettings
from tpuctl.spec.yamlfile import check_spec_text, load_spec_text

BASE = "cluster: pod-a\naccelerator: v4-32\nbackend: sim\nhosts: [h0, h1, h2, h3]\n"


def test_without_the_section_the_defaults_hold() -> None:
    assert load_spec_text(BASE).preemption == PreemptionSettings(25.0, "auto")


@pytest.mark.parametrize("off", ["off", "false", "'off'"])
def test_every_key_is_read_and_off_is_off_however_yaml_reads_it(off: str) -> None:
    assert load_spec_text(BASE + f"preemption: {{grace: 40s, metadata: {off}}}\n").preemption == PreemptionSettings(40.0, "off")


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        (
            "preemption: {grace: 100ms}",
            "c.yaml:5:21: preemption.grace: '100ms' is shorter than 1s (the hosts need time to agree on a step and "
            "save it); expected a duration from 1s to 1h",
        ),
        ("preemption: {metadata: on}", "c.yaml:5:24: preemption.metadata: got boolean on (YAML reads an unquoted on as a boolean: quote it); expected auto or off"),
        ("preemption: {metadata: atuo}", "c.yaml:5:24: preemption.metadata: 'atuo' is not a watch setting; did you mean 'auto'?"),
        ("preemption: {grce: 1s}", "c.yaml:5:14: preemption.grce: unknown key; did you mean 'grace'?"),
    ],
)
def test_each_mistake_is_named_where_it_was_written(section: str, expected: str) -> None:
    problems = check_spec_text(BASE + section + "\n", "c.yaml").formatted()
    assert problems == [expected]
