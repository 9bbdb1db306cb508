"""The client's connection to the coordinator, and how one call on it is made and fails.

``Channel`` holds the ``grpc.aio`` channel with its options (no proxy, quick reconnects, a connect
timeout a busy coordinator can meet, keepalive pings, TLS), the stub, and the call deadlines; it makes a
unary call or a call answered on a server stream, and turns a failed call's status into the
``TpuctlError`` a user sees, worded for the coordinator at ``target``. ``CoordinationClient`` (the calls)
and its sessions (``session.py``) share it.
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import Any, TypeVar

import grpc

from tpuctl.coordination import convert
from tpuctl.coordination.auth import TOKEN_KEY
from tpuctl.coordination.calls import finished
from tpuctl.coordination.tls import ClientTls, channel_credentials, handshake_refusal
from tpuctl.errors import ClusterError, CoordinatorUnreachable, GenerationOver, TlsRefused, TpuctlError
from tpuctl.proto import coordination_pb2_grpc as pb_grpc

_Self = TypeVar("_Self", bound="Channel")

RPC_TIMEOUT_S = 10.0
MAX_WAIT_S = 3600.0
"""Client-side bound on a wait the caller left to the service's default (a barrier without a timeout)."""
MAX_RECEIVE_BYTES = 64 * 1024 * 1024
"""Largest answer accepted: a gather's table is at most 32 MiB (``values.MAX_GATHER_TABLE``)."""

KEEPALIVE_S = 5.0
"""Default seconds between this client's HTTP/2 keepalive pings (and how long it waits for each answer):
the spec's default heartbeat interval. A session whose pings vouch for the coordinator within half its
``give_up_after`` sends no heartbeat messages; see ``Session``."""
MIN_KEEPALIVE_S = 0.2
"""Pings closer than the service's abuse limit (``server.MIN_CLIENT_PING_MS``) would get the connection closed."""

TLS_CHECK_EVERY_S = 1.0
"""Least time between two plain handshakes asking why a TLS connection failed (``Channel.tls_refusal``)."""

CONNECT_TIMEOUT_MS = 20_000
"""How long one connection attempt may take before the channel gives it up and dials again (gRPC's
default minimum connect timeout): a coordinator busy with thousands of handshakes answers late, not
never."""

_CHANNEL_OPTIONS = (
    # Coordination traffic stays inside the cluster; an http_proxy in the environment would route it
    # through a proxy and hang (jax-ml/jax#22995).
    ("grpc.enable_http_proxy", 0),
    # Hosts start in any order: once the coordinator is up, reconnect within 250 ms, not after
    # gRPC's default backoff of up to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 250),
    # gRPC reads ``grpc.min_reconnect_backoff_ms`` as the *connect timeout* (a connection attempt's
    # deadline is at least this): a short one makes every host abandon and redial a connection whose
    # handshake a busy coordinator has not finished yet, the abandoned ones fill its accept queue, and a
    # pod's registration burst stalls on the kernel's SYN retries. A refused connection still fails at
    # once and is retried after the backoff above.
    ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
    ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
)


