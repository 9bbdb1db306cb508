"""A coordinator that steps down for a successor's service, over real gRPC on 127.0.0.1 (soak seed 70045).

Task 0 was frozen for 1.2 heartbeat timeouts while every host waited in a barrier: three hosts judged it
lost and went to its successor, four saw it answer again and stayed. Those four learnt where the cluster
had gone only when task 0's service judged the three failed and task 0 found the successor: 6 s after the
freeze, then a heartbeat timeout of refused connections more. Now the service says it when it steps down
(``ClusterFailure.moved``): pushed to every open session at once, and the answer to every call after."""

from __future__ import annotations

import asyncio
import time

import pytest
from coordination_harness import make_config, run, serving

from tpuctl.coordination import convert
from tpuctl.coordination.plan import Roster
from tpuctl.coordination.values import ClusterFailed, ClusterFailure, Moved, RestartPolicy, TaskFailure, TaskInfo

CAUSE = "stepped down as the coordinator: task 2 (127.0.0.3:8476) serves the cluster at generation 2 (this host's service is at 1)"


def test_a_step_down_reaches_every_session_at_once_and_refuses_every_registration_after() -> None:
    async def body() -> None:
        config = make_config(4, restart=RestartPolicy(rejoin=True, timeout=30.0), heartbeat_timeout=5.0)
        async with serving(config) as cluster:
            members = [await cluster.join(i) for i in range(3)]  # task 3 not yet: the generation forms
            watches = [asyncio.create_task(c.watch_errors(m.task, timeout=10.0)) for c, m in members[1:]]
            await asyncio.sleep(0.2)  # both watches wait on the service
            assert not any(w.done() for w in watches)
            service = cluster.server.service
            asked = time.monotonic()
            assert service.step_down(Moved(2, 2), CAUSE)
            heard = await asyncio.wait_for(asyncio.gather(*watches), 5.0)
            assert time.monotonic() - asked < 2.0  # pushed, not found at a heartbeat timeout (5 s)
            for failure in heard:
                assert failure is not None and failure.rejoin and failure.moved == Moved(2, 2)
                assert failure.generation == 1
                assert [f.task.task_id for f in failure.failures] == [0]
                assert str(failure) == (
                    f"task 0 (127.0.0.1) {CAUSE}; generation 1 is over: every host registers with task 2's service"
                )
            with pytest.raises(ClusterFailed) as refused:  # a host registering after hears the same
                await cluster.client().open_session("test", 3, hostname="host-3")  # as an agent registers
            assert refused.value.failure.moved == Moved(2, 2)
            assert not service.step_down(Moved(1, 2), "again")  # once: the cluster is in error now

    run(body())


def test_moved_survives_the_wire_and_is_absent_otherwise() -> None:
    failure = ClusterFailure((TaskFailure(TaskInfo(0, "10.0.0.1"), CAUSE),), generation=18, rejoin=True, moved=Moved(1, 19))
    message = convert.cluster_failure_pb(failure)
    assert message.HasField("moved") and (message.moved.task, message.moved.generation) == (1, 19)
    assert convert.cluster_failure(message) == failure
    plain = ClusterFailure((TaskFailure(TaskInfo(3, "10.0.0.4"), "no heartbeat for 3.2 s"),), generation=2, rejoin=True)
    assert not convert.cluster_failure_pb(plain).HasField("moved")
    assert convert.cluster_failure(convert.cluster_failure_pb(plain)).moved is None


def test_the_service_says_when_it_could_not_run_for_half_the_heartbeat_timeout_and_only_then() -> None:
    """Its host frozen (SIGSTOP) or starved: the survivors may have judged it lost meanwhile. A stall
    shorter than half the heartbeat timeout (a busy moment) is not reported."""

    async def body() -> None:
        async with serving(make_config(2, heartbeat_timeout=2.0)) as cluster:
            stalls: list[float] = []
            cluster.server.service.on_stalled = stalls.append
            await asyncio.sleep(0.6)  # the service's watchdog is running
            time.sleep(0.2)  # the event loop blocked: a busy moment (reported from 1 s on)
            await asyncio.sleep(0.6)
            assert stalls == []
            time.sleep(1.6)  # blocked for most of the heartbeat timeout: as if frozen
            await asyncio.sleep(0.6)
            assert stalls and max(stalls) >= 1.3, stalls

    run(body())


def test_a_coordinator_silent_past_the_heartbeat_timeout_ends_its_generation_itself_under_rejoin() -> None:
    """Soak seed 70045 again: the coordinator frozen 1.2 heartbeat timeouts. Two hosts judged it lost and
    went looking for a successor; the five others saw it answer again and were told, a heartbeat timeout
    later, that those two had failed: never what happened. Now the service, silent past the timeout
    itself, ends the generation with its own failure, pushed to every host at once; the next generation has
    the same plan (a spare slice does not replace the coordinator's, which lost nothing)."""

    async def body() -> None:
        roster = Roster(active=4, spares=2, hosts_per_slice=2)
        config = make_config(6, roster=roster, restart=RestartPolicy(rejoin=True, timeout=30.0), heartbeat_timeout=2.0)
        async with serving(config) as cluster:
            members = [await cluster.join(i) for i in range(4)]
            await cluster.join(4)
            await cluster.join(5)  # a ready spare slice: a lost slice would be replaced by it
            await asyncio.gather(*(c.wait_for_all(m.task, timeout=5.0) for c, m in members))
            plan = cluster.server.service.state.plan
            watch = asyncio.create_task(members[1][0].watch_errors(members[1][1].task, timeout=10.0))
            await asyncio.sleep(0.3)
            time.sleep(0.8)  # under half the timeout: nothing ends
            await asyncio.sleep(0.5)
            assert not watch.done() and cluster.server.service.state.generation == 1
            time.sleep(2.4)  # the event loop, the service's included, blocked past the heartbeat timeout
            failure = await asyncio.wait_for(watch, 5.0)
            assert failure is not None and failure.rejoin and failure.generation == 1 and failure.moved is None
            assert [f.task.task_id for f in failure.failures] == [0]
            assert failure.failures[0].cause.startswith("could not run for ")
            assert "as the coordinator (its host frozen or starved), longer than the heartbeat timeout (2 s)" in str(failure)
            assert failure.next == ""  # no slice replaced
            state = cluster.server.service.state
            assert state.generation == 2 and state.plan == plan

    run(body())


def test_under_policy_fail_a_stalled_coordinator_ends_nothing_itself() -> None:
    async def body() -> None:
        async with serving(make_config(2, heartbeat_timeout=2.0)) as cluster:
            members = await cluster.join_all(heartbeat_interval=None)
            await asyncio.gather(*(c.wait_for_all(m.task, timeout=5.0) for c, m in members))
            await asyncio.sleep(0.3)
            time.sleep(2.4)
            await asyncio.sleep(0.5)
            state = cluster.server.service.state
            assert state.failure is None or all(f.task.task_id != 0 for f in state.failure.failures)

    run(body())
