"""Start and stop the coordination service: a ``grpc.aio`` server bound to one host:port."""

from __future__ import annotations

import asyncio
import errno
import logging
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from tpuctl.coordination.auth import TokenCheck
from tpuctl.coordination.ledger import ServiceLedger
from tpuctl.coordination.service import CHECK_INTERVAL_S, CoordinationServicer
from tpuctl.coordination.state import CoordinationState
from tpuctl.coordination.tls import ServerTls, server_credentials
from tpuctl.coordination.values import ServiceConfig, keepalive_interval
from tpuctl.errors import StateError
from tpuctl.proto import coordination_pb2 as pb

log = logging.getLogger("tpuctl.coordination")

# gRPC sets SO_REUSEPORT by default: a second coordinator on the same port then binds silently and
# clients split between the two (observed with jaxlib's service). 0 makes the second bind fail instead.
_SERVER_OPTIONS = (
    ("grpc.so_reuseport", 0),
    # A whole pod registers at once: grpc core cancels calls beyond 1,000 (hard: 3,000) waiting for the
    # application to take them ("Too many pending requests for this server"; the client sees CANCELLED).
    # The service takes every call quickly and parks the waiting ones itself: let them queue.
    ("grpc.server.max_pending_requests", 1_000_000),
    ("grpc.server.max_pending_requests_hard_limit", 1_000_000),
    # ... and it also cancels a call the application has not taken within 30 s of its arrival (the same
    # CANCELLED): under heavy load a grpc.aio server takes a burst of thousands of calls more slowly than
    # that (the scale guard flaked with it). The calls are bounded by their own deadlines instead.
    ("grpc.server_max_unrequested_time_in_server", 3600),
)
SERVICE_NAME = "tpuctl.v1.CoordinationService"
MIN_CLIENT_PING_MS = 100
"""The least time between two pings from a host that the service's transport expects."""


def keepalive_options(config: ServiceConfig) -> tuple[tuple[str, int], ...]:
    """HTTP/2 keepalive for the cluster's heartbeat timeout: the service pings every host's
    connection every ``keepalive_interval`` s and closes one whose answer has not come as long after, in
    gRPC's transport (no Python per ping), which ends that host's session; it accepts the hosts' own
    pings (how they tell that the service is alive) on idle streams."""
    ping_ms = round(keepalive_interval(config.heartbeat_timeout) * 1000)
    return (
        ("grpc.keepalive_time_ms", ping_ms),
        ("grpc.keepalive_timeout_ms", ping_ms),
        ("grpc.http2.ping_timeout_ms", ping_ms),  # what grpc core waits for a ping's answer (1.85)
        ("grpc.http2.max_pings_without_data", 0),  # sessions are idle between events: ping anyway
        ("grpc.http2.min_recv_ping_interval_without_data_ms", MIN_CLIENT_PING_MS),
        # ... and without counting strikes: with the default of two, gRPC 1.85 sent hosts pinging every
        # 200 ms on open streams GOAWAY "too_many_pings" (their sessions broke and reconnected). A ping
        # costs the transport microseconds, no Python: a peer flooding them is no worse than one sending
        # any other bytes.
        ("grpc.http2.max_ping_strikes", 0),
    )


MALLOC_ARENAS = 1
"""glibc malloc arenas the serving process may have in all (``M_ARENA_MAX``). By default a process gets
one per thread up to 8 x cores; gRPC core grows its thread pool during a pod's registration burst and
each new thread's arena keeps what it freed, so the service's memory per host after registration would
depend on how many threads the burst happened to start (docs/development/performance-history-2.md,
"Protocol v7 and gRPC channel arguments"; with the cap: docs/development/performance-history.md,
"Malloc arenas"). The service is one Python thread and gRPC's few, mostly waiting on each other: one arena
costs no measurable contention."""
_M_ARENA_MAX = -8  # glibc's malloc.h


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap this process's malloc arenas (glibc only; elsewhere nothing happens: False). Takes effect for
    threads that have not allocated yet, so it is called before the server's first thread starts;
    threads already running keep their arena."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, arenas))


@dataclass
class CoordinationServer:
    """A running coordination service; ``port`` is the bound one (useful after asking for port 0)."""

    host: str
    port: int
    service: CoordinationServicer
    _server: Any

    @property
    def target(self) -> str:
        return host_port(self.host, self.port)

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving; calls still running after ``grace`` seconds are cancelled, and their handlers
        have finished when this returns (``_until_calls_finished``)."""
        await self.service.stop()
        await self._server.stop(grace)
        await _until_calls_finished()
        log.info("coordination service at %s stopped", self.target)


GRPC_CALL_TASK = "_schedule_rpc_coro"
"""grpc.aio's task for one call: its coroutine's name (grpcio 1.85)."""
CALLS_FINISH_S = 2.0
"""The longest ``stop`` waits for the calls' tasks once the server stopped (they take a loop turn or two)."""


