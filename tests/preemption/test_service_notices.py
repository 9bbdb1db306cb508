"""Preemption notices in a real coordination service (gRPC on loopback, in-process sessions): a host's notice
reaches every host in one push each, the hosts' reports decide one step, status carries both, a notice of a
host that is gone is refused and logged, and the bound without every report is no agreement."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "coordination"))

from coordination_harness import make_config, run, serving

from tpuctl.coordination.session import Session
from tpuctl.errors import TpuctlError
from tpuctl.preemption.notice import AgreementHeard, NoticeHeard


async def formed(cluster: Any, hosts: int) -> tuple[list[Session], list[asyncio.Task[Any]], list[list[object]]]:
    """Every host's session up, registered, waiting for all done, watching errors; what each heard."""
    name = cluster.server.service.state.config.cluster
    sessions = [await cluster.client().open_session(name, i, hostname=f"host-{i}", interval=0.2) for i in range(hosts)]
    heard: list[list[object]] = [[] for _ in range(hosts)]
    for i, session in enumerate(sessions):
        session.on_notice = heard[i].append
        session.on_agreement = heard[i].append
    runs = [asyncio.create_task(s.run()) for s in sessions]
    await asyncio.gather(*(s.wait_for_all(timeout=5.0) for s in sessions))
    watches = [asyncio.create_task(s.watch_errors()) for s in sessions]
    runs += watches
    await asyncio.sleep(0.2)  # the watches reach the service
    return sessions, runs, heard


async def close(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, TpuctlError):
            await task


