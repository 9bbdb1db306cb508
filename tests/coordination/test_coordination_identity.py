"""Identity that cannot be borrowed, bounded key-value writes, shutdown as a field, compressed gathers.

Over the wire (a real ``grpc.aio`` service on loopback) a stranger that knows a task's id and even its
incarnation, but not the credential its registration got, is refused on every task-scoped call and
changes nothing: a barrier does not pass without the real task, a reported error does not put the
cluster in error. Nothing a stranger can ask reveals a credential or an incarnation. Refusals are logged
rate-limited. The key-value store's quotas refuse with the limit and the use. A shutdown is a flag.
"""

from __future__ import annotations

import asyncio
import logging
import lzma

import pytest
from coordination_harness import make_config, run, serving

from tpuctl.coordination.convert import gather_response, gather_values
from tpuctl.coordination.kv import KeyValueStore
from tpuctl.coordination.logs import RateLimitedLog, peer_host
from tpuctl.coordination.state import CoordinationState
from tpuctl.coordination.values import (
    PROTOCOL_VERSION,
    Counters,
    KvLimits,
    Reason,
    Refused,
    Registration,
    TaskRef,
    fingerprint,
)
from tpuctl.errors import ClusterError, InputError
from tpuctl.proto import coordination_pb2 as pb


def borrowed(task: TaskRef) -> TaskRef:
    """What a stranger who learned a task's id and incarnation (but not its credential) can send."""
    return TaskRef(task.task_id, task.incarnation)


def test_every_task_scoped_call_without_the_credential_is_refused_and_changes_nothing() -> None:
    async def body() -> None:
        async with serving(make_config(3, heartbeat_timeout=5.0)) as cluster:
            members = await cluster.join_all()
            (c0, m0), (c1, m1), (c2, m2) = members
            waiting = [asyncio.create_task(c.barrier(m.task, "step", timeout=10.0)) for c, m in ((c0, m0), (c2, m2))]
            await asyncio.sleep(0.3)
            stranger = cluster.client()
            task1 = borrowed(m1.task)
            calls = {
                "Barrier": stranger.barrier(task1, "step", timeout=2.0),
                "Gather": stranger.gather(task1, "g", b"x", timeout=2.0),
                "ReportError": stranger.report_error(task1, "impersonated"),
                "shutdown": stranger.report_error(task1, "impersonated", shutdown=True),
                "Heartbeat": stranger.heartbeat(task1),
                "WaitForAllTasks": stranger.wait_for_all(task1, timeout=2.0),
                "PollForError": stranger.watch_errors(task1, timeout=1.0),
                "RendezvousProgress": stranger.rendezvous_progress(task1, "step"),
                "KeyValueSet": stranger.kv_set("k", b"v", task=task1),
                "Disconnect": stranger.disconnect(task1),
                "forged credential": stranger.heartbeat(TaskRef(1, m1.task.incarnation, b"\0" * 32)),
            }
            for name, call in calls.items():
                with pytest.raises(ClusterError) as excinfo:
                    await call
                message = excinfo.value.message
                assert "does not carry the credential" in message, (name, message)
                assert str(m1.task.incarnation) not in message and m1.task.credential.hex() not in message
            assert not any(w.done() for w in waiting)  # 'step' did not pass without the real task 1
            status = await stranger.status()
            assert status.failure is None and [t.state.name for t in status.tasks] == ["CONNECTED"] * 3
            assert await stranger.kv_dir("") == []
            # Nothing in status lets anyone borrow an identity: no incarnation, no credential.
            raw = (await stranger.stub.GetStatus(pb.GetStatusRequest())).SerializeToString()
            for _, member in members:
                assert member.task.credential not in raw
                assert member.task.incarnation.to_bytes(8, "little") not in raw
            assert all(t.incarnation == 0 and len(t.fingerprint) == 8 for t in status.tasks)
            # The real task 1 still arrives, and the barrier passes for everyone.
            assert await c1.barrier(m1.task, "step", timeout=10.0) == 1
            assert [await w for w in waiting] == [1, 1]

    run(body(), timeout=60.0)


def test_a_registration_retry_gets_the_same_credential_and_a_new_registration_another() -> None:
    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            client, member = await cluster.join(1, heartbeat_interval=None)
            again = await client.register("test", 1, incarnation=member.task.incarnation)
            assert again.task == member.task and again.task.credential == member.task.credential
            await client.disconnect(member.task)
            other = await client.register("test", 1)
            assert other.task.credential != member.task.credential
            with pytest.raises(ClusterError, match="is stale"):  # the old registration is no one's now
                await client.heartbeat(member.task)

    run(body())


