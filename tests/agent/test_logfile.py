"""The agent's log lines: text as it always was, byte for byte; JSON one object a line with the cluster, the
task, the generation now and, for errors, the cause, whatever the message or traceback holds."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from tpuctl.agent.logfile import JsonFormatter, LogContext, configure_logging, rfc3339
from tpuctl.errors import StateError

RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def record(msg: str, *args: object, level: int = logging.INFO, exc_info: object = None, name: str = "tpuctl.agent.bringup") -> logging.LogRecord:
    made = logging.LogRecord(name, level, "bringup.py", 10, msg, args, exc_info)  # type: ignore[arg-type]
    made.created, made.msecs = 1765000000.25, 250.0
    return made


def test_text_lines_are_unchanged(tmp_path: Path) -> None:
    configure_logging(tmp_path / "agent.log")  # the default: text, as before --log-format existed
    try:
        handler = logging.getLogger("tpuctl").handlers[0]
        line = handler.format(record("task %d: registered", 3))
        assert line == logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s").format(record("task %d: registered", 3))
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,250 INFO tpuctl\.agent\.bringup: task 3: registered", line), line
    finally:
        logging.getLogger("tpuctl").handlers[:] = []


def test_a_json_line_has_every_field_and_the_generation_now() -> None:
    generation = [1]
    formatter = JsonFormatter(LogContext("pod-a", 3, lambda: generation[0]))
    first = json.loads(formatter.format(record("task %d: registered", 3)))
    assert first == {
        "ts": "2025-12-06T05:46:40.250000Z", "level": "info", "msg": "task 3: registered", "cluster": "pod-a",
        "task": 3, "generation": 1, "logger": "tpuctl.agent.bringup", "pid": first["pid"],
    }  # fmt: skip
    generation[0] = 2  # the agent re-formed
    assert json.loads(formatter.format(record("generation 2 formed")))["generation"] == 2
    assert RFC3339_UTC.match(rfc3339(0.9999999)) and rfc3339(0.9999999) == "1970-01-01T00:00:01.000000Z"


def test_a_multi_line_message_and_a_traceback_stay_one_line_and_an_error_has_its_cause() -> None:
    formatter = JsonFormatter(LogContext("pod-a", 0))
    error = StateError("task 0: cannot serve metrics on 10.0.0.2:8491: Address already in use", hint="choose another port")
    text = formatter.format(record("init failed: %s", error, level=logging.ERROR))
    assert "\n" not in text
    line = json.loads(text)
    assert line["msg"] == f"init failed: {error.message}\nhint: choose another port"
    assert line["cause"] == error.message and line["level"] == "error"
    try:
        raise ValueError("bad\nvalue")
    except ValueError as exc:
        crashed = record("agent crashed: %s", exc, level=logging.CRITICAL, exc_info=(type(exc), exc, exc.__traceback__))
    text = formatter.format(crashed)
    assert "\n" not in text
    line = json.loads(text)
    assert line["cause"] == "ValueError: bad\nvalue" and line["exception"] == "ValueError" and line["level"] == "critical"
    assert line["traceback"].startswith("Traceback (most recent call last):") and "raise ValueError" in line["traceback"]
    plain = json.loads(formatter.format(record("task %d: %s", 2, "the cluster failed", level=logging.ERROR)))
    assert plain["cause"] == "task 2: the cluster failed"  # no exception: the message is the cause
    assert "cause" not in json.loads(formatter.format(record("a warning", level=logging.WARNING)))
    given = record("lost", level=logging.ERROR)
    given.cause = "preempted"
    assert json.loads(formatter.format(given))["cause"] == "preempted"


@pytest.mark.parametrize("message", ["ünïcode ✓", 'quotes " and \\ backslashes', "tab\tand\rcarriage"])
def test_any_text_round_trips(message: str) -> None:
    line = JsonFormatter(LogContext("c", 1)).format(record("%s", message))
    assert "\n" not in line and json.loads(line)["msg"] == message


def test_init_foreground_with_a_json_log_says_its_progress_as_log_lines(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``init --foreground`` logs to stderr: with a JSON log its progress must be JSON lines too, not text."""
    from tpuctl.cli.init import _StderrReporter

    configure_logging(None, fmt="json", context=LogContext("pod-a", 2))
    try:
        _StderrReporter("text", json_log=True).progress("task 2: registered; waiting for every host")
        lines = capsys.readouterr().err.splitlines()
        assert [json.loads(line)["msg"] for line in lines] == ["task 2: registered; waiting for every host"]
        _StderrReporter("text").progress("task 2: registered")
        assert capsys.readouterr().err == "task 2: registered\n"  # a text log: the chatter as before
    finally:
        logging.getLogger("tpuctl").handlers[:] = []
