"""Connecting to a coordinator that is slow to answer: one connection per host, not a retry storm.

gRPC's ``grpc.min_reconnect_backoff_ms`` is also its *connect timeout* (``min_connect_timeout`` in its
subchannel). Set to 50 ms (floored at 100 ms), a client abandoned every connection whose handshake the
service had not finished within 100-250 ms and dialled again: under a pod's registration burst the
abandoned connections filled the service's accept queue (4,096), the kernel dropped handshakes, and the
hosts waited out SYN retries of 1, 3 and 7 s (the bench's "slow mode": TcpExt ListenOverflows in the
thousands). Here a real TCP relay on loopback holds each connection for a while before passing bytes
to a real coordination service, and counts the connections it accepts.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from coordination_harness import make_config, run, serving

from tpuctl.coordination.client import CoordinationClient
from tpuctl.coordination.values import TaskState
from tpuctl.errors import CoordinatorUnreachable

pytestmark = pytest.mark.timeout(60)

HOLD_S = 0.8
"""How long the relay holds a new connection before any byte passes: longer than the old 100-250 ms
connect timeout, far shorter than the connect timeout a client must allow."""


class SlowRelay:
    """Accepts on 127.0.0.1, waits ``HOLD_S``, then pipes both ways to ``target``; counts connections."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.accepted = 0
        self.server: asyncio.Server | None = None
        self.pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        await asyncio.sleep(HOLD_S)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self.pipes.add(task)
            task.add_done_callback(self.pipes.discard)

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        with contextlib.suppress(OSError):
            sink.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in list(self.pipes):
            task.cancel()
        for task in list(self.pipes):
            with contextlib.suppress(BaseException):
                await task


def test_a_slow_handshake_gets_one_connection_not_a_retry_storm() -> None:
    async def body() -> None:
        config = make_config(1)
        async with serving(config) as cluster:
            port = int(cluster.server.target.rsplit(":", 1)[1])
            relay = SlowRelay(port)
            relay_port = await relay.start()
            client = CoordinationClient(f"127.0.0.1:{relay_port}", rpc_timeout=10.0)
            try:
                member = await client.register(config.cluster, 0, hostname="host-0")
                assert member.task.task_id == 0
                # One TCP connection: the attempt the relay held was waited for, not abandoned and
                # redialled (the old connect timeout failed this call after several abandoned dials).
                assert relay.accepted == 1
                assert (await client.status()) is not None  # and it stays the connection in use
                assert relay.accepted == 1
            finally:
                await client.close()
                await relay.stop()

    run(body(), timeout=40)


def test_a_coordinator_not_yet_listening_is_reached_within_a_second_of_starting() -> None:
    """The other half of the trade: a refused connection is retried quickly (the backoff stays short),
    so hosts that start before task 0 still register the moment it listens."""

    async def body() -> None:
        config = make_config(1)
        async with serving(config) as cluster:
            port = int(cluster.server.target.rsplit(":", 1)[1])
            # A relay that is not listening yet: the client's first attempts are refused.
            relay = SlowRelay(port)
            probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
            relay_port = int(probe.sockets[0].getsockname()[1])
            probe.close()
            await probe.wait_closed()
            client = CoordinationClient(f"127.0.0.1:{relay_port}", rpc_timeout=10.0)
            try:
                registering = asyncio.create_task(
                    client.register(config.cluster, 0, hostname="host-0", connect_timeout=20.0)
                )
                await asyncio.sleep(1.5)  # refused attempts, backing off
                assert not registering.done()
                relay.server = await asyncio.start_server(relay._handle, "127.0.0.1", relay_port)
                started = asyncio.get_running_loop().time()
                member = await asyncio.wait_for(registering, 5.0)
                waited = asyncio.get_running_loop().time() - started
                assert member.task.task_id == 0
                # The hold itself plus at most one short backoff (250 ms) and scheduling slack.
                assert waited < HOLD_S + 1.0, waited
            finally:
                await client.close()
                await relay.stop()

    run(body(), timeout=40)


