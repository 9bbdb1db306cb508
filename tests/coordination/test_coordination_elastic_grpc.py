"""Spares and plans over real gRPC on 127.0.0.1 (protocol v17): a spare's registration and its standby
answer, the plan in every registration, a shape refused naming what differs, standby calls refused,
status's roles, ranks and spare slices, and a generation's end saying which spare slice takes over."""

from __future__ import annotations

import asyncio

import pytest
from coordination_harness import make_config, run, serving

from tpuctl.coordination.plan import Plan, Roster, SliceShape
from tpuctl.coordination.values import RestartPolicy
from tpuctl.errors import ClusterError, InputError

SHAPE = SliceShape("v4-16", "2x2x2", 2)


def test_spares_plans_and_status_over_grpc() -> None:
    async def body() -> None:
        roster = Roster(active=6, spares=2, hosts_per_slice=2)
        config = make_config(
            8, roster=roster, slice_shape=SHAPE, restart=RestartPolicy(rejoin=True, timeout=30.0), heartbeat_timeout=5.0
        )
        async with serving(config) as cluster:
            members = [await cluster.join(i) for i in range(6)]
            spare_client = cluster.client()
            spare = await spare_client.register("test", 6, hostname="spare-6", spare=True, slice_shape=SHAPE)
            assert spare.standby and spare.plan == Plan(((0, 3),)) and spare.num_tasks == 8
            assert not members[0][1].standby and members[0][1].plan == Plan(((0, 3),))
            with pytest.raises(InputError) as excinfo:
                await cluster.client().register("test", 7, slice_shape=SliceShape("v4-16", "2x2x4", 4))
            assert excinfo.value.message == (
                "task 7 (127.0.0.8): its slice is not shaped like the cluster's: topology 2x2x4 (the cluster's "
                "slices: 2x2x2); hosts per slice 4 (the cluster's slices: 2)"
            )
            with pytest.raises(InputError) as not_spare:
                await cluster.client().register("test", 1, spare=True, incarnation=4242)
            assert "task 1 registered as a spare" in not_spare.value.message
            await asyncio.gather(*(c.wait_for_all(m.task, timeout=5.0) for c, m in members))  # 6 members: formed
            with pytest.raises(ClusterError) as refused:
                await spare_client.barrier(spare.task, "step", timeout=1.0)
            assert refused.value.message.startswith("task 6 (127.0.0.7) is a spare in generation 1")
            await cluster.client().register("test", 7, hostname="spare-7", slice_shape=SHAPE)
            status = await members[0][0].status()
            assert [(t.role, t.rank) for t in status.tasks] == [("member", i) for i in range(6)] + [
                ("standby", None)
            ] * 2
            assert status.plan == Plan(((0, 3),))
            (slice_,) = status.spares
            assert (slice_.roster_slice, slice_.first_task, slice_.registered, slice_.spare) == (3, 6, 2, True)
            assert slice_.ready
            watch = asyncio.create_task(members[0][0].watch_errors(members[0][1].task, timeout=5.0))
            await members[3][0].report_error(members[3][1].task, "VM preempted")
            ended = await asyncio.wait_for(watch, 5.0)
            assert ended is not None and ended.rejoin
            assert ended.next == "generation 2 forms with spare slice 3 (tasks 6, 7) in place of slice 1"
            assert (await members[0][0].status()).plan == Plan.of([0, 3, 2])

    run(body())
