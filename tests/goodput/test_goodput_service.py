"""The ledger over the wire: a real coordination service on 127.0.0.1 (port 0) and real clients: sessions
register, pass init's final barrier and report their job's pace; ``GetGoodput`` answers the ledger and
``GetStatus`` its one line, also once the cluster failed for good; the journal written as it goes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

from tpuctl.agent.bringup import INIT_DONE_BARRIER
from tpuctl.coordination.client import CoordinationClient
from tpuctl.coordination.ledger import FORMED_BARRIER, ServiceLedger
from tpuctl.coordination.server import start_server
from tpuctl.coordination.values import ServiceConfig, TaskSpec
from tpuctl.goodput.journal import load
from tpuctl.watchdog.pace import PaceReport

HOSTS = 3


def test_the_service_knows_init_s_final_barrier_by_its_name() -> None:
    assert FORMED_BARRIER == INIT_DONE_BARRIER


async def _cluster_life(journal: Path) -> tuple[dict[str, object], dict[str, object], object]:
    config = ServiceConfig(
        cluster="wire", tasks=tuple(TaskSpec(f"127.0.0.{i + 1}") for i in range(HOSTS)), heartbeat_timeout=3.0,
        register_timeout=10.0, barrier_timeout=10.0,
    )  # fmt: skip
    started = time.time()
    ledger = ServiceLedger.open("wire", generation=1, started=started, now=started, journal_path=journal)
    server = await start_server(config, host="127.0.0.1", port=0, ledger=ledger)
    clients = [CoordinationClient(server.target) for _ in range(HOSTS)]
    runs: list[asyncio.Task[object]] = []
    try:
        sessions = await asyncio.gather(
            *(c.open_session("wire", t, interval=0.5, give_up_after=3.0) for t, c in enumerate(clients))
        )
        runs = [asyncio.create_task(s.run()) for s in sessions]
        await asyncio.gather(*(s.wait_for_all(timeout=10.0) for s in sessions))
        await asyncio.gather(*(s.barrier(FORMED_BARRIER, timeout=10.0) for s in sessions))
        for step in (1, 2, 3):
            for session in sessions:
                await session.report_pace(PaceReport(step, 0.0, 0.05, step, False, checkpointed=step - 1, sent_at=time.time()))
            await asyncio.sleep(0.05)
        for _ in range(100):  # bounded: the reports are read by the service within a moment
            document = json.loads(await clients[0].goodput())
            if document["generations"][0]["steps"]["top"] == 3:
                break
            await asyncio.sleep(0.02)
        status = (await clients[1].status()).as_dict()
        await clients[2].report_error(sessions[2].membership.task, "the job's host ran out of memory")
        failed = json.loads(await clients[0].goodput())
        return document, status, failed
    finally:
        for run in runs:
            run.cancel()
            with contextlib.suppress(BaseException):
                await run
        for client in clients:
            await client.close()
        await server.stop(grace=None)


def test_get_goodput_and_status_answer_the_ledger_from_any_host_also_after_a_final_failure(tmp_path: Path) -> None:
    journal = tmp_path / "goodput.jsonl"
    before = time.time()
    document, status, failed = asyncio.run(asyncio.wait_for(_cluster_life(journal), 30))
    assert document["schema"] == "tpuctl.goodput/v1" and document["cluster"] == "wire"
    assert document["bucket"] == "productive" and document["error"] is None
    buckets = document["generations"][0]["buckets"]
    assert buckets["bring_up"] > 0 and buckets["productive"] > 0
    assert abs(sum(document["totals"].values()) - document["wall_seconds"]) < 1e-6
    goodput = status["goodput"]
    assert isinstance(goodput, dict) and goodput["bucket"] == "productive" and 0 < goodput["fraction"] < 1
    # the cluster failed for good: the ledger still answers, ends at the failure and says why
    assert failed["bucket"] is None and "ran out of memory" in failed["error"]
    assert failed["generations"][0]["final"] and failed["generations"][0]["failures"][0]["task"] == 2
    # the document's times are rounded to the millisecond: compare at that precision
    assert before - 0.001 <= failed["since"] <= failed["until"] <= time.time() + 0.001
    # the journal has it all: the service's stop wrote the last of it
    assert load(journal).generations[0].final
