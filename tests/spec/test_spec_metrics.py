"""The spec's ``metrics:`` section and ``log_format``, ``init --metrics`` / ``--log-format`` and their
variables over them: every form read, each mistake named where it was written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuctl.agent.options import AgentOptions, observed
from tpuctl.agent.statedir import StateDir
from tpuctl.errors import InputError
from tpuctl.spec.metrics import MetricsSpec, parse_metrics_option
from tpuctl.spec.yamlfile import check_spec_text, load_spec_text

BASE = "cluster: pod-a\naccelerator: v4-32\nbackend: sim\nhosts: [h0, h1, h2, h3]\n"


def test_off_and_text_unless_the_spec_says() -> None:
    spec = load_spec_text(BASE)
    assert spec.metrics is None and spec.log_format == "text"
    assert load_spec_text(BASE + "metrics: off\n").metrics is None


@pytest.mark.parametrize(
    ("section", "value"),
    [
        ("metrics: {port: 8491}", MetricsSpec(port=8491)),
        ("metrics: {port: 9100, address: 0.0.0.0}", MetricsSpec(port=9100, address="0.0.0.0")),
        ("metrics: {socket: metrics.sock}", MetricsSpec(socket="metrics.sock")),
        ("metrics: {socket: /run/tpuctl/m.sock}", MetricsSpec(socket="/run/tpuctl/m.sock")),
    ],
)
def test_every_form_is_read(section: str, value: MetricsSpec) -> None:
    spec = load_spec_text(BASE + section + "\nlog_format: json\n")
    assert spec.metrics == value and spec.log_format == "json"


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ("metrics: {}", "c.yaml:5:10: metrics: neither port nor socket; expected a port (metrics: {port: 8491}) or a Unix socket (metrics: {socket: metrics.sock}), or off"),
        ("metrics: {port: 1, socket: s}", "c.yaml:5:10: metrics: both port and socket given; expected a port (metrics: {port: 8491}) or a Unix socket (metrics: {socket: metrics.sock}), or off"),
        ("metrics: {port: 70000}", "c.yaml:5:17: metrics.port: 70000 is out of range; expected an integer from 1 to 65535"),
        ("metrics: {port: 8490}", "c.yaml:5:10: metrics.port: 8490 is the coordinator's port too; expected another port"),
        ("metrics: {prot: 8491}", "c.yaml:5:11: metrics.prot: unknown key; did you mean 'port'?"),
        ("metrics: {socket: s, address: 0.0.0.0}", "c.yaml:5:31: metrics.address: an address goes with a port, not a socket; expected one of them"),
        ("metrics: {port: 8491, address: 'not an address'}", "c.yaml:5:32: metrics.address: 'not an address' contains whitespace; expected a host name or an IP address, without a port"),
        ("metrics: 8491", "c.yaml:5:10: metrics: got integer 8491; expected a port (metrics: {port: 8491}) or a Unix socket (metrics: {socket: metrics.sock}), or off"),
        ("log_format: yaml", "c.yaml:5:13: log_format: 'yaml' is not a log format; expected one of text, json"),
        ("log_format: jsn", "c.yaml:5:13: log_format: 'jsn' is not a log format; did you mean 'json'?"),
    ],
)
def test_mistakes_are_named_where_they_were_written(section: str, expected: str) -> None:
    check = check_spec_text(BASE + section + "\n", "c.yaml")
    assert check.formatted() == [expected]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8491", MetricsSpec(port=8491)),
        ("0.0.0.0:9100", MetricsSpec(port=9100, address="0.0.0.0")),
        ("[::1]:9100", MetricsSpec(port=9100, address="::1")),
        ("unix:metrics.sock", MetricsSpec(socket="metrics.sock")),
        ("off", None),
    ],
)
def test_the_option_reads_one_word(text: str, value: MetricsSpec | None) -> None:
    assert parse_metrics_option(text) == value


@pytest.mark.parametrize("text", ["", "http://x:1", "99999", "host:", "unix:", "a b:80", "8491x"])
def test_a_bad_option_says_what_it_expects(text: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_metrics_option(text, what="TPUCTL_METRICS")
    assert caught.value.message.startswith("TPUCTL_METRICS ") and caught.value.exit_code == 2
    assert caught.value.hint == "expected a port (8491), ADDRESS:PORT (0.0.0.0:8491), unix:PATH or off"


def test_several_tasks_on_one_machine_take_the_next_ports() -> None:
    hosts = ("a", "a", "b", "b")  # two TPU processes per machine, side by side
    assert [MetricsSpec(port=9000).port_for(t, hosts) for t in range(4)] == [9000, 9001, 9000, 9001]
    assert [MetricsSpec(port=9000).port_for(t, ("a", "b")) for t in range(2)] == [9000, 9000]


def options(spec_text: str) -> AgentOptions:
    spec = load_spec_text(spec_text)
    return AgentOptions(spec=spec, task=0, state=StateDir("/tmp/x"), output=Path("/tmp/x/m.json"), address="h0")


def test_the_command_line_wins_over_the_variable_over_the_spec() -> None:
    base = options(BASE + "metrics: {port: 8491}\nlog_format: json\n")
    assert observed(base, None, None, {}) is base
    env = {"TPUCTL_METRICS": "unix:m.sock", "TPUCTL_LOG_FORMAT": "text"}
    by_env = observed(base, None, None, env).spec
    assert (by_env.metrics, by_env.log_format) == (MetricsSpec(socket="m.sock"), "text")
    by_option = observed(base, "9100", "json", env).spec
    assert (by_option.metrics, by_option.log_format) == (MetricsSpec(port=9100), "json")
    assert observed(base, "off", None, env).spec.metrics is None
    with pytest.raises(InputError, match="TPUCTL_LOG_FORMAT 'xml' is not a log format"):
        observed(base, None, None, {"TPUCTL_LOG_FORMAT": "xml"})
    with pytest.raises(InputError, match="metrics port 8490 is the coordinator's port too"):
        observed(base, "8490", None, {})
