"""The GCE metadata watch against a real loopback HTTP server speaking the recorded protocol (ETag,
wait_for_change, last_etag, timeout_sec, Metadata-Flavor required), and against servers that answer
garbage, hang, fail with 500s or disappear: each named once, retried with backoff, never in the agent's way."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from preemption.gce_server import GceServer, close, gce_server
from tpuctl.agent.metadata_watch import KeyWatch, watch_metadata
from tpuctl.spec.metadata import Endpoint

PREEMPTED = "instance/preempted"
MAINTENANCE = "instance/maintenance-event"


def endpoint(address: str, origin: str = "GCE_METADATA_HOST") -> Endpoint:
    host, port = address.rsplit(":", 1)
    return Endpoint(host, int(port), origin)


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class Heard:
    def __init__(self) -> None:
        self.values: list[tuple[str, str, float]] = []
        self.lock = threading.Lock()

    def __call__(self, key: str, value: str) -> None:
        with self.lock:
            self.values.append((key, value, time.monotonic()))

    def of(self, key: str) -> list[str]:
        with self.lock:
            return [v for k, v, _ in self.values if k == key]


def watch(server_address: str, key: str = PREEMPTED, *, explicit: bool = True, **options: Any) -> tuple[KeyWatch, Heard]:
    heard = Heard()
    settings: dict[str, Any] = {"wait_s": 2, "connect_timeout": 0.5, "first_backoff": 0.05, "max_backoff": 0.4}
    settings.update(options)
    watcher = KeyWatch(key, [endpoint(server_address)], heard, explicit=explicit, **settings)
    watcher.start()
    return watcher, heard


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name == "tpuctl.agent.metadata"]


def test_a_change_is_heard_at_once_through_a_held_long_poll() -> None:
    with gce_server() as server:
        watcher, heard = watch(server.address, wait_s=30)
        try:
            wait_for(lambda: heard.of(PREEMPTED) == ["FALSE"] and server.waiting() >= 1, 5, "the first value and a held poll")
            flipped = time.monotonic()
            server.set(PREEMPTED, "TRUE")
            wait_for(lambda: heard.of(PREEMPTED) == ["FALSE", "TRUE"], 5, "the change")
            assert heard.values[-1][2] - flipped < 1.0  # the held request answered, no polling interval
            asked = [r for r in server.requests if "wait_for_change" in r]
            assert asked[0] == "/computeMetadata/v1/instance/preempted?wait_for_change=true&last_etag=0000000000000001&timeout_sec=30"
        finally:
            watcher.stop()


def test_no_change_is_heard_once_per_value_across_timed_out_polls() -> None:
    with gce_server() as server:
        watcher, heard = watch(server.address, wait_s=1)
        try:
            wait_for(lambda: server.waiting() >= 3, 10, "three long polls that time out")
            assert heard.of(PREEMPTED) == ["FALSE"]
        finally:
            watcher.stop()


@pytest.mark.parametrize(
    ("mode", "named"),
    [("garbage", "is not a value of instance/preempted"), ("noflavor", "without Metadata-Flavor: Google"),
     ("failing", "HTTP 500")],
)  # fmt: skip
def test_a_misbehaving_server_is_named_once_retried_with_backoff_and_heard_again(
    caplog: pytest.LogCaptureFixture, mode: str, named: str
) -> None:
    with caplog.at_level(logging.INFO, logger="tpuctl.agent.metadata"), gce_server() as server:
        server.mode = mode
        watcher, heard = watch(server.address)
        try:
            wait_for(lambda: len(server.requests) >= 5, 10, "five tries")
            started, tries = time.monotonic(), len(server.requests)
            time.sleep(1.0)
            assert len(server.requests) - tries <= 4  # backing off (at most every 0.4 s here), not a busy loop
            assert heard.values == []  # garbage is never a value
            said = [m for m in warnings(caplog) if named in m]
            assert len(said) == 1, warnings(caplog)  # named once, however many tries
            assert f"GCE metadata server 127.0.0.1:{server.server_address[1]} (from GCE_METADATA_HOST)" in said[0]
            server.mode = "ok"
            wait_for(lambda: heard.of(PREEMPTED) == ["FALSE"], 5, "the value once the server behaves")
            assert any("answers instance/preempted again" in r.getMessage() for r in caplog.records)
            assert time.monotonic() - started < 5
        finally:
            watcher.stop()


def test_a_hanging_server_is_named_and_the_event_loop_never_waits_for_it(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="tpuctl.agent.metadata"), gce_server() as server:
        server.mode = "hang"

        async def agent_loop() -> float:
            """The agent's event loop while the watch is stuck in a held request: its timers stay on time."""
            loop = asyncio.get_running_loop()
            notices: list[tuple[str, str, float]] = []
            watches = watch_metadata(
                lambda *notice: loop.call_soon_threadsafe(notices.append, notice),
                {"GCE_METADATA_HOST": server.address}, backend="sim", setting="auto",
            )  # fmt: skip
            assert len(watches) == 2
            worst = 0.0
            for _ in range(50):
                before = loop.time()
                await asyncio.sleep(0.01)
                worst = max(worst, loop.time() - before - 0.01)
            for w in watches:
                w.stop()
            assert notices == []
            return worst

        assert asyncio.run(agent_loop()) < 0.2
        assert server.requests  # the watch did ask (and is held)


