"""The session stream (protocol v6) over real gRPC on 127.0.0.1: heartbeats, barriers and the error watch
of a host on one ``HeartbeatStream``. The outcomes and messages are the unary calls' (same texts), the
service parks nothing per host, and the stream is its opener's task only.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import grpc
import pytest
from coordination_harness import check_bounded_registration_timeout, make_config, run, serving

from tpuctl.coordination import calls, convert
from tpuctl.coordination import client as client_module
from tpuctl.coordination import fanout as fanout_module
from tpuctl.coordination import stream_answers as stream_answers_module
from tpuctl.coordination.client import CoordinationClient
from tpuctl.coordination.session import Session
from tpuctl.coordination.values import (
    PROTOCOL_VERSION,
    ClusterFailed,
    Membership,
    RestartPolicy,
    TaskInfo,
    TaskRef,
    TaskState,
)
from tpuctl.errors import ClusterError, DeadlineError, GenerationOver, InputError
from tpuctl.proto import coordination_pb2 as pb
from tpuctl.proto import coordination_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)


async def sessions(cluster: Any, interval: float = 0.2) -> tuple[list[Session], list[asyncio.Task[Any]]]:
    members = [await cluster.join(i, heartbeat_interval=None) for i in range(len(cluster.server.service.state.tasks))]
    opened = [client.session(member, interval=interval) for client, member in members]
    return opened, [asyncio.create_task(s.run()) for s in opened]


async def close(runs: list[asyncio.Task[Any]]) -> None:
    for task in runs:
        task.cancel()
    for task in runs:
        with contextlib.suppress(BaseException):
            await task


def test_barriers_on_sessions_pass_in_order_without_a_unary_call() -> None:
    async def body() -> None:
        async with serving(make_config(4)) as cluster:
            opened, runs = await sessions(cluster)
            counters = cluster.server.service.counters
            try:
                await asyncio.sleep(0.3)  # the streams are open
                before = counters.snapshot()
                for round_ in range(1, 6):
                    assert await asyncio.gather(*(s.barrier("step", timeout=5.0) for s in opened)) == [round_] * 4
                after = counters.snapshot()
                # 20 arrivals in, 20 outcomes out (plus heartbeats and their confirmations), no unary call:
                # every RPC counted is a stream message.
                assert after["calls"] - before["calls"] == after["stream_in"] - before["stream_in"]
                assert after["stream_in"] - before["stream_in"] >= 20
                assert after["woken"] - before["woken"] >= 15  # the waiting arrivals, answered by key
                # A unary barrier of the same task counts in the same series (the service counts per task).
                client, member = cluster.clients[0], opened[0].membership
                unary = asyncio.create_task(client.barrier(member.task, "step", timeout=5.0))
                assert await asyncio.gather(*(s.barrier("step", timeout=5.0) for s in opened[1:])) == [6] * 3
                assert await unary == 6
            finally:
                await close(runs)

    run(body())


def test_a_barrier_timeout_on_a_session_says_what_the_unary_call_says() -> None:
    async def body() -> None:
        async with serving(make_config(4)) as cluster:
            opened, runs = await sessions(cluster)
            try:
                started = time.monotonic()
                results = await asyncio.gather(
                    *(s.barrier("sync", timeout=0.5) for s in opened[:3]), return_exceptions=True
                )
                assert 0.5 <= time.monotonic() - started < 2.0
                for result in results:
                    assert isinstance(result, DeadlineError)
                    assert result.message == (
                        "barrier 'sync' #1 timed out after 0.5 s: 3 of 4 hosts arrived; missing: task 3 (127.0.0.4)"
                    )
                    assert result.hint is not None and "missing hosts" in result.hint
                # A late arrival does not join the instance that failed (nor hear itself named missing): it
                # opens the next, and waits there for the others' next call.
                with pytest.raises(DeadlineError) as late:
                    await opened[3].barrier("sync", timeout=0.5)
                assert late.value.message == (
                    "barrier 'sync' #2 timed out after 0.5 s: 1 of 4 hosts arrived; missing: task 0 (127.0.0.1), "
                    "task 1 (127.0.0.2), task 2 (127.0.0.3)"
                )
                assert await asyncio.gather(*(s.barrier("after", timeout=5.0) for s in opened)) == [1] * 4
                # A name too long for the service is refused clearly, on the stream, and the stream goes on.
                with pytest.raises(InputError, match="barrier name is 60,000 characters"):
                    await opened[0].barrier("x" * 60_000, timeout=1.0)
                assert await asyncio.gather(*(s.barrier("after", timeout=5.0) for s in opened)) == [2] * 4
                assert not any(r.done() for r in runs)
            finally:
                await close(runs)

    run(body())


def test_a_round_after_a_failed_one_passes_on_sessions_and_status_lists_the_failures() -> None:
    """Issue 24, item 1, through the service: host 0 alone at "sync" (times out), then both hosts twice:
    both rounds pass; a gather the same, with only the new values; ``GetStatus`` lists what failed."""

    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            opened, runs = await sessions(cluster)
            try:
                with pytest.raises(DeadlineError) as alone:
                    await opened[0].barrier("sync", timeout=0.5)
                assert alone.value.message == (
                    "barrier 'sync' #1 timed out after 0.5 s: 1 of 2 hosts arrived; missing: task 1 (127.0.0.2)"
                )
                for instance in (2, 3):
                    assert await asyncio.gather(*(s.barrier("sync", timeout=5.0) for s in opened)) == [instance] * 2
                with pytest.raises(DeadlineError, match=r"^gather 'ids' #1 timed out .* missing: task 0 "):
                    await opened[1].gather("ids", b"stale", timeout=0.5)
                both = await asyncio.gather(*(s.gather("ids", b"v%d" % i, timeout=5.0) for i, s in enumerate(opened)))
                assert both == [[b"v0", b"v1"]] * 2
                status = await cluster.clients[0].status()
                assert status.barriers == ()
                assert [
                    (f.kind, f.name, f.instance, f.reason, f.arrived, [t.task_id for t in f.missing], f.missing_count)
                    for f in status.failed_barriers
                ] == [("barrier", "sync", 1, "timed out", 1, [1], 1), ("gather", "ids", 1, "timed out", 1, [0], 1)]
                assert status.failed_barriers[0].message == alone.value.message
                assert 0 < status.failed_barriers[1].seconds_ago < status.failed_barriers[0].seconds_ago < 15
            finally:
                await close(runs)

    run(body())


def test_a_silent_host_is_pushed_to_every_session_and_fails_their_barriers() -> None:
    heartbeat_timeout, interval = 1.0, 0.2

    async def body() -> None:
        async with serving(make_config(4, heartbeat_timeout=heartbeat_timeout)) as cluster:
            opened, runs = await sessions(cluster, interval=interval)
            try:
                watches = [asyncio.create_task(s.watch_errors()) for s in opened[:3]]
                barriers = [asyncio.create_task(s.barrier("sync", timeout=30.0)) for s in opened[:3]]
                await asyncio.sleep(0.3)
                assert not any(b.done() for b in barriers)
                assert not cluster.server.service._parking._slots  # nothing parked per host
                runs[3].cancel()  # task 3's session ends (its process went away)
                silent_since = time.monotonic()
                failures = await asyncio.gather(*watches)
                heard_after = time.monotonic() - silent_since
                window = cluster.server.service.state.keepalive_window  # v8: silent since then at the latest
                assert heartbeat_timeout - window - 0.05 <= heard_after < heartbeat_timeout + 1.0
                for failure in failures:
                    (only,) = failure.failures
                    assert only.task == TaskInfo(3, "127.0.0.4")
                    assert "no heartbeat for " in only.cause and ": its session ended " in only.cause
                done, _ = await asyncio.wait(barriers, timeout=0.5)
                assert len(done) == 3
                for barrier in barriers:
                    error = barrier.exception()
                    assert isinstance(error, ClusterError)
                    assert error.message.startswith("barrier 'sync' #1 failed: task 3 (127.0.0.4) failed: no heartbeat for ")
                # A watch started after the failure hears it at once.
                late = cluster.client()
                assert (await asyncio.wait_for(opened[0].watch_errors(), 1.0)).failures == failures[0].failures
                await late.close()
            finally:
                await close(runs)

    run(body())


def test_a_session_barrier_of_an_ended_generation_is_refused_naming_both() -> None:
    async def body() -> None:
        policy = RestartPolicy(rejoin=True, timeout=30.0, max_restarts=2)
        async with serving(make_config(2, restart=policy)) as cluster:
            opened, runs = await sessions(cluster)
            try:
                assert await asyncio.gather(*(s.barrier("b", timeout=5.0) for s in opened)) == [1, 1]
                watch = asyncio.create_task(opened[0].watch_errors())
                await cluster.clients[1].report_error(opened[1].membership.task, "boom")
                failure = await asyncio.wait_for(watch, 2.0)
                assert failure.rejoin and failure.generation == 1
                with pytest.raises((GenerationOver, ClusterError)) as excinfo:
                    await opened[0].barrier("b", timeout=5.0)
                assert "generation 1" in excinfo.value.message and "generation 2" in excinfo.value.message
            finally:
                await close(runs)

    run(body())


def test_a_session_carries_only_its_openers_task() -> None:
    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            (c0, m0), (_c1, m1) = [await cluster.join(i, heartbeat_interval=None) for i in (0, 1)]
            channel = grpc.aio.insecure_channel(cluster.server.target)
            stub = pb_grpc.CoordinationServiceStub(channel)
            try:
                call = stub.HeartbeatStream()
                await call.write(pb.HeartbeatRequest(task=convert.task_ref_pb(m0.task), ack=True))
                assert isinstance(await call.read(), pb.HeartbeatResponse)
                # Later messages may omit the task; one naming task 1 (with task 1's own credential) is refused.
                await call.write(pb.HeartbeatRequest(ack=True))
                assert isinstance(await call.read(), pb.HeartbeatResponse)
                await call.write(pb.HeartbeatRequest(task=convert.task_ref_pb(m1.task), ack=True))
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call.read()
                assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
                assert "carries the calls of the task that opened it (task 0)" in (refused.value.details() or "")
                # A stream opened with a forged credential gets nothing done, barriers included.
                forged = pb.TaskRef(task_id=1, incarnation=m1.task.incarnation, credential=b"x" * 32, generation=1)
                call = stub.HeartbeatStream()
                await call.write(pb.HeartbeatRequest(task=forged, barrier=pb.StreamBarrier(request_id=7, name="b")))
                answer = await call.read()
                assert answer.request_id == 7 and answer.code == grpc.StatusCode.PERMISSION_DENIED.value[0]
                assert "does not carry the credential" in answer.details
                await call.write(pb.HeartbeatRequest(ack=True))
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call.read()
                assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
                assert (await c0.status()).barriers == ()  # the forged arrival was not counted
            finally:
                await channel.close()

    run(body())


def test_a_session_barrier_before_the_stream_is_up_waits_for_it() -> None:
    async def body() -> None:
        async with serving(make_config(1)) as cluster:
            client = cluster.client()
            member = await client.register("test", 0)
            session = client.session(member, interval=0.2)
            waiting = asyncio.create_task(session.barrier("solo", timeout=2.0))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            running = asyncio.create_task(session.run())
            try:
                assert await asyncio.wait_for(waiting, 2.0) == 1
            finally:
                await close([running])
            # Once run ended, the session refuses at once with why it ended.
            with pytest.raises(ClusterError, match=r"session with .* was closed"):
                await session.barrier("solo", timeout=2.0)

    run(body())


def test_session_and_unary_client_stay_compatible() -> None:
    """A v6 service still answers the unary calls other clients (status, tools) make."""

    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            members = await cluster.join_all()
            assert await asyncio.gather(*(c.barrier(m.task, "u", timeout=5.0) for c, m in members)) == [1, 1]
            client: CoordinationClient = members[0][0]
            assert await client.watch_errors(members[0][1].task, timeout=0.2) is None

    run(body())


# --- protocol v7: registering and waiting for all on the session ------------------------------------------


async def open_sessions(
    cluster: Any, tasks: range, interval: float = 0.2
) -> tuple[list[Session], list[asyncio.Task[Any]]]:
    name = cluster.server.service.state.config.cluster
    opened = [await cluster.client().open_session(name, i, hostname=f"host-{i}", interval=interval) for i in tasks]
    return opened, [asyncio.create_task(s.run()) for s in opened]


def test_open_session_registers_on_the_stream_and_waits_for_all_there() -> None:
    async def body() -> None:
        async with serving(make_config(3)) as cluster:
            counters = cluster.server.service.counters
            opened, runs = await open_sessions(cluster, range(2))
            try:
                # Two registrations, each the first message of its stream: two calls (the streams), no unary.
                assert counters.calls - counters.stream_in == 2
                assert [s.membership.task.task_id for s in opened] == [0, 1]
                assert all(s.membership.num_tasks == 3 and len(s.membership.task.credential) > 0 for s in opened)
                seen: list[str] = []
                waiting = [
                    asyncio.create_task(
                        s.wait_for_all(timeout=10.0, progress=lambda p: seen.append(p.describe()), progress_every=0.1)
                    )
                    for s in opened
                ]
                await asyncio.sleep(0.4)
                assert not any(w.done() for w in waiting)
                assert "waiting for 1 of 3 hosts: task 2 (127.0.0.3)" in seen
                late, late_runs = await open_sessions(cluster, range(2, 3))
                runs += late_runs
                started = time.monotonic()
                await asyncio.wait_for(asyncio.gather(*waiting, late[0].wait_for_all(timeout=5.0)), 5.0)
                assert time.monotonic() - started < 0.5  # answered when the last host registered, not at a poll
                assert counters.calls - counters.stream_in == 3  # three streams, still not one unary call
                # The sessions work as sessions: a barrier of all three on them.
                everyone = [*opened, *late]
                assert await asyncio.gather(*(s.barrier("after", timeout=5.0) for s in everyone)) == [1, 1, 1]
                # The credential the stream handed out is the task's: a unary call with it is accepted.
                assert await cluster.clients[0].heartbeat(opened[0].membership.task) > 0
            finally:
                await close(runs)

    run(body())


def test_a_shutdown_while_hosts_wait_for_registration_reaches_them_with_its_failure() -> None:
    """``tpuctl down --all`` while a generation forms: the waits refused carry the cluster's failure, so a host
    knows it was a shutdown without asking again (task 0 may have stopped the service by then: soak seed
    10020); so does a host that registers after it."""

    async def body() -> None:
        rejoin = RestartPolicy(rejoin=True, timeout=30.0, max_restarts=3)
        async with serving(make_config(3, restart=rejoin)) as cluster:
            opened, runs = await open_sessions(cluster, range(2))
            try:
                waiting = [asyncio.create_task(s.wait_for_all(timeout=10.0)) for s in opened]
                await asyncio.sleep(0.2)
                await cluster.clients[1].report_error(opened[1].membership.task, "tpuctl down --all", shutdown=True)
                for wait in waiting:
                    with pytest.raises(ClusterFailed, match="shut the cluster down") as refused:
                        await asyncio.wait_for(wait, 5.0)
                    assert refused.value.failure.shutdown and not refused.value.failure.rejoin
                    assert refused.value.failure.failures[0].task.task_id == 1
                with pytest.raises(ClusterFailed, match="cannot join") as late:
                    await cluster.client().open_session("test", 2, hostname="host-2")
                assert late.value.failure.shutdown
            finally:
                await close(runs)

    run(body())


def test_open_session_is_refused_as_register_is() -> None:
    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            client = cluster.client()
            with pytest.raises(ClusterError, match="cluster name mismatch") as wrong:
                await client.open_session("other", 0)
            assert wrong.value.hint is not None and "same cluster spec" in wrong.value.hint
            with pytest.raises(InputError, match=r"unknown task id 7: cluster .test. has tasks 0\.\.1"):
                await client.open_session("test", 7)
            # Nothing was registered by the refusals.
            assert all(t.state is TaskState.WAITING for t in (await client.status()).tasks)

    run(body())


def test_a_second_registration_on_one_stream_is_refused() -> None:
    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            session = await cluster.client().open_session("test", 0)
            call = session._adopted
            try:
                again = pb.HeartbeatRequest(
                    register=pb.RegisterTaskRequest(
                        protocol_version=PROTOCOL_VERSION, cluster_name="test", task_id=1, incarnation=5, retry_secret=b"s" * 16
                    )
                )
                await call.write(again)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    for _ in range(5):  # a heartbeat confirmation may come first
                        await call.read()
                assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
                assert "registers once" in (refused.value.details() or "")
                assert (await cluster.clients[0].status()).tasks[1].state is TaskState.WAITING
            finally:
                call.cancel()

    run(body())


def test_a_registration_timeout_on_the_session_is_the_unary_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calls, "PROGRESS_POLLS_PER_S", 1e9)  # progress every 0.2 s even at 10,000 hosts

    async def body() -> None:
        async with serving(make_config(10_000, register_timeout=1.0, heartbeat_timeout=60.0)) as cluster:
            opened, runs = await open_sessions(cluster, range(1))
            lines: list[str] = []
            try:
                assert opened[0].membership.tasks == ()  # no O(hosts) answer by default
                with pytest.raises(DeadlineError) as excinfo:
                    await opened[0].wait_for_all(
                        timeout=10.0, progress=lambda p: lines.append(p.describe()), progress_every=0.2
                    )
            finally:
                await close(runs)
            check_bounded_registration_timeout(excinfo.value, lines)

    run(body(), timeout=60.0)


# --- protocol v9: gathers on the session ----------------------------------------------------------------


def test_a_gather_on_sessions_returns_every_value_with_no_call_of_its_own() -> None:
    async def body() -> None:
        async with serving(make_config(4)) as cluster:
            opened, runs = await sessions(cluster)
            service = cluster.server.service
            counters = service.counters
            try:
                await asyncio.sleep(0.3)  # the streams are open
                before = counters.snapshot()
                waiting = [
                    asyncio.create_task(s.gather("cores", f"[{s.membership.task.task_id}]".encode(), timeout=5.0))
                    for s in opened[:3]
                ]
                await asyncio.sleep(0.2)
                assert not any(w.done() for w in waiting)
                assert not service._parking._slots  # nothing parked per host: the arrivals wait on their streams
                last = await opened[3].gather("cores", b"[3]", timeout=5.0)
                tables = [*(await asyncio.gather(*waiting)), last]
                assert tables == [[b"[0]", b"[1]", b"[2]", b"[3]"]] * 4
                after = counters.snapshot()
                assert after["calls"] - before["calls"] == after["stream_in"] - before["stream_in"]  # no Gather call
                assert after["encoded"] - before["encoded"] == 1  # the table encoded once, sent four times
                # The unary Gather and the session's count in the same series, and get the same table.
                client, member = cluster.clients[0], opened[0].membership
                unary = asyncio.create_task(client.gather(member.task, "cores", b"u", timeout=5.0))
                streamed = await asyncio.gather(*(s.gather("cores", b"s", timeout=5.0) for s in opened[1:]))
                assert streamed == [[b"u", b"s", b"s", b"s"]] * 3
                assert await unary == streamed[0]
                assert not service._streams._barriers
            finally:
                await close(runs)

    run(body())


def test_a_gather_answer_is_one_shared_table_joined_per_host_as_written() -> None:
    # The table is the same object for every waiting host; each host's copy (its request id + the table)
    # exists only while the serializer writes it, at most a fan-out budget's worth at once.
    async def body() -> None:
        async with serving(make_config(4)) as cluster:
            opened, runs = await sessions(cluster)
            queued: list[Any] = []
            send, write = fanout_module.SessionStream.send, fanout_module.SessionStream.write

            def spy_send(self: Any, data: Any) -> None:
                queued.append(data)
                send(self, data)

            async def spy_write(self: Any, data: Any) -> None:  # a fan-out's writers write to idle sessions
                queued.append(data)
                await write(self, data)

            try:
                await asyncio.sleep(0.3)
                with pytest.MonkeyPatch.context() as patch:
                    patch.setattr(fanout_module.SessionStream, "send", spy_send)
                    patch.setattr(fanout_module.SessionStream, "write", spy_write)
                    tables = await asyncio.gather(*(s.gather("big", bytes([i]) * 900, timeout=5.0) for i, s in enumerate(opened)))
                assert tables == [[bytes([i]) * 900 for i in range(4)]] * 4
                fanned = list({id(q): q for q in queued if isinstance(q, fanout_module.Fanned)}.values())
                assert len(fanned) == 4
                assert len({id(f.tail) for f in fanned}) == 1 and len({id(f.gate) for f in fanned}) == 1
                response = pb.HeartbeatResponse.FromString(fanned[0].join())
                assert response.request_id and response.gathered.table and response.gathered.instance == 1
            finally:
                await close(runs)

    run(body())


def test_a_gather_timeout_and_a_refused_value_on_a_session_say_what_the_unary_call_says() -> None:
    async def body() -> None:
        async with serving(make_config(4)) as cluster:
            opened, runs = await sessions(cluster)
            client, member = cluster.clients[0], opened[0].membership
            try:
                results = await asyncio.gather(
                    *(s.gather("g", b"v", timeout=0.5) for s in opened[:3]), return_exceptions=True
                )
                for result in results:
                    assert isinstance(result, DeadlineError)
                    assert result.message == (
                        "gather 'g' #1 timed out after 0.5 s: 3 of 4 hosts published; missing: task 3 (127.0.0.4)"
                    )
                limit = cluster.server.service.state.gather_value_limit
                with pytest.raises(InputError) as streamed:
                    await opened[0].gather("big", b"x" * (limit + 1), timeout=1.0)
                with pytest.raises(InputError) as unary:
                    await client.gather(member.task, "big2", b"x" * (limit + 1), timeout=1.0)
                assert streamed.value.message.replace("'big'", "'big2'") == unary.value.message
                # The stream goes on.
                assert await asyncio.gather(*(s.gather("after", b"a", timeout=5.0) for s in opened)) == [[b"a"] * 4] * 4
                assert not any(r.done() for r in runs)
            finally:
                await close(runs)

    run(body())


def count_writers(monkeypatch: pytest.MonkeyPatch, width: int) -> list[int]:
    """Fan-outs of at most ``width`` writers; each writer started adds how many answers it found left."""
    writers: list[int] = []
    write_answers = fanout_module.write_answers

    async def counted(fan: Any) -> None:
        writers.append(len(fan.answers))
        await write_answers(fan)

    monkeypatch.setattr(stream_answers_module, "RELEASE_WIDTH", width)
    monkeypatch.setattr(fanout_module, "write_answers", counted)
    return writers


def test_a_passed_barrier_is_written_by_a_few_writers_not_a_task_per_host(monkeypatch: pytest.MonkeyPatch) -> None:
    # A pod's release: at most RELEASE_WIDTH writer tasks take the answers in turn (a task per host was
    # about 1 kB each, 10 MB at 10,000 hosts for every barrier), and every host is still answered.
    writers = count_writers(monkeypatch, width=3)
    monkeypatch.setattr(fanout_module, "FANOUT_BYTES", 1)  # a gather's width: at least FANOUT_MIN (16)

    async def body() -> None:
        async with serving(make_config(20)) as cluster:
            opened, runs = await sessions(cluster, interval=5.0)
            try:
                await asyncio.sleep(0.3)
                assert await asyncio.gather(*(s.barrier("release", timeout=5.0) for s in opened)) == [1] * 20
                assert len(writers) == 3
                tables = await asyncio.gather(*(s.gather("g", b"v", timeout=5.0) for s in opened))
                assert tables == [[b"v"] * 20] * 20
                assert len(writers) == 3 + 16
            finally:
                await close(runs)

    run(body())


def test_completed_registration_is_written_by_a_few_writers_not_a_task_per_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The last host's registration answers every host's wait for all at once: the same fan-out as a
    # barrier's (a task per host was 10,000 tasks created at once at a pod's size); every wait is answered.
    writers = count_writers(monkeypatch, width=3)

    async def body() -> None:
        async with serving(make_config(12)) as cluster:
            opened, runs = await open_sessions(cluster, range(11), interval=5.0)
            try:
                waiting = [asyncio.create_task(s.wait_for_all(timeout=10.0)) for s in opened]
                await asyncio.sleep(0.3)
                assert not any(w.done() for w in waiting) and writers == []
                late, late_runs = await open_sessions(cluster, range(11, 12), interval=5.0)
                runs += late_runs
                await asyncio.wait_for(asyncio.gather(*waiting), 5.0)
                assert len(writers) == 3 and writers[0] == 11  # three writers took the eleven answers
                await late[0].wait_for_all(timeout=5.0)  # complete already: answered at once, no fan-out
                assert len(writers) == 3
            finally:
                await close(runs)

    run(body())


def test_the_clusters_error_is_pushed_by_a_few_writers_not_a_task_per_host(monkeypatch: pytest.MonkeyPatch) -> None:
    # A host's failure is pushed to every watching host at once: the same fan-out as a barrier's release.
    writers = count_writers(monkeypatch, width=3)

    async def body() -> None:
        async with serving(make_config(12)) as cluster:
            opened, runs = await sessions(cluster, interval=5.0)
            try:
                watches = [asyncio.create_task(s.watch_errors()) for s in opened[:11]]
                await asyncio.sleep(0.3)
                await cluster.clients[11].report_error(opened[11].membership.task, "boom")
                failures = await asyncio.wait_for(asyncio.gather(*watches), 5.0)
                assert {f.failures[0].task.task_id for f in failures} == {11}
                assert len(writers) == 3 and writers[0] == 11  # three writers took the eleven pushes
            finally:
                await close(runs)

    run(body())


def test_stopping_the_service_right_after_an_error_still_tells_every_watching_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Task 0's agent stops its service as soon as it has heard the cluster's error itself; the pushes
    # the fan-out's writers have not reached yet go to the sessions' own outboxes, flushed in the grace.
    monkeypatch.setattr(stream_answers_module, "RELEASE_WIDTH", 2)
    hosts = 60

    async def body() -> None:
        async with serving(make_config(hosts)) as cluster:
            opened, runs = await sessions(cluster, interval=5.0)
            watches = [asyncio.create_task(s.watch_errors()) for s in opened[:-1]]
            try:
                await asyncio.sleep(0.3)
                await cluster.clients[-1].report_error(opened[-1].membership.task, "boom")
                await asyncio.wait(watches, return_when=asyncio.FIRST_COMPLETED)
                await cluster.server.stop(grace=0.25)
                done, _ = await asyncio.wait(watches, timeout=5.0)
                told = [w for w in done if not w.cancelled() and w.exception() is None]
                assert len(told) == hosts - 1, [w.exception() for w in done if not w.cancelled() and w.exception()][:3]
                assert {w.result().failures[0].task.task_id for w in told} == {hosts - 1}
            finally:
                await close(runs + watches)

    run(body())


class _EndedStream:
    """A session stream that ended under a write: gRPC raises a bare INTERNAL for such a write."""

    def __init__(self, before: Any = None) -> None:
        self.before = before

    async def write(self, request: Any) -> None:
        if self.before is not None:
            self.before()
        raise grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), "Internal error from Core")


def _session_on(stream: _EndedStream) -> Session:
    client = CoordinationClient("127.0.0.1:9", rpc_timeout=2.0)
    member = Membership(
        task=TaskRef(1, 7, b"c" * 32, 1), service_incarnation=5, tasks=(), heartbeat_timeout=3.0, barrier_timeout=30.0,
        num_tasks=4,
    )  # fmt: skip
    session = Session(client, member)
    session._call = stream
    session._opened.set()
    return session


def test_an_arrival_whose_write_finds_the_stream_ended_gets_the_sessions_verdict() -> None:
    # The coordinator killed while a host sends its gather: the write fails with gRPC's bare INTERNAL,
    # but the host must name what the session learns (unreachable, frozen), as for an arrival already sent.
    async def body() -> None:
        session = _session_on(_EndedStream())
        waiting = asyncio.create_task(session.gather("cores", b"[1]", timeout=30.0))
        await asyncio.sleep(0.1)
        assert not waiting.done()  # waits for the session's verdict, not the write's INTERNAL
        verdict = client_module.CoordinatorUnreachable("coordinator at 127.0.0.1:9 unreachable/frozen: no heartbeat confirmed for 3.2 s")
        session._end(verdict)
        with pytest.raises(client_module.CoordinatorUnreachable) as raised:
            await waiting
        assert raised.value is verdict

    run(body())


def test_an_arrival_whose_stream_was_already_replaced_fails_at_once() -> None:
    async def body() -> None:
        holder: list[Session] = []

        def reopened() -> None:  # a new stream came up (and failed the broken one's calls) before the write failed
            session = holder[0]
            session._broke = client_module.CoordinatorUnreachable("the stream broke")
            session._broken()

        session = _session_on(_EndedStream(before=reopened))
        holder.append(session)
        with pytest.raises(client_module.CoordinatorUnreachable, match=r"broke while sending barrier 'step'"):
            await asyncio.wait_for(session.barrier("step", timeout=30.0), 5.0)

    run(body())


def test_stopping_the_service_with_open_sessions_prints_no_traceback_when_the_loop_ends_right_after(capfd) -> None:
    """Task 0's agent stops its service (`tpuctl down`) and exits at once: every host's session stream is
    still open. grpc.aio's task for each call outlived the server's stop by a loop turn, and ``asyncio.run``
    cancelling it made grpc print ``Traceback ... _schedule_rpc_coro ... CancelledError`` to stderr (the
    agent log; soak seeds 30000, 30028, 30049)."""

    async def body() -> None:
        async with serving(make_config(4)) as cluster:
            opened, _runs = await sessions(cluster)
            await asyncio.sleep(0.3)  # the streams are open
            assert all(s._opened.is_set() for s in opened)
            await cluster.server.stop(grace=1.0)  # the agent's (``Agent._tear_down``)
            # the loop ends right here (asyncio.run cancels what is left), as when an agent exits

    asyncio.run(body())
    err = capfd.readouterr().err
    assert "Traceback" not in err and "CancelledError" not in err, err
