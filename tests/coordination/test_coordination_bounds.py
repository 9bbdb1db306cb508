"""The state machine at pod scale: bounded samples, targeted wakeups, bounded messages, O(answer) work.

Pure (no grpc, no clock): 10,000-host clusters are cheap here. Work is asserted by counting
(``CoordinationState.counters``), never by timing.
"""

from __future__ import annotations

import pytest
from coordination_harness import MESSAGE_BOUND, make_config
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuctl.coordination.convert import MAX_DETAILS_WIRE, fit_text, status_details
from tpuctl.coordination.state import CoordinationState
from tpuctl.coordination.taskset import Missing
from tpuctl.coordination.values import (
    MAX_NAME_CHARS,
    PROTOCOL_VERSION,
    REGISTRATION,
    SAMPLE,
    BarrierId,
    ClusterFailure,
    Gathered,
    Pending,
    Reason,
    Refused,
    Registration,
    TaskFailure,
    TaskInfo,
    TaskRef,
    Wakeup,
    barrier_key,
)

BIG = 10_000


def new_state(tasks: int, **overrides: object) -> CoordinationState:
    return CoordinationState(make_config(tasks, **overrides), service_incarnation=77)


def join(state: CoordinationState, task_ids: range | list[int], now: float = 0.0) -> list[TaskRef]:
    refs = []
    for i in task_ids:
        registration = Registration(PROTOCOL_VERSION, "test", i, 1000 + i, f"host-{i}", f"ipv4:127.0.0.1:{i}", retry_secret=b"r" * 16)
        refs.append(state.register(registration, now=now).task)
    return refs


def wire_size(text: str) -> int:
    """Bytes of ``text`` as gRPC percent-encodes a status message."""
    return sum(1 if " " <= c <= "~" and c != "%" else 3 * len(c.encode()) for c in text)


# --- the missing set -----------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(n=st.integers(min_value=0, max_value=60), removals=st.lists(st.integers(min_value=0, max_value=59)))
def test_missing_set_matches_a_sorted_set(n: int, removals: list[int]) -> None:
    missing, model = Missing(n), set(range(n))
    for task_id in (r for r in removals if r < n):
        assert missing.discard(task_id) == (task_id in model)
        model.discard(task_id)
        assert len(missing) == len(model)
        assert missing.first(3) == sorted(model)[:3]
    assert list(missing) == sorted(model)
    assert all((i in missing) == (i in model) for i in range(n))


# --- registration --------------------------------------------------------------------------------------


def test_registration_progress_at_10000_hosts_is_counts_and_a_sample() -> None:
    state = new_state(BIG)
    refs = join(state, [0, 1, 2, 5, 9_999])
    before = state.counters.touched
    progress = state.registration_progress(refs[0], now=1.0)
    assert state.counters.touched - before <= SAMPLE + 1  # O(sample), not O(hosts)
    assert (progress.registered, progress.total, progress.missing_count) == (5, BIG, BIG - 5)
    assert [t.task_id for t in progress.missing] == [3, 4, 6, 7, 8, 9, 10, 11, 12, 13]
    assert progress.describe() == (
        "waiting for 9,995 of 10,000 hosts: task 3 (127.0.0.4), task 4 (127.0.0.5), task 6 (127.0.0.7), "
        "task 7 (127.0.0.8), task 8 (127.0.0.9), task 9 (127.0.0.10), task 10 (127.0.0.11), "
        "task 11 (127.0.0.12), task 12 (127.0.0.13), task 13 (127.0.0.14), ... and 9,985 more; "
        "`tpuctl status --json` lists all"
    )


def test_registration_wakes_nobody_until_the_last_host() -> None:
    state = new_state(1_000)
    join(state, range(999))
    assert state.take_wakeup() == Wakeup()
    join(state, [999])
    assert state.take_wakeup() == Wakeup(frozenset({REGISTRATION}))


