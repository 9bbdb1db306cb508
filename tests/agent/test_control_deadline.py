"""An operation's announced deadline on the control socket: ``{"deadline": SECONDS}`` from the agent sets
how long the caller waits from then on (plus DEADLINE_MARGIN_S), longer or shorter than what it was
ready to wait before. ``tpuctl barrier`` without ``--timeout`` relies on it instead of reading agent.json.
A real unix socket and a scripted agent thread."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuctl.agent import control
from tpuctl.agent.control import Op, call
from tpuctl.agent.statedir import StateDir
from tpuctl.errors import DeadlineError


class ScriptedAgent:
    """Answers one request: sends ``lines`` (each after its delay), then closes."""

    def __init__(self, folder: Path, lines: list[tuple[float, dict[str, object]]]) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(folder / "agent.sock"))
        self.server.listen(1)
        self.server.settimeout(10)
        self.lines = lines
        self.requests: list[dict[str, object]] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.server.accept()
        except OSError:
            return
        with conn:
            self.requests.append(json.loads(conn.makefile("rb").readline()))
            for delay, message in self.lines:
                time.sleep(delay)
                try:
                    conn.sendall(json.dumps(message).encode() + b"\n")
                except OSError:
                    return

    def close(self) -> None:
        self.server.close()
        self.thread.join(timeout=15)


@pytest.fixture
def state(tmp_path: Path) -> Iterator[StateDir]:
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    yield StateDir(folder)


def test_an_announced_deadline_lets_the_caller_wait_past_its_first_timeout(state: StateDir) -> None:
    answer = {"ok": True, "result": {"name": "step", "instance": 1, "hosts": 2}}
    agent = ScriptedAgent(Path(state.path), [(0.0, {"deadline": 30.0}), (1.5, answer)])
    try:
        result = call(state, Op.BARRIER, {"name": "step", "timeout": None}, timeout=0.5)
    finally:
        agent.close()
    assert result == answer["result"]  # 1.5 s after a 0.5 s timeout: the announcement extended it
    assert agent.requests == [{"op": "barrier", "args": {"name": "step", "timeout": None}}]


def test_without_an_announcement_the_first_timeout_holds(state: StateDir) -> None:
    answer = {"ok": True, "result": {}}
    agent = ScriptedAgent(Path(state.path), [(1.5, answer)])
    try:
        with pytest.raises(DeadlineError) as excinfo:
            call(state, Op.BARRIER, {"name": "step"}, timeout=0.5)
    finally:
        agent.close()
    assert "did not answer 'barrier' within 0.5 s" in excinfo.value.message


def test_an_announced_deadline_also_shortens_the_wait(state: StateDir, monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent that announced 0.2 s and then stays silent is given up on after 0.2 s + the margin,
    not after the caller's own (longer) timeout; the message says how long that was."""
    monkeypatch.setattr(control, "DEADLINE_MARGIN_S", 0.3)
    agent = ScriptedAgent(Path(state.path), [(0.0, {"deadline": 0.2}), (5.0, {"ok": True, "result": {}})])
    started = time.monotonic()
    try:
        with pytest.raises(DeadlineError) as excinfo:
            call(state, Op.BARRIER, {"name": "step"}, timeout=60)
    finally:
        agent.close()
    assert time.monotonic() - started < 30  # not the 60 s the caller first allowed
    assert "did not answer 'barrier' within 0.5 s" in excinfo.value.message


@pytest.mark.parametrize("bad", [-1, "30", True, None, 1e9])
def test_a_malformed_announcement_changes_nothing(state: StateDir, bad: object) -> None:
    answer = {"ok": True, "result": {"instance": 3}}
    agent = ScriptedAgent(Path(state.path), [(0.0, {"deadline": bad}), (1.5, answer)])
    try:
        with pytest.raises(DeadlineError):
            call(state, Op.BARRIER, {"name": "step"}, timeout=0.5)
    finally:
        agent.close()
