"""The coordination service over real gRPC, in process, on 127.0.0.1 port 0.

Each test body runs under ``run`` (bounded in time); timings assert an upper bound with slack for a
loaded 2-core machine, and a lower bound where "too early" would be a bug too.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import pytest
from coordination_harness import make_config, run, serving

from tpuctl.coordination import client as client_module
from tpuctl.coordination.client import CoordinationClient
from tpuctl.coordination.server import start_server
from tpuctl.coordination.values import PROTOCOL_VERSION, TaskInfo, TaskState, fingerprint
from tpuctl.errors import ClusterError, CoordinatorUnreachable, DeadlineError, InputError, StateError

pytestmark = pytest.mark.timeout(60)


async def arrived(client: CoordinationClient, barrier: str, tasks: list[int], timeout: float = 5.0) -> None:
    """Wait (polling the service's status, with a deadline) until exactly ``tasks`` wait at ``barrier``."""
    deadline = time.monotonic() + timeout
    seen: list[tuple[int, ...]] = []
    while time.monotonic() < deadline:
        seen = [b.arrived for b in (await client.status()).barriers if b.name == barrier]
        if seen == [tuple(tasks)]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"barrier {barrier!r}: {seen} arrived, not {tasks}, within {timeout} s")


def test_four_hosts_register_and_pass_five_repeated_barriers() -> None:
    async def body() -> None:
        async with serving(make_config(4)) as cluster:
            members = await cluster.join_all()
            await asyncio.gather(*(c.wait_for_all(m.task, timeout=5.0) for c, m in members))
            for round_ in range(1, 6):
                instances = await asyncio.gather(*(c.barrier(m.task, "step", timeout=5.0) for c, m in members))
                assert instances == [round_] * 4
            status = await members[0][0].status()
            assert [t.state for t in status.tasks] == [TaskState.CONNECTED] * 4
            assert status.failure is None

    run(body())


def test_registration_progress_then_deadline_lists_every_missing_host() -> None:
    async def body() -> None:
        async with serving(make_config(4, register_timeout=1.0)) as cluster:
            (c0, m0), (c1, m1) = [await cluster.join(i) for i in (0, 1)]
            seen: list[str] = []
            started = time.monotonic()
            with pytest.raises(DeadlineError) as excinfo:
                await c0.wait_for_all(
                    m0.task, timeout=10.0, progress=lambda p: seen.append(p.describe()), progress_every=0.2
                )
            elapsed = time.monotonic() - started
            assert "waiting for 2 of 4 hosts: task 2 (127.0.0.3), task 3 (127.0.0.4)" in seen
            assert excinfo.value.message == (
                "registration timed out after 1.0 s: 2 of 4 hosts registered; "
                "missing: task 2 (127.0.0.3), task 3 (127.0.0.4)"
            )
            assert excinfo.value.hint is not None and "tpuctl init" in excinfo.value.hint
            assert elapsed < 2.5
            with pytest.raises(DeadlineError) as other:  # every waiting host hears the same
                await c1.wait_for_all(m1.task, timeout=1.0)
            assert other.value.message == excinfo.value.message

    run(body())


def test_barrier_timeout_names_the_missing_host_and_the_cluster_goes_on() -> None:
    async def body() -> None:
        async with serving(make_config(4)) as cluster:
            members = await cluster.join_all()
            started = time.monotonic()
            results = await asyncio.gather(
                *(c.barrier(m.task, "sync", timeout=0.5) for c, m in members[:3]), return_exceptions=True
            )
            elapsed = time.monotonic() - started
            assert 0.5 <= elapsed < 2.0
            for result in results:
                assert isinstance(result, DeadlineError)
                assert result.message == (
                    "barrier 'sync' #1 timed out after 0.5 s: 3 of 4 hosts arrived; missing: task 3 (127.0.0.4)"
                )
            assert (await members[0][0].status()).failure is None
            # The cluster carries on: a later barrier of another name passes.
            assert await asyncio.gather(*(c.barrier(m.task, "after", timeout=5.0) for c, m in members)) == [1] * 4

    run(body())


