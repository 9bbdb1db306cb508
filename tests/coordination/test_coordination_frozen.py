"""A frozen or cut-off coordinator, as the heartbeat stream sees it: through a real TCP proxy that stops
moving bytes while keeping both connections open (what a SIGSTOPped coordinator or a dead link does: the
client's writes are accepted, nothing ever comes back). The heartbeat loop must give up within the
heartbeat timeout + ``CONFIRM_GRACE_S`` of the last confirmation, not at the 10 s RPC timeout; a freeze
shorter than the timeout must be ridden out.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from coordination_harness import make_config, run, serving

from tpuctl.coordination.calls import CONFIRM_GRACE_S
from tpuctl.coordination.client import CoordinationClient
from tpuctl.errors import CoordinatorUnreachable


class FreezingProxy:
    """Forwards TCP between a client and ``target_port`` on 127.0.0.1; ``freeze`` stops reading both ways
    (the kernel's buffers fill, nothing is delivered or dropped), ``thaw`` resumes."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.moving = asyncio.Event()
        self.moving.set()
        self._server: asyncio.AbstractServer | None = None
        self._pumps: set[asyncio.Task[None]] = set()
        self.target = ""

    async def __aenter__(self) -> FreezingProxy:
        self._server = await asyncio.start_server(self._connected, "127.0.0.1", 0)
        self.target = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for pump in self._pumps:
            pump.cancel()
        for pump in list(self._pumps):
            with contextlib.suppress(BaseException):
                await pump

    def freeze(self) -> None:
        self.moving.clear()

    def thaw(self) -> None:
        self.moving.set()

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            pump = asyncio.create_task(self._pump(source, sink))
            self._pumps.add(pump)
            pump.add_done_callback(self._pumps.discard)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self.moving.wait()
                data = await source.read(65536)
                if not data:
                    return
                await self.moving.wait()  # frozen while a chunk was in hand: hold it too
                sink.write(data)
                await sink.drain()
        except (ConnectionError, OSError):
            return
        finally:
            sink.close()


TIMEOUT_S = 1.5


def test_a_frozen_coordinator_ends_the_heartbeat_loop_within_the_heartbeat_timeout() -> None:
    async def body() -> None:
        async with (
            serving(make_config(1, heartbeat_timeout=TIMEOUT_S)) as cluster,
            FreezingProxy(cluster.server.port) as proxy,
        ):
            client = CoordinationClient(proxy.target)
            try:
                member = await client.register("test", 0)
                beating = asyncio.create_task(client.heartbeat_loop(member, interval=0.1))
                await asyncio.sleep(1.0)  # confirmations flowing
                assert not beating.done()
                proxy.freeze()
                frozen = time.monotonic()
                with pytest.raises(CoordinatorUnreachable) as excinfo:
                    await asyncio.wait_for(beating, 8.0)  # the RPC timeout (10 s) would overrun this
                took = time.monotonic() - frozen
                proxy.thaw()
            finally:
                await client.close()
        message = excinfo.value.message
        assert message.startswith(f"coordinator at {proxy.target} unreachable/frozen: no heartbeat confirmed for ")
        assert f"(heartbeat timeout {TIMEOUT_S:g} s)" in message and "did not confirm a heartbeat within" in message
        # the last confirmation came at most timeout / 3 before the freeze
        assert TIMEOUT_S + CONFIRM_GRACE_S - TIMEOUT_S / 3 - 0.1 <= took <= TIMEOUT_S + CONFIRM_GRACE_S + 0.5, took

    run(body())


def test_a_freeze_shorter_than_the_heartbeat_timeout_is_ridden_out() -> None:
    async def body() -> None:
        async with serving(make_config(1, heartbeat_timeout=TIMEOUT_S)) as cluster:
            async with FreezingProxy(cluster.server.port) as proxy:
                client = CoordinationClient(proxy.target)
                try:
                    member = await client.register("test", 0)
                    beating = asyncio.create_task(client.heartbeat_loop(member, interval=0.1))
                    for _ in range(3):  # three short freezes, each under the timeout
                        await asyncio.sleep(0.6)
                        proxy.freeze()
                        await asyncio.sleep(TIMEOUT_S / 2)
                        proxy.thaw()
                    await asyncio.sleep(TIMEOUT_S + CONFIRM_GRACE_S)
                    assert not beating.done(), beating.exception()
                    beating.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await beating
                finally:
                    await client.close()
            assert (await cluster.client().status()).failure is None

    run(body())


def test_a_frozen_coordinator_ends_a_session_and_its_waiting_barrier_within_the_heartbeat_timeout() -> None:
    """The session stream (protocol v6) keeps the heartbeat loop's deadlines, and a barrier waiting on it
    ends with the session, not at its own (30 s) timeout."""

    async def body() -> None:
        async with (
            serving(make_config(2, heartbeat_timeout=TIMEOUT_S)) as cluster,
            FreezingProxy(cluster.server.port) as proxy,
        ):
            client = CoordinationClient(proxy.target)
            try:
                member = await client.register("test", 0)
                session = client.session(member, interval=0.1)
                running = asyncio.create_task(session.run())
                watching = asyncio.create_task(session.watch_errors())
                waiting = asyncio.create_task(session.barrier("never", timeout=30.0))
                await asyncio.sleep(1.0)  # confirmations flowing; task 1 never arrives
                assert not running.done() and not waiting.done() and not watching.done()
                proxy.freeze()
                frozen = time.monotonic()
                with pytest.raises(CoordinatorUnreachable) as excinfo:
                    await asyncio.wait_for(running, 8.0)
                took = time.monotonic() - frozen
                with pytest.raises(CoordinatorUnreachable):
                    await asyncio.wait_for(waiting, 0.5)
                with pytest.raises(CoordinatorUnreachable):
                    await asyncio.wait_for(watching, 0.5)
                proxy.thaw()
            finally:
                await client.close()
        assert "unreachable/frozen: no heartbeat confirmed for " in excinfo.value.message
        assert TIMEOUT_S + CONFIRM_GRACE_S - TIMEOUT_S / 3 - 0.1 <= took <= TIMEOUT_S + CONFIRM_GRACE_S + 0.5, took

    run(body())
