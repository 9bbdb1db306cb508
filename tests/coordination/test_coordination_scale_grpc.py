"""Gather, streamed heartbeats, progress and message bounds over real gRPC (in process, 127.0.0.1 port 0)."""

from __future__ import annotations

import asyncio
import time

import pytest
from coordination_harness import MESSAGE_BOUND, check_bounded_registration_timeout, make_config, run, serving

from tpuctl.coordination import CoordinationClient, RendezvousProgress, calls
from tpuctl.coordination.server import start_server
from tpuctl.errors import ClusterError, CoordinatorUnreachable, DeadlineError, InputError

pytestmark = pytest.mark.timeout(120)


def test_gather_returns_every_value_by_task_and_encodes_the_table_once() -> None:
    async def body() -> None:
        async with serving(make_config(4)) as cluster:
            members = await cluster.join_all(heartbeat_interval=None)
            counters = cluster.server.service.counters
            before = counters.encoded
            tables = await asyncio.gather(
                *(c.gather(m.task, "cores", f"[{m.task.task_id}]".encode(), timeout=5.0) for c, m in members)
            )
            assert tables == [[b"[0]", b"[1]", b"[2]", b"[3]"]] * 4
            assert counters.encoded - before == 1  # one encoding, sent four times
            again = await asyncio.gather(*(c.gather(m.task, "cores", b"2", timeout=5.0) for c, m in members))
            assert again == [[b"2"] * 4] * 4

    run(body())


def test_barrier_and_gather_progress_name_the_missing_hosts() -> None:
    async def body() -> None:
        async with serving(make_config(3, heartbeat_timeout=30.0)) as cluster:
            members = await cluster.join_all(heartbeat_interval=None)
            seen: list[RendezvousProgress] = []
            (c0, m0), (c1, m1), (c2, m2) = members
            waiting = asyncio.create_task(
                c0.barrier(m0.task, "step", timeout=10.0, progress=seen.append, progress_every=0.1)
            )
            await asyncio.sleep(0.5)
            assert seen and seen[-1].describe().startswith(
                "1 of 3 hosts arrived; missing: task 1 (127.0.0.2), task 2 (127.0.0.3) (times out in "
            )
            await asyncio.gather(c1.barrier(m1.task, "step", timeout=10.0), c2.barrier(m2.task, "step", timeout=10.0))
            assert await waiting == 1
            gathered: list[RendezvousProgress] = []

            async def report(found: RendezvousProgress) -> None:  # a coroutine function is awaited
                await asyncio.sleep(0)
                gathered.append(found)

            publishing = asyncio.create_task(
                c0.gather(m0.task, "g", b"a", timeout=10.0, progress=report, progress_every=0.1)
            )
            await asyncio.sleep(0.5)
            assert gathered and gathered[-1].kind == "gather" and gathered[-1].arrived == 1
            await asyncio.gather(c1.gather(m1.task, "g", b"b", timeout=10.0), c2.gather(m2.task, "g", b"c", timeout=10.0))
            assert await publishing == [b"a", b"b", b"c"]

    run(body())


def test_registration_progress_polls_are_paced_by_the_cluster_size() -> None:
    # A whole pod polls at most PROGRESS_POLLS_PER_S times a second in all, from the first poll on.
    assert calls.progress_interval(2.0, 4) == 2.0
    assert calls.progress_interval(2.0, 2_304) == pytest.approx(2_304 / calls.PROGRESS_POLLS_PER_S)
    assert calls.progress_interval(2.0, 10_000) == 100.0


@pytest.mark.parametrize(("hosts", "polls"), [(4, "many"), (1_000, "none")])
def test_barrier_progress_polls_are_paced_by_the_cluster_size_from_the_first(hosts: int, polls: str) -> None:
    # The first poll too: a pod's hosts start their waits together, and one poll each at 2 s was 2,304
    # calls in the service's busiest second. At 1,000 hosts a poll is due every 10 s (the first at 5-10 s).
    async def body() -> None:
        async with serving(make_config(hosts, heartbeat_timeout=30.0)) as cluster:
            client, member = await cluster.join(0, heartbeat_interval=None)
            asked: list[str] = []
            real = client.rendezvous_progress

            async def counted(*args: object, **kwargs: object) -> RendezvousProgress | None:
                asked.append("poll")
                return await real(*args, **kwargs)  # type: ignore[arg-type]

            client.rendezvous_progress = counted  # type: ignore[method-assign]
            seen: list[RendezvousProgress] = []
            with pytest.raises(DeadlineError):
                await client.barrier(member.task, "step", timeout=1.5, progress=seen.append, progress_every=0.1)
            if polls == "many":
                assert len(asked) >= 5 and seen
            else:
                assert asked == [] and seen == []

    run(body(), timeout=30.0)