class DyingCoordinator:
    """A relay in front of a real service that dies the moment the service answers a stream: it passes
    the client's bytes and the service's connection frames (SETTINGS, PING, WINDOW_UPDATE: stream 0),
    and when the service's first frame of a stream comes (the registration's answer) it drops it, resets
    the connection and stops listening, as a coordinator killed between taking a registration and
    answering it (CI: ``test_fault[kill-merging-coordinator]``)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.server: asyncio.Server | None = None
        self.died = asyncio.Event()
        self.pipes: set[asyncio.Task[None]] = set()
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers += [writer, up_writer]
        for task in (SlowRelay._pipe(reader, up_writer), self._frames(up_reader, writer)):
            pipe = asyncio.create_task(task)
            self.pipes.add(pipe)
            pipe.add_done_callback(self.pipes.discard)

    async def _frames(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            while True:
                header = await source.readexactly(9)  # HTTP/2 frame: length (3), type, flags, stream id (4)
                body = await source.readexactly(int.from_bytes(header[:3], "big"))
                if int.from_bytes(header[5:9], "big") & 0x7FFFFFFF:
                    self.die()
                    return
                sink.write(header + body)
                await sink.drain()

    def die(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            transport = writer.transport
            if isinstance(transport, asyncio.Transport):
                transport.abort()  # RST, as the kernel does for a killed process's sockets
        self.died.set()

    async def stop(self) -> None:
        if not self.died.is_set():
            self.die()
        for task in list(self.pipes):
            task.cancel()
        for task in list(self.pipes):
            with contextlib.suppress(BaseException):
                await task


def test_a_coordinator_that_dies_before_answering_a_registration_fails_it_within_the_heartbeat_timeout() -> None:
    """The registration reached the service, the coordinator died before its answer came back: the host
    has seen the coordinator, so its silence is a failure within the heartbeat timeout (``give_up_after``),
    not a late start retried for the whole register timeout (``connect_timeout``, 30 s here)."""

    async def body() -> None:
        config = make_config(2)
        async with serving(config) as cluster:
            port = int(cluster.server.target.rsplit(":", 1)[1])
            relay = DyingCoordinator(port)
            relay_port = await relay.start()
            client = CoordinationClient(f"127.0.0.1:{relay_port}", rpc_timeout=10.0)
            loop = asyncio.get_running_loop()
            try:
                started = loop.time()
                with pytest.raises(CoordinatorUnreachable) as failed:
                    await client.open_session(
                        config.cluster, 1, hostname="host-1", connect_timeout=30.0, give_up_after=1.5
                    )
                waited = loop.time() - started
                assert relay.died.is_set()
                status = await cluster.client().status()
                assert [t.task.task_id for t in status.tasks if t.state is not TaskState.WAITING] == [1]  # it got there
                assert "after it was reached" in failed.value.message, failed.value.message
                assert "task 0" in (failed.value.hint or "")
                # The heartbeat timeout after the break, plus at most one retry's backoff and slack.
                assert 1.5 <= waited < 1.5 + 3.0, waited
            finally:
                await client.close()
                await relay.stop()

    run(body(), timeout=40)


def test_a_coordinator_never_reached_is_retried_for_the_whole_connect_timeout() -> None:
    """The other side: nobody ever answered, so the coordinator may start late; ``give_up_after`` does
    not cut the wait short."""

    async def body() -> None:
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = int(probe.sockets[0].getsockname()[1])
        probe.close()
        await probe.wait_closed()
        client = CoordinationClient(f"127.0.0.1:{port}", rpc_timeout=10.0)
        loop = asyncio.get_running_loop()
        try:
            started = loop.time()
            with pytest.raises(CoordinatorUnreachable) as failed:
                await client.open_session("test", 1, connect_timeout=2.5, give_up_after=0.5)
            assert loop.time() - started >= 2.5
            assert "kept trying for" in failed.value.message
            assert "after it was reached" not in failed.value.message
        finally:
            await client.close()

    run(body(), timeout=40)
