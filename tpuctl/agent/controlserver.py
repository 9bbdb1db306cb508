"""The agent's side of the local control channel: an owner-only unix socket, one JSON line each way.

The caller's side and the message format are in :mod:`tpuctl.agent.control`; the operations in
:mod:`tpuctl.agent.protocol`.

A request that is not one (not UTF-8, not JSON, nested past Python's recursion limit, not an object,
``op`` not a string, ``args`` not an object, text with lone surrogates, a line over ``MAX_LINE``) is
answered with an :class:`~tpuctl.errors.InputError` (exit 2 for the caller) and logged in one line,
never a traceback; the handler only ever sees an ``op`` string and an ``args`` dict of valid text. A
handler failing with anything but a ``TpuctlError`` is a bug: logged with its traceback, and answered
as an internal error (exit 1), so the caller does not report an agent that "may have exited".

A caller that goes away before its answer (Ctrl-C, SIGTERM, its own timeout: it closes the connection)
cancels its operation, but ``down``, which must not stop halfway: a barrier so withdraws its arrival
(:mod:`tpuctl.coordination.session`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tpuctl.agent.control import MAX_LINE, Op
from tpuctl.errors import InputError, TpuctlError, error_payload

BACKLOG = 1024
"""Connections the kernel queues for the agent (capped by ``net.core.somaxconn``): every job process and
shell of a busy host may ask at once; past it a command waits and tries again (``control._connect``)."""

Progress = Callable[..., Awaitable[None]]
"""``await progress(text)``: a progress line for the caller; ``await progress(deadline=seconds)``: the
operation's own deadline, announced (:mod:`tpuctl.agent.control`)."""
Handler = Callable[[str, dict[str, object], Progress], Awaitable[dict[str, object]]]

log = logging.getLogger(__name__)
_HINT = "the command and the agent are of different tpuctl versions, or something else wrote to the socket"


def parse_request(raw: bytes) -> tuple[str, dict[str, object]]:
    """``(op, args)`` of one request line; InputError saying what is wrong with it otherwise."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"malformed control request: not UTF-8 ({exc.reason} at byte {exc.start})", hint=_HINT) from None
    try:
        request = json.loads(text)
    except RecursionError:
        raise InputError("malformed control request: JSON nested too deeply", hint=_HINT) from None
    except ValueError as exc:
        raise InputError(f"malformed control request: not JSON ({exc})", hint=_HINT) from None
    if not isinstance(request, dict):
        raise InputError(f"malformed control request: the document is {_kind(request)}; expected an object", hint=_HINT)
    op = request.get("op")
    if not isinstance(op, str):
        raise InputError(f"malformed control request: 'op' is {_kind(op)}; expected a string", hint=_HINT)
    args = request.get("args")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise InputError(
            f"malformed control request: 'args' of {op[:40]!r} is {_kind(args)}; expected an object", hint=_HINT
        )
    try:
        json.dumps(request, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:  # "\udcff": what a shell argument not in UTF-8 becomes
        bad = exc.object[exc.start : exc.end]
        raise InputError(
            f"malformed control request: its text is not UTF-8 (lone surrogate {bad!r} in {op[:40]!r})", hint=_HINT
        ) from None
    except RecursionError:  # only as deep as loads allowed: the encoder's frames are larger
        raise InputError("malformed control request: JSON nested too deeply", hint=_HINT) from None
    return op, args


def _kind(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


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
                try:
                    raw = await reader.readline()
                except ValueError:  # asyncio's LimitOverrunError: no newline within the limit
                    raw = None
                if raw == b"":
                    return  # connected and left without a word
                try:
                    if raw is None:
                        raise InputError(f"malformed control request: longer than {MAX_LINE:,} bytes", hint=_HINT)
                    op, args = parse_request(raw)
                except InputError as exc:
                    log.warning("control socket: %s; answered with an error", exc.message)
                    await send({"ok": False, "error": error_payload(exc)})
                    return
                handling = asyncio.ensure_future(handler(op, args, progress))
                if op != Op.DOWN and not await _answered_before_hangup(handling, reader):
                    return  # the caller went away: its operation was cancelled, nobody to answer
                try:
                    result = await handling
                    await send({"ok": True, "result": result})
                except TpuctlError as exc:
                    await send({"ok": False, "error": error_payload(exc)})
                except ConnectionError:
                    raise
                except Exception as exc:  # a bug: its traceback belongs in the log, and the caller is told
                    log.exception("control socket: %r failed", op)
                    bug = TpuctlError(
                        f"the tpuctl agent failed answering {op!r}: {type(exc).__name__}: {exc}",
                        hint="this is a bug in tpuctl: its traceback is in the agent's log; please report it",
                    )
                    await send({"ok": False, "error": error_payload(bug)})
            except ConnectionError:
                pass  # the caller went away: nothing to answer
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