def test_registration_timeout_with_9999_missing_is_one_bounded_message() -> None:
    state = new_state(BIG, register_timeout=5.0)
    (ref,) = join(state, [0])
    with pytest.raises(Refused) as excinfo:
        state.registration_progress(ref, now=5.0)
    message = excinfo.value.message
    assert excinfo.value.reason is Reason.TIMED_OUT
    assert message.startswith(
        "registration timed out after 5.0 s: 1 of 10,000 hosts registered; missing: task 1 (127.0.0.2), "
    )
    assert message.endswith("task 10 (127.0.0.11), ... and 9,989 more; `tpuctl status --json` lists all")
    assert len(message) < MESSAGE_BOUND
    touched = state.counters.touched
    for _ in range(100):  # every later waiter and registrant hears the same, built once
        with pytest.raises(Refused) as again:
            state.registration_progress(ref, now=6.0)
        assert again.value.message == message
    assert state.counters.touched == touched


# --- barriers and gathers ------------------------------------------------------------------------------


def test_barrier_timeout_with_9999_missing_is_bounded_and_costs_a_sample() -> None:
    state = new_state(BIG)
    (ref,) = join(state, [0])
    barrier = state.barrier_arrive(ref, "step", 2.0, now=0.0)
    before = state.counters.touched
    with pytest.raises(Refused) as excinfo:
        state.barrier_outcome(barrier, now=2.0)
    assert state.counters.touched - before <= SAMPLE + 1
    assert excinfo.value.message.startswith(
        "barrier 'step' #1 timed out after 2.0 s: 1 of 10,000 hosts arrived; missing: task 1 (127.0.0.2), "
    )
    assert excinfo.value.message.endswith(", ... and 9,989 more; `tpuctl status --json` lists all")
    assert len(excinfo.value.message) < MESSAGE_BOUND


def test_a_passing_barrier_wakes_only_its_own_key_once() -> None:
    state = new_state(1_000)
    refs = join(state, range(1_000))
    state.take_wakeup()
    for ref in refs[:-1]:
        state.barrier_arrive(ref, "step", 10.0, now=1.0)
        assert state.take_wakeup() == Wakeup()
    barrier = state.barrier_arrive(refs[-1], "step", 10.0, now=1.0)
    assert state.take_wakeup() == Wakeup(frozenset({barrier_key(barrier)}))


def test_disconnect_wakes_only_the_barriers_it_decides() -> None:
    state = new_state(100)
    refs = join(state, range(100))
    waiting = state.barrier_arrive(refs[0], "a", 10.0, now=1.0)
    state.barrier_arrive(refs[5], "b", 10.0, now=1.0)  # task 5 already arrived at "b": unaffected
    state.take_wakeup()
    state.disconnect(refs[5], now=2.0)
    assert state.take_wakeup() == Wakeup(frozenset({barrier_key(waiting)}))  # not everyone


@pytest.mark.parametrize("kind", ["barrier", "gather"])
def test_a_60000_character_name_is_refused_with_the_bound(kind: str) -> None:
    state = new_state(4)
    (ref,) = join(state, [0])
    name = "x" * 60_000
    with pytest.raises(Refused) as excinfo:
        if kind == "barrier":
            state.barrier_arrive(ref, name, 1.0, now=0.0)
        else:
            state.gather_arrive(ref, name, b"", 1.0, now=0.0)
    assert excinfo.value.reason is Reason.INVALID
    message = excinfo.value.message
    assert message.startswith(f"{kind} name is 60,000 characters long: 'xxxxxxxxxxxxxxxxxxxx'...")
    assert message.endswith(f"; at most {MAX_NAME_CHARS:,} characters are allowed")
    assert len(message) < 200
    state.barrier_arrive(ref, "y" * MAX_NAME_CHARS, 1.0, now=0.0)  # the bound itself is fine


def test_gather_assembles_once_and_every_caller_gets_the_same_table() -> None:
    state = new_state(1_000)
    refs = join(state, range(1_000))
    ids = [state.gather_arrive(ref, "cores", f"[{ref.task_id}]".encode(), 10.0, now=1.0) for ref in reversed(refs)]
    assert set(ids) == {BarrierId("cores", 1, "gather")}
    tables = [state.gather_outcome(i, now=1.5) for i in ids]
    first = tables[0]
    assert isinstance(first, Gathered)
    assert all(t is first for t in tables)  # one object: the servicer encodes it once
    assert first.values == tuple(f"[{i}]".encode() for i in range(1_000))
    # A barrier of the same name counts separately.
    assert state.barrier_arrive(refs[0], "cores", 10.0, now=2.0) == BarrierId("cores", 1)


