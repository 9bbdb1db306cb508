"""Hostile RPCs against a live 2-host cluster, from a stranger that reaches the coordinator's port with the
coordination client (no auth configured, the default): impersonation of a task, wrong or guessed
incarnations, replayed registrations, oversized names and values, an unbounded key-value store.

Required: every such call is refused and the cluster's state (tasks, incarnations, open barriers, error)
is unchanged; no answer reveals a task's credential (its incarnation).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from harness import TPUCTL, Proc
from harness.clusters import LocalCluster

from tpuctl.coordination.client import CoordinationClient
from tpuctl.coordination.values import TaskRef
from tpuctl.errors import TpuctlError

from .faultlib import SPEC, status
from .recorder import HostOutcome, Measurement, first_error

pytestmark = pytest.mark.slow



def snapshot(doc: Any) -> dict[str, Any]:
    """What a refused call must not change: every task's state and incarnation, the error, open barriers."""
    return {
        "tasks": [(t.task.task_id, t.state.name, t.incarnation, t.hostname, t.peer) for t in doc.tasks],
        "error": str(doc.failure) if doc.failure else None,
        "barriers": sorted((b.name, b.instance, tuple(b.arrived)) for b in doc.barriers),
    }


def stranger(c: LocalCluster, act: Callable[[CoordinationClient], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        async with CoordinationClient(f"{c.hosts[0]}:{c.port}", rpc_timeout=5.0) as client:
            return await act(client)

    return asyncio.run(go())


def attempt(c: LocalCluster, act: Callable[[CoordinationClient], Awaitable[Any]]) -> str | None:
    """The refusal message, or None if the call was accepted."""

    async def go(client: CoordinationClient) -> str | None:
        try:
            await act(client)
        except TpuctlError as exc:
            return exc.message
        return None

    result: str | None = stranger(c, go)
    return result


def state_now(c: LocalCluster) -> dict[str, Any]:
    async def go(client: CoordinationClient) -> Any:
        return await client.status()

    return snapshot(stranger(c, go))


def real_incarnation(c: LocalCluster, task: int) -> int:
    return int(c.info(task)["incarnation"])


def leaked_incarnation(c: LocalCluster, task: int) -> int:
    async def go(client: CoordinationClient) -> Any:
        return await client.status()

    return int(stranger(c, go).tasks[task].incarnation)


@pytest.fixture
def cluster(make_cluster) -> LocalCluster:
    c = make_cluster("v4-16", **SPEC)
    c.up()
    return c


def park(c: LocalCluster, task: int, name: str) -> Proc:
    proc = c.start(f"barrier-{task}", [*TPUCTL, "barrier", name, "--timeout", "20s", "--state-dir", str(c.state(task))])
    from harness import wait_until

    wait_until(
        lambda: any(b[0] == name for b in state_now(c)["barriers"]), 20, f"task {task} at {name!r}", interval=0.1
    )
    return proc


def record(request, fault: str, refusals: dict[str, str | None], problems: list[str], defect: str | None,
           c: LocalCluster) -> None:  # fmt: skip
    hosts = []
    for t in range(c.num_hosts):
        code, text = status(c, t, timeout=20)
        hosts.append(HostOutcome(t, "peer", "status", code, first_error(text) or "healthy", None, text))
        if code != 0:
            problems.append(f"task {t}: `tpuctl status` exited {code} after the hostile calls: {first_error(text)!r}")
    said = "; ".join(f"{call}: {'ACCEPTED' if why is None else why[:90]}" for call, why in refusals.items())
    Measurement(
        test=request.node.nodeid, fault=fault, phase="steady", victim="the coordination service",
        detected_by="the service's refusal", limit_s=None, hosts=hosts, problems=problems, expected_defect=defect,
        notes=said,
    ).write()  # fmt: skip


def test_wrong_incarnation_calls_are_refused_and_change_nothing(cluster, request) -> None:
    c = cluster
    waiting = park(c, 0, "step")
    before = state_now(c)
    wrong = TaskRef(1, real_incarnation(c, 1) ^ (1 << 40) or 7)
    calls = {
        "Heartbeat": lambda cl: cl.heartbeat(wrong),
        "Barrier": lambda cl: cl.barrier(wrong, "step", timeout=2),
        "ReportError": lambda cl: cl.report_error(wrong, "stranger says task 1 broke"),
        "Disconnect": lambda cl: cl.disconnect(wrong),
        "Gather": lambda cl: cl.gather(wrong, "tpuctl/init/cores", b"[]", timeout=2),
    }
    refusals = {name: attempt(c, call) for name, call in calls.items()}
    after = state_now(c)
    problems = [f"{name} with a wrong incarnation was accepted" for name, why in refusals.items() if why is None]
    if after != before:
        problems.append(f"the cluster's state changed: {before} -> {after}")
    if waiting.poll() is not None:
        problems.append(f"task 0's barrier ended: {waiting.err()!r}")
    record(request, "wrong incarnation (Heartbeat, Barrier, ReportError, Disconnect, Gather)", refusals, problems,
           None, c)  # fmt: skip
    assert not problems, "\n".join(problems)


def test_refusals_do_not_echo_the_real_incarnation(cluster, request) -> None:
    c = cluster
    real = real_incarnation(c, 1)
    refusals = {"Heartbeat": attempt(c, lambda cl: cl.heartbeat(TaskRef(1, real + 1)))}
    problems = [
        f"the refusal names the real incarnation {real}" for why in refusals.values() if str(real) in (why or "")
    ]
    record(request, "wrong incarnation: what the refusal reveals", refusals, problems, None, c)
    assert not problems, "\n".join(problems)


def test_status_reveals_no_credential(cluster, request) -> None:
    c = cluster
    shown = [leaked_incarnation(c, t) for t in range(2)]
    real = [real_incarnation(c, t) for t in range(2)]
    problems = [f"GetStatus shows task {t}'s incarnation" for t in range(2) if shown[t] == real[t]]
    record(request, "credential leak (GetStatus from a stranger)", {"GetStatus": None}, problems, None, c)
    assert not problems, "\n".join(problems)


def test_impersonated_barrier_with_a_leaked_incarnation_is_refused(cluster, request) -> None:
    c = cluster
    waiting = park(c, 0, "step")
    before = state_now(c)
    task1 = TaskRef(1, real_incarnation(c, 1))  # even the real one: it is not the credential
    refusals = {"Barrier as task 1": attempt(c, lambda cl: cl.barrier(task1, "step", timeout=5))}
    time.sleep(0.3)
    problems = [f"{name} was accepted" for name, why in refusals.items() if why is None]
    if waiting.poll() is not None:
        problems.append(f"task 0 passed barrier 'step' without the real task 1: {waiting.err().strip()!r}")
    after = state_now(c)
    if after["barriers"] != before["barriers"]:
        problems.append(f"open barriers changed: {before['barriers']} -> {after['barriers']}")
    record(request, "impersonation: Barrier for task 1 (leaked incarnation)", refusals, problems, None, c)
    assert not problems, "\n".join(problems)


def test_impersonated_report_error_with_a_leaked_incarnation_is_refused(cluster, request) -> None:
    c = cluster
    task1 = TaskRef(1, real_incarnation(c, 1))  # even the real one: it is not the credential
    refusals = {"ReportError as task 1": attempt(c, lambda cl: cl.report_error(task1, "impersonated failure"))}
    problems = [f"{name} was accepted" for name, why in refusals.items() if why is None]
    if state_now(c)["error"] is not None:
        problems.append("the cluster is in error")
    record(request, "impersonation: ReportError for task 1 (leaked incarnation)", refusals, problems,
           None, c)  # fmt: skip
    assert not problems, "\n".join(problems)


def test_guessed_incarnation_impersonation_is_refused(cluster, request) -> None:
    c = cluster
    before = state_now(c)
    guesses = [TaskRef(1, secrets.randbits(63) or 1) for _ in range(20)]
    refusals: dict[str, str | None] = {}
    for i, guess in enumerate(guesses):
        refusals[f"ReportError guess {i}"] = attempt(c, lambda cl, g=guess: cl.report_error(g, "guessed"))
        refusals[f"Heartbeat guess {i}"] = attempt(c, lambda cl, g=guess: cl.heartbeat(g))
    problems = [f"{name} was accepted" for name, why in refusals.items() if why is None]
    if state_now(c) != before:
        problems.append("the cluster's state changed")
    shown = {k: v for k, v in list(refusals.items())[:2]}
    record(request, "impersonation: 20 guessed incarnations (ReportError, Heartbeat)", shown, problems, None, c)
    assert not problems, "\n".join(problems)


def test_replayed_registration_of_a_live_task_is_refused(cluster, request) -> None:
    c = cluster
    before = state_now(c)
    refusals = {
        "RegisterTask task 1, new incarnation": attempt(c, lambda cl: cl.register("test-pod", 1, incarnation=12345)),
        "RegisterTask task 0, new incarnation": attempt(c, lambda cl: cl.register("test-pod", 0)),
    }
    problems = [f"{name} was accepted" for name, why in refusals.items() if why is None]
    if state_now(c)["tasks"] != before["tasks"]:
        problems.append("a task's registration changed")
    record(request, "replayed registration (a new incarnation for a live task)", refusals, problems, None, c)
    assert not problems, "\n".join(problems)


def test_replayed_registration_with_the_leaked_incarnation_gives_no_power(cluster, request) -> None:
    c = cluster
    waiting = park(c, 0, "step")
    leaked = real_incarnation(c, 1)  # the strongest replay: the real incarnation, not only what status shows

    async def replay_then_act(cl: CoordinationClient) -> Any:
        member = await cl.register("test-pod", 1, incarnation=leaked)
        return await cl.barrier(member.task, "step", timeout=5)

    refusals = {"RegisterTask replay, then Barrier": attempt(c, replay_then_act)}
    time.sleep(0.3)
    problems = [f"{name} was accepted" for name, why in refusals.items() if why is None]
    if waiting.poll() is not None:
        problems.append("task 0 passed barrier 'step' without the real task 1")
    record(request, "replayed registration (the incarnation GetStatus shows)", refusals, problems, None, c)
    assert not problems, "\n".join(problems)


def test_oversized_names_and_values_are_refused(cluster, request) -> None:
    c = cluster
    before = state_now(c)
    wrong = TaskRef(1, 99)
    real0 = TaskRef(0, real_incarnation(c, 0))  # a call a real host could make, with too much in it
    calls = {
        "Barrier name 4,000 chars": lambda cl: cl.barrier(real0, "b" * 4000, timeout=1),
        "Gather value 1 MiB": lambda cl: cl.gather(real0, "big", b"x" * (1 << 20), timeout=1),
        "KeyValueSet key 4,000 chars": lambda cl: cl.kv_set("k" * 4000, b"v"),
        "ReportError cause 8 MiB (wrong incarnation)": lambda cl: cl.report_error(wrong, "c" * (8 << 20)),
        "RegisterTask hostname 8 MiB": lambda cl: cl.register("test-pod", 1, hostname="h" * (8 << 20)),
        "KeyValueSet value 128 MiB": lambda cl: cl.kv_set("huge", b"v" * (128 << 20)),
    }
    refusals = {name: attempt(c, call) for name, call in calls.items()}
    problems = [f"{name} was accepted" for name, why in refusals.items() if why is None]
    after = state_now(c)
    if after != before:
        problems.append(f"the cluster's state changed: {before} -> {after}")
    record(request, "oversized names and values", refusals, problems, None, c)
    assert not problems, "\n".join(problems)


def test_key_value_store_has_a_quota(cluster, request) -> None:
    c = cluster

    async def flood(cl: CoordinationClient) -> str | None:
        for i in range(96):  # 96 x 1 MiB from one stranger
            try:
                await cl.kv_set(f"flood/{i}", b"\0" * (1 << 20))
            except TpuctlError as exc:
                return f"refused at value {i}: {exc.message}"
        return None

    refused = stranger(c, flood)
    refusals = {"KeyValueSet 96 x 1 MiB": refused}
    problems = [] if refused else ["all 96 MiB were stored"]
    record(request, "key-value flood (96 x 1 MiB)", refusals, problems, None, c)
    assert not problems, "\n".join(problems)


def test_the_cluster_still_works_after_hostile_calls(cluster) -> None:
    """The hostile calls above left the real hosts able to meet: a barrier on both passes."""
    c = cluster
    attempt(c, lambda cl: cl.heartbeat(TaskRef(1, 5)))
    attempt(c, lambda cl: cl.barrier(TaskRef(0, 5), "x" * 5000, timeout=1))
    procs = [c.spawn("barrier", "after", task=t) for t in range(2)]
    assert [p.code for p in c.processes.wait_all(procs, timeout=30)] == [0, 0], c.logs()
    assert json.loads(c.tpuctl("status", "--json", task=1).out)["error"] is None
