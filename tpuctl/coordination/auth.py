"""A shared token: every call to the coordinator carries it, and the server refuses calls without it.

This keeps a stray or mistyped client (another cluster on the same port range, a scanner) away from the
state; it is not encryption: over the plaintext gRPC channel the token travels in clear text (with
``auth.tls``, inside TLS). Refusals are logged rate-limited (one line per peer every 10 s at most).
"""

from __future__ import annotations

import hmac
import logging
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from tpuctl.coordination.convert import hint_metadata
from tpuctl.coordination.logs import RateLimitedLog
from tpuctl.errors import InputError
from tpuctl.files import FileTooLarge, NotRegularFile, read_regular_file

TOKEN_KEY = "x-tpuctl-token"
"""Metadata key of the token on every call."""
MAX_TOKEN_BYTES = 4096
"""Largest token file read: a token is one word (``secrets.token_urlsafe(32)`` is 43 characters)."""

log = logging.getLogger("tpuctl.coordination")

_CREATE_HINT = "create one with: (umask 077; python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > {path})"


def load_token(path: str | os.PathLike[str]) -> str:
    """The token in ``path``, stripped of surrounding whitespace.

    Refused (``InputError``) when the file is missing, not a regular file (a FIFO, a device: refused
    unread, never waited on), over ``MAX_TOKEN_BYTES``, readable or writable by group or others (a shared
    secret must not be; checked on the file opened), empty, or not one word of printable ASCII (gRPC
    metadata).
    """
    path = Path(path)

    def private(info: os.stat_result) -> None:
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise InputError(
                f"token file {path} is accessible by group or others (mode {mode:04o}); a shared secret must not be",
                hint=f"chmod 600 {path}",
            )

    try:
        raw = read_regular_file(path, MAX_TOKEN_BYTES, check=private)
    except FileNotFoundError:
        raise InputError(f"token file {path} does not exist", hint=_CREATE_HINT.format(path=path)) from None
    except NotRegularFile as exc:
        raise InputError(
            f"token file {path} is {exc.kind}, not a regular file", hint=_CREATE_HINT.format(path=path)
        ) from None
    except FileTooLarge as exc:
        raise InputError(
            f"token file {path} is over {MAX_TOKEN_BYTES:,} bytes ({exc.size}): not a token",
            hint=_CREATE_HINT.format(path=path),
        ) from None
    except OSError as exc:
        raise InputError(f"cannot read token file {path}: {exc.strerror or exc}") from exc
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise InputError(f"token file {path} is not ASCII text", hint=_CREATE_HINT.format(path=path)) from None
    if not token:
        raise InputError(f"token file {path} is empty", hint=_CREATE_HINT.format(path=path))
    if not token.isprintable() or any(c.isspace() for c in token):
        raise InputError(
            f"token file {path} must hold one word of printable ASCII (no spaces or line breaks inside)",
            hint=_CREATE_HINT.format(path=path),
        )
    return token


class TokenCheck(grpc.aio.ServerInterceptor):  # type: ignore[misc, unused-ignore]  # Any without types-grpcio
    """Refuses (UNAUTHENTICATED) every call whose token is missing or wrong, before any handler runs.

    The refusal is a handler of the same kind as the method's (unary or streaming); it does not even
    parse the request.
    """

    def __init__(self, token: str) -> None:
        self._token = token.encode()
        self.refusal_log = RateLimitedLog(log)
        """One warning per peer every 10 s at most, with a count of those left out."""

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        problem = self._problem(details.invocation_metadata or ())
        handler = await continuation(details)
        if problem is None or handler is None:
            return handler
        refuse = _refusal(details.method, problem, self.refusal_log)
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(refuse)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(refuse)
        return grpc.unary_unary_rpc_method_handler(refuse)

    def _problem(self, metadata: Any) -> str | None:
        given = next((value for key, value in metadata if key == TOKEN_KEY), None)
        if given is None:
            return "the call carries no auth token, and this coordinator requires one"
        if not hmac.compare_digest(str(given).encode(), self._token):  # constant time: no timing oracle
            return "the call's auth token does not match this coordinator's"
        return None


def _refusal(method: str, problem: str, refusals: RateLimitedLog) -> Callable[[Any, Any], Awaitable[None]]:
    async def refuse(request: Any, context: Any) -> None:
        peer = context.peer()
        refusals.log(logging.WARNING, peer, problem, "refused %s from %s: %s", method, peer, problem)
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            problem,
            trailing_metadata=hint_metadata("give every host the same token file as the coordinator"),
        )

    return refuse