def test_gather_work_is_linear_in_the_hosts() -> None:
    touched = []
    for hosts in (250, 1_000):
        state = new_state(hosts)
        refs = join(state, range(hosts))
        before = state.counters.touched
        ids = [state.gather_arrive(ref, "cores", b"[0, 1, 2, 3]", 10.0, now=1.0) for ref in refs]
        for i in ids:
            state.gather_outcome(i, now=1.0)
        touched.append((state.counters.touched - before) / hosts)
    assert touched[1] <= touched[0] * 1.5


def test_gather_value_limit_and_timeout_and_disconnect() -> None:
    state = new_state(4)
    refs = join(state, range(4))
    limit = state.gather_value_limit
    with pytest.raises(Refused) as big:
        state.gather_arrive(refs[0], "g", b"x" * (limit + 1), 1.0, now=0.0)
    assert big.value.reason is Reason.INVALID
    assert big.value.message == (
        f"gather 'g': this host's value is {limit + 1:,} bytes; at most {limit:,} bytes per host in a cluster "
        "of 4 hosts"
    )
    gather = state.gather_arrive(refs[0], "g", b"a", 1.0, now=0.0)
    assert state.gather_outcome(gather, now=0.5) == Pending(1.0)
    with pytest.raises(Refused) as late:
        state.gather_outcome(gather, now=1.0)
    assert late.value.message == (
        "gather 'g' #1 timed out after 1.0 s: 1 of 4 hosts published; "
        "missing: task 1 (127.0.0.2), task 2 (127.0.0.3), task 3 (127.0.0.4)"
    )
    second = state.gather_arrive(refs[1], "h", b"b", 10.0, now=2.0)
    state.disconnect(refs[3], now=3.0)
    with pytest.raises(Refused) as gone:
        state.gather_outcome(second, now=3.0)
    assert gone.value.message == "gather 'h' #1 cannot pass: task 3 (127.0.0.4) left the cluster: it disconnected (tpuctl down, or its agent stopped)"


def test_passed_instances_are_dropped_once_a_later_one_passes() -> None:
    state = new_state(3)
    refs = join(state, range(3))
    for round_ in range(1, 51):
        for ref in refs:
            state.barrier_arrive(ref, "step", 10.0, now=float(round_))
        assert state.barrier_outcome(BarrierId("step", round_), now=float(round_)) == round_
    assert len(state._rendezvous._instances) == 1  # memory stays O(1) per name
    assert state.barrier_outcome(BarrierId("step", 7), now=60.0) == 7  # a late question still gets its answer


def test_rendezvous_progress_is_a_sample_and_says_when_decided() -> None:
    state = new_state(BIG)
    refs = join(state, range(20))
    for ref in refs:
        state.barrier_arrive(ref, "step", 30.0, now=1.0)
    assert state.rendezvous_progress(refs[0], "other", now=2.0) is None
    before = state.counters.touched
    progress = state.rendezvous_progress(refs[3], "step", now=2.0)
    assert state.counters.touched - before <= SAMPLE + 1
    assert progress is not None and not progress.done
    assert (progress.instance, progress.arrived, progress.total, progress.missing_count) == (1, 20, BIG, BIG - 20)
    assert [t.task_id for t in progress.missing] == list(range(20, 30))
    assert progress.describe().startswith("20 of 10,000 hosts arrived; missing: task 20 (127.0.0.21), ")
    assert progress.describe().endswith(", ... and 9,970 more; `tpuctl status --json` lists all (times out in 29 s)")
    small = new_state(2)
    a, b = join(small, range(2))
    small.barrier_arrive(a, "s", 5.0, now=0.0)
    small.barrier_arrive(b, "s", 5.0, now=0.0)
    decided = small.rendezvous_progress(a, "s", now=0.0)
    assert decided is not None and decided.done


# --- heartbeats and failures ---------------------------------------------------------------------------


