"""The agent's side of the local control channel: an owner-only unix socket, one JSON line each way.

The caller's side and the message format are in :mod:`tpuctl.agent.control`; the operations in
:mod:`tpuctl.agent.protocol`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

from tpuctl.agent.control import MAX_LINE
from tpuctl.errors import TpuctlError, error_payload

BACKLOG = 1024
"""Connections the kernel queues for the agent (capped by ``net.core.somaxconn``): every job process and
shell of a busy host may ask at once; past it a command waits and tries again (``control._connect``)."""

Progress = Callable[..., Awaitable[None]]
"""``await progress(text)``: a progress line for the caller; ``await progress(deadline=seconds)``: the
operation's own deadline, announced (:mod:`tpuctl.agent.control`)."""
Handler = Callable[[str, dict[str, object], Progress], Awaitable[dict[str, object]]]


async def serve(path: Path, handler: Handler) -> asyncio.AbstractServer:
    """Answer requests on ``path`` with ``handler(op, args, progress)``; owner-only socket."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def send(message: dict[str, object]) -> None:
            writer.write(json.dumps(message).encode() + b"\n")
            await writer.drain()

        async def progress(text: str | None = None, *, deadline: float | None = None) -> None:
            await send({"progress": text} if deadline is None else {"deadline": deadline})

        try:
            try:
                raw = await reader.readline()
                request = json.loads(raw) if raw else {}
                op = str(request.get("op", ""))
                args = request.get("args") or {}
                try:
                    result = await handler(op, args, progress)
                    await send({"ok": True, "result": result})
                except TpuctlError as exc:
                    await send({"ok": False, "error": error_payload(exc)})
            except (ConnectionError, ValueError):
                pass  # the caller went away or sent garbage: nothing to answer
            finally:
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()
        except asyncio.CancelledError:
            # The agent is going down and its loop cancels what still runs: this connection ends here (the
            # caller reads a closed connection). Not re-raised: Python 3.11's stream protocol asks a
            # cancelled handler task for its exception() and logs the CancelledError as a traceback.
            writer.close()

    server = await asyncio.start_unix_server(on_connect, path=str(path), limit=MAX_LINE, backlog=BACKLOG)
    path.chmod(0o600)
    return server