def test_silent_host_is_detected_and_everyone_hears_within_the_heartbeat_timeout() -> None:
    heartbeat_timeout, interval = 1.0, 0.2

    async def body() -> None:
        async with serving(make_config(4, heartbeat_timeout=heartbeat_timeout)) as cluster:
            members = await cluster.join_all(heartbeat_interval=interval)
            watches = [asyncio.create_task(c.watch_errors(m.task, timeout=10.0)) for c, m in members[:3]]
            barriers = [asyncio.create_task(c.barrier(m.task, "sync", timeout=30.0)) for c, m in members[:3]]
            await arrived(members[3][0], "sync", [0, 1, 2])
            await cluster.stop_heartbeats(3)  # task 3's session ends (its process went away)
            silent_since = time.monotonic()

            failures = await asyncio.gather(*watches)
            heard_after = time.monotonic() - silent_since
            # Protocol v8: its silence counts from the keepalive window before its session ended (the last
            # moment the pings vouched for it at the latest), so it is named within the timeout of that.
            window = cluster.server.service.state.keepalive_window
            assert heartbeat_timeout - window - 0.05 <= heard_after < heartbeat_timeout + 1.0
            for failure in failures:
                assert failure is not None
                (only,) = failure.failures
                assert only.task == TaskInfo(3, "127.0.0.4")
                assert only.cause.startswith("no heartbeat for ") and ": its session ended " in only.cause
                assert only.cause.endswith(" and it did not reconnect (timeout 1 s)")

            # The pending barrier failed at once (it was already done when the watches returned, give or
            # take a scheduling round), naming the failed host.
            done, _ = await asyncio.wait(barriers, timeout=0.5)
            assert len(done) == 3
            for barrier in barriers:
                error = barrier.exception()
                assert isinstance(error, ClusterError)
                assert error.message.startswith("barrier 'sync' #1 failed: task 3 (127.0.0.4) failed: no heartbeat for ")

            # So does any later barrier.
            started = time.monotonic()
            with pytest.raises(ClusterError, match=r"the cluster is in error: task 3 \(127.0.0.4\) failed"):
                await members[0][0].barrier(members[0][1].task, "later", timeout=30.0)
            assert time.monotonic() - started < 0.5
            status = await members[0][0].status()
            assert status.tasks[3].state is TaskState.FAILED
            assert status.failure is not None

    run(body())


def test_token_is_required_and_checked(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tpuctl.coordination")

    async def body() -> None:
        async with serving(make_config(2, token="right-token")) as cluster:
            (good, _) = await cluster.join(0)
            for token, problem in ((None, "carries no auth token"), ("wrong-token", "does not match")):
                intruder = cluster.client(token=token)
                with pytest.raises(ClusterError, match=problem) as excinfo:
                    await intruder.register("test", 1)
                assert excinfo.value.hint == "give every host the same token file as the coordinator"
            status = await good.status()
            assert status.tasks[1].state is TaskState.WAITING  # the refused calls changed nothing

    run(body())
    refusals = [
        r.getMessage()
        for r in caplog.records
        if r.name == "tpuctl.coordination" and r.levelno == logging.WARNING and "auth token" in r.getMessage()
    ]
    assert len(refusals) == 2
    assert all("/RegisterTask from ipv4:127.0.0.1:" in message for message in refusals)


def test_wrong_cluster_and_unknown_task_are_refused() -> None:
    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            client = cluster.client()
            with pytest.raises(ClusterError) as wrong:
                await client.register("prod", 0)
            assert wrong.value.message == (
                "cluster name mismatch: the registering host is in cluster 'prod', "
                "this coordinator serves cluster 'test'"
            )
            with pytest.raises(InputError, match=r"unknown task id 5: cluster 'test' has tasks 0\.\.1"):
                await client.register("test", 5)

    run(body())


def test_a_second_live_process_for_a_task_is_refused() -> None:
    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            first = cluster.client()
            member = await first.register("test", 1, hostname="host-a")
            again = await first.register("test", 1, incarnation=member.task.incarnation, hostname="host-a")
            assert again == member  # the same process registering again is fine
            with pytest.raises(ClusterError) as excinfo:
                await cluster.client().register("test", 1, hostname="host-b")
            assert excinfo.value.message.startswith(
                "task 1 is already registered by another live process, connected from 127.0.0.1:"
            )
            assert "calling itself 'host-a' (unchecked)" in excinfo.value.message
            assert str(member.task.incarnation) not in excinfo.value.message  # never echoed

    run(body())


def test_protocol_version_mismatch_is_refused_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "PROTOCOL_VERSION", PROTOCOL_VERSION + 1)

    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            with pytest.raises(ClusterError) as excinfo:
                await cluster.client().register("test", 0)
            assert (
                f"the client speaks tpuctl coordination protocol v{PROTOCOL_VERSION + 1}, "
                f"this coordinator speaks v{PROTOCOL_VERSION}"
            ) in str(excinfo.value)
            assert excinfo.value.hint == "run the same tpuctl version on every host"

    run(body())


