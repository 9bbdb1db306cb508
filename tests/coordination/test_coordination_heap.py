"""``freeze_heap``: the serving process's heap is frozen for Python's garbage collector while its
cluster stands (every host registered) and thawed when the generation ends or the service stops; the
young generation's threshold is raised while it serves and restored after. Real gRPC on 127.0.0.1."""

from __future__ import annotations

import asyncio
import gc

import pytest
from coordination_harness import make_config, run, serving

from tpuctl.coordination.heap import Heap
from tpuctl.coordination.values import RestartPolicy

pytestmark = pytest.mark.timeout(60)


def test_the_heap_is_frozen_while_the_cluster_stands_and_thawed_when_it_fails() -> None:
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0

    async def body() -> None:
        async with serving(make_config(3, heartbeat_timeout=1.0), freeze_heap=True) as cluster:
            assert gc.get_threshold()[0] == Heap.YOUNG
            first = await cluster.join(0, heartbeat_interval=None)
            await cluster.join(1, heartbeat_interval=None)
            assert gc.get_freeze_count() == 0  # not formed yet: registration still allocates
            await cluster.join(2, heartbeat_interval=None)
            assert gc.get_freeze_count() > 0  # every host registered: the cluster's objects are frozen
            client, member = first
            await client.report_error(member.task, "the job crashed")
            await asyncio.sleep(0.05)
            assert gc.get_freeze_count() == 0  # the generation ended: thawed, its leftovers collectable
        assert gc.get_threshold() == before

    run(body())
    assert gc.get_freeze_count() == 0


def test_a_stopped_service_leaves_the_collector_as_it_found_it() -> None:
    before = gc.get_threshold()

    async def body() -> None:
        async with serving(make_config(2), freeze_heap=True) as cluster:
            await cluster.join_all(heartbeat_interval=None)
            assert gc.get_freeze_count() > 0

    run(body())
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before


def test_without_freeze_heap_the_collector_is_untouched() -> None:
    before = gc.get_threshold()

    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            await cluster.join_all(heartbeat_interval=None)
            assert gc.get_freeze_count() == 0 and gc.get_threshold() == before

    run(body())


def test_a_re_forming_cluster_is_thawed_and_frozen_again_when_every_host_is_back() -> None:
    policy = RestartPolicy(rejoin=True, timeout=30.0, max_restarts=2)

    async def body() -> None:
        async with serving(make_config(2, restart=policy), freeze_heap=True) as cluster:
            members = await cluster.join_all(heartbeat_interval=None)
            assert gc.get_freeze_count() > 0
            (c0, m0), (c1, m1) = members
            await c1.report_error(m1.task, "preempted")  # generation 1 ends; the cluster re-forms as 2
            await asyncio.sleep(0.05)
            assert cluster.server.service.state.generation == 2
            assert gc.get_freeze_count() == 0
            name = cluster.server.service.state.config.cluster
            await c0.register(name, 0, incarnation=m0.task.incarnation, generation=1, previous_credential=m0.task.credential)
            assert gc.get_freeze_count() == 0
            again = await c1.register(name, 1, generation=1, previous_credential=m1.task.credential)
            assert again.generation == 2
            assert gc.get_freeze_count() > 0  # generation 2 formed

    run(body())
    assert gc.get_freeze_count() == 0


def test_a_stopped_heap_policy_never_freezes_again_and_a_new_generation_refreezes() -> None:
    heap = Heap(True)
    heap.start()
    try:
        heap.formed(1)
        assert gc.get_freeze_count() > 0 and heap.generation == 1
        heap.formed(2)  # generation 1's thaw had not come yet: thawed, then frozen for 2
        assert heap.frozen and heap.generation == 2
    finally:
        heap.stop()
    assert gc.get_freeze_count() == 0
    heap.formed(3)  # a registration during the server's grace period
    assert gc.get_freeze_count() == 0 and not heap.frozen
