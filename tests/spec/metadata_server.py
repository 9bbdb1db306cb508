"""A real HTTP metadata server on 127.0.0.1 (port 0), serving recorded Cloud TPU VM attributes.

It answers as the GCE metadata server does: ``GET /computeMetadata/v1/instance/attributes/KEY`` with
``Metadata-Flavor: Google`` on every answer, 403 when the request lacks that header, 404 for an unknown
key. Recorded values follow ../shared/reference/tpu-topology.md sections 2.2-2.4 (the worker list in both
formats, tpu-env lines of a real v4 slice); addresses are loopback ones so a whole slice can run here.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PREFIX = "/computeMetadata/v1/instance/attributes/"

# tpu-env of a v4-32 worker, the keys a real v4 slice has (v4-256 dump in the reference), values for v4-32.
V4_32_TPU_ENV = """ACCELERATOR_TYPE: 'v4-32'
ALT: 'false'
CHIPS_PER_HOST_BOUNDS: '2,2,1'
ENABLE_ICI_RESILIENCY: 'true'
HOST_BOUNDS: '1,1,4'
NODE_ID: 'tpu-v4-32-a'
TOPOLOGY: '2x2x4'
TPU_CHIPS_PER_PROCESS_BOUNDS: '2,2,1'
TPU_PROCESS_BOUNDS: '1,1,4'
TPU_RUNTIME_METRICS_PORTS: '8431,8432,8433,8434'
TPU_TOPOLOGY_ALT: 'false'
TPU_TOPOLOGY_WRAP: 'false,false,false'
TYPE: 'V4'
WORKER_ID: '{worker}'
WRAP: 'false,false,false'
ZONE: 'us-central2-b'
"""

V5E_16_TPU_ENV = """ACCELERATOR_TYPE: 'v5litepod-16'
CHIPS_PER_HOST_BOUNDS: '2,2,1'
HOST_BOUNDS: '2,2,1'
TOPOLOGY: '4x4'
TPU_RUNTIME_METRICS_PORTS: '8431,8432,8433,8434'
TYPE: 'V5LITE_POD'
WORKER_ID: '{worker}'
ZONE: 'us-west4-a'
"""


def v4_32_attributes(addresses: list[str], worker: int) -> dict[str, str]:
    """A v4-32 TPU VM worker; worker-network-endpoints in the older name:uid:address form."""
    endpoints = ",".join(f"t1v-n-0f996b37-w-{i}:{12345 + i}:{a}" for i, a in enumerate(addresses))
    return {
        "accelerator-type": "v4-32",
        "agent-worker-number": str(worker),
        "worker-network-endpoints": endpoints,
        "tpu-env": V4_32_TPU_ENV.format(worker=worker),
    }


def v5e_16_attributes(hosts: list[str], worker: int) -> dict[str, str]:
    """A v5e-16 TPU VM worker; worker-network-endpoints as a plain comma list (the newer form)."""
    return {
        "accelerator-type": "v5litepod-16",
        "agent-worker-number": str(worker),
        "worker-network-endpoints": ",".join(hosts),
        "tpu-env": V5E_16_TPU_ENV.format(worker=worker),
    }


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:  # http.server's name
        self.server.requests.append(self.path)
        if self.headers.get("Metadata-Flavor") != "Google":
            self._answer(403, "Missing Metadata-Flavor:Google header.")
        elif not self.path.startswith(PREFIX) or self.path[len(PREFIX) :] not in self.server.attributes:
            self._answer(404, "not found")
        else:
            self._answer(200, self.server.attributes[self.path[len(PREFIX) :]])

    def _answer(self, status: int, text: str) -> None:
        body = text.encode()
        self.send_response(status)
        if self.server.flavor:
            self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "application/text")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, attributes: dict[str, str], flavor: bool) -> None:
        self.attributes = attributes
        self.flavor = flavor
        self.requests: list[str] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


@contextmanager
def metadata_server(attributes: dict[str, str], *, flavor: bool = True) -> Iterator[_Server]:
    """A running server (``.address`` is ``127.0.0.1:PORT``), shut down and closed on exit."""
    server = _Server(attributes, flavor)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def silent_server() -> Iterator[str]:
    """A port that accepts connections (the kernel's backlog) and never answers: ``127.0.0.1:PORT``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def closed_port() -> str:
    """``127.0.0.1:PORT`` where nothing listens (connection refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"