def test_stale_incarnation_heartbeat_is_aborted() -> None:
    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            client = cluster.client()
            old = await client.register("test", 1, incarnation=5)
            await client.disconnect(old.task)
            await client.register("test", 1, incarnation=6)
            with pytest.raises(ClusterError, match=r"task 1 \(127.0.0.2\): incarnation 5 is stale"):
                await client.heartbeat(old.task)

    run(body())


def test_disconnect_fails_the_barriers_waiting_for_that_host_but_not_the_cluster() -> None:
    async def body() -> None:
        async with serving(make_config(3)) as cluster:
            members = await cluster.join_all(heartbeat_interval=None)
            waiting = asyncio.create_task(members[0][0].barrier(members[0][1].task, "end", timeout=30.0))
            await arrived(members[1][0], "end", [0])
            await members[2][0].disconnect(members[2][1].task)
            with pytest.raises(
                ClusterError, match=r"barrier 'end' #1 cannot pass: task 2 \(127.0.0.3\) left the cluster: it disconnected \(tpuctl down, or its agent stopped\)"
            ):
                await asyncio.wait_for(waiting, 1.0)
            status = await members[0][0].status()
            assert status.tasks[2].state is TaskState.DISCONNECTED and status.failure is None

    run(body())


def test_port_in_use_by_a_plain_socket_is_refused() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(StateError) as excinfo:
            run(start_server(make_config(2), host="127.0.0.1", port=port))
    assert excinfo.value.message == f"cannot start the coordination service: 127.0.0.1:{port} is already in use"
    assert excinfo.value.hint is not None and f"sport = :{port}" in excinfo.value.hint


def test_second_server_on_the_same_port_is_refused_and_the_first_keeps_serving() -> None:
    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            port = cluster.server.port
            with pytest.raises(StateError, match=f"127.0.0.1:{port} is already in use"):
                await start_server(make_config(2, cluster="other"), host="127.0.0.1", port=port)
            status = await cluster.client().status()  # every client still reaches the first one
            assert status.cluster == "test"

    run(body())


def test_unreachable_coordinator_fails_fast() -> None:
    with socket.socket() as probe:  # a port nobody listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def body() -> None:
        client = CoordinationClient(f"127.0.0.1:{port}")
        try:
            started = time.monotonic()
            with pytest.raises(CoordinatorUnreachable) as excinfo:
                await client.status()
            assert time.monotonic() - started < 2.0
            assert excinfo.value.message.startswith(f"coordinator unreachable at 127.0.0.1:{port}: ")
            assert excinfo.value.hint is not None and "tpuctl init" in excinfo.value.hint
            started = time.monotonic()
            with pytest.raises(CoordinatorUnreachable, match=r"kept trying for 0\.5 s"):
                await client.register("test", 0, connect_timeout=0.5)
            assert 0.5 <= time.monotonic() - started < 2.5
        finally:
            await client.close()

    run(body())