class Channel:
    """A channel to the coordination service at ``target`` ("host:port"). Create it inside the event
    loop that uses it; ``close`` it (or use ``async with``).

    ``token``: the cluster's shared token, if the service requires one. ``tls``: talk TLS (``tls.
    load_client_tls``: the CA that signed the service's certificate, and for mutual TLS this host's
    certificate and key). ``rpc_timeout``: the deadline of a call that does not wait in the service, and
    the slack added to one that does. ``max_wait``: the client-side bound on a barrier or gather left to
    the service's default timeout. ``keepalive``: seconds between the channel's keepalive pings (None or
    0: none)."""

    coordinator_task: int = 0
    """The task whose host serves at ``target`` (a successor's, once the coordinator moved): hints name it."""

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        rpc_timeout: float = RPC_TIMEOUT_S,
        max_wait: float = MAX_WAIT_S,
        tls: ClientTls | None = None,
        keepalive: float | None = KEEPALIVE_S,
    ) -> None:
        self.target = target
        self.keepalive = max(MIN_KEEPALIVE_S, keepalive) if keepalive else None
        """Seconds between the channel's keepalive pings (None: none), each answered within as long."""
        self.rpc_timeout = rpc_timeout
        self.max_wait = max_wait
        self.metadata = ((TOKEN_KEY, token),) if token else None
        self._tls = tls
        self._next_tls_check = 0.0
        options: tuple[tuple[str, Any], ...] = _CHANNEL_OPTIONS
        if self.keepalive:
            ping_ms = round(self.keepalive * 1000)
            options += (
                ("grpc.keepalive_time_ms", ping_ms),
                ("grpc.keepalive_timeout_ms", ping_ms),
                ("grpc.http2.ping_timeout_ms", ping_ms),
                ("grpc.http2.max_pings_without_data", 0),
            )
        if tls is None:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        else:
            if tls.server_name:
                options += (("grpc.ssl_target_name_override", tls.server_name),)
            self._channel = grpc.aio.secure_channel(target, channel_credentials(tls), options=options)
        self.stub = pb_grpc.CoordinationServiceStub(self._channel)

    async def __aenter__(self: _Self) -> _Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, rpc: Any, request: Any, call: str, timeout: float, *, wait_for_ready: bool = False) -> Any:
        try:
            return await rpc(request, timeout=timeout, metadata=self.metadata, wait_for_ready=wait_for_ready)
        except grpc.aio.AioRpcError as exc:
            raise self.error_of(exc, call, timeout) from exc

    async def _call_streamed(self, rpc: Any, request: Any, call: str, timeout: float) -> Any:
        """A call whose one answer comes on a server stream (``Gather``)."""
        stream = rpc(request, timeout=timeout, metadata=self.metadata, wait_for_ready=False)
        try:
            response = await stream.read()
        except grpc.aio.AioRpcError as exc:
            raise self.error_of(exc, call, timeout) from exc
        except asyncio.CancelledError:
            stream.cancel()
            raise
        if response is grpc.aio.EOF:
            ended = await finished(stream)
            if ended.code() is not grpc.StatusCode.OK:
                raise self.error_of(ended, call, timeout)
            raise ClusterError(f"the coordinator at {self.target} ended {call} without an answer")
        return response

    def error_of(self, exc: grpc.aio.AioRpcError, call: str, timeout: float) -> TpuctlError:
        hint = convert.hint_from_metadata(exc.trailing_metadata())
        if hint is None and self._tls is not None and exc.code() is grpc.StatusCode.UNAVAILABLE:
            hint = (
                f"this host talks TLS to {self.target}: check that the coordinator serves TLS, that its "
                "certificate is signed by auth.tls.ca and names that address (or auth.tls.server_name), and "
                "for mutual TLS that this host's client certificate is signed by the same CA"
            )
        return convert.error_from_status(
            exc.code(), exc.details() or "", hint, target=self.target, call=call, timeout=timeout
        )

    async def tls_refusal(self, failed: TpuctlError) -> TlsRefused | None:
        """After a connection attempt failed with ``failed``: why TLS refused it, when waiting cannot heal
        that (``tls.handshake_refusal``: a plain handshake, in a thread); None otherwise, when the
        connection was refused (nobody listens yet: the usual wait), or when asked again within
        ``TLS_CHECK_EVERY_S``."""
        if self._tls is None or self._tls.files is None or "connection refused" in failed.message.lower():
            return None
        now = time.monotonic()
        if now < self._next_tls_check:
            return None
        self._next_tls_check = now + TLS_CHECK_EVERY_S
        return await asyncio.to_thread(handshake_refusal, self.target, self._tls)

    def unconfirmed(self, silent: float, give_up_after: float, exc: TpuctlError) -> CoordinatorUnreachable:
        return CoordinatorUnreachable(
            f"coordinator at {self.target} unreachable/frozen: no heartbeat confirmed for {silent:.1f} s "
            f"(heartbeat timeout {give_up_after:g} s): {exc.message}",
            hint=self.lost_hint(exc),
        )

    def lost_hint(self, exc: TpuctlError) -> str:
        """The hint for a coordinator that answered this host before and stopped, by how it stopped: a
        refused (or reset) connection means its host answers and nothing listens on the port any more (task
        0's agent died or restarted); silence means its host is cut off from this one, frozen or down. Never
        the start-up advice (is `tpuctl init` running on task 0, is the address right): it was, and it is."""
        text = exc.message.lower()
        if "refused" in text or "reset by peer" in text:
            return (
                f"the coordinator answered before; now its host refuses connections on {self.target}: task "
                f"{self.coordinator_task}'s agent died or restarted. Check its agent log; `tpuctl init` on task "
                f"{self.coordinator_task} brings it back "
                "(restart policy rejoin re-forms the cluster, else restart every host)"
            )
        return (
            f"the coordinator answered before; now nothing comes back from {self.target}, not even a refusal: "
            f"task {self.coordinator_task}'s host is cut off from this one (a network partition), frozen or down. "
            f"Check the network between the hosts and task {self.coordinator_task}'s host"
        )

    def restart_error(self, now: int, was: int) -> ClusterError:
        return GenerationOver(  # this host's generation is gone: under restart policy rejoin it re-registers
            f"the coordinator at {self.target} restarted (service incarnation {now}, was {was}); this host's "
            "registration is gone",
            hint="restart `tpuctl init` on every host",
        )