def test_a_replayed_registration_with_the_real_incarnation_gets_no_credential() -> None:
    """Another process that learned a live task's incarnation cannot replay its registration: a retry must
    bring the retry secret the registering client chose (never answered), so the replay is refused."""

    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            _, member = await cluster.join(1, heartbeat_interval=None)
            with pytest.raises(ClusterError, match="already registered by another live process") as excinfo:
                await cluster.client().register("test", 1, incarnation=member.task.incarnation)
            assert str(member.task.incarnation) not in excinfo.value.message
            raw = pb.RegisterTaskRequest(protocol_version=PROTOCOL_VERSION, cluster_name="test", task_id=1,
                                         incarnation=member.task.incarnation, hostname="h")  # fmt: skip
            with pytest.raises(Exception, match="retry secret of 16 to 64 random bytes"):
                await cluster.client().stub.RegisterTask(raw)  # none at all: refused, not a free retry
            status = await cluster.client().status()
            assert [t.fingerprint for t in status.tasks][1] == fingerprint(member.task.credential)

    run(body())


def test_refusals_are_logged_with_the_peer_at_most_once_per_10_s(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            _, member = await cluster.join(1)
            stranger = cluster.client()
            for _ in range(50):
                with pytest.raises(ClusterError):
                    await stranger.heartbeat(borrowed(member.task))
            assert cluster.server.service.refusal_log.suppressed >= 49

    caplog.set_level(logging.INFO, logger="tpuctl.coordination")
    run(body())
    lines = [r.getMessage() for r in caplog.records if "does not carry the credential" in r.getMessage()]
    assert len(lines) == 1 and "from ipv4:127.0.0.1:" in lines[0]


def test_the_rate_limited_log_counts_what_it_left_out(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    limited = RateLimitedLog(logging.getLogger("tpuctl.test"), every=10.0, clock=lambda: now[0], max_peers=2)
    caplog.set_level(logging.INFO, logger="tpuctl.test")
    for step in range(30):  # one call a second from two ports of one peer
        now[0] = float(step)
        limited.log(logging.WARNING, f"ipv4:10.0.0.9:{4000 + step % 2}", "NOT_PERMITTED", "refused %s", "Barrier")
    assert [r.getMessage() for r in caplog.records] == [
        "refused Barrier",
        "refused Barrier (9 more like it from ipv4:10.0.0.9 in the last 10 s not logged)",
        "refused Barrier (9 more like it from ipv4:10.0.0.9 in the last 10 s not logged)",
    ]
    assert limited.suppressed == 27
    assert peer_host("ipv6:[::1]:5000") == "ipv6:[::1]" and peer_host("unix:/tmp/s") == "unix:/tmp/s"
    for i in range(5):  # more peers than it remembers: the oldest are forgotten, memory stays bounded
        limited.log(logging.WARNING, f"ipv4:10.0.1.{i}:1", "x", "m")
    assert len(limited._seen) == 2


# --- key-value quotas ------------------------------------------------------------------------------


def small_store() -> KeyValueStore:
    return KeyValueStore(Counters(), KvLimits(max_value=100, task_keys=3, task_bytes=200, total_keys=5, total_bytes=400))


def refused(excinfo: pytest.ExceptionInfo[Refused]) -> tuple[Reason, str]:
    return excinfo.value.reason, excinfo.value.message


def test_kv_quotas_refuse_with_the_limit_and_the_use_and_change_nothing() -> None:
    store = small_store()
    with pytest.raises(Refused) as excinfo:
        store.set("big", b"x" * 101, allow_overwrite=False, owner=0)
    assert refused(excinfo) == (
        Reason.QUOTA,
        "the value for key 'big' is 101 bytes; a value may be at most 100 bytes",
    )
    for i in range(3):
        store.set(f"a{i}", b"x" * 10, allow_overwrite=False, owner=0)
    version = store.version
    with pytest.raises(Refused) as excinfo:
        store.set("a3", b"x", allow_overwrite=False, owner=0)
    assert refused(excinfo) == (
        Reason.QUOTA,
        "key-value quota exceeded setting key 'a3': task 0 holds 3 keys; the limit is 3 keys per task",
    )
    store.set("a0", b"y" * 90, allow_overwrite=True, owner=0)  # an overwrite adds no key
    with pytest.raises(Refused) as excinfo:
        store.set("a1", b"y" * 100, allow_overwrite=True, owner=0)
    assert excinfo.value.message.endswith("task 0 holds 116 bytes; the limit is 200 bytes per task")
    store.set("b0", b"z" * 95, allow_overwrite=False, owner=1)
    store.set("b1", b"z" * 95, allow_overwrite=False, owner=1)
    with pytest.raises(Refused) as excinfo:
        store.set("c0", b"w", allow_overwrite=False, owner=2)
    assert excinfo.value.message.endswith("the store holds 5 keys; the limit is 5 keys in all")
    assert store.version == version + 3 and store.get("a3") is None
    assert store.usage(0) == (3, 116) and store.usage(1) == (2, 194)
    # Overwriting another task's key moves its charge to the writer.
    store.set("b0", b"v", allow_overwrite=True, owner=2)
    assert store.usage(1) == (1, 97) and store.usage(2) == (1, 3)
    assert (store.total_keys, store.total_bytes) == (5, 116 + 97 + 3)


def test_kv_total_bytes_bound_holds_across_tasks() -> None:
    store = small_store()
    store.set("a", b"x" * 99, allow_overwrite=False, owner=0)
    store.set("b", b"x" * 99, allow_overwrite=False, owner=1)
    store.set("c", b"x" * 99, allow_overwrite=False, owner=2)
    store.set("d", b"x" * 99, allow_overwrite=False, owner=3)
    with pytest.raises(Refused, match=r"the store holds 400 bytes; the limit is 400 bytes in all"):
        store.set("e", b"", allow_overwrite=False, owner=4)


def test_a_kv_flood_over_the_wire_is_refused_at_the_task_quota() -> None:
    limits = KvLimits(max_value=1 << 20, task_keys=1024, task_bytes=4 << 20, total_keys=65_536, total_bytes=64 << 20)

    async def body() -> None:
        async with serving(make_config(2, kv_limits=limits)) as cluster:
            client, _ = await cluster.join(0)
            with pytest.raises(InputError) as excinfo:
                for i in range(10):
                    await client.kv_set(f"flood/{i}", b"\0" * (1 << 20))
            assert i == 3  # 4 MiB per task: the 4th MiB (with its keys) does not fit
            assert "task 0 holds 3,145,749 bytes (3.0 MiB); the limit is 4,194,304 bytes (4.0 MiB) per task" in (
                excinfo.value.message
            )
            with pytest.raises(InputError, match=r"a value may be at most 1,048,576 bytes \(1.0 MiB\)"):
                await client.kv_set("big", b"\0" * ((1 << 20) + 1))
            with pytest.raises(InputError, match="this client has not registered"):
                await cluster.client().kv_set("stranger", b"v")  # a write is charged to a task
            assert len(await client.kv_dir("flood/")) == 3

    run(body())


def test_the_default_kv_limits() -> None:
    assert KvLimits() == KvLimits(1 << 20, 1024, 16 << 20, 65_536, 64 << 20)


# --- shutdown as a field -----------------------------------------------------------------------------


def test_a_shutdown_report_is_a_flag_of_the_clusters_error() -> None:
    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            (c0, m0), (c1, m1) = await cluster.join_all()
            watching = asyncio.create_task(c1.watch_errors(m1.task, timeout=10.0))
            await asyncio.sleep(0.1)
            await c0.report_error(m0.task, "tpuctl/shutdown is just text now", shutdown=True)
            failure = await watching
            assert failure is not None and failure.shutdown
            assert str(failure) == "task 0 (127.0.0.1) shut the cluster down: tpuctl/shutdown is just text now"
            assert (await c1.status()).failure == failure

    run(body())


def test_an_error_whose_cause_names_the_old_shutdown_key_is_not_a_shutdown() -> None:
    state = CoordinationState(make_config(2), service_incarnation=7)
    member = state.register(Registration(PROTOCOL_VERSION, "test", 1, 11, "h", "p", b"c" * 32, b"r" * 16), now=0.0)
    state.report_error(member.task, "tpuctl/shutdown: a lie", now=0.1)
    assert state.failure is not None and not state.failure.shutdown


# --- gather tables -----------------------------------------------------------------------------------


def test_a_gather_table_is_compressed_and_inflated_with_a_bound() -> None:
    values = [f"[{4 * i}, {4 * i + 1}, {4 * i + 2}, {4 * i + 3}]".encode() for i in range(1000)]
    response = gather_response(1, values)
    raw = len(pb.GatherTable(values=values).SerializeToString())
    assert len(response.SerializeToString()) * 2 < raw
    assert gather_values(pb.GatherResponse.FromString(response.SerializeToString())) == values

    bomb = pb.GatherResponse(instance=1, table=lzma.compress(b"\0" * (1 << 20)), table_bytes=100)
    with pytest.raises(ClusterError, match="inflates beyond 1,000 bytes"):
        gather_values(bomb, limit=1000)
    with pytest.raises(ClusterError, match="gather table of 2,000 bytes; at most 1,000"):
        gather_values(pb.GatherResponse(table=b"x", table_bytes=2000), limit=1000)
    with pytest.raises(ClusterError, match="does not inflate"):
        gather_values(pb.GatherResponse(table=b"not xz", table_bytes=10))
    lying = pb.GatherResponse(table=lzma.compress(pb.GatherTable(values=[b"a"]).SerializeToString()), table_bytes=9)
    with pytest.raises(ClusterError, match="not the 9 it announced"):
        gather_values(lying)
