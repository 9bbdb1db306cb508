"""The /metrics endpoint as a scraper meets it: real HTTP on a loopback port or a Unix socket, in-process
(one event loop, as in the agent); what it refuses; a port it cannot take is named, with the cause."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from pathlib import Path

import pytest
from prometheus_client.core import GaugeMetricFamily

from tpuctl.errors import StateError
from tpuctl.metrics.endpoint import MAX_HEAD_BYTES, open_endpoint, registry_of
from tpuctl.spec.metrics import MetricsSpec

OPENMETRICS = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
HOSTS = ("127.0.0.1",)


class Figures:
    """A collector whose one series counts the scrapes that asked it."""

    def __init__(self) -> None:
        self.asked = 0

    def collect(self) -> list[GaugeMetricFamily]:
        self.asked += 1
        return [GaugeMetricFamily("tpuctl_test_asked", "Scrapes so far.", self.asked)]


async def exchange(request: bytes, *, port: int | None = None, path: Path | None = None) -> tuple[str, bytes]:
    """Send ``request``, read to the end: (status line and headers, body)."""
    if path is not None:
        reader, writer = await asyncio.open_unix_connection(str(path))
    else:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.decode(), body


def get(target: str = "/metrics", accept: str | None = None) -> bytes:
    extra = f"Accept: {accept}\r\n" if accept else ""
    return f"GET {target} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_scrape_over_tcp_in_either_format_and_what_is_refused() -> None:
    async def body() -> None:
        figures = Figures()
        port = free_port()
        endpoint = await open_endpoint(MetricsSpec(port=port), registry_of(figures), task=0, hosts=HOSTS, state_dir="/nonexistent")
        try:
            assert endpoint.where == f"http://127.0.0.1:{port}/metrics"
            head, text = await exchange(get(), port=port)
            assert head.startswith("HTTP/1.1 200 OK") and "Content-Type: text/plain; version=0.0.4" in head
            assert b"tpuctl_test_asked 1.0\n" in text and b"process_cpu_seconds_total" in text
            assert f"Content-Length: {len(text)}" in head
            head, text = await exchange(get(accept=OPENMETRICS), port=port)
            assert "Content-Type: application/openmetrics-text" in head and text.endswith(b"# EOF\n")
            assert b"tpuctl_test_asked 2.0\n" in text
            assert (await exchange(get("/other"), port=port))[0].startswith("HTTP/1.1 404")
            assert (await exchange(b"POST /metrics HTTP/1.1\r\n\r\n", port=port))[0].startswith("HTTP/1.1 405")
            assert (await exchange(b"hello there\r\n\r\n", port=port))[0].startswith("HTTP/1.1 400")
            assert await exchange(b"GET /metrics HTTP/1.1\r\nX: " + b"y" * MAX_HEAD_BYTES + b"\r\n\r\n", port=port) == ("", b"")
            head, text = await exchange(b"HEAD /metrics HTTP/1.1\r\n\r\n", port=port)
            assert head.startswith("HTTP/1.1 200") and text == b""
            assert figures.asked == 3  # the two GETs and the HEAD; nothing for what was refused
        finally:
            await endpoint.close()

    asyncio.run(asyncio.wait_for(body(), 30))


def test_a_scrape_over_a_unix_socket_in_the_state_dir(tmp_path: Path) -> None:
    async def body() -> None:
        (tmp_path / "metrics.sock").write_bytes(b"")  # not a socket: never removed
        with pytest.raises(StateError, match="exists and is not a socket"):
            await open_endpoint(MetricsSpec(socket="metrics.sock"), registry_of(), task=0, hosts=HOSTS, state_dir=str(tmp_path))
        os.unlink(tmp_path / "metrics.sock")
        endpoint = await open_endpoint(MetricsSpec(socket="metrics.sock"), registry_of(Figures()), task=0, hosts=HOSTS, state_dir=str(tmp_path))
        path = tmp_path / "metrics.sock"
        try:
            assert endpoint.where == f"unix:{path}"
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            head, text = await exchange(get(), path=path)
            assert head.startswith("HTTP/1.1 200") and b"tpuctl_test_asked 1.0" in text
        finally:
            await endpoint.close()
        assert not path.exists()

    asyncio.run(asyncio.wait_for(body(), 30))


def test_a_port_in_use_is_named_with_the_cause_and_a_hint() -> None:
    async def body() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            with pytest.raises(StateError) as caught:
                await open_endpoint(MetricsSpec(port=port), registry_of(), task=0, hosts=HOSTS, state_dir="/x")
        assert caught.value.message == f"task 0: cannot serve metrics on 127.0.0.1:{port}: Address already in use"
        assert caught.value.hint is not None and "metrics" in caught.value.hint and caught.value.exit_code == 5

    asyncio.run(asyncio.wait_for(body(), 30))


def test_an_agent_without_metrics_never_imports_prometheus_client() -> None:
    """prometheus_client (tens of milliseconds) loads only with metrics on: not with init, its agent or the
    service's modules."""
    import subprocess
    import sys

    modules = "tpuctl.cli.init, tpuctl.agent.bringup, tpuctl.agent.launch, tpuctl.coordination.server, tpuctl.coordination.figures"
    probe = f"import sys, {modules}; print('prometheus_client' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stdout + done.stderr