async def until(condition: Any, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_a_notice_reaches_every_host_and_their_reports_decide_one_step() -> None:
    async def body() -> None:
        async with serving(make_config(4)) as cluster:
            service = cluster.server.service
            sessions, runs, heard = await formed(cluster, 4)
            events: list[object] = []
            service.preemptions.on_event = events.append
            try:
                pushes = service.counters.sent_bytes
                answer = await sessions[2].send_notice("gce-preempted", "instance/preempted TRUE", 30.0)
                assert answer.task == 2 and answer.source == "gce-preempted" and answer.notice_id == 1
                assert 29.0 < answer.deadline_in <= 30.0
                await until(lambda: all(any(isinstance(h, NoticeHeard) for h in hs) for hs in heard))
                notice = next(h for h in heard[0] if isinstance(h, NoticeHeard))
                assert (notice.task, notice.source, notice.generation) == (2, "gce-preempted", 1)
                assert 0 < notice.agree_in <= 10.0  # a third of 30 s
                assert service.counters.sent_bytes - pushes < 4 * 200  # one small message per host
                # every host reports where its job stands: host 1 is one step ahead
                for task, next_step in ((0, 42), (1, 43), (2, 42)):
                    assert await sessions[task].report_checkpoint(1, next_step, checkpointed=40)
                await asyncio.sleep(0.2)
                assert not any(isinstance(h, AgreementHeard) for h in heard[0])  # task 3 has not reported yet
                assert await sessions[3].report_checkpoint(1, -1)  # its job does not ask: it holds nothing back
                await until(lambda: all(any(isinstance(h, AgreementHeard) for h in hs) for hs in heard))
                agreed = [next(h for h in hs if isinstance(h, AgreementHeard)) for hs in heard]
                assert {(a.step, a.generation) for a in agreed} == {(43, 1)}
                status = (await cluster.client().status()).as_dict()["preemption"]
                assert status["notices"][0]["task"] == 2 and status["notices"][0]["address"] == "127.0.0.3"
                assert status["notices"][0]["source"] == "gce-preempted"
                assert status["agreement"]["state"] == "agreed" and status["agreement"]["step"] == 43
                assert (status["agreement"]["reported"], status["agreement"]["hosts"]) == (4, 4)
                assert await sessions[0].report_checkpoint(1, -1, checkpointed=43, saved=True)
                await until(lambda: (cluster_status := service.preemptions.view(0.0)) is not None and cluster_status.saved == 1)
                kinds = [(e.kind, e.task, e.step) for e in events]  # type: ignore[attr-defined]
                assert kinds == [("notice", 2, -1), ("agreed", -1, 43), ("saved", 0, 43)]
                notice_event = events[0].to_dict()  # type: ignore[attr-defined]
                assert notice_event["source"] == "gce-preempted" and notice_event["deadline"] > notice_event["at"]
                # the same events are the goodput ledger's: its generation carries the notice and the steps
                ledger = json.loads(service.ledger.document(time.time()))["generations"][-1]
                assert [(n["task"], n["source"]) for n in ledger["notices"]] == [(2, "gce-preempted")]
                assert ledger["steps"]["agreed"] == 43 and ledger["steps"]["saved"] == 43
            finally:
                await close(runs)

    run(body())


def test_no_agreement_at_the_bound_and_a_second_notice_joins_the_first() -> None:
    async def body() -> None:
        async with serving(make_config(3)) as cluster:
            service = cluster.server.service
            sessions, runs, heard = await formed(cluster, 3)
            events: list[object] = []
            service.preemptions.on_event = events.append
            try:
                await sessions[1].send_notice("command", "drill", 3.0)  # agreement bound: 1 s
                await sessions[0].send_notice("sigterm", "tpuctl run got SIGTERM", 60.0)
                assert await sessions[0].report_checkpoint(1, 5)
                await until(lambda: all(any(isinstance(h, AgreementHeard) for h in hs) for hs in heard), timeout=4.0)
                decision = next(h for h in heard[2] if isinstance(h, AgreementHeard))
                assert decision.step == -1 and "2 of 3 hosts did not say where their jobs stand" in decision.reason
                assert decision.deadline_in <= 3.0  # the earliest notice's deadline counts
                view = service.preemptions.view(0.0)
                assert view is not None and view.count == 2 and view.state == "none"
                # the deadline passes with no checkpoint: the steps since the last one are lost (for the ledger)
                await until(lambda: any(e.kind == "lost" for e in events), timeout=5.0)  # type: ignore[attr-defined]
                kinds = [(e.kind, e.lost_steps) for e in events]  # type: ignore[attr-defined]
                assert kinds == [("notice", 0), ("notice", 0), ("no-agreement", 0), ("lost", 4)]
                ledger = json.loads(service.ledger.document(time.time()))["generations"][-1]
                assert ledger["steps"]["lost_steps"] == 4 and ledger["notices_total"] == 2
            finally:
                await close(runs)

    run(body())


def test_a_notice_of_a_host_that_is_gone_is_refused_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            sessions, runs, heard = await formed(cluster, 2)
            try:
                client = cluster.clients[1]
                await client.disconnect(sessions[1].membership.task)  # task 1 left (policy fail: not an error)
                with pytest.raises(TpuctlError, match="disconnected"):
                    await sessions[1].send_notice("gce-preempted", "", 30.0)
                await asyncio.sleep(0.2)
                assert not any(isinstance(h, NoticeHeard) for h in heard[0])  # never spread
                assert cluster.server.service.preemptions.view(0.0) is None
            finally:
                await close(runs)

    with caplog.at_level(logging.WARNING, logger="tpuctl.coordination"):
        run(body())
    assert any("ignored a preemption notice from task 1" in r.getMessage() for r in caplog.records)


def test_a_malformed_notice_is_refused_and_the_session_goes_on() -> None:
    async def body() -> None:
        async with serving(make_config(2)) as cluster:
            sessions, runs, _ = await formed(cluster, 2)
            try:
                with pytest.raises(TpuctlError, match="not a notice source"):
                    await sessions[0].send_notice("bogus", "", 30.0)
                with pytest.raises(TpuctlError, match="deadline"):
                    await sessions[0].send_notice("command", "", -1.0)
                assert (await sessions[0].send_notice("command", "", 30.0)).notice_id == 1  # the stream went on
            finally:
                await close(runs)

    run(body())
