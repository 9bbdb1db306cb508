"""Abandoned calls do not count, through the service over real gRPC on 127.0.0.1 (protocol v13).

A barrier or gather call that gives up withdraws its arrival: its own timeout ran out (the session sends
``StreamWithdraw``), its caller cancelled it (the same, in the background), its session ended (the service
withdraws what the stream still waited for), or a unary call was cancelled. The instance then waits for that
host again, and the host's retry joins it; a pass that reached the service first wins, and the caller is
told it passed. Before, the arrival kept counting: the instance passed for the others with that host gone,
and the host's retry joined the next instance, out of step for good.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from coordination_harness import make_config, run, serving
from test_coordination_session import close, sessions

from tpuctl.coordination import session as session_module
from tpuctl.coordination.client import CoordinationClient
from tpuctl.coordination.session import Session
from tpuctl.coordination.values import OpenBarrier
from tpuctl.errors import DeadlineError

pytestmark = pytest.mark.timeout(60)

GAVE_UP = (
    "barrier 'sync' #1 did not pass within this call's timeout of 0.5 s: 2 of 3 hosts had arrived, this one "
    "included; missing: task 2 (127.0.0.3); this host's arrival was withdrawn"
)


async def open_barriers(client: CoordinationClient) -> tuple[OpenBarrier, ...]:
    return (await client.status()).barriers


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.05)


async def arrived(client: CoordinationClient, name: str) -> tuple[int, ...] | None:
    """Who arrived at ``name``'s open instance (None: no open instance)."""
    found = [b for b in await open_barriers(client) if b.name == name]
    return found[0].arrived if found else None


def test_a_call_whose_timeout_runs_out_is_withdrawn_and_the_others_wait_for_its_host() -> None:
    """The report: host 1 waits with 30 s, host 0 comes with 0.5 s and gives up, host 2 comes later.
    Before the fix host 0 heard "the coordinator ... did not answer" 10 s later, and #1 passed for hosts
    1 and 2 without it."""

    async def body() -> None:
        async with serving(make_config(3)) as cluster:
            opened, runs = await sessions(cluster)
            client = cluster.clients[0]
            try:
                host1 = asyncio.create_task(opened[1].barrier("sync", timeout=30.0))
                await until(lambda: _is(arrived(client, "sync"), (1,)), "host 1 at #1")
                started = time.monotonic()
                with pytest.raises(DeadlineError) as gave_up:
                    await opened[0].barrier("sync", timeout=0.5)
                assert 0.5 <= time.monotonic() - started < 5.0
                assert gave_up.value.message == GAVE_UP
                assert gave_up.value.hint is not None and "joins it again (a retry is safe)" in gave_up.value.hint
                host2 = asyncio.create_task(opened[2].barrier("sync", timeout=30.0))
                await until(lambda: _is(arrived(client, "sync"), (1, 2)), "host 2 at #1, host 0 no more")
                await asyncio.sleep(0.5)
                assert not host1.done() and not host2.done()  # no pass with host 0 gone
                assert await opened[0].barrier("sync", timeout=30.0) == 1  # the retry meets them at #1
                assert await host1 == 1 and await host2 == 1
                assert await asyncio.gather(*(s.barrier("sync", timeout=5.0) for s in opened)) == [2] * 3
                assert (await client.status()).failed_barriers == ()
            finally:
                await close(runs)

    run(body())


def test_a_cancelled_call_is_withdrawn_and_an_empty_instance_is_forgotten() -> None:
    """Ctrl-C on `tpuctl barrier` cancels the agent's call: the arrival goes, and #1, left empty, is opened
    afresh by the next call (with that call's own timeout, not the cancelled one's)."""

    async def body() -> None:
        async with serving(make_config(3)) as cluster:
            opened, runs = await sessions(cluster)
            client = cluster.clients[0]
            try:
                waiting = asyncio.create_task(opened[0].barrier("sync", timeout=1.0))
                beside = asyncio.create_task(opened[0].barrier("other", timeout=30.0))  # a second call, kept
                await until(lambda: _is(arrived(client, "sync"), (0,)), "host 0 at #1")
                await until(lambda: _is(arrived(client, "other"), (0,)), "host 0 at other #1")
                waiting.cancel()
                await until(lambda: _is(arrived(client, "sync"), None), "host 0's arrival withdrawn")
                assert await arrived(client, "other") == (0,)
                others = [asyncio.create_task(s.barrier("sync", timeout=30.0)) for s in opened[1:]]
                await until(lambda: _is(arrived(client, "sync"), (1, 2)), "hosts 1 and 2 at #1")
                await asyncio.sleep(1.5)  # past the cancelled call's 1 s: #1 is the new arrivals' own
                assert not any(t.done() for t in others)
                assert await opened[0].barrier("sync", timeout=30.0) == 1
                assert [await t for t in others] == [1, 1]
                assert await asyncio.gather(beside, *(s.barrier("other", timeout=5.0) for s in opened[1:])) == [1] * 3
                assert (await client.status()).failed_barriers == ()
            finally:
                await close(runs)

    run(body())


