"""A barrier whose session broke just as its instance passed learns that it passed, over real gRPC on
127.0.0.1 (protocol v13's ``RendezvousProgressRequest.request_id``).

The service answered the arrival (the instance passed with this host counted) but the stream broke before
the answer was read. Before, the call failed with the broken session's error (``tpuctl barrier`` exit 3)
though the round had passed for every host with this one in it, and the host's retry joined the next
instance, where it waited alone. Now the session asks the service what became of the arrival, by its
request id, once a new stream is up: passed (its number), failed (that failure), or no longer counted
(withdrawn as the old stream ended: it arrives again on the new stream, where it meets the others).
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
from tpuctl.proto import coordination_pb2 as pb

pytestmark = pytest.mark.timeout(60)


class LostAnswer:
    """Once armed, the stream of ``victim`` breaks (UNAVAILABLE) as the next answer of the kind chosen comes,
    unread: the answer to a barrier or gather arrival that passed (``passed``), or a heartbeat confirmation (the
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
                    answer = bool(response.request_id and (response.instance or response.HasField("gathered")))
                    if answer if passed else not response.request_id:
                        outer.lost.append(response.request_id)
                        metadata = grpc.aio.Metadata()
                        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, metadata, metadata, "Stream removed")
                return response

        async def lossy_read(session: Session, call: Any) -> Any:
            return await read(session, Lossy(call) if session is victim else call)

        monkeypatch.setattr(Session, "_read", lossy_read)


class Rendezvous:
    """A barrier or a gather as these tests call it: ``call(session, host, round_)`` is host ``host``'s call
    for round ``round_``, and ``passed(round_, hosts)`` what every call of that round returns once it passed
    (a barrier's instance number; a gather's table, every host's value for the round)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.name = "sync" if kind == "barrier" else "cores"

    def call(self, session: Session, host: int, round_: int = 1) -> Any:
        if self.kind == "barrier":
            return session.barrier(self.name, timeout=20.0)
        return session.gather(self.name, f"v{host}.{round_}".encode(), timeout=20.0)

    def passed(self, round_: int, hosts: int) -> Any:
        return round_ if self.kind == "barrier" else [f"v{host}.{round_}".encode() for host in range(hosts)]


@pytest.mark.parametrize("kind", ["barrier", "gather"])
def test_a_call_whose_stream_breaks_as_it_passes_is_told_it_passed(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The instance passed with this host counted, and the answer (a barrier's number, a gather's table) was
    lost with the stream. The session asks for it again, by the arrival's request id, and the service sends
    what every host got. Before, the call failed with the broken session's error (for a gather: init's
    core-ID merge on that host ended the generation)."""
    r = Rendezvous(kind)

    async def body() -> None:
        async with serving(make_config(3)) as cluster:
            opened, runs = await sessions(cluster)
            lossy = LostAnswer(monkeypatch, opened[0], passed=True)
            lossy.armed = True
            try:
                others = [asyncio.create_task(r.call(s, i)) for i, s in enumerate(opened) if i]
                await until(lambda: _is(arrived(cluster.clients[0], r.name), (1, 2)), "hosts 1 and 2 at #1")
                assert await asyncio.wait_for(r.call(opened[0], 0), 30) == r.passed(1, 3)
                assert len(lossy.lost) == 1  # its answer was lost with the stream, and asked again
                assert await asyncio.gather(*others) == [r.passed(1, 3)] * 2
                # in step: the next round passes on every host at #2
                assert await asyncio.gather(*(r.call(s, i, 2) for i, s in enumerate(opened))) == [r.passed(2, 3)] * 3
            finally:
                await close(runs)

    run(body())


