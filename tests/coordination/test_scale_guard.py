"""Regression guard: the coordination service's work per host does not grow with the cluster.

One real ``grpc.aio`` server on 127.0.0.1 port 0 and N hosts' clients in this process run what
``tpuctl init`` runs on the wire (a registration opening the session stream, the wait for all and the
error watch on it, a gather of 4 core IDs and two barriers on the session) at two sizes. The service's own counters
(``Counters``: RPCs, records visited, messages built and encoded, parked calls woken, bytes sent) divided
by the host count may grow by at most 1.5x from the small size to the large one; so may the session
streams' messages in and out and the bytes written on them (``stream_in``, ``stream_out``,
``stream_bytes``), and no call stays parked per host once init is done (the barriers and the error
watch are stream messages since protocol v6, not parked calls). Counting, not timing:
the result does not depend on how loaded the machine is.

The gather's table is the one answer that is O(hosts) per host by nature (every host needs every host's
core IDs); its bytes are checked to be exactly the table, and the rest of the bytes per host is held
to the same 1.5x. Since protocol v5 the table is sent xz-compressed: at 1,000 hosts each host gets
about 1.6 KB instead of 24.9 KB for the table in protocol v2's layout and 9.3 KB zlib-compressed in v3
(measured here, and held to at most a fifth of v2's).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from coordination_harness import make_config, run

from tpuctl.coordination import CoordinationClient
from tpuctl.coordination.convert import gather_response
from tpuctl.coordination.server import start_server
from tpuctl.proto import coordination_pb2 as pb

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SIZES = (250, 1_000)
GROWTH = 1.5
CLUSTER = "guard"


def core_ids(task: int) -> bytes:
    return json.dumps([4 * task + i for i in range(4)]).encode()


async def init_sequence(hosts: int) -> dict[str, Any]:
    """Every host's init on the wire; the service's counters for it, and the gather table's size."""
    config = make_config(hosts, cluster=CLUSTER, heartbeat_timeout=600.0, register_timeout=600.0)
    server = await start_server(config, host="127.0.0.1", port=0)
    clients = [CoordinationClient(server.target, rpc_timeout=120.0) for _ in range(hosts)]
    background: list[asyncio.Task[Any]] = []
    counters = server.service.counters
    try:
        start = counters.snapshot()

        async def host(task: int) -> list[bytes]:
            client = clients[task]
            # Registered on the session's stream (its first, confirmed heartbeat); no heartbeat after it.
            session = await client.open_session(
                CLUSTER, task, hostname=f"guard-{task}", connect_timeout=60.0, interval=3600.0
            )
            member = session.membership
            background.append(asyncio.create_task(session.run()))
            await session.wait_for_all(timeout=300.0, progress_every=60.0)
            background.append(asyncio.create_task(session.watch_errors()))
            assert member.task.task_id == task
            table = await session.gather("cores", core_ids(task), timeout=300.0)  # v9: on the session
            await session.barrier("cores-done", timeout=300.0)
            await session.barrier("init-done", timeout=300.0)
            return table

        tables = await asyncio.gather(*(host(t) for t in range(hosts)))
        await asyncio.sleep(0.2)  # let the last heartbeat confirmations land
        end = counters.snapshot()
        service = server.service
        parked = sum(len(slot) for slot in service._parking._slots.values())
        assert parked == 0, f"{parked} calls parked after init"
        assert not service._streams._barriers
        assert all(table == [core_ids(t) for t in range(hosts)] for table in tables)
        work = {name: end[name] - start[name] for name in end}
        work["gather_bytes"] = hosts * len(gather_response(1, tables[0]).SerializeToString())  # as sent
        work["raw_gather_bytes"] = hosts * len(pb.GatherTable(values=tables[0]).SerializeToString())  # uncompressed
        return work
    finally:
        for task in background:
            task.cancel()
        for task in background:
            with contextlib.suppress(BaseException):
                await task
        for client in clients:
            await client.close()
        await server.stop(grace=None)


def test_service_work_and_bytes_per_host_stay_flat_from_250_to_1000_hosts() -> None:
    per_host = []
    for hosts in SIZES:
        work = run(init_sequence(hosts), timeout=300.0)
        assert work["sent_bytes"] >= work["gather_bytes"]  # the table was sent to every host
        work["other_bytes"] = work["sent_bytes"] - work["gather_bytes"]
        work["other_stream_bytes"] = work["stream_bytes"] - work["gather_bytes"]  # the table is on the stream (v9)
        per_host.append({name: value / hosts for name, value in work.items()})
    small, large = per_host
    report = {name: (round(small[name], 2), round(large[name], 2)) for name in small}
    print("per host (small, large):", report)
    for name in (
        "calls",
        "touched",
        "built",
        "encoded",
        "woken",
        "other_bytes",
        "stream_in",
        "stream_out",
        "other_stream_bytes",
    ):
        assert large[name] <= small[name] * GROWTH, f"{name} per host grew: {report[name]}"
    # The session: the registration, the wait for all, the watch, the gather and two arrivals in; the
    # registration's answer, the wait's, the table and two outcomes out. A host's only call is the
    # stream (protocol v7: no RegisterTask, no WaitForAllTasks; v9: no Gather).
    assert 6 <= large["stream_in"] <= 7 and 5 <= large["stream_out"] <= 6, report
    assert large["calls"] - large["stream_in"] <= 1.05, report
    # Besides the table (its request id and framing: at most 8 bytes), a host's stream carries little.
    assert large["other_stream_bytes"] <= 160 + 8, report
    # Shared answers are encoded once, not once per host: far fewer encodings than hosts.
    assert large["encoded"] < 1.0
    # The gather table per host is the table and nothing more: linear in hosts by nature (a little more
    # per entry here, as the core IDs of later hosts take more digits).
    assert large["gather_bytes"] <= small["gather_bytes"] * (SIZES[1] / SIZES[0]) * GROWTH
    # Compressed once: the table each host receives is at most a fifth of v2's uncompressed one.
    assert large["gather_bytes"] * 5 <= large["raw_gather_bytes"], report["gather_bytes"]
