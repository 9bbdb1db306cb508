"""Fuzzing the coordination service's state machine with hypothesis-generated call sequences (issue 9).

Every RPC of the service lands in one method of :class:`CoordinationState`; here hypothesis drives those
methods with random task refs (known, stale, zero and absurd incarnations; task ids in and far out of
range), names (empty, tpuctl's own, past the 1,024-character limit, odd Unicode), values (up to past the
gather limit), timeouts (0, negative, NaN, infinite, huge) and clock steps. Two properties, for every call:

* it answers or raises ``Refused``: nothing else (no TypeError, OverflowError, AssertionError ...);
* a refused call leaves the service as it was: the status document (tasks, failure, open barriers), the
  key-value store and the cluster's error, compared at the same instant before and after. The
  documented exceptions: a heartbeat that arrives after its own timeout (the service declares its task
  failed and refuses it: ``heartbeat``'s "late by its own account"), checked to be exactly that task
  failing; and a withdrawal by a task that left since it arrived (the instance cannot pass: it fails,
  ``withdraw``), checked to be exactly that instance ending.

An instance past its deadline is decided lazily (by the next call that looks at it) and ``status`` lists it
as open with 0 s left until then; the snapshot counts such an instance as decided, as every call does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest
from coordination_harness import make_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuctl.coordination.state import CoordinationState
from tpuctl.coordination.values import PROTOCOL_VERSION, BarrierId, Reason, Refused, Registration, TaskRef, TaskState

TASKS = 3
CLUSTER = "test"
HEARTBEAT_TIMEOUT = 1.0

names = st.one_of(
    st.sampled_from(["step", "init", "", "tpuctl/init", "x" * 1024, "x" * 1025, "é\u0000\U0001f600"]),
    st.text(max_size=12),
)
timeouts = st.one_of(
    st.sampled_from([0.0, -1.0, math.nan, math.inf, -math.inf, 1e308, 1e-9, 0.5, 3.0]),
    st.floats(min_value=0, max_value=10),
)
values = st.one_of(st.binary(max_size=16), st.sampled_from([b"", b"v" * (64 * 1024 + 1)]))
task_ids = st.sampled_from([*range(TASKS)] * 5 + [-1, TASKS, -(2**31), 2**31 - 1, 2**63])
incarnation_picks: st.SearchStrategy[str | int] = st.sampled_from(["live"] * 10 + ["stale", "zero", "borrowed", "any"]).flatmap(
    lambda pick: st.integers(min_value=0, max_value=2**64 - 1) if pick == "any" else st.just(pick)
)


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """One call: its method and its drawn arguments (refs resolved against the run's state later)."""
    method = draw(
        st.sampled_from(
            [
                "register", "register", "register", "registration_progress", "heartbeat", "heartbeat",
                "report_error", "disconnect", "poll_error", "barrier_arrive", "barrier_arrive", "barrier_outcome",
                "gather_arrive", "gather_outcome", "rendezvous_progress", "kv_set", "kv_get", "kv_dir", "expire",
                "withdraw", "withdraw",
            ]
        )
    )  # fmt: skip
    args: dict[str, Any] = {
        "task_id": draw(task_ids),
        "incarnation": draw(incarnation_picks),
        "step": draw(st.sampled_from([0.0] * 4 + [0.05] * 4 + [0.3, 0.9, 1.5, 6.0])),
        "name": draw(names),
        "timeout": draw(timeouts),
        "value": draw(values),
        "cluster": draw(st.sampled_from([CLUSTER] * 8 + ["other", ""])),
        "version": draw(st.sampled_from([PROTOCOL_VERSION] * 8 + [0, PROTOCOL_VERSION + 1])),
        "overwrite": draw(st.booleans()),
        "service_incarnation": draw(st.sampled_from([0, 0, 77, 78])),
        "pick": draw(st.integers(min_value=0, max_value=10**6)),
    }
    return method, args


@dataclass
class Run:
    state: CoordinationState = field(
        default_factory=lambda: CoordinationState(
            make_config(TASKS, heartbeat_timeout=HEARTBEAT_TIMEOUT, register_timeout=5.0, barrier_timeout=2.0),
            service_incarnation=77,
        )
    )
    now: float = 100.0
    incarnations: dict[int, int] = field(default_factory=dict)
    """The incarnation each task last registered with (what its real process holds)."""
    credentials: dict[int, bytes] = field(default_factory=dict)
    """The credential each task's last registration returned."""
    stale: dict[int, TaskRef] = field(default_factory=dict)
    barriers: list[BarrierId] = field(default_factory=list)
    counter: int = 1

    def ref(self, args: dict[str, Any]) -> TaskRef:
        task_id, pick = args["task_id"], args["incarnation"]
        if pick == "live":
            return TaskRef(task_id, self.incarnations.get(task_id, 1), self.credentials.get(task_id, b""))
        if pick == "borrowed":  # a stranger who learnt the incarnation but not the credential
            return TaskRef(task_id, self.incarnations.get(task_id, 1), b"\0" * 32)
        if pick == "stale":
            return self.stale.get(task_id, TaskRef(task_id, 12345))
        if pick == "zero":
            return TaskRef(task_id, 0)
        return TaskRef(task_id, pick)

    def fresh_incarnation(self, args: dict[str, Any]) -> int:
        if args["incarnation"] == "zero":
            return 0
        if isinstance(args["incarnation"], int):
            return int(args["incarnation"])
        self.counter += 1
        return 1000 * self.counter + (args["task_id"] % 1000 if isinstance(args["task_id"], int) else 0)


def snapshot(state: CoordinationState, now: float) -> dict[str, Any]:
    """What a caller can observe at ``now``: the status document, every key-value entry, the error."""
    status = state.status(now=now)
    doc = status.as_dict()
    open_barriers = [b for b in status.barriers if b.seconds_left > 0]  # past its deadline: decided
    return {
        "tasks": [(t.task, t.state, t.incarnation, t.hostname, t.peer, t.cause) for t in status.tasks],
        "heartbeat_age": [t.seconds_since_heartbeat for t in status.tasks],
        "barriers": [(b.kind, b.name, b.instance, b.arrived) for b in open_barriers],
        "failure": status.failure,
        "kv": state.kv_dir(""),
        "doc_keys": sorted(doc),
    }


def call(run: Run, method: str, args: dict[str, Any]) -> object:
    state, now = run.state, run.now
    ref = run.ref(args)
    if method == "register":
        incarnation = run.fresh_incarnation(args)
        registration = Registration(
            protocol_version=args["version"], cluster=args["cluster"], task_id=args["task_id"],
            incarnation=incarnation, hostname=args["name"][:300], peer="ipv4:127.0.0.1:1",
            retry_secret=b"retry" + (incarnation % 2**88).to_bytes(11, "big"),  # a retry brings the same
        )  # fmt: skip
        member = state.register(registration, now=now)
        old = run.incarnations.get(member.task.task_id)
        if old is not None and old != member.task.incarnation:
            run.stale[member.task.task_id] = run.ref({"task_id": member.task.task_id, "incarnation": "live"})
        run.incarnations[member.task.task_id] = member.task.incarnation
        run.credentials[member.task.task_id] = member.task.credential
        return member
    if method == "registration_progress":
        return state.registration_progress(ref, now=now)
    if method == "heartbeat":
        return state.heartbeat(ref, now=now, service_incarnation=args["service_incarnation"])
    if method == "report_error":
        return state.report_error(ref, args["name"], now=now)
    if method == "disconnect":
        return state.disconnect(ref, now=now)
    if method == "poll_error":
        return state.poll_error(ref, now=now)
    if method in ("barrier_arrive", "gather_arrive"):
        if method == "barrier_arrive":
            barrier = state.barrier_arrive(ref, args["name"], args["timeout"], now=now)
        else:
            barrier = state.gather_arrive(ref, args["name"], args["value"], args["timeout"], now=now)
        run.barriers.append(barrier)
        return barrier
    if method in ("barrier_outcome", "gather_outcome"):
        kind = "barrier" if method == "barrier_outcome" else "gather"
        known = [b for b in run.barriers if b.kind == kind]
        if not known:
            return None
        barrier = known[args["pick"] % len(known)]
        return state.barrier_outcome(barrier, now=now) if kind == "barrier" else state.gather_outcome(barrier, now=now)
    if method == "withdraw":
        if not run.barriers:
            return None
        return state.withdraw(ref, run.barriers[args["pick"] % len(run.barriers)], now=now)
    if method == "rendezvous_progress":
        kind = "gather" if args["pick"] % 2 else "barrier"
        return state.rendezvous_progress(ref, args["name"], kind=kind, now=now)
    if method == "kv_set":
        return state.kv_set(args["name"], args["value"], allow_overwrite=args["overwrite"], now=now, caller=ref)
    if method == "kv_get":
        return state.kv_get(args["name"], started=now - args["step"], timeout=args["timeout"], now=now)
    if method == "kv_dir":
        return state.kv_dir(args["name"])
    assert method == "expire"
    return state.expire(now=now)


def late_heartbeat(before: dict[str, Any], after: dict[str, Any], method: str, ref: TaskRef, exc: Refused) -> bool:
    """The documented change on refusal: a heartbeat past its own timeout fails exactly its task."""
    if method != "heartbeat" or exc.reason is not Reason.CLUSTER_FAILED or not 0 <= ref.task_id < TASKS:
        return False
    changed = [i for i, (b, a) in enumerate(zip(before["tasks"], after["tasks"], strict=True)) if b != a]
    task = after["tasks"][ref.task_id]
    return (
        changed == [ref.task_id]
        and before["tasks"][ref.task_id][1] is TaskState.CONNECTED
        and task[1] is TaskState.FAILED
        and task[5].startswith("no heartbeat for ")
        and before["kv"] == after["kv"]
    )


def left_while_waiting(before: dict[str, Any], after: dict[str, Any], method: str, exc: Refused) -> bool:
    """The documented change on refusal: a withdrawal by a task that left since it arrived ends its instance."""
    if method != "withdraw" or exc.reason is not Reason.CLUSTER_FAILED or "left the cluster" not in exc.message:
        return False
    gone = [b for b in before["barriers"] if b not in after["barriers"]]
    rest_unchanged = {**before, "barriers": []} == {**after, "barriers": []}
    return len(gone) == 1 and rest_unchanged and len(after["barriers"]) == len(before["barriers"]) - 1


def drive(sequence: list[tuple[str, dict[str, Any]]], registered: bool = False) -> dict[str, int]:
    """Run ``sequence`` (after every task registered, if ``registered``), checking each call."""
    run = Run()
    for task_id in range(TASKS if registered else 0):
        member = run.state.register(
            Registration(
                protocol_version=PROTOCOL_VERSION, cluster=CLUSTER, task_id=task_id, incarnation=500 + task_id,
                hostname=f"h{task_id}", peer="p", retry_secret=b"r" * 16,
            ),
            now=run.now,
        )
        run.incarnations[task_id] = member.task.incarnation
        run.credentials[task_id] = member.task.credential
    outcomes = {"answered": 0, "refused": 0}
    for method, args in sequence:
        run.now += args["step"]
        before = snapshot(run.state, run.now)
        ref = run.ref(args)
        try:
            call(run, method, args)
        except Refused as exc:
            outcomes["refused"] += 1
            assert isinstance(exc.reason, Reason) and exc.message, (method, args)
            assert len(exc.message) < 4096, (method, exc.message[:200])  # bounded, whatever the input
            after = snapshot(run.state, run.now)
            if after != before:
                late = late_heartbeat(before, after, method, ref, exc)
                assert late or left_while_waiting(before, after, method, exc), (method, args, exc.message, before, after)
        else:
            outcomes["answered"] += 1
    return outcomes


sequences = st.lists(calls(), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequences, st.booleans())
def test_refused_calls_leave_the_service_unchanged(sequence: list[tuple[str, dict[str, Any]]], registered: bool) -> None:
    drive(sequence, registered)


@pytest.mark.slow
@pytest.mark.fuzz
@pytest.mark.timeout(900)  # 10,000 examples: minutes on a loaded 2-core machine
@settings(max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequences, st.booleans())
def test_refused_calls_leave_the_service_unchanged_10000_sequences(
    sequence: list[tuple[str, dict[str, Any]]], registered: bool
) -> None:
    drive(sequence, registered)


def test_the_fuzzer_reaches_both_answers_and_refusals() -> None:
    """A sanity check of the generator: a plain cluster's calls are answered, an impostor's refused."""
    base = {"step": 0.1, "name": "step", "timeout": 1.0, "value": b"v", "cluster": CLUSTER,
            "version": PROTOCOL_VERSION, "overwrite": False, "service_incarnation": 0, "pick": 0}  # fmt: skip
    sequence = [("register", {**base, "task_id": t, "incarnation": "live"}) for t in range(TASKS)]
    sequence += [("barrier_arrive", {**base, "task_id": t, "incarnation": "live"}) for t in range(TASKS)]
    sequence += [("barrier_outcome", {**base, "task_id": 0, "incarnation": "live"})]
    sequence += [("heartbeat", {**base, "task_id": 1, "incarnation": 999}), ("kv_set", {**base, "task_id": 0, "incarnation": "live", "name": ""})]
    sequence += [("register", {**base, "task_id": 2, "incarnation": 5, "cluster": "other"})]
    sequence += [("report_error", {**base, "task_id": 2, "incarnation": "borrowed"})]  # no credential
    assert drive(sequence) == {"answered": 7, "refused": 4}
