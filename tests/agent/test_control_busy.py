"""Hundreds of local commands at once: the agent's queue of connections fills (a unix socket then
refuses with EAGAIN). A command waits and tries again within its deadline, and says so if the queue
stays full; never an internal error. A real unix socket whose accepting is held back."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from tpuctl.agent.control import Op, call
from tpuctl.agent.statedir import StateDir
from tpuctl.errors import DeadlineError


def full_queue(folder: Path) -> tuple[socket.socket, list[socket.socket]]:
    """A listening socket (backlog 1) nobody accepts on, its queue filled by connections until refused."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(folder / "agent.sock"))
    server.listen(1)
    fillers = []
    for _ in range(64):
        filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        filler.setblocking(False)
        try:
            filler.connect(str(folder / "agent.sock"))
        except BlockingIOError:
            filler.close()
            return server, fillers
        fillers.append(filler)
    raise AssertionError("the queue never filled")


@pytest.fixture
def state(tmp_path: Path) -> StateDir:
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    (folder / "agent.pid").write_text("1\n")  # pid 1 lives: "not answering" would name it, not "not running"
    return StateDir(folder)


def test_a_full_queue_is_waited_out_within_the_deadline(state: StateDir) -> None:
    server, fillers = full_queue(Path(state.path))
    answered: list[dict[str, object]] = []

    def serve_later() -> None:
        time.sleep(0.5)  # the agent was busy; now it takes its queue (the fillers have gone: empty lines)
        for filler in fillers:
            filler.close()
        server.settimeout(10)
        for _ in range(len(fillers) + 2):
            conn, _ = server.accept()
            with conn:
                conn.settimeout(10)
                line = conn.makefile("rb").readline()
                if line:
                    answered.append(json.loads(line))
                    conn.sendall(json.dumps({"ok": True, "result": {"fine": True}}).encode() + b"\n")
                    return

    thread = threading.Thread(target=serve_later, daemon=True)
    thread.start()
    try:
        started = time.monotonic()
        assert call(state, Op.STATUS, timeout=5.0) == {"fine": True}
        assert 0.4 <= time.monotonic() - started < 5.0
        assert answered and answered[0]["op"] == Op.STATUS
    finally:
        thread.join(10)
        for filler in fillers:
            filler.close()
        server.close()


def test_a_queue_that_stays_full_is_a_deadline_naming_the_socket(state: StateDir) -> None:
    server, fillers = full_queue(Path(state.path))
    try:
        started = time.monotonic()
        with pytest.raises(DeadlineError) as failed:
            call(state, Op.STATUS, timeout=0.5)
        assert 0.4 <= time.monotonic() - started < 3.0
        assert "queue of connections" in failed.value.message and state.socket in failed.value.message
        assert failed.value.exit_code == 4 and failed.value.hint
    finally:
        for filler in fillers:
            filler.close()
        server.close()


@pytest.mark.parametrize("written", ["/tmp/x\n", "  /tmp/x  ", "/tmp/x\r\n"])
def test_a_state_dir_from_the_environment_is_taken_without_surrounding_whitespace(written: str) -> None:
    """``TPUCTL_STATE_DIR=$(...)`` can carry a trailing newline: it names the same folder."""
    from tpuctl.agent.statedir import default_state_dir

    assert default_state_dir({"TPUCTL_STATE_DIR": written}, 1000) == "/tmp/x"
    assert default_state_dir({"TPUCTL_STATE_DIR": "\n"}, 0) == "/run/tpuctl"  # only whitespace: the default
