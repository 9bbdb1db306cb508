"""The agent's side of the local control channel: an owner-only unix socket, one JSON line each way.

The caller's side and the message format are in :mod:`tpuctl.agent.control`; the operations in
:mod:`tpuctl.agent.protocol`. A caller that goes away before its answer (Ctrl-C, SIGTERM, its own
timeout: it closes the connection) cancels its operation, but ``down``, which must not stop halfway: a
barrier so withdraws its arrival (:mod:`tpuctl.coordination.session`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tpuctl.agent.control import MAX_LINE, Op
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
            raw = await reader.readline()
            request = json.loads(raw) if raw else {}
            op = str(request.get("op", ""))
            args = request.get("args") or {}
            handling = asyncio.ensure_future(handler(op, args, progress))
            if op != Op.DOWN and not await _answered_before_hangup(handling, reader):
                return  # the caller went away: its operation was cancelled, nobody to answer
            try:
                result = await handling
                await send({"ok": True, "result": result})
            except TpuctlError as exc:
                await send({"ok": False, "error": error_payload(exc)})
        except (ConnectionError, ValueError):
            pass  # the caller went away or sent garbage: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_unix_server(on_connect, path=str(path), limit=MAX_LINE, backlog=BACKLOG)
    path.chmod(0o600)
    return server


async def _answered_before_hangup(handling: asyncio.Future[dict[str, object]], reader: asyncio.StreamReader) -> bool:
    """Wait for ``handling``; True once it is done, False (it cancelled) when the caller closed the connection
    first. A caller sends one line and then only reads, so anything more it sends is ignored."""
    hangup = asyncio.ensure_future(_closed(reader))
    try:
        either: set[asyncio.Future[Any]] = {handling, hangup}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        handling.cancel()  # the agent is stopping: the operation with it
        raise
    finally:
        hangup.cancel()
    if handling.done():
        return True
    handling.cancel()
    with contextlib.suppress(BaseException):
        await handling
    return False


async def _closed(reader: asyncio.StreamReader) -> None:
    """Returns when the caller closed its side of the connection (or broke it)."""
    with contextlib.suppress(ConnectionError):
        while await reader.read(4096):
            pass
