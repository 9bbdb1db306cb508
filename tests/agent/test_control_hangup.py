"""A local command that goes away (Ctrl-C, SIGTERM, its own timeout: it closes its connection) cancels its
operation in the agent, so a barrier withdraws its arrival; ``down`` runs to its end. A real unix socket
served by the agent's own ``controlserver.serve``, in process."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest

from tpuctl.agent.control import Op
from tpuctl.agent.controlserver import Progress, serve

pytestmark = pytest.mark.timeout(30)


def hang_up_during(op: str, folder: Path) -> list[str]:
    """Send ``op``, close the connection once the operation started; what became of the operation."""
    events: list[str] = []

    async def body() -> None:
        started, finished = asyncio.Event(), asyncio.Event()

        async def handler(name: str, args: dict[str, object], progress: Progress) -> dict[str, object]:
            started.set()
            try:
                await asyncio.sleep(0.5)
                events.append("finished")
                return {}
            except asyncio.CancelledError:
                events.append("cancelled")
                raise
            finally:
                finished.set()

        path = folder / "agent.sock"
        server = await serve(path, handler)
        try:
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(str(path))
            client.sendall(json.dumps({"op": op, "args": {"name": "step"}}).encode() + b"\n")
            await asyncio.wait_for(started.wait(), 5.0)
            client.close()
            await asyncio.wait_for(finished.wait(), 5.0)
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(body())
    return events


def test_a_caller_that_hangs_up_cancels_its_barrier(tmp_path: Path) -> None:
    assert hang_up_during(Op.BARRIER, tmp_path) == ["cancelled"]  # before: it ran on, the arrival counted


def test_down_runs_to_its_end_whoever_listens(tmp_path: Path) -> None:
    assert hang_up_during(Op.DOWN, tmp_path) == ["finished"]
