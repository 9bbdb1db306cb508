"""Hints that fit the moment (issue 24 item 3), over real gRPC on loopback: a coordinator that never
answered gets the start-up advice (is ``tpuctl init`` running on task 0, is the address right, is the port
open); one that answered and then stopped gets advice for that, by how it stopped: a refused connection
(its agent died or restarted) or no answer at all (a partition, a frozen or lost host)."""

from __future__ import annotations

import asyncio

import pytest
from coordination_harness import make_config, run, serving
from test_coordination_frozen import FreezingProxy

from tpuctl.coordination.client import CoordinationClient
from tpuctl.errors import CoordinatorUnreachable

STARTUP = "check that `tpuctl init` runs on task 0"
TIMEOUT_S = 1.5


async def _session_error(client: CoordinationClient, stop: object) -> CoordinatorUnreachable:
    """Open a session, let it confirm, ``await stop()`` (the coordinator goes away), return how it ended."""
    session = await client.open_session("test", 0, interval=0.1, give_up_after=TIMEOUT_S)
    beating = asyncio.create_task(session.run())
    await asyncio.sleep(0.5)
    assert not beating.done()
    await stop()  # type: ignore[operator]
    with pytest.raises(CoordinatorUnreachable) as excinfo:
        await asyncio.wait_for(beating, 10.0)
    return excinfo.value


def test_a_coordinator_that_never_answered_gets_the_start_up_advice() -> None:
    async def body() -> None:
        client = CoordinationClient("127.0.0.1:1")  # nothing listens on port 1
        try:
            with pytest.raises(CoordinatorUnreachable) as excinfo:
                await client.open_session("test", 0, connect_timeout=0.3)
        finally:
            await client.close()
        assert STARTUP in (excinfo.value.hint or "")

    run(body())


def test_a_coordinator_that_answered_then_died_is_not_given_start_up_advice() -> None:
    async def body() -> None:
        async with serving(make_config(1, heartbeat_timeout=TIMEOUT_S)) as cluster:
            client = cluster.client()
            error = await _session_error(client, lambda: cluster.server.stop(grace=None))
        hint = error.hint or ""
        assert STARTUP not in hint, hint
        assert "the coordinator answered before; now its host refuses connections" in hint, hint
        assert "task 0's agent died or restarted" in hint, hint

    run(body())


def test_a_coordinator_cut_off_or_frozen_gets_the_partition_advice() -> None:
    async def body() -> None:
        async with (
            serving(make_config(1, heartbeat_timeout=TIMEOUT_S)) as cluster,
            FreezingProxy(cluster.server.port) as proxy,
        ):
            client = CoordinationClient(proxy.target, token=cluster.token)

            async def freeze() -> None:
                proxy.freeze()

            try:
                error = await _session_error(client, freeze)
            finally:
                proxy.thaw()
                await client.close()
        hint = error.hint or ""
        assert STARTUP not in hint, hint
        assert "not even a refusal" in hint and "network partition" in hint, hint

    run(body())


def test_a_new_registration_after_the_coordinator_answered_before_says_so() -> None:
    """An agent re-registering into the next generation after its coordinator stopped: the error at the
    end of the wait says the coordinator answered before, with the advice for a stopped one."""

    async def body() -> None:
        async with serving(make_config(1)) as cluster:
            target = cluster.server.target
            await cluster.server.stop(grace=None)
        client = CoordinationClient(target)
        try:
            with pytest.raises(CoordinatorUnreachable) as excinfo:
                await client.open_session("test", 0, connect_timeout=0.3, answered_before=True)
        finally:
            await client.close()
        assert "it answered this host before" in excinfo.value.message
        assert STARTUP not in (excinfo.value.hint or "") and "refuses connections" in (excinfo.value.hint or "")

    run(body())