def test_registration_timeout_with_9999_of_10000_missing_is_a_clean_bounded_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Progress lines every 0.2 s even at 10,000 hosts (paced, the first would come after 100 s): their bound is
    # what is tested here.
    monkeypatch.setattr(calls, "PROGRESS_POLLS_PER_S", 1e9)

    async def body() -> None:
        async with serving(make_config(10_000, register_timeout=1.0, heartbeat_timeout=60.0)) as cluster:
            client, member = await cluster.join(0, heartbeat_interval=None)
            assert member.num_tasks == 10_000 and member.tasks == ()  # no O(hosts) answer by default
            lines: list[str] = []
            with pytest.raises(DeadlineError) as excinfo:
                await client.wait_for_all(
                    member.task, timeout=10.0, progress=lambda p: lines.append(p.describe()), progress_every=0.2
                )
            check_bounded_registration_timeout(excinfo.value, lines)
            status = await client.status()  # the one answer listing every host
            assert len(status.tasks) == 10_000

    run(body(), timeout=60.0)


def test_barrier_timeout_with_9999_of_10000_missing_is_a_clean_bounded_deadline() -> None:
    async def body() -> None:
        async with serving(make_config(10_000, heartbeat_timeout=60.0)) as cluster:
            client, member = await cluster.join(0, heartbeat_interval=None)
            started = time.monotonic()
            with pytest.raises(DeadlineError) as excinfo:
                await client.barrier(member.task, "step", timeout=0.5)
            assert time.monotonic() - started < 3.0
            message = excinfo.value.message
            assert message.startswith("barrier 'step' #1 timed out after 0.5 s: 1 of 10,000 hosts arrived; missing: ")
            assert message.endswith(", ... and 9,989 more; `tpuctl status --json` lists all")
            assert len(message) < MESSAGE_BOUND
            with pytest.raises(DeadlineError, match="1 of 10,000 hosts published"):
                await client.gather(member.task, "cores", b"[0]", timeout=0.5)

    run(body(), timeout=60.0)


def test_a_60000_character_name_is_refused_as_bad_input_not_resource_exhausted() -> None:
    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            client, member = await cluster.join(0, heartbeat_interval=None)
            for call in (
                client.barrier(member.task, "b" * 60_000, timeout=1.0),
                client.gather(member.task, "g" * 60_000, b"", timeout=1.0),
                client.kv_set("k" * 60_000, b""),
            ):
                with pytest.raises(InputError) as excinfo:
                    await call
                assert "is 60,000 characters long" in excinfo.value.message
                assert "at most 1,024 characters are allowed" in excinfo.value.message
                assert len(str(excinfo.value)) < 400
            with pytest.raises(ClusterError) as wrong:
                await cluster.client().register("c" * 60_000, 1)
            assert "(60,000 characters)" in wrong.value.message and len(wrong.value.message) < 400

    run(body())


def test_a_huge_reported_cause_reaches_every_host_bounded() -> None:
    async def body() -> None:
        async with serving(make_config(3)) as cluster:
            members = await cluster.join_all(heartbeat_interval=None)
            watches = [asyncio.create_task(c.watch_errors(m.task, timeout=10.0)) for c, m in members[1:]]
            waiting = asyncio.create_task(members[1][0].barrier(members[1][1].task, "b", timeout=10.0))
            await asyncio.sleep(0.2)
            await members[0][0].report_error(members[0][1].task, "\N{SNOWMAN}" * 60_000)
            for failure in await asyncio.gather(*watches):
                assert failure is not None and str(failure).startswith("task 0 (127.0.0.1) failed: reported an error: ")
                assert len(str(failure)) < 1_200
            with pytest.raises(ClusterError, match=r"barrier 'b' #1 failed: task 0 \(127.0.0.1\) failed"):
                await waiting

    run(body())


