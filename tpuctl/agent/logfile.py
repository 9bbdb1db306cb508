"""Where an agent logs: its state dir's ``agent.log`` (a background agent) or stderr (``--foreground``), as
text (the default) or one JSON object a line (``--log-format json``, :mod:`tpuctl.logformat`).

A JSON line, for log pipelines (Cloud Logging, Loki, fluent-bit)::

    {"ts": "2026-12-06T02:23:58.280412Z", "level": "error", "msg": "task 3: ...", "cluster": "pod-a",
     "task": 3, "generation": 2, "logger": "tpuctl.agent.bringup", "pid": 4242, "cause": "..."}

``ts`` is RFC 3339 in UTC with microseconds; ``level`` is tpuctl's name for it (``debug``, ``info``,
``warning``, ``error``, ``critical``); ``generation`` is the one this host's agent is in when the line is
written (0 before it first registered). Records at ``error`` and above carry ``cause``: the exception the
record is about (its message, or ``Type: text``), else the message itself; a record with a traceback
carries it in ``traceback``, in the same line (JSON escapes its newlines, as a message's own).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from tpuctl.logformat import JSON, TEXT

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVEL_NAMES = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning", logging.ERROR: "error", logging.CRITICAL: "critical"}


class LogContext:
    """What every JSON line names beside its record: the cluster, this host's task, and its generation as
    ``generation()`` answers when the line is written (the agent's, once it runs)."""

    def __init__(self, cluster: str, task: int, generation: Callable[[], int] = lambda: 0) -> None:
        self.cluster = cluster
        self.task = task
        self.generation = generation


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line whatever the message or traceback holds."""

    def __init__(self, context: LogContext) -> None:
        super().__init__()
        self.context = context

    def format(self, record: logging.LogRecord) -> str:
        context = self.context
        try:
            generation = context.generation()
        except Exception:  # a record written while the agent is torn down must still be written
            generation = 0
        line: dict[str, object] = {
            "ts": rfc3339(record.created),
            "level": LEVEL_NAMES.get(record.levelno, str(record.levelno)),
            "msg": record.getMessage(),
            "cluster": context.cluster,
            "task": context.task,
            "generation": generation,
            "logger": record.name,
            "pid": record.process,
        }
        exc = record.exc_info[1] if record.exc_info else None
        if record.levelno >= logging.ERROR:
            line["cause"] = cause(record, exc)
        if exc is not None:
            line["exception"] = type(exc).__name__
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def rfc3339(epoch: float) -> str:
    """``1765000000.5`` -> ``2025-12-06T05:46:40.500000Z``."""
    seconds = int(epoch)
    micros = round((epoch - seconds) * 1e6)
    if micros == 1_000_000:
        seconds, micros = seconds + 1, 0
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"


def cause(record: logging.LogRecord, exc: BaseException | None) -> str:
    """Why an error record was written: its ``cause`` (``extra={"cause": ...}``), the exception it carries
    (its traceback's, or one among its arguments), else its message."""
    given = getattr(record, "cause", None)
    if isinstance(given, str) and given:
        return given
    if exc is None and isinstance(record.args, tuple):
        exc = next((arg for arg in record.args if isinstance(arg, BaseException)), None)
    if exc is None:
        return record.getMessage()
    from tpuctl.errors import TpuctlError

    if isinstance(exc, TpuctlError):
        return exc.message
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def configure_logging(
    path: Path | None, level: int = logging.INFO, fmt: str = TEXT, context: LogContext | None = None
) -> None:
    """Every ``tpuctl`` logger to ``path`` (or stderr), one line per record, at ``level``; ``fmt`` ``json``
    writes :class:`JsonFormatter`'s lines, naming ``context``'s cluster, task and generation."""
    handler: logging.Handler = logging.FileHandler(path) if path else logging.StreamHandler()
    if fmt == JSON:
        handler.setFormatter(JsonFormatter(context or LogContext("", -1)))
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger("tpuctl")
    root.handlers[:] = [handler]
    root.setLevel(level)


__all__ = ["JsonFormatter", "LogContext", "configure_logging", "rfc3339"]
