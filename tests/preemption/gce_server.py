"""A real HTTP server on 127.0.0.1 (port 0) speaking the GCE metadata server's protocol for the two keys a
preemption watch asks, as ../shared/reference/runtime-health.md records it:

``GET /computeMetadata/v1/instance/preempted`` (``TRUE`` / ``FALSE``) and ``.../instance/maintenance-event``
(``NONE``, ``MIGRATE_ON_HOST_MAINTENANCE``, ``TERMINATE_ON_HOST_MAINTENANCE``); ``Metadata-Flavor: Google``
on every answer and required on every request (403 without); an ``ETag`` per value; ``?wait_for_change=true``
holds the request until the value's ETag differs from ``last_etag`` (or, without one, until it changes) or
``timeout_sec`` passes, then answers the current value.

It misbehaves on request (``mode``): ``garbage`` (200 with an HTML page), ``noflavor`` (no flavor header),
``failing`` (HTTP 500), ``hang`` (takes the request and never answers until closed); ``close()`` makes it
disappear (connection refused).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PREFIX = "/computeMetadata/v1/"
MAX_HOLD_S = 60.0  # the longest any request is held (a test's server never outlives its test by more)


class _Handler(BaseHTTPRequestHandler):
    server: GceServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # http.server's name
        server = self.server
        url = urlsplit(self.path)
        server.requests.append(self.path)
        if server.mode == "hang":
            server.released.wait(MAX_HOLD_S)
            return
        if self.headers.get("Metadata-Flavor") != "Google":
            self._answer(403, "Missing Metadata-Flavor:Google header.")
            return
        key = url.path[len(PREFIX):] if url.path.startswith(PREFIX) else ""
        if key not in server.values:
            self._answer(404, "not found")
            return
        if server.mode == "failing":
            self._answer(500, "internal error")
            return
        query = parse_qs(url.query)
        if query.get("wait_for_change") == ["true"]:
            timeout = min(float(query.get("timeout_sec", ["3600"])[0]), MAX_HOLD_S)
            last = query.get("last_etag", [None])[0]
            with server.changed:
                start_etag = server.etag(key)
                server.changed.wait_for(
                    lambda: server.etag(key) != (last if last is not None else start_etag) or server.released.is_set(),
                    timeout,
                )
        with server.changed:
            value, etag = server.values[key], server.etag(key)
        if server.mode == "garbage":
            self._answer(200, "<html><body>Sign in to the hotel wifi</body></html>", etag=etag)
        else:
            self._answer(200, value, etag=etag, flavor=server.mode != "noflavor")

    def _answer(self, status: int, text: str, *, etag: str = "", flavor: bool = True) -> None:
        body = text.encode()
        self.send_response(status)
        if flavor:
            self.send_header("Metadata-Flavor", "Google")
        if etag:
            self.send_header("ETag", etag)
        self.send_header("Content-Type", "application/text")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass


class GceServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, preempted: str = "FALSE", maintenance: str = "NONE") -> None:
        self.values = {"instance/preempted": preempted, "instance/maintenance-event": maintenance}
        self._etags = {key: 1 for key in self.values}
        self.changed = threading.Condition()
        self.released = threading.Event()
        self.mode = "ok"
        self.requests: list[str] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def etag(self, key: str) -> str:
        return f"{self._etags[key]:016x}"

    def set(self, key: str, value: str) -> None:
        """Change a value (a new ETag), answering every request held for it."""
        with self.changed:
            self.values[key] = value
            self._etags[key] += 1
            self.changed.notify_all()

    def waiting(self) -> int:
        """Requests that asked to wait for a change."""
        return sum("wait_for_change=true" in r for r in self.requests)


@contextmanager
def gce_server(preempted: str = "FALSE") -> Iterator[GceServer]:
    """A running server (``.address`` is ``127.0.0.1:PORT``), shut down and closed on exit."""
    server = GceServer(preempted)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        close(server, thread)


def close(server: GceServer, thread: threading.Thread | None = None) -> None:
    """Make the server disappear: held requests end, the port refuses."""
    server.released.set()
    with server.changed:
        server.changed.notify_all()
    server.shutdown()
    server.server_close()
    if thread is not None:
        thread.join(timeout=5)
    time.sleep(0)  # let the handler threads see the release
