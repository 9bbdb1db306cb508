"""Where an agent says how init is going: progress lines, then ready or failed.

``tpuctl init`` reads the agent's events from a pipe (:class:`PipeReporter`); ``--foreground`` prints them
directly; tests collect them. On the pipe the agent also says which phase it is in and how long that
phase may take (``phase``), and that its event loop still runs (``alive``, a few times a second): the
waiting ``init`` bounds its wait by both (:mod:`tpuctl.agent.launch`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
from collections.abc import Callable
from typing import IO, NotRequired, TypedDict

from tpuctl.errors import TpuctlError, error_payload

log = logging.getLogger("tpuctl.agent.bringup")

INIT_INTERRUPTED = signal.SIGUSR1
"""What an interrupted ``tpuctl init`` sends its agent: leave unless the cluster formed (``Agent.init_gone``)."""


class TaskAddress(TypedDict):
    task: int
    address: str


class InitSummary(TypedDict):
    """``tpuctl init``'s document (schema ``tpuctl.init/v1``; key names as in status and topology), sent
    by the agent when it is ready."""

    schema: str
    cluster: str
    task: int
    address: str
    num_hosts: int
    tasks: list[TaskAddress]
    accelerator: str
    topology: list[int]
    topology_name: str
    num_devices: int
    num_local_devices: int
    coordinator: str
    mapping: str
    state_dir: str
    pid: int
    role: NotRequired[str]
    """``standby`` when this host registered as a spare (or a left-out slice's host) and waits to be chosen."""
    generation: NotRequired[int]


class Reporter:
    """Where the agent says how init is going: ``progress`` lines, then ``ready`` or ``failed``."""

    def progress(self, text: str) -> None:
        raise NotImplementedError

    def ready(self, summary: InitSummary) -> None:
        raise NotImplementedError

    def failed(self, exc: TpuctlError) -> None:
        raise NotImplementedError

    def phase(self, name: str, limit: float) -> None:
        """Init enters phase ``name``, which ends (one way or the other) within ``limit`` s."""

    def alive(self) -> None:
        """The agent's event loop still runs (sent every ``ALIVE_EVERY_S``)."""


class PipeReporter(Reporter):
    """JSON lines on a pipe to the waiting ``tpuctl init`` process; closed after the outcome.

    ``on_gone`` is called once if the pipe breaks before then: init died without a word (``kill -9``); the
    agent's ``alive`` events, a few a second, notice it."""

    def __init__(self, stream: IO[str], on_gone: Callable[[], None] | None = None) -> None:
        self._stream: IO[str] | None = stream
        self.on_gone = on_gone

    def _send(self, message: dict[str, object]) -> None:
        if self._stream is None:
            return
        try:
            self._stream.write(json.dumps(message) + "\n")
            self._stream.flush()
        except (BrokenPipeError, OSError):
            self._stream = None  # the log still has everything
            if self.on_gone is not None:
                self.on_gone()

    def _close(self) -> None:
        if self._stream is not None:
            with contextlib.suppress(OSError):
                self._stream.close()
            self._stream = None

    def progress(self, text: str) -> None:
        log.info("%s", text)
        self._send({"event": "progress", "text": text})

    def phase(self, name: str, limit: float) -> None:
        self._send({"event": "phase", "phase": name, "limit": limit})

    def alive(self) -> None:
        self._send({"event": "alive"})

    def ready(self, summary: InitSummary) -> None:
        self._send({"event": "ready", "summary": summary})
        self._close()

    def failed(self, exc: TpuctlError) -> None:
        self._send({"event": "failed", "error": error_payload(exc)})
        self._close()
