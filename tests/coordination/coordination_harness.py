"""Helpers for the coordination tests: a config on loopback addresses, and an in-process cluster.

The service always binds 127.0.0.1 port 0; the tasks' addresses (127.0.0.1, .2, ...) only appear in messages.
Every asynchronous test body runs under ``run``, which bounds it in time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tpuctl.coordination.client import CoordinationClient
from tpuctl.coordination.server import CoordinationServer, start_server
from tpuctl.coordination.state import Membership, ServiceConfig, TaskSpec
from tpuctl.errors import TpuctlError

T = TypeVar("T")


def address(task_id: int) -> str:
    return f"127.0.0.{task_id + 1}"


def make_config(tasks: int = 4, **overrides: Any) -> ServiceConfig:
    settings: dict[str, Any] = {
        "cluster": "test",
        "tasks": tuple(TaskSpec(address(i)) for i in range(tasks)),
        "heartbeat_timeout": 1.0,
        "register_timeout": 5.0,
        "barrier_timeout": 5.0,
    }
    settings.update(overrides)
    return ServiceConfig(**settings)


def run(coro: Coroutine[Any, Any, T], *, timeout: float = 20.0) -> T:
    """Run one test body in a fresh event loop; nothing may take longer than ``timeout`` seconds."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


@dataclass
class Cluster:
    """A coordination server on 127.0.0.1 plus the clients a test made; all closed on exit."""

    server: CoordinationServer
    token: str | None = None
    clients: list[CoordinationClient] = field(default_factory=list)
    heartbeats: dict[int, asyncio.Task[Any]] = field(default_factory=dict)

    def client(self, **options: Any) -> CoordinationClient:
        options.setdefault("token", self.token)
        client = CoordinationClient(self.server.target, **options)
        self.clients.append(client)
        return client

    async def join(
        self, task_id: int, *, heartbeat_interval: float | None = 0.2
    ) -> tuple[CoordinationClient, Membership]:
        """Register ``task_id`` with its own client and (unless None) start its heartbeat loop."""
        client = self.client()
        member = await client.register(self.server.service.state.config.cluster, task_id, hostname=f"host-{task_id}")
        if heartbeat_interval is not None:
            self.heartbeats[task_id] = asyncio.create_task(client.heartbeat_loop(member, interval=heartbeat_interval))
        return client, member

    async def join_all(self, **options: Any) -> list[tuple[CoordinationClient, Membership]]:
        tasks = len(self.server.service.state.config.tasks)
        return list(await asyncio.gather(*(self.join(i, **options) for i in range(tasks))))

    async def stop_heartbeats(self, task_id: int) -> None:
        task = self.heartbeats.pop(task_id)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, TpuctlError):  # a loop may have ended in an error
            await task


@contextlib.asynccontextmanager
async def serving(config: ServiceConfig, **server_options: Any) -> AsyncIterator[Cluster]:
    server = await start_server(config, host="127.0.0.1", port=0, **server_options)
    cluster = Cluster(server, token=config.token)
    try:
        yield cluster
    finally:
        for task in list(cluster.heartbeats):
            await cluster.stop_heartbeats(task)
        for client in cluster.clients:
            await client.close()
        await server.stop(grace=None)
