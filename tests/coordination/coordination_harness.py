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
from tpuctl.coordination.values import Membership, ServiceConfig, TaskSpec
from tpuctl.errors import DeadlineError, TpuctlError

T = TypeVar("T")

MESSAGE_BOUND = 2_000
"""Characters: any message about any number of hosts stays under this (addresses here are short)."""


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


def check_bounded_registration_timeout(error: DeadlineError, lines: list[str]) -> None:
    """What a host hears when 1 of 10,000 registered and the service's 1 s register timeout ran out, on
    the unary wait and on the session alike: counts and a bounded sample, in the timeout message (with
    its hint) and in every progress line."""
    message = error.message
    assert message.startswith("registration timed out after 1.0 s: 1 of 10,000 hosts registered; missing: ")
    assert message.endswith(", ... and 9,989 more; `tpuctl status --json` lists all")
    assert len(message) < MESSAGE_BOUND
    assert error.hint is not None and "tpuctl init" in error.hint
    assert lines and all(len(line) < MESSAGE_BOUND for line in lines)
    assert lines[0].startswith("waiting for 9,999 of 10,000 hosts: task 1 (127.0.0.2), ")