def test_register_waits_for_a_coordinator_that_starts_later() -> None:
    async def body() -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        client = CoordinationClient(f"127.0.0.1:{port}")
        registering = asyncio.create_task(client.register("test", 0, connect_timeout=10.0))
        await asyncio.sleep(0.5)
        server = await start_server(make_config(1), host="127.0.0.1", port=port)
        try:
            started = time.monotonic()
            member = await registering
            assert member.task.task_id == 0
            assert time.monotonic() - started < 2.0  # reconnect backoff is capped at 1 s
        finally:
            await client.close()
            await server.stop(grace=None)

    run(body())


def test_kv_blocking_get_is_released_by_a_later_set_and_has_a_deadline() -> None:
    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            reader, (writer, _) = cluster.client(), await cluster.join(1)
            started = time.monotonic()
            getting = asyncio.create_task(reader.kv_get("cores/1", timeout=5.0))
            await asyncio.sleep(0.2)
            assert not getting.done()
            await writer.kv_set("cores/1", b"[0, 1]")
            assert await getting == b"[0, 1]"
            assert time.monotonic() - started < 1.0

            started = time.monotonic()
            with pytest.raises(DeadlineError) as excinfo:
                await reader.kv_get("never", timeout=0.3)
            assert 0.3 <= time.monotonic() - started < 1.5
            assert excinfo.value.message == "key 'never' was not set within 0.3 s"

            with pytest.raises(ClusterError, match="key 'cores/1' already exists"):
                await writer.kv_set("cores/1", b"again")
            await writer.kv_set("cores/1", b"again", allow_overwrite=True)
            await writer.kv_set("cores/0", b"first")
            assert await reader.kv_dir("cores/") == [("cores/0", b"first"), ("cores/1", b"again")]

    run(body())


def test_status_over_the_wire() -> None:
    async def body() -> None:
        async with serving(make_config(3)) as cluster:
            (client, member) = await cluster.join(1)
            status = await client.status()
            assert (status.cluster, status.service_incarnation) == ("test", member.service_incarnation)
            assert [(t.task, t.state) for t in status.tasks] == [
                (TaskInfo(0, "127.0.0.1"), TaskState.WAITING),
                (TaskInfo(1, "127.0.0.2"), TaskState.CONNECTED),
                (TaskInfo(2, "127.0.0.3"), TaskState.WAITING),
            ]
            connected = status.tasks[1]
            assert connected.hostname == "host-1"
            # Nobody learns a task's incarnation or credential from status: a fingerprint tells them apart.
            assert connected.incarnation == 0 and connected.fingerprint == fingerprint(member.task.credential)
            assert len(member.task.credential) == 32
            assert connected.seconds_since_heartbeat is not None and 0 <= connected.seconds_since_heartbeat < 1.0
            assert status.tasks[0].seconds_since_heartbeat is None

    run(body())


def test_error_watch_gives_up_once_the_coordinator_is_gone() -> None:
    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            client, member = await cluster.join(0, heartbeat_interval=None)
            watching = asyncio.create_task(client.watch_errors(member.task, timeout=20.0, give_up_after=0.5))
            await asyncio.sleep(0.2)
            assert not watching.done()
            stopped = time.monotonic()
            await cluster.server.stop(grace=None)
            with pytest.raises(CoordinatorUnreachable, match=r"coordinator unreachable at 127\.0\.0\.1:"):
                await asyncio.wait_for(watching, 5.0)
            assert 0.5 <= time.monotonic() - stopped < 3.0  # rode out the drop for give_up_after, no longer

    run(body())