def test_a_session_that_ends_withdraws_the_arrivals_it_still_waited_for() -> None:
    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            opened, runs = await sessions(cluster)
            client = cluster.clients[1]
            try:
                waiting = [asyncio.create_task(opened[0].barrier(name, timeout=30.0)) for name in ("sync", "other")]
                await until(lambda: _is(arrived(client, "sync"), (0,)), "host 0 at sync #1")
                await until(lambda: _is(arrived(client, "other"), (0,)), "host 0 at other #1")
                await close(runs[:1])  # host 0's session ends (its agent stopping, a broken connection)
                await until(lambda: _is(open_barriers(client), ()), "the ended session's two arrivals withdrawn")
                for call in waiting:
                    with pytest.raises(Exception, match="session"):
                        await asyncio.wait_for(call, 5.0)
                again = cluster.clients[0].session(opened[0].membership, interval=0.2)
                runs[0] = asyncio.create_task(again.run())
                for name in ("sync", "other"):
                    both = [again.barrier(name, timeout=10.0), opened[1].barrier(name, timeout=10.0)]
                    assert await asyncio.gather(*both) == [1, 1]
            finally:
                await close(runs)

    run(body())


def test_a_pass_that_reaches_the_service_before_the_withdrawal_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """The race: host 0's timeout runs out, and the last host arrives before its withdrawal reaches the
    service. The instance passed with host 0 counted: host 0 is told it passed, as the others are."""

    async def body() -> None:
        async with serving(make_config(3)) as cluster:
            opened, runs = await sessions(cluster)
            client = cluster.clients[0]
            monkeypatch.setattr(session_module, "WITHDRAW_GRACE_S", 0.0)
            send = Session._send_withdraw
            last: list[asyncio.Task[int]] = []

            async def late_withdrawal(self: Session, request_id: int, call: str) -> None:
                if self is opened[0] and not last:
                    last.append(asyncio.create_task(opened[2].barrier("sync", timeout=10.0)))
                    assert await last[0] == 1  # passed, host 0's arrival counted
                await send(self, request_id, call)

            monkeypatch.setattr(Session, "_send_withdraw", late_withdrawal)
            try:
                first = asyncio.create_task(opened[1].barrier("sync", timeout=10.0))
                await until(lambda: _is(arrived(client, "sync"), (1,)), "host 1 at #1")
                assert await opened[0].barrier("sync", timeout=0.3) == 1
                assert await first == 1 and len(last) == 1
                assert await asyncio.gather(*(s.barrier("sync", timeout=5.0) for s in opened)) == [2] * 3
            finally:
                await close(runs)

    run(body())


def test_a_withdrawn_gather_value_does_not_reach_the_table() -> None:
    async def body() -> None:
        async with serving(make_config(3)) as cluster:
            opened, runs = await sessions(cluster)
            client = cluster.clients[0]
            try:
                host1 = asyncio.create_task(opened[1].gather("ids", b"v1", timeout=30.0))
                await until(lambda: _is(arrived(client, "ids"), (1,)), "host 1 at gather #1")
                gave_up = r"^gather 'ids' #1 did not pass within this call's timeout of 0\.5 s"
                with pytest.raises(DeadlineError, match=gave_up):
                    await opened[0].gather("ids", b"stale", timeout=0.5)
                host2 = asyncio.create_task(opened[2].gather("ids", b"v2", timeout=30.0))
                await until(lambda: _is(arrived(client, "ids"), (1, 2)), "host 2 at gather #1")
                assert not host1.done()
                table = [b"fresh", b"v1", b"v2"]
                assert await opened[0].gather("ids", b"fresh", timeout=30.0) == table
                assert await host1 == table and await host2 == table
            finally:
                await close(runs)

    run(body())


def test_a_cancelled_unary_barrier_is_withdrawn() -> None:
    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            (c0, m0), (c1, m1) = await cluster.join_all()
            waiting = asyncio.create_task(c0.barrier(m0.task, "unary", timeout=30.0))
            await until(lambda: _is(arrived(c1, "unary"), (0,)), "task 0 at #1")
            waiting.cancel()  # the caller gives up: gRPC cancels the call, the service withdraws
            await until(lambda: _is(arrived(c1, "unary"), None), "task 0's unary arrival withdrawn")
            both = [c0.barrier(m0.task, "unary", timeout=5.0), c1.barrier(m1.task, "unary", timeout=5.0)]
            assert await asyncio.gather(*both) == [1, 1]

    run(body())


async def _is(found: Awaitable[Any], expected: Any) -> bool:
    return await found == expected
