"""Malformed requests on the agent's control socket: each is answered with an input error (exit 2) and
logged in one line, without a traceback, and never reaches the operations (issue 24, item 13). The real
server (:func:`tpuctl.agent.controlserver.serve`) on a real unix socket, in this process; the caller
is a plain socket writing the bytes, as any local process could."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from pathlib import Path

import pytest

from tpuctl.agent.control import MAX_LINE
from tpuctl.agent.controlserver import Progress, serve
from tpuctl.errors import EXIT_INPUT, EXIT_INTERNAL

DEEP = 100_000

MALFORMED = [
    (b"[" * DEEP + b"]" * DEEP, "malformed control request: JSON nested too deeply"),
    (b'{"op": "barrier", "args": ["step", 5]}', "malformed control request: 'args' of 'barrier' is a list; expected an object"),
    (b'{"op": 7, "args": {}}', "malformed control request: 'op' is a number; expected a string"),
    (b'["barrier"]', "malformed control request: the document is a list; expected an object"),
    (b"barrier step", "malformed control request: not JSON (Expecting value: line 1 column 1 (char 0))"),
    (b'{"op": "barrier", "args": {"name": "\xff"}}', "malformed control request: not UTF-8 (invalid start byte at byte 36)"),
    (b'{"op": "barrier", "args": {"name": "\\udcff"}}',
     "malformed control request: its text is not UTF-8 (lone surrogate '\\udcff' in 'barrier')"),
    (b'{"op": "barrier", "args": {"name": "' + b"x" * MAX_LINE + b'"}}',
     f"malformed control request: longer than {MAX_LINE:,} bytes"),
]  # fmt: skip


def exchange(path: Path, line: bytes) -> list[dict[str, object]]:
    """Send ``line`` (and a newline) and read every answer line until the agent closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(20)
        sock.connect(str(path))
        with contextlib.suppress(BrokenPipeError):  # the agent answered an over-long line before reading it all
            sock.sendall(line + b"\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return [json.loads(answer) for answer in data.splitlines()]


def run_server(tmp_path: Path, lines: list[bytes], fail_with: Exception | None = None) -> tuple[list[list[dict[str, object]]], list[str]]:
    """Serve on a socket under ``tmp_path``, send each line from a thread, return the answers and the ops
    the handler was called with."""
    path = tmp_path / "agent.sock"
    seen: list[str] = []

    async def handler(op: str, args: dict[str, object], progress: Progress) -> dict[str, object]:
        seen.append(op)
        if fail_with is not None:
            raise fail_with
        return {"op": op}

    async def main() -> list[list[dict[str, object]]]:
        server = await serve(path, handler)
        try:
            return [await asyncio.wait_for(asyncio.to_thread(exchange, path, line), 30) for line in lines]
        finally:
            server.close()
            await server.wait_closed()

    return asyncio.run(main()), seen


@pytest.mark.parametrize(("line", "message"), MALFORMED, ids=[m for _, m in MALFORMED])
def test_a_malformed_request_gets_an_input_error_and_one_log_line(
    tmp_path: Path, line: bytes, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    answers, seen = run_server(tmp_path, [line])
    assert seen == []
    assert answers == [[{"ok": False, "error": {
        "type": "InputError", "message": message, "exit_code": EXIT_INPUT,
        "hint": "the command and the agent are of different tpuctl versions, or something else wrote to the socket",
    }}]]  # fmt: skip
    records = [r for r in caplog.records if r.name.startswith("tpuctl") or r.levelno >= logging.WARNING]
    assert [(r.levelname, r.getMessage()) for r in records] == [("WARNING", f"control socket: {message}; answered with an error")]
    assert all(r.exc_info is None for r in caplog.records)


def test_a_well_formed_request_still_reaches_its_operation(tmp_path: Path) -> None:
    answers, seen = run_server(tmp_path, [b'{"op": "status"}', b'{"op": "barrier", "args": {"name": "\\u00e9t\\u00e9"}}'])
    assert seen == ["status", "barrier"]
    assert answers == [[{"ok": True, "result": {"op": "status"}}], [{"ok": True, "result": {"op": "barrier"}}]]


def test_an_operation_failing_unexpectedly_is_an_internal_error_not_a_closed_connection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A UnicodeEncodeError deep in an operation used to be swallowed with the connection closed: the caller
    # then said the agent "may have exited" (exit 5).
    answers, _ = run_server(tmp_path, [b'{"op": "barrier", "args": {"name": "x"}}'], fail_with=RuntimeError("boom"))
    ((answer,),) = answers
    assert answer["ok"] is False
    error = answer["error"]
    assert isinstance(error, dict) and error["exit_code"] == EXIT_INTERNAL
    assert error["message"] == "the tpuctl agent failed answering 'barrier': RuntimeError: boom"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == ["control socket: 'barrier' failed"]
