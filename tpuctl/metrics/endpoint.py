"""The ``/metrics`` endpoint: HTTP/1.1 on a TCP port or a Unix socket, served on the agent's event loop.

Prometheus scrapes it with ``GET /metrics``; the answer is ``prometheus_client``'s exposition of a registry,
in the format the scraper's ``Accept`` header asks for (OpenMetrics 1.0, as Prometheus asks first, or the
Prometheus text format). The endpoint runs on the event loop that owns the agent and the coordination
service, so a scrape reads their state between two of their steps, never in the middle of one (no thread,
no lock). One request per connection (``Connection: close``); a request head larger than
``MAX_HEAD_BYTES`` or slower than ``READ_TIMEOUT_S`` is dropped, and at most ``MAX_CONNECTIONS`` are served
at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from pathlib import Path

from prometheus_client.exposition import choose_encoder
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from tpuctl.errors import StateError
from tpuctl.spec.metrics import MetricsSpec

log = logging.getLogger("tpuctl.metrics")

PATHS = ("/metrics", "/")
MAX_HEAD_BYTES = 8192
READ_TIMEOUT_S = 10.0
WRITE_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 16


def registry_of(*collectors: Collector) -> CollectorRegistry:
    """A registry of ``collectors`` and the process's own series (``process_cpu_seconds_total``,
    ``process_resident_memory_bytes``, open file descriptors, start time: ``prometheus_client``'s)."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    for collector in collectors:
        registry.register(collector)
    return registry


def render(registry: CollectorRegistry, accept: str) -> tuple[bytes, str]:
    """The exposition of ``registry`` in the format ``accept`` asks for, and its content type."""
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type


class MetricsEndpoint:
    """Serves ``registry`` once :meth:`listen` (TCP) or :meth:`listen_unix` ran; :meth:`close` stops it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.where = ""
        """``http://127.0.0.2:8491/metrics`` or ``unix:/run/tpuctl/metrics.sock`` once listening."""
        self._server: asyncio.AbstractServer | None = None
        self._socket_path: Path | None = None
        self._open = 0

    async def listen(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD_BYTES)
        bound = self._server.sockets[0].getsockname()
        shown = f"[{host}]" if ":" in host else host
        self.where = f"http://{shown}:{bound[1]}/metrics"

    async def listen_unix(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(path.lstat().st_mode):
                raise StateError(f"{path} exists and is not a socket: metrics cannot be served there", hint="remove it, or name another metrics.socket")
            path.unlink()  # a socket a dead agent left
        self._server = await asyncio.start_unix_server(self._serve, str(path), limit=MAX_HEAD_BYTES)
        os.chmod(path, 0o600)
        self._socket_path = path
        self.where = f"unix:{path}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None
        if self._socket_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._socket_path.unlink()
            self._socket_path = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= MAX_CONNECTIONS:
            writer.close()
            return
        self._open += 1
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            status, body, content_type = self._answer(head)
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode() + body
            )
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
            pass  # a scraper that went away, or a request that is not one: nothing to answer
        finally:
            self._open -= 1
            writer.close()

    def _answer(self, head: bytes) -> tuple[str, bytes, str]:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return "400 Bad Request", b"not an HTTP request\n", "text/plain; charset=utf-8"
        method, target = parts[0], parts[1].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", b"GET /metrics\n", "text/plain; charset=utf-8"
        if target not in PATHS:
            return "404 Not Found", b"tpuctl serves /metrics\n", "text/plain; charset=utf-8"
        accept = next((line.split(":", 1)[1].strip() for line in lines[1:] if line.lower().startswith("accept:")), "")
        body, content_type = render(self.registry, accept)
        return "200 OK", (b"" if method == "HEAD" else body), content_type


async def open_endpoint(
    metrics: MetricsSpec, registry: CollectorRegistry, *, task: int, hosts: tuple[str, ...], state_dir: str
) -> MetricsEndpoint:
    """Serve ``registry`` where the spec's ``metrics:`` says for ``task``; StateError naming the address and
    the cause when it cannot listen there (a port in use, an address not this host's)."""
    endpoint = MetricsEndpoint(registry)
    if metrics.socket is not None:
        path = Path(state_dir) / metrics.socket  # an absolute path stays itself
        what = f"unix socket {path}"
    else:
        host, port = metrics.address or hosts[task], metrics.port_for(task, hosts)
        what = f"{host}:{port}"
    try:
        if metrics.socket is not None:
            await endpoint.listen_unix(path)
        else:
            await endpoint.listen(host, port)
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)  # asyncio's own text repeats the address
        raise StateError(
            f"task {task}: cannot serve metrics on {what}: {why}",
            hint="another process may listen there (`ss -ltnp`); choose another metrics port or socket "
            "(the spec's metrics:, tpuctl init --metrics), or turn metrics off",
        ) from exc
    log.info("task %d: metrics on %s", task, endpoint.where)
    return endpoint


__all__ = ["MAX_CONNECTIONS", "MetricsEndpoint", "open_endpoint", "registry_of", "render"]
