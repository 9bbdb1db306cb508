"""This host's job in the agreement, as its agent sees it (tpuctl.agent.checkpoints): where each process stands
when a notice comes, the host's one report, the answers once the coordinator decided. Fake connections, a real
event loop (the bound is a timer)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from tpuctl.agent.checkpoints import JobCheckpoints
from tpuctl.preemption.notice import AgreementHeard, NoticeHeard


class Conn:
    def __init__(self) -> None:
        self.said: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.said.append(data)

    def is_closing(self) -> bool:
        return self.closing


def notice(generation: int = 1, agree_in: float = 2.0) -> NoticeHeard:
    return NoticeHeard(2, "command", "drill", 30.0, agree_in, 1, generation)


def decided(step: int, generation: int = 1) -> AgreementHeard:
    return AgreementHeard(generation, step, "", 20.0)


def run(body: Any) -> None:
    asyncio.run(asyncio.wait_for(body(), 10))


def started(reports: list[tuple[int, int, dict[str, Any]]]) -> JobCheckpoints:
    checkpoints = JobCheckpoints()

    async def report(generation: int, next_step: int, **flags: Any) -> bool:
        reports.append((generation, next_step, flags))
        return True

    checkpoints.start(1, report)
    return checkpoints


def test_the_host_reports_once_every_listener_answered_the_largest_next_step() -> None:
    async def body() -> None:
        reports: list[tuple[int, int, dict[str, Any]]] = []
        checkpoints = started(reports)
        a, b = Conn(), Conn()
        checkpoints.subscribe(a, 100, 1)
        checkpoints.subscribe(b, 101, 1)
        assert checkpoints.taking_part == 2
        checkpoints.notice(notice())
        assert a.said == [b"N 2.0\n"] and b.said == [b"N 2.0\n"]
        checkpoints.answer(a, 42)
        await asyncio.sleep(0)
        assert reports == []  # b has not said where it stands
        checkpoints.answer(b, 43)
        await asyncio.sleep(0)
        assert [(g, n) for g, n, _ in reports] == [(1, 43)] and reports[0][2]["unknown"] is False
        checkpoints.decided(decided(43))
        assert a.said[-1] == b"A 43\n" and b.said[-1] == b"A 43\n"
        checkpoints.checkpointed(43)  # the job saved the agreed step: the coordinator hears it once
        checkpoints.checkpointed(43)
        await asyncio.sleep(0)
        assert [flags.get("saved") for _, _, flags in reports] == [False, True]

    run(body)


def test_a_listener_that_does_not_answer_in_time_makes_the_host_unknown() -> None:
    async def body() -> None:
        reports: list[tuple[int, int, dict[str, Any]]] = []
        checkpoints = started(reports)
        a, frozen = Conn(), Conn()
        checkpoints.subscribe(a, 100, 1)
        checkpoints.subscribe(frozen, 101, 1)
        checkpoints.notice(notice(agree_in=0.2))  # half the bound: 0.1 s
        checkpoints.answer(a, 7)
        await asyncio.sleep(0.3)
        assert len(reports) == 1 and reports[0][1] == 7 and reports[0][2]["unknown"] is True

    run(body)


def test_a_shell_loop_is_answered_at_once_held_while_the_hosts_agree_and_told_at_the_agreed_step() -> None:
    async def body() -> None:
        reports: list[tuple[int, int, dict[str, Any]]] = []
        checkpoints = started(reports)
        pid = os.getpid()  # a live process asks
        first = Conn()
        checkpoints.ask(first, 10, pid)
        assert first.said == [b"G\n"]
        checkpoints.notice(notice())  # no listener: the host reports at once, from what it answered
        await asyncio.sleep(0)
        assert reports[0][1] == 11
        held = Conn()
        checkpoints.ask(held, 11, pid)
        assert held.said == [b"W 2.0\n"]
        checkpoints.decided(decided(12))  # another host was further
        assert held.said[-1] == b"G\n"
        at = Conn()
        checkpoints.ask(at, 12, pid)
        assert at.said == [b"C 12\n"]
        after = Conn()
        checkpoints.ask(after, 13, pid)
        assert after.said == [b"G\n"]  # once

    run(body)


def test_a_late_listener_raises_the_hosts_report_before_the_decision() -> None:
    async def body() -> None:
        reports: list[tuple[int, int, dict[str, Any]]] = []
        checkpoints = started(reports)
        checkpoints.notice(notice())
        await asyncio.sleep(0)
        assert [n for _, n, _ in reports] == [-1]  # nothing of the job asks yet
        late = Conn()
        checkpoints.subscribe(late, 100, 1)
        assert late.said == [b"N 2.0\n"]
        checkpoints.answer(late, 5)
        await asyncio.sleep(0)
        assert [n for _, n, _ in reports] == [-1, 5]

    run(body)


def test_the_generations_end_answers_no_step_to_the_waiting_and_keeps_a_decision_for_its_job() -> None:
    async def body() -> None:
        reports: list[tuple[int, int, dict[str, Any]]] = []
        checkpoints = started(reports)
        listener = Conn()
        checkpoints.subscribe(listener, 100, 1)
        checkpoints.notice(notice())
        checkpoints.stop()  # the generation ended before the decision
        assert listener.said[-1] == b"X\n"

        decided_first = started(reports)
        decided_first.notice(notice())
        decided_first.decided(decided(8))
        decided_first.stop()  # the host going away left: this host's slower job still asks
        slow = Conn()
        decided_first.ask(slow, 8, os.getpid())
        assert slow.said == [b"C 8\n"]

    run(body)


def test_listeners_of_another_generation_are_not_asked() -> None:
    async def body() -> None:
        reports: list[tuple[int, int, dict[str, Any]]] = []
        checkpoints = started(reports)
        old = Conn()
        checkpoints.subscribe(old, 100, 7)  # a process of another generation's job
        assert checkpoints.taking_part == 0
        checkpoints.notice(notice())
        assert old.said == []

    run(body)