def test_expiry_visits_only_the_late_tasks() -> None:
    state = new_state(BIG, heartbeat_timeout=10.0)
    refs = join(state, range(BIG), now=0.0)
    for ref in refs:
        state.heartbeat(ref, now=5.0)
    before = state.counters.touched
    for tick in range(40):  # ten seconds of watchdog checks, four a second
        assert state.expire(now=5.0 + tick / 4) == ()
    assert state.counters.touched - before == 40  # one look each, not 10,000
    for ref in refs[1:]:
        state.heartbeat(ref, now=14.0)
    (failure,) = state.expire(now=15.5)  # task 0 went silent at 5.0
    assert failure.task == TaskInfo(0, "127.0.0.1")


def test_thousands_failing_at_once_make_one_bounded_error() -> None:
    state = new_state(BIG, heartbeat_timeout=1.0)
    join(state, range(BIG), now=0.0)
    assert len(state.expire(now=2.0)) == BIG
    failure = state.failure
    assert failure is not None and failure.total == BIG and len(failure.failures) == SAMPLE
    text = str(failure)
    assert text.startswith("10,000 tasks failed: task 0 (127.0.0.1): no heartbeat for 2.0 s (timeout 1 s); ")
    assert text.endswith("; ... and 9,990 more; `tpuctl status --json` lists all")
    assert len(text) < MESSAGE_BOUND


def test_client_text_is_clipped_where_it_is_kept() -> None:
    state = new_state(2)
    registration = Registration(PROTOCOL_VERSION, "test", 0, 5, "h" * 60_000, "ipv4:127.0.0.1:1", retry_secret=b"r" * 16)
    ref = state.register(registration, now=0.0).task
    assert len(state.status(now=0.0).tasks[0].hostname) < 300
    with pytest.raises(Refused) as wrong:
        state.register(Registration(PROTOCOL_VERSION, "c" * 60_000, 1, 6, "h", "p", retry_secret=b"r" * 16), now=0.0)
    assert len(wrong.value.message) < 400 and "(60,000 characters)" in wrong.value.message
    state.report_error(ref, "boom " * 20_000, now=0.0)
    assert len(str(state.failure)) < 1_200


def test_cluster_failure_text_for_one_and_many() -> None:
    one = ClusterFailure((TaskFailure(TaskInfo(3, "10.0.0.4"), "gone"),))
    assert str(one) == "task 3 (10.0.0.4) failed: gone"
    two = ClusterFailure((TaskFailure(TaskInfo(1, "a"), "x"), TaskFailure(TaskInfo(2, "b"), "y")))
    assert str(two) == "2 tasks failed: task 1 (a): x; task 2 (b): y"


# --- key-value -----------------------------------------------------------------------------------------


def test_kv_dir_visits_only_its_own_entries() -> None:
    state = new_state(2)
    for i in range(5_000):
        state.kv_set(f"noise/{i}", b"", allow_overwrite=False, now=0.0)
    for i in range(3):
        state.kv_set(f"cores/{i}", b"x", allow_overwrite=False, now=0.0)
    before = state.counters.touched
    assert [k for k, _ in state.kv_dir("cores/")] == ["cores/0", "cores/1", "cores/2"]
    assert state.counters.touched - before <= 4


def test_a_long_key_is_refused_and_quoted_short() -> None:
    state = new_state(2)
    with pytest.raises(Refused) as excinfo:
        state.kv_set("k" * 60_000, b"", allow_overwrite=False, now=0.0)
    assert excinfo.value.reason is Reason.INVALID and len(excinfo.value.message) < 200


# --- status texts on the wire --------------------------------------------------------------------------


@pytest.mark.parametrize("char", ["a", "%", "é", "\N{SNOWMAN}", "\n"])
def test_status_details_always_fit_the_trailers(char: str) -> None:
    details = status_details(char * 100_000)
    assert wire_size(details) <= MAX_DETAILS_WIRE
    assert details.endswith(" more characters cut]")
    assert status_details("short, plain") == "short, plain"
    assert fit_text("é" * 10, 20, percent=False) == "é" * 10  # 20 UTF-8 bytes: fits exactly
