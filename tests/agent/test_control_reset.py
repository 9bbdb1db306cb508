"""The control call when the agent dies mid-call (kill -9): the connection is reset, and the caller gets a
StateError naming the agent's folder, not ConnectionResetError (which ended tpuctl run's watcher thread, so
it never noticed its agent was gone). A real Unix socket that closes with the request unread."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from tpuctl.agent.control import Op, call
from tpuctl.agent.statedir import StateDir
from tpuctl.errors import StateError


def test_a_reset_connection_is_a_state_error_naming_the_agent(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    state = StateDir(folder)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(state.socket))
    server.listen(1)

    def die_with_the_request_unread() -> None:
        peer, _ = server.accept()
        time.sleep(0.2)  # the request is in peer's buffer, unread: closing now resets the connection
        peer.close()

    thread = threading.Thread(target=die_with_the_request_unread, daemon=True)
    thread.start()
    try:
        with pytest.raises(StateError) as excinfo:
            call(state, Op.WAIT_ERROR, {"timeout": 5}, timeout=5)
        assert f"the tpuctl agent in {folder} closed the connection during 'wait_error'" in excinfo.value.message
    finally:
        thread.join(5)
        server.close()