async def _until_calls_finished(limit: float = CALLS_FINISH_S) -> None:
    """grpc.aio's server stop returns once its core has ended every call, while the call's own asyncio task
    (which cancels the handler, then awaits it) still has a loop turn or two to go. Cancelled after that,
    as when ``asyncio.run`` ends right after the stop (an agent exiting), that task prints its
    ``CancelledError`` traceback to stderr (grpc's ``traceback.print_exc()``), the agent log: let them finish.
    Bounded: calls not finished within ``limit`` s are counted in a warning and left."""

    def calls() -> set[asyncio.Task[Any]]:
        tasks = asyncio.all_tasks()
        return {t for t in tasks if not t.done() and getattr(t.get_coro(), "__name__", "") == GRPC_CALL_TASK}

    pending = calls()
    if pending:
        await asyncio.wait(pending, timeout=limit)
        left = len(calls())
        if left:
            log.warning(
                "coordination service stop: %d calls had not finished %.1f s after the server stopped", left, limit
            )


async def start_server(
    config: ServiceConfig,
    *,
    host: str,
    port: int,
    clock: Callable[[], float] = time.monotonic,
    service_incarnation: int | None = None,
    check_interval: float | None = None,
    tls: ServerTls | None = None,
    freeze_heap: bool = False,
    ledger: ServiceLedger | None = None,
) -> CoordinationServer:
    """Serve ``config``'s cluster on ``host:port`` (port 0: any free port).

    ``clock`` is the state machine's (monotonic seconds); parked calls sleep on the event loop's timers,
    so it must run at real speed. ``check_interval`` (default: 0.25 s, or a quarter of the heartbeat
    timeout if that is shorter) is how often silent tasks are looked for.

    Raises ``StateError`` when the port is taken or the address is not this host's: both are facts about
    this host (most often another ``tpuctl init`` already serving), fixed here, not in the cluster.

    ``tls``: serve over TLS (``tls.load_server_tls``; mutual TLS when it has a client CA) instead of
    plaintext.

    ``freeze_heap``: freeze the process's heap for Python's garbage collector once every host has
    registered, until the generation ends (``heap.Heap``); for a process that serves and little else.

    ``ledger``: the goodput ledger (task 0's agent opens it with its journal); default: in memory, from now.
    """
    limit_malloc_arenas()
    incarnation = service_incarnation or secrets.randbits(64) or 1
    state = CoordinationState(config, service_incarnation=incarnation)
    if check_interval is None:
        check_interval = min(CHECK_INTERVAL_S, config.heartbeat_timeout / 4)
    service = CoordinationServicer(
        state, clock=clock, check_interval=check_interval, freeze_heap=freeze_heap, ledger=ledger
    )
    interceptors = [TokenCheck(config.token)] if config.token else []
    server = grpc.aio.server(options=_SERVER_OPTIONS + keepalive_options(config), interceptors=interceptors)
    handlers = method_handlers(service)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
    try:
        if tls is None:
            bound = server.add_insecure_port(host_port(host, port))
        else:
            bound = server.add_secure_port(host_port(host, port), server_credentials(tls))
    except RuntimeError as exc:  # grpc says only "Failed to bind"; ask the OS why
        raise _bind_error(host, port) from exc
    if not bound:  # older grpcio returned 0 instead of raising
        raise _bind_error(host, port)
    await server.start()
    service.start()
    log.info(
        "coordination service for cluster %r (%d tasks) listening on %s, incarnation %d%s%s",
        config.cluster,
        len(config.tasks),
        host_port(host, bound),
        incarnation,
        ", token required" if config.token else "",
        "" if tls is None else ", mutual TLS" if tls.client_ca else ", TLS",
    )
    return CoordinationServer(host, bound, service, server)


def method_handlers(service: CoordinationServicer) -> dict[str, Any]:
    """A handler for every method of ``coordination.proto``'s service, by name.

    Unlike the generated ``add_..._to_server``, every response goes through ``service.encode``, which
    passes already serialized answers through: that is how one encoded answer reaches every caller."""
    handlers: dict[str, Any] = {}
    for method in pb.DESCRIPTOR.services_by_name["CoordinationService"].methods:
        request = getattr(pb, method.input_type.name)
        if method.client_streaming and method.server_streaming:
            make = grpc.stream_stream_rpc_method_handler
        elif method.client_streaming:
            make = grpc.stream_unary_rpc_method_handler
        elif method.server_streaming:
            make = grpc.unary_stream_rpc_method_handler
        else:
            make = grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(
            getattr(service, method.name), request_deserializer=request.FromString, response_serializer=service.encode
        )
    return handlers


def host_port(host: str, port: int) -> str:
    """``host:port`` as gRPC wants it: an IPv6 literal in brackets."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def _bind_error(host: str, port: int) -> StateError:
    where = host_port(host, port)
    cause = _bind_probe(host, port)
    if cause is not None and cause.errno == errno.EADDRINUSE:
        return StateError(
            f"cannot start the coordination service: {where} is already in use",
            hint=f"another process (perhaps another `tpuctl init`) holds the port; `ss -ltnp 'sport = :{port}'` "
            "shows which; stop it or choose another coordinator port in the cluster spec",
        )
    if cause is not None and cause.errno == errno.EADDRNOTAVAIL:
        return StateError(
            f"cannot start the coordination service on {where}: {host} is not an address of this host",
            hint="task 0 serves on its own address: check that this host is task 0 of the cluster spec",
        )
    reason = cause.strerror if cause is not None and cause.strerror else "gRPC could not bind it"
    return StateError(f"cannot start the coordination service on {where}: {reason}")


def _bind_probe(host: str, port: int) -> OSError | None:
    """Bind a plain socket where gRPC failed to, for the OS's reason (in use, not our address, ...)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.bind(address)
    except OSError as exc:  # socket.gaierror is one too
        return exc
    return None
