"""A registration the coordinator never answers is retried like an unreachable coordinator, over real gRPC
on 127.0.0.1 through a proxy that swallows the first connection (soak seed 50042).

There: task 2 was cut off while task 0 was frozen; task 0, resumed, closed task 2's connection (keepalive
pings unanswered) and task 2, still cut off, never heard it. Task 2 noticed the coordinator silent and
registered again, into that dead connection: the coordinator never answered. Before, ``open_session``
raised ``DeadlineError`` ("did not answer RegisterTask within 10.0 s"), which the agent took as final: it
stayed up, failed, and never registered again, while every other host waited out the restart timeout for
it. Now the silence is ``CoordinatorUnreachable``: retried (after contact, for ``give_up_after`` at most),
and the agent's re-forming handles it as any other unreachable coordinator.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from coordination_harness import make_config, run, serving

from tpuctl.coordination.client import CoordinationClient
from tpuctl.errors import CoordinatorUnreachable

pytestmark = pytest.mark.timeout(60)

SWALLOW_S = 1.5  # how long the first connection is a black hole before the proxy drops it


@contextlib.asynccontextmanager
async def swallowing_proxy(target: str) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP proxy on 127.0.0.1 to ``target``: its first connection reads and discards everything for
    ``SWALLOW_S`` s, then is reset (a coordinator that went silent on a connection); later ones are piped
    through. Yields its address and the connection count (a list of one int)."""
    host, port = target.rsplit(":", 1)
    count = [0]
    tasks: set[asyncio.Task[None]] = set()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            async with asyncio.timeout(SWALLOW_S):
                while await reader.read(65536):
                    pass
        writer.transport.abort()

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        count[0] += 1
        if count[0] == 1:
            await swallow(reader, writer)
            return
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        both = [asyncio.create_task(pipe(reader, up_writer)), asyncio.create_task(pipe(up_reader, writer))]
        tasks.update(both)
        await asyncio.gather(*both, return_exceptions=True)

    server = await asyncio.start_server(accepted, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}", count
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def test_a_registration_the_coordinator_never_answers_is_retried_and_registers_once_it_answers() -> None:
    async def body() -> None:
        async with serving(make_config(2)) as cluster, swallowing_proxy(cluster.server.target) as (target, count):
            proxied = CoordinationClient(target, token=cluster.token, rpc_timeout=0.5)
            cluster.clients.append(proxied)
            session = await proxied.open_session(
                "test", 0, hostname="host-0", connect_timeout=10.0, give_up_after=5.0, answered_before=True
            )
            assert session.membership.task.task_id == 0
            assert count[0] >= 2  # the swallowed connection, then the one that answered

    run(body())


def test_a_registration_never_answered_at_all_ends_as_unreachable_not_as_a_verdict() -> None:
    """Nothing answers for the whole wait: ``CoordinatorUnreachable`` (the agent's re-forming waits for the
    coordinator or its successor), never ``DeadlineError``."""

    async def body() -> None:
        async def swallow_all(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while await reader.read(65536):
                    pass
            writer.close()

        server = await asyncio.start_server(swallow_all, "127.0.0.1", 0)
        client = CoordinationClient(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", rpc_timeout=0.3)
        try:
            with pytest.raises(CoordinatorUnreachable, match="did not answer RegisterTask"):
                await client.open_session("test", 0, hostname="host-0", connect_timeout=1.5, give_up_after=1.0)
        finally:
            await client.close()
            server.close()

    run(body())