@pytest.mark.parametrize("kind", ["barrier", "gather"])
def test_a_call_whose_stream_breaks_while_it_waits_arrives_again_on_the_new_stream_and_passes(
    kind: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The session rides out the break: the arrival (a gather's value with it), withdrawn with the old
    stream, arrives again on the new one. Soak seed 50212 (a barrier): the coordinator cut off for 1.2 s,
    every host's connection closed by unanswered keepalive pings, the generation survived; the call failed
    with "the session ... broke while the call waited" (exit 3) and the hosts whose streams held waited out
    their timeout alone. Soak seed 130024 (a gather): a 0.47 s cut during init's core-ID gather; the host
    failed that way, re-registered and ended the generation."""
    r = Rendezvous(kind)
    caplog.set_level(logging.INFO, logger="tpuctl.coordination")

    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            opened, runs = await sessions(cluster)
            lossy = LostAnswer(monkeypatch, opened[0], passed=False)
            try:
                waiting = asyncio.create_task(r.call(opened[0], 0))
                await until(lambda: _is(arrived(cluster.clients[1], r.name), (0,)), "host 0 at #1")
                lossy.armed = True  # the next heartbeat confirmation is lost with the stream

                async def arrived_again() -> bool:
                    return "arriving again" in caplog.text and await _is(arrived(cluster.clients[1], r.name), (0,))

                await until(arrived_again, "host 0 at #1 again, on its new stream", timeout=15.0)
                assert lossy.lost == [0] and not waiting.done()
                assert await r.call(opened[1], 1) == r.passed(1, 2)  # host 1 meets it at #1
                assert await asyncio.wait_for(waiting, 30) == r.passed(1, 2)
                # in step: the next round passes on both hosts at #2
                assert await asyncio.gather(*(r.call(s, i, 2) for i, s in enumerate(opened))) == [r.passed(2, 2)] * 2
            finally:
                await close(runs)

    run(body())


def test_an_arrival_sent_again_asks_only_for_what_is_left_of_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Soak seed 100316: every arrival of a round was sent while the coordinator was cut off and arrived
    again 1.8 s later, the first to reach it, with the call's whole 2.3 s: the service counts a round's
    deadline from its first arrival, so the round stayed open past every caller's own timeout, and the next
    round's first callers completed it. The arrival sent again asks for what is left."""

    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            opened, runs = await sessions(cluster)
            sent: list[float] = []
            write = Session._write

            async def recording(self: Session, request: pb.HeartbeatRequest, *args: Any, **kwargs: Any) -> bool:
                if self is opened[0] and request.HasField("barrier"):
                    sent.append(request.barrier.timeout_seconds)
                return bool(await write(self, request, *args, **kwargs))

            monkeypatch.setattr(Session, "_write", recording)
            lossy = LostAnswer(monkeypatch, opened[0], passed=False)
            try:
                waiting = asyncio.create_task(opened[0].barrier("sync", timeout=8.0))
                await until(lambda: _is(arrived(cluster.clients[1], "sync"), (0,)), "host 0 at #1")
                await asyncio.sleep(1.0)
                lossy.armed = True  # the next heartbeat confirmation is lost with the stream
                async def sent_again() -> bool:
                    return len(sent) >= 2

                await until(sent_again, "host 0's arrival sent again", timeout=15.0)
                assert sent[0] == pytest.approx(8.0)
                assert 0.05 <= sent[1] <= 8.0 - 1.0, sent  # at least the second waited is gone from it
                assert await opened[1].barrier("sync", timeout=20.0) == 1
                assert await asyncio.wait_for(waiting, 30) == 1
            finally:
                await close(runs)

    run(body())


def test_a_lost_gather_answer_is_encoded_once_per_instance_for_every_host_that_asks() -> None:
    """Every host whose stream broke as a gather passed asks for the table: the reply (its table's bytes as
    the stream sent them) is built once per instance, not once per host, and parses to the same table."""
    from tpuctl.coordination import convert
    from tpuctl.coordination.shared import SharedAnswers
    from tpuctl.coordination.values import Counters, Gathered

    answers = SharedAnswers(Counters())
    first = Gathered(1, (b"a", b"b", b"c"))
    replies = [answers.lost_gather("cores", first) for _ in range(100)]
    assert all(reply is replies[0] for reply in replies)
    assert answers.counters.encoded == 2  # the table once, the reply once
    parsed = pb.RendezvousProgressResponse.FromString(replies[0])
    assert (parsed.counted, parsed.passed, parsed.instance) == (True, True, 1)
    assert convert.gather_values(parsed.gathered) == [b"a", b"b", b"c"]
    second = Gathered(2, (b"x", b"y", b"z"))
    assert convert.gather_values(pb.RendezvousProgressResponse.FromString(answers.lost_gather("cores", second)).gathered) == [
        b"x", b"y", b"z"
    ]  # fmt: skip
    assert answers.counters.encoded == 4