def test_streamed_heartbeats_keep_a_host_alive_and_a_refusal_ends_the_loop() -> None:
    async def body() -> None:
        async with serving(make_config(2, heartbeat_timeout=0.6)) as cluster:
            (c0, _), (c1, m1) = await cluster.join_all(heartbeat_interval=0.1)
            await asyncio.sleep(1.5)  # well past the timeout: the streams kept both alive
            assert (await c0.status()).failure is None
            calls = cluster.server.service.counters.calls
            await asyncio.sleep(0.5)
            assert cluster.server.service.counters.calls - calls >= 6  # heartbeats are arriving on the streams
            await cluster.stop_heartbeats(1)
            await asyncio.sleep(1.0)  # task 1 is declared failed
            with pytest.raises(ClusterError, match=r"task 1 \(127.0.0.2\) was declared failed: no heartbeat for "):
                await asyncio.wait_for(c1.heartbeat_loop(m1, interval=0.1), 5.0)

    run(body())


def test_a_restarted_coordinator_is_noticed_by_the_heartbeat_stream() -> None:
    async def body() -> None:
        config = make_config(1, heartbeat_timeout=2.0)
        first = await start_server(config, host="127.0.0.1", port=0)
        port = first.port
        client = CoordinationClient(first.target)
        try:
            member = await client.register("test", 0)
            beating = asyncio.create_task(client.heartbeat_loop(member, interval=0.1))
            await asyncio.sleep(0.3)
            await first.stop(grace=None)
            second = await start_server(config, host="127.0.0.1", port=port)
            try:
                with pytest.raises(ClusterError) as excinfo:
                    await asyncio.wait_for(beating, 5.0)
                assert excinfo.value.message.startswith(f"the coordinator at {first.target} restarted (service incarnation ")
                assert excinfo.value.hint == "restart `tpuctl init` on every host"
            finally:
                await second.stop(grace=None)
        finally:
            await client.close()

    run(body())


def test_a_restarted_coordinator_is_named_by_the_error_watch_not_as_an_unregistered_task() -> None:
    """The new coordinator never saw this host: its refusal says "task 0 has not registered". With the
    registration's service incarnation the watch asks the status and names the restart instead."""

    async def body() -> None:
        config = make_config(1, heartbeat_timeout=2.0)
        first = await start_server(config, host="127.0.0.1", port=0)
        port = first.port
        client = CoordinationClient(first.target)
        try:
            member = await client.register("test", 0)
            await first.stop(grace=None)
            second = await start_server(config, host="127.0.0.1", port=port)
            try:
                with pytest.raises(ClusterError, match=r"task 0 \(127.0.0.1\) has not registered"):
                    await client.watch_errors(member.task, timeout=5.0)  # without: the refusal as it is
                with pytest.raises(ClusterError) as excinfo:
                    await client.watch_errors(
                        member.task, timeout=5.0, service_incarnation=member.service_incarnation
                    )
                assert excinfo.value.message.startswith(
                    f"the coordinator at {first.target} restarted (service incarnation "
                    f"{second.service.state.service_incarnation}, was {member.service_incarnation})"
                )
                assert excinfo.value.hint == "restart `tpuctl init` on every host"
            finally:
                await second.stop(grace=None)
        finally:
            await client.close()

    run(body())


