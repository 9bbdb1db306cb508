"""A barrier whose session broke just as its instance passed learns that it passed, over real gRPC on
127.0.0.1 (protocol v13's ``RendezvousProgressRequest.request_id``).

The service answered the arrival (the instance passed with this host counted) but the stream broke before
the answer was read. Before, the call failed with the broken session's error (``tpuctl barrier`` exit 3)
though the round had passed for every host with this one in it, and the host's retry joined the next
instance, where it waited alone. Now the session asks the service what became of the arrival, by its
request id, once a new stream is up: passed (its number), failed (that failure), or no longer counted
(withdrawn as the old stream ended, or never arrived: the call arrives again on the new stream, within
its own timeout, and meets the others).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest
from coordination_harness import make_config, run, serving
from test_coordination_session import close, sessions
from test_coordination_withdraw import _is, arrived, until

from tpuctl.coordination.session import Session
from tpuctl.errors import CoordinatorUnreachable, DeadlineError
from tpuctl.proto import coordination_pb2 as pb

pytestmark = pytest.mark.timeout(60)


class LostAnswer:
    """Once armed, the stream of ``victim`` breaks (UNAVAILABLE) as the next answer of the kind chosen comes,
    unread: the answer to a barrier arrival that passed (``passed``), or a heartbeat confirmation (the
    instance still open). ``lost``: the request ids whose answer was lost (0 for a confirmation)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, victim: Session, *, passed: bool) -> None:
        self.lost: list[int] = []
        self.armed = False
        read = Session._read
        outer = self

        class Lossy:
            def __init__(self, call: Any) -> None:
                self._call = call

            def __getattr__(self, attr: str) -> Any:
                return getattr(self._call, attr)

            async def read(self) -> Any:
                response = await self._call.read()
                if outer.armed and not outer.lost and isinstance(response, pb.HeartbeatResponse):
                    answer = bool(response.request_id and response.instance)
                    if answer if passed else not response.request_id:
                        outer.lost.append(response.request_id)
                        metadata = grpc.aio.Metadata()
                        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, metadata, metadata, "Stream removed")
                return response

        async def lossy_read(session: Session, call: Any) -> Any:
            return await read(session, Lossy(call) if session is victim else call)

        monkeypatch.setattr(Session, "_read", lossy_read)


async def _said(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in record.getMessage() for record in caplog.records)


def test_a_barrier_whose_stream_breaks_as_it_passes_is_told_it_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    async def body() -> None:
        async with serving(make_config(3)) as cluster:
            opened, runs = await sessions(cluster)
            lossy = LostAnswer(monkeypatch, opened[0], passed=True)
            lossy.armed = True
            try:
                others = [asyncio.create_task(s.barrier("sync", timeout=20.0)) for s in opened[1:]]
                await until(lambda: _is(arrived(cluster.clients[0], "sync"), (1, 2)), "hosts 1 and 2 at #1")
                assert await asyncio.wait_for(opened[0].barrier("sync", timeout=20.0), 30) == 1
                assert len(lossy.lost) == 1  # its answer was lost with the stream, and asked again
                assert await asyncio.gather(*others) == [1, 1]
                # in step: the next round passes on every host at #2
                assert await asyncio.gather(*(s.barrier("sync", timeout=20.0) for s in opened)) == [2, 2, 2]
            finally:
                await close(runs)

    run(body())


def test_a_barrier_whose_stream_breaks_while_it_waits_arrives_again_and_passes_with_the_others(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by the soak (``tools/soak``, seed 50496): a cut of a host shorter than the heartbeat timeout
    (which the cluster rides out) broke its stream under a barrier arrival; the service withdrew it (or never
    got it) and the call failed with exit 3, so every other host's call timed out waiting for it. Now the
    call arrives again on the new stream, within its own timeout, and the round passes."""

    caplog.set_level(logging.INFO, logger="tpuctl.coordination")

    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            opened, runs = await sessions(cluster)
            lossy = LostAnswer(monkeypatch, opened[0], passed=False)
            try:
                waiting = asyncio.create_task(opened[0].barrier("sync", timeout=20.0))
                await until(lambda: _is(arrived(cluster.clients[1], "sync"), (0,)), "host 0 at #1")
                lossy.armed = True  # the next heartbeat confirmation is lost with the stream
                # the service took its arrival back as the old stream ended; the call arrived again
                await until(lambda: _said(caplog, "arriving again on the new stream"), "host 0 to arrive again", 10.0)
                await until(lambda: _is(arrived(cluster.clients[1], "sync"), (0,)), "host 0 at #1 again")
                assert not waiting.done()
                assert await opened[1].barrier("sync", timeout=20.0) == 1
                assert await asyncio.wait_for(waiting, 30) == 1  # it met host 1 at #1
                both = [opened[0].barrier("sync", timeout=20.0), opened[1].barrier("sync", timeout=20.0)]
                assert await asyncio.gather(*both) == [2, 2]  # in step
            finally:
                await close(runs)

    run(body())


def test_a_barrier_whose_stream_breaks_after_its_timeout_says_the_session_broke(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No time left of the call's own timeout when the new stream is up: the break's error (exit 3)."""

    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            opened, runs = await sessions(cluster)
            lossy = LostAnswer(monkeypatch, opened[0], passed=False)
            try:
                waiting = asyncio.create_task(opened[0].barrier("sync", timeout=0.3))
                await until(lambda: _is(arrived(cluster.clients[1], "sync"), (0,)), "host 0 at #1")
                lossy.armed = True
                with pytest.raises((CoordinatorUnreachable, DeadlineError)):
                    await asyncio.wait_for(waiting, 30)
                await until(lambda: _is(arrived(cluster.clients[1], "sync"), None), "host 0's arrival withdrawn")
            finally:
                await close(runs)

    run(body())