def test_a_held_request_that_never_ends_is_named_hanging(caplog: pytest.LogCaptureFixture) -> None:
    import tpuctl.agent.metadata_watch as module

    with caplog.at_level(logging.INFO, logger="tpuctl.agent.metadata"), gce_server() as server:
        server.mode = "hang"
        saved = module.READ_MARGIN_S
        module.READ_MARGIN_S = 0.3
        try:
            watcher, _ = watch(server.address, connect_timeout=0.3)
            wait_for(lambda: any("hanging" in m for m in warnings(caplog)), 5, "the hang to be named")
            watcher.stop()
        finally:
            module.READ_MARGIN_S = saved
    assert sum("hanging" in m for m in warnings(caplog)) == 1


def test_a_server_that_disappears_is_named_once_and_asked_again_until_it_is_back(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="tpuctl.agent.metadata"):
        server = GceServer()
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        port = server.server_address[1]
        watcher, heard = watch(server.address, wait_s=1)
        try:
            wait_for(lambda: heard.of(PREEMPTED) == ["FALSE"], 5, "the first value")
            close(server, thread)
            wait_for(lambda: any("unreachable" in m for m in warnings(caplog)), 5, "the loss to be named")
            time.sleep(0.8)  # several retries
            assert sum("unreachable" in m for m in warnings(caplog)) == 1
            try:
                back = _server_on(port, preempted="TRUE")  # back on the same address
            except OSError:
                pytest.skip("the port was taken meanwhile")
            again = threading.Thread(target=back.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
            again.start()
            try:
                wait_for(lambda: heard.of(PREEMPTED) == ["FALSE", "TRUE"], 5, "the value from the server that came back")
            finally:
                close(back, again)
        finally:
            watcher.stop()


def _server_on(port: int, **values: str) -> GceServer:
    class OnPort(GceServer):
        def server_bind(self) -> None:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.server_address = ("127.0.0.1", port)
            self.socket.bind(self.server_address)

    return OnPort(**values)


def test_where_no_server_answers_the_watch_is_off_unless_one_was_named(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        nobody = f"127.0.0.1:{sock.getsockname()[1]}"  # closed: connection refused
    with caplog.at_level(logging.INFO, logger="tpuctl.agent.metadata"):
        default, _ = watch(nobody, explicit=False)
        default.join(5)
        assert not default.is_alive() and default.off
        assert any("preemption notices from it are off" in r.getMessage() for r in caplog.records)
        named, _ = watch(nobody, explicit=True)
        time.sleep(0.5)
        assert named.is_alive() and not named.off  # a named server is retried, never turned off
        named.stop()


def test_the_watch_starts_only_where_it_belongs() -> None:
    assert watch_metadata(lambda *a: None, {}, backend="sim", setting="auto") == []  # a sim host is no GCE VM
    assert watch_metadata(lambda *a: None, {"GCE_METADATA_HOST": "127.0.0.1:1"}, backend="jax", setting="off") == []
    assert watch_metadata(lambda *a: None, {"GCE_METADATA_HOST": "not a host:x"}, backend="sim", setting="auto") == []


def test_values_that_are_notices() -> None:
    from tpuctl.preemption.notice import gce_notice

    assert gce_notice(PREEMPTED, "TRUE") == ("gce-preempted", "instance/preempted is TRUE", 30.0)
    assert gce_notice(PREEMPTED, "FALSE") is None
    assert gce_notice(MAINTENANCE, "TERMINATE_ON_HOST_MAINTENANCE") is not None
    assert gce_notice(MAINTENANCE, "MIGRATE_ON_HOST_MAINTENANCE") is None  # a live migration keeps the VM