def test_the_error_watch_hears_a_coordinator_that_restarted_after_a_gap_as_soon_as_it_listens() -> None:
    """After a dropped poll the next one waits for the channel to reconnect (wait_for_ready, bounded by the
    give-up time) instead of failing fast and sleeping: the new coordinator is heard within the channel's
    reconnect backoff (at most 250 ms, jittered), not that plus a retry delay of the watch's own."""

    async def body() -> None:
        config = make_config(1, heartbeat_timeout=2.0)
        first = await start_server(config, host="127.0.0.1", port=0)
        port = first.port
        client = CoordinationClient(first.target)
        try:
            member = await client.register("test", 0)
            watching = asyncio.create_task(
                client.watch_errors(member.task, give_up_after=10.0, service_incarnation=member.service_incarnation)
            )
            await asyncio.sleep(0.2)
            await first.stop(grace=None)
            await asyncio.sleep(1.0)  # dropped, retried against nobody: the channel is backing off
            assert not watching.done()
            second = await start_server(config, host="127.0.0.1", port=port)
            back = time.monotonic()
            try:
                with pytest.raises(ClusterError) as excinfo:
                    await asyncio.wait_for(watching, 5.0)
                heard = time.monotonic() - back
                assert excinfo.value.message.startswith(f"the coordinator at {first.target} restarted")
                assert heard < 1.5, f"{heard:.2f} s"  # a loose bound for a loaded machine; typically ~0.2 s
            finally:
                await second.stop(grace=None)
        finally:
            await client.close()

    run(body())


def test_the_error_watch_still_gives_up_on_an_unreachable_coordinator_and_keeps_the_callers_timeout() -> None:
    async def body() -> None:
        config = make_config(1, heartbeat_timeout=2.0)
        server = await start_server(config, host="127.0.0.1", port=0)
        client = CoordinationClient(server.target)
        try:
            member = await client.register("test", 0)
            await server.stop(grace=None)
            started = time.monotonic()
            with pytest.raises(CoordinatorUnreachable):
                await client.watch_errors(member.task, give_up_after=0.8)
            assert 0.8 <= time.monotonic() - started < 2.5
            started = time.monotonic()
            assert await client.watch_errors(member.task, timeout=0.6, give_up_after=30.0) is None
            assert 0.5 <= time.monotonic() - started < 2.0
        finally:
            await client.close()

    run(body())


def test_a_heartbeat_stream_with_a_wrong_token_is_refused() -> None:
    async def body() -> None:
        async with serving(make_config(1, token="right")) as cluster:
            _, member = await cluster.join(0, heartbeat_interval=None)
            intruder = cluster.client(token="wrong")
            with pytest.raises(ClusterError, match="does not match"):
                await asyncio.wait_for(intruder.heartbeat_loop(member, interval=0.1), 5.0)

    run(body())


def test_an_unreachable_coordinator_ends_the_heartbeat_loop_after_give_up_after() -> None:
    async def body() -> None:
        async with serving(make_config(1, heartbeat_timeout=5.0)) as cluster:
            client, member = await cluster.join(0, heartbeat_interval=None)
            beating = asyncio.create_task(client.heartbeat_loop(member, interval=0.1, give_up_after=0.6))
            await asyncio.sleep(0.3)
            stopped = time.monotonic()
            await cluster.server.stop(grace=None)
            with pytest.raises(ClusterError, match="unreachable/frozen: no heartbeat confirmed for"):
                await asyncio.wait_for(beating, 5.0)
            assert time.monotonic() - stopped < 3.0

    run(body())


def test_a_call_the_coordinator_dropped_is_retried_like_an_unreachable_one() -> None:
    import grpc

    from tpuctl.coordination.convert import error_from_status
    from tpuctl.errors import CoordinatorUnreachable

    error = error_from_status(grpc.StatusCode.CANCELLED, "CANCELLED", None, target="h:1", call="PollForError", timeout=1)
    assert isinstance(error, CoordinatorUnreachable)  # watch_errors and heartbeat_loop ride it out
    assert error.message == "the coordinator at h:1 dropped PollForError (CANCELLED: CANCELLED)"


def test_a_stream_broken_by_grpc_core_is_retried_and_any_other_internal_error_is_not() -> None:
    import grpc

    from tpuctl.coordination.convert import error_from_status
    from tpuctl.errors import CoordinatorUnreachable

    broken = error_from_status(
        grpc.StatusCode.INTERNAL, "Internal error from Core", None, target="h:1", call="HeartbeatStream", timeout=1
    )
    assert isinstance(broken, CoordinatorUnreachable)  # a coordinator stopped mid-stream, on a loaded machine
    assert broken.message == "the coordinator at h:1 broke off HeartbeatStream (INTERNAL: Internal error from Core)"
    other = error_from_status(grpc.StatusCode.INTERNAL, "a bug", None, target="h:1", call="Barrier", timeout=1)
    assert not isinstance(other, CoordinatorUnreachable)
