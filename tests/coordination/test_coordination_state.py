"""The pure coordination state machine, driven with explicit times (no clock, no grpc, no asyncio)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from coordination_harness import make_config
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuctl.coordination.state import CoordinationState
from tpuctl.coordination.values import (
    PROTOCOL_VERSION,
    REGISTRATION,
    BarrierId,
    Pending,
    Reason,
    Refused,
    Registration,
    ServiceConfig,
    TaskInfo,
    TaskRef,
    TaskState,
    Wakeup,
    barrier_key,
    fingerprint,
    kv_key,
)
from tpuctl.errors import InputError


def retry_secret(incarnation: int) -> bytes:
    """A registering process's retry secret (one per incarnation: a retry brings the same)."""
    return b"retry" + (incarnation % 2**88).to_bytes(11, "big")


def new_state(tasks: int = 4, **overrides: object) -> CoordinationState:
    return CoordinationState(make_config(tasks, **overrides), service_incarnation=77)


def registration(task_id: int, incarnation: int | None = None, **overrides: object) -> Registration:
    fields: dict[str, object] = {
        "protocol_version": PROTOCOL_VERSION,
        "cluster": "test",
        "task_id": task_id,
        "incarnation": 1000 + task_id if incarnation is None else incarnation,
        "hostname": f"host-{task_id}",
        "peer": f"ipv4:127.0.0.1:{5000 + task_id}",
    }
    fields["credential"] = credential(task_id, int(fields["incarnation"]))  # type: ignore[call-overload]
    fields["retry_secret"] = retry_secret(int(fields["incarnation"]))  # type: ignore[call-overload]
    fields.update(overrides)
    return Registration(**fields)  # type: ignore[arg-type]


def credential(task_id: int, incarnation: int) -> bytes:
    """A fixed credential per registration (the service generates random ones at its edge)."""
    return f"credential-{task_id}-{incarnation}".encode().ljust(32, b".")


def register(state: CoordinationState, task_ids: range | list[int], now: float = 0.0) -> list[TaskRef]:
    return [state.register(registration(i), now=now).task for i in task_ids]


def refusal(excinfo: pytest.ExceptionInfo[Refused]) -> tuple[Reason, str]:
    return excinfo.value.reason, excinfo.value.message


# --- config --------------------------------------------------------------------------------------------


def test_config_lists_every_problem() -> None:
    with pytest.raises(InputError) as excinfo:
        ServiceConfig(cluster="", tasks=(), heartbeat_timeout=0.0, barrier_timeout=float("nan"))
    message = str(excinfo.value)
    assert "cluster name is empty" in message
    assert "the cluster has no tasks" in message
    assert "heartbeat_timeout must be a positive number of seconds, got 0.0" in message
    assert "barrier_timeout must be a positive number of seconds, got nan" in message


def test_config_repr_hides_the_token() -> None:
    assert "s3cret" not in repr(make_config(token="s3cret"))


# --- registration --------------------------------------------------------------------------------------


def test_registration_progress_names_the_missing_hosts() -> None:
    state = new_state()
    t0, t1 = register(state, [0, 1], now=10.0)
    progress = state.registration_progress(t0, now=11.0)
    assert progress.missing == (TaskInfo(2, "127.0.0.3"), TaskInfo(3, "127.0.0.4"))
    assert (progress.registered, progress.total, progress.seconds_left) == (2, 4, 4.0)
    assert progress.describe() == "waiting for 2 of 4 hosts: task 2 (127.0.0.3), task 3 (127.0.0.4)"
    assert progress.describe_wait(1.4) == (  # as a barrier's wait reads (issue 24)
        "waiting 1 s for 2 of 4 hosts: task 2 (127.0.0.3), task 3 (127.0.0.4) (registration times out in 4 s)"
    )
    register(state, [2, 3], now=12.0)
    done = state.registration_progress(t1, now=12.0)
    assert done.complete and done.registered == 4
    assert done.describe() == "all 4 hosts registered"


def test_only_the_last_registration_wakes_the_waiters() -> None:
    state = new_state()
    state.take_wakeup()
    for task_id in range(3):
        register(state, [task_id])
        assert state.take_wakeup() == Wakeup()  # no storm: waiters sleep until the last one
    register(state, [3])
    assert state.take_wakeup() == Wakeup(frozenset({REGISTRATION}))
    assert state.take_wakeup() == Wakeup()


def test_membership_tells_the_task_about_the_cluster() -> None:
    member = new_state(2).register(registration(1), now=0.0)
    assert member.task == TaskRef(1, 1001, credential(1, 1001))
    assert member.service_incarnation == 77
    assert member.tasks == (TaskInfo(0, "127.0.0.1"), TaskInfo(1, "127.0.0.2"))
    assert member.num_tasks == 2
    assert (member.heartbeat_timeout, member.barrier_timeout) == (1.0, 5.0)


def test_wrong_cluster_names_both_clusters() -> None:
    with pytest.raises(Refused) as excinfo:
        new_state().register(registration(0, cluster="prod"), now=0.0)
    assert refusal(excinfo) == (
        Reason.WRONG_CLUSTER,
        "cluster name mismatch: the registering host is in cluster 'prod', this coordinator serves cluster 'test'",
    )


def test_protocol_version_mismatch_is_refused_first() -> None:
    with pytest.raises(Refused) as excinfo:
        new_state().register(registration(9, protocol_version=PROTOCOL_VERSION + 1, cluster="other"), now=0.0)
    assert excinfo.value.reason is Reason.VERSION_MISMATCH
    assert (
        f"the client speaks tpuctl coordination protocol v{PROTOCOL_VERSION + 1}, "
        f"this coordinator speaks v{PROTOCOL_VERSION}"
    ) in excinfo.value.message
    assert excinfo.value.hint == "run the same tpuctl version on every host"


@pytest.mark.parametrize("task_id", [-1, 4, 1000])
def test_unknown_task_id(task_id: int) -> None:
    with pytest.raises(Refused) as excinfo:
        new_state().register(registration(task_id), now=0.0)
    assert refusal(excinfo) == (Reason.UNKNOWN_TASK, f"unknown task id {task_id}: cluster 'test' has tasks 0..3")


def test_incarnation_zero_is_refused() -> None:
    with pytest.raises(Refused) as excinfo:
        new_state().register(registration(0, incarnation=0), now=0.0)
    assert excinfo.value.reason is Reason.INVALID


def test_same_incarnation_registering_again_is_idempotent() -> None:
    state = new_state()
    first = state.register(registration(1), now=0.0)
    again = state.register(registration(1, peer="ipv4:127.0.0.1:6000"), now=0.5)
    assert again == first
    assert state.status(now=0.5).tasks[1].seconds_since_heartbeat == 0.0  # the retry counted as proof of life


def test_second_live_process_for_a_task_is_refused_with_the_first_ones_identity() -> None:
    state = new_state()
    state.register(registration(1, incarnation=111), now=0.0)
    with pytest.raises(Refused) as excinfo:
        state.register(registration(1, incarnation=222, hostname="other"), now=0.5)
    assert refusal(excinfo) == (
        Reason.TASK_TAKEN,
        "task 1 is already registered by another live process, connected from 127.0.0.1:5001 (as the coordinator "
        f"saw it), calling itself 'host-1' (unchecked), fingerprint {fingerprint(credential(1, 111))}",
    )
    assert state.status(now=0.5).tasks[1].incarnation == 111


def test_a_task_id_taken_by_a_stranger_is_reported_as_observed_not_as_claimed() -> None:
    # issue 24: a stranger (auth none) registering as task 1 under a host name of its choosing was reported by
    # that name ("is tpuctl init already running on host-1?"), and its death was blamed on the spec's host.
    state = new_state(heartbeat_timeout=1.0)
    refs = register(state, [0, 2, 3], now=0.0)
    stranger = registration(1, incarnation=666, hostname="host-1", peer="ipv4:10.9.9.9:40000")
    state.register(stranger, now=0.0)
    with pytest.raises(Refused) as taken:
        state.register(registration(1, incarnation=111), now=0.5)  # the real host 1
    assert refusal(taken) == (
        Reason.TASK_TAKEN,
        "task 1 is already registered by another live process, connected from 10.9.9.9:40000 (as the coordinator "
        f"saw it), calling itself 'host-1' (unchecked), fingerprint {fingerprint(credential(1, 666))}",
    )
    assert taken.value.hint == (
        "is `tpuctl init` for task 1 already running at 10.9.9.9? If not, something else took the task id; with "
        "auth none any process that reaches the coordinator may take a task id: set auth.token_file in the spec; "
        "else check this host's task id"
    )
    for ref in refs:
        state.heartbeat(ref, now=0.9)
    state.expire(now=1.5)  # the stranger falls silent: the process that failed is named as seen
    assert str(state.failure) == (
        "task 1 (127.0.0.2) failed: no heartbeat for 1.5 s (timeout 1 s) (its registration came from "
        "10.9.9.9:40000, as the coordinator saw it, not from 127.0.0.2)"
    )


def test_a_registration_from_the_tasks_own_address_adds_nothing_to_its_cause() -> None:
    from tpuctl.coordination.tasks import TaskRecord, elsewhere

    def record(address: str, peer: str) -> TaskRecord:
        return TaskRecord(TaskInfo(1, address), peer=peer)

    assert elsewhere(record("10.0.0.3", "ipv4:10.0.0.3:5000")) == ""
    assert elsewhere(record("127.0.0.3", "ipv4:127.0.0.1:5000")) == ""  # one machine: simulated hosts
    assert elsewhere(record("::ffff:10.0.0.3", "ipv6:[::ffff:10.0.0.3]:5000")) == ""
    assert elsewhere(record("10.0.0.3", "ipv6:%5B::ffff:10.0.0.3%5D:5000")) == ""  # IPv4 mapped into IPv6
    assert elsewhere(record("host-1.example", "ipv4:10.0.0.9:5000")) == ""  # a name: not told apart without DNS
    assert elsewhere(record("10.0.0.3", "")) == ""  # never registered
    assert elsewhere(record("fd00::3", "ipv6:[fd00::9]:5000")) == (
        " (its registration came from [fd00::9]:5000, as the coordinator saw it, not from fd00::3)"
    )


def test_registration_deadline_runs_from_the_first_registration_and_lists_every_missing_host() -> None:
    state = new_state(register_timeout=5.0)
    (t0,) = register(state, [0], now=100.0)  # the service may have been up long before: irrelevant
    register(state, [1], now=101.0)
    assert isinstance(state.registration_progress(t0, now=104.9).seconds_left, float)
    expected = (
        Reason.TIMED_OUT,
        "registration timed out after 5.0 s: 2 of 4 hosts registered; missing: task 2 (127.0.0.3), task 3 (127.0.0.4)",
    )
    with pytest.raises(Refused) as excinfo:
        state.registration_progress(t0, now=105.0)
    assert refusal(excinfo) == expected
    assert excinfo.value.hint == (  # the key to raise, and its value now (issue 24)
        "start `tpuctl init` on the missing hosts and check they reach the coordinator, or raise "
        "coordinator.register_timeout in the cluster spec (now 5s)"
    )
    with pytest.raises(Refused) as late:  # registration is closed: a late host hears the same
        state.register(registration(2), now=106.0)
    assert refusal(late) == expected
    assert state.failure is None  # a registration timeout is not a cluster error


# --- heartbeats and failures ---------------------------------------------------------------------------


def test_silent_task_is_declared_failed_with_its_cause() -> None:
    state = new_state(heartbeat_timeout=1.0)
    refs = register(state, range(4), now=0.0)
    for ref in refs[:3]:
        state.heartbeat(ref, now=0.9)
    assert state.expire(now=1.0) == ()  # silent for exactly the timeout: not yet
    state.take_wakeup()
    (failure,) = state.expire(now=1.5)
    assert (failure.task, failure.cause) == (TaskInfo(3, "127.0.0.4"), "no heartbeat for 1.5 s (timeout 1 s)")
    assert str(state.failure) == "task 3 (127.0.0.4) failed: no heartbeat for 1.5 s (timeout 1 s)"
    assert state.take_wakeup().everyone
    task3 = state.status(now=1.5).tasks[3]
    assert (task3.state, task3.cause) == (TaskState.FAILED, "no heartbeat for 1.5 s (timeout 1 s)")


def test_tasks_silent_together_fail_in_one_batch() -> None:
    state = new_state(heartbeat_timeout=1.0)
    register(state, range(4), now=0.0)
    assert len(state.expire(now=2.0)) == 4
    assert str(state.failure).startswith("4 tasks failed: task 0 (127.0.0.1): no heartbeat for 2.0 s")


def test_the_services_own_stalls_are_not_counted_as_a_tasks_silence() -> None:
    # A wave of calls kept the service busy: heartbeats waited in its backlog, not the tasks' fault.
    state = new_state(tasks=2, heartbeat_timeout=10.0)
    early, late = register(state, range(2), now=0.0)
    state.heartbeat(late, now=4.0)
    state.service_stalled(6.0)
    assert state.expire(now=12.0) == ()  # silent 12 s and 8 s, less the 6 s stall: 6 s and 2 s
    state.heartbeat(early, now=15.0)  # 15 - 6 = 9 s: in time
    state.service_stalled(0.0)
    assert state.expire(now=20.0) == ()
    (failure,) = state.expire(now=20.5)  # task 1: 20.5 - 4 - 6 = 10.5 s
    assert failure.cause == (
        "no heartbeat for 16.5 s (timeout 10 s; 6.0 s of it the coordinator itself was busy, not counted)"
    )
    assert state.status(now=20.5).tasks[0].state is TaskState.CONNECTED


def test_a_stall_before_a_heartbeat_does_not_extend_the_next_silence() -> None:
    state = new_state(tasks=1, heartbeat_timeout=1.0)
    (ref,) = register(state, [0], now=0.0)
    state.service_stalled(5.0)
    state.heartbeat(ref, now=5.5)  # heard from after the stall: the stall is behind it
    assert state.expire(now=6.4) == ()
    (failure,) = state.expire(now=6.6)
    assert failure.cause == "no heartbeat for 1.1 s (timeout 1 s)"


def test_a_late_heartbeat_fails_its_own_task() -> None:
    state = new_state(heartbeat_timeout=1.0)
    (ref,) = register(state, [0])
    with pytest.raises(Refused) as excinfo:
        state.heartbeat(ref, now=1.2)
    assert refusal(excinfo) == (
        Reason.CLUSTER_FAILED,
        "task 0 (127.0.0.1) was declared failed: no heartbeat for 1.2 s (timeout 1 s)",
    )
    assert state.failure is not None


def test_heartbeat_returns_the_service_incarnation() -> None:
    state = new_state()
    (ref,) = register(state, [0])
    assert state.heartbeat(ref, now=0.5) == 77


def test_heartbeat_with_a_stale_incarnation_is_aborted_naming_the_task() -> None:
    state = new_state()
    old = state.register(registration(2, incarnation=5), now=0.0).task
    state.disconnect(old, now=1.0)
    state.register(registration(2, incarnation=6), now=2.0)
    with pytest.raises(Refused) as excinfo:
        state.heartbeat(old, now=2.1)
    assert refusal(excinfo) == (
        Reason.STALE_INCARNATION,
        "task 2 (127.0.0.3): incarnation 5 is stale; the task is registered by another process (connected "
        "from 127.0.0.1:5002 (as the coordinator saw it), calling itself 'host-2' (unchecked), fingerprint "
        f"{fingerprint(credential(2, 6))})",
    )


def test_calls_before_registering_are_refused() -> None:
    with pytest.raises(Refused) as excinfo:
        new_state().heartbeat(TaskRef(1, 9), now=0.0)
    assert refusal(excinfo) == (Reason.NOT_CONNECTED, "task 1 (127.0.0.2) has not registered")


def test_reported_error_puts_the_cluster_in_error() -> None:
    state = new_state()
    refs = register(state, range(4))
    assert state.poll_error(refs[0], now=0.1) is None
    state.report_error(refs[2], "disk full", now=0.2)
    assert str(state.poll_error(refs[0], now=0.3)) == "task 2 (127.0.0.3) failed: reported an error: disk full"
    # The failed task itself may still poll: that is how a process learns it was declared failed.
    assert state.poll_error(refs[2], now=0.3) == state.failure
    state.disconnect(refs[2], now=0.4)  # and leave without an error; its failure stands
    assert state.status(now=0.4).tasks[2].state is TaskState.FAILED


def test_once_in_error_every_wait_fails_at_once_naming_the_failed_host() -> None:
    state = new_state(heartbeat_timeout=1.0)
    refs = register(state, range(4))
    for ref in refs[:3]:
        state.heartbeat(ref, now=0.8)
    pending = state.barrier_arrive(refs[0], "step", 10.0, now=0.9)
    state.expire(now=1.5)
    cause = "task 3 (127.0.0.4) failed: no heartbeat for 1.5 s (timeout 1 s)"
    with pytest.raises(Refused) as in_flight:
        state.barrier_outcome(pending, now=1.5)
    assert refusal(in_flight) == (Reason.CLUSTER_FAILED, f"barrier 'step' #1 failed: {cause}")
    with pytest.raises(Refused) as later:
        state.barrier_arrive(refs[1], "next", 10.0, now=1.6)
    assert refusal(later) == (Reason.CLUSTER_FAILED, f"barrier 'next' refused: the cluster is in error: {cause}")
    with pytest.raises(Refused) as kv:
        state.kv_get("missing", started=1.6, timeout=10.0, now=1.6)
    assert refusal(kv) == (Reason.CLUSTER_FAILED, f"waiting for key 'missing': the cluster is in error: {cause}")
    with pytest.raises(Refused) as joining:
        state.registration_progress(refs[0], now=1.6)
    assert joining.value.reason is Reason.CLUSTER_FAILED


def test_disconnect_is_not_an_error_but_fails_barriers_that_wait_for_the_task() -> None:
    state = new_state()
    refs = register(state, range(4))
    waiting = state.barrier_arrive(refs[0], "step", 10.0, now=1.0)
    state.disconnect(refs[3], now=2.0)
    state.disconnect(refs[3], now=2.1)  # a retry is fine
    assert state.failure is None
    assert state.status(now=2.0).tasks[3].state is TaskState.DISCONNECTED
    expected = (Reason.CLUSTER_FAILED, "barrier 'step' #1 cannot pass: task 3 (127.0.0.4) left the cluster: it disconnected (tpuctl down, or its agent stopped)")
    with pytest.raises(Refused) as in_flight:
        state.barrier_outcome(waiting, now=2.0)
    assert refusal(in_flight) == expected
    with pytest.raises(Refused) as later:  # refused at once: no instance can pass while task 3 is gone
        state.barrier_arrive(refs[1], "other", 10.0, now=3.0)
    assert later.value.message == "barrier 'other' #1 cannot pass: task 3 (127.0.0.4) left the cluster: it disconnected (tpuctl down, or its agent stopped)"
    with pytest.raises(Refused) as gone:
        state.heartbeat(refs[3], now=3.0)
    assert refusal(gone) == (Reason.NOT_CONNECTED, "task 3 (127.0.0.4) has disconnected")


# --- barriers ------------------------------------------------------------------------------------------


def test_barrier_counts_calls_per_name_and_task() -> None:
    state = new_state(3)
    t0, t1, t2 = register(state, range(3))
    first = state.barrier_arrive(t0, "step", 5.0, now=0.0)
    second = state.barrier_arrive(t0, "step", 5.0, now=0.1)  # task 0 runs ahead: joins instance 2
    other = state.barrier_arrive(t1, "other", 5.0, now=0.1)  # names count separately
    assert (first, second, other) == (BarrierId("step", 1), BarrierId("step", 2), BarrierId("other", 1))
    assert state.barrier_outcome(first, now=0.2) == Pending(5.0)
    state.barrier_arrive(t1, "step", 5.0, now=0.3)
    state.take_wakeup()
    assert state.barrier_arrive(t2, "step", 5.0, now=0.4) == first
    assert state.take_wakeup() == Wakeup(frozenset({barrier_key(first)}))
    assert state.barrier_outcome(first, now=0.5) == 1
    assert isinstance(state.barrier_outcome(second, now=0.5), Pending)


def test_barrier_timeout_lists_every_missing_host_and_is_not_a_cluster_error() -> None:
    state = new_state()
    t0, t1, t2, _ = register(state, range(4))
    barrier = state.barrier_arrive(t0, "step", 10.0, now=0.0)
    state.barrier_arrive(t1, "step", 100.0, now=5.0)  # the first arrival's timeout decides the deadline
    assert state.barrier_outcome(barrier, now=9.9) == Pending(10.0)
    expected = (
        Reason.TIMED_OUT,
        "barrier 'step' #1 timed out after 10.0 s: 2 of 4 hosts arrived; "
        "missing: task 2 (127.0.0.3), task 3 (127.0.0.4)",
    )
    with pytest.raises(Refused) as excinfo:
        state.barrier_outcome(barrier, now=10.0)
    assert refusal(excinfo) == expected
    assert state.failure is None
    assert excinfo.value.hint is not None and "a retry is safe" in excinfo.value.hint
    # A straggler's call does not join the instance that failed (it would hear itself named missing):
    # #1 is over for every host, and the straggler opens #2, where the others' next calls meet it.
    assert state.barrier_arrive(t2, "step", 10.0, now=11.0) == BarrierId("step", 2)
    assert state.barrier_outcome(BarrierId("step", 2), now=11.0) == Pending(21.0)
    with pytest.raises(Refused) as again:
        state.barrier_outcome(barrier, now=11.0)
    assert refusal(again) == expected  # #1's verdict stands for those who were in it


def test_barrier_timeout_zero_means_the_configured_default() -> None:
    state = new_state(barrier_timeout=7.0)
    (t0,) = register(state, [0])
    assert state.barrier_outcome(state.barrier_arrive(t0, "b", 0.0, now=1.0), now=1.0) == Pending(8.0)


@pytest.mark.parametrize(("name", "timeout"), [("", 1.0), ("b", -1.0), ("b", float("inf"))])
def test_barrier_arguments_are_checked(name: str, timeout: float) -> None:
    state = new_state()
    (t0,) = register(state, [0])
    with pytest.raises(Refused) as excinfo:
        state.barrier_arrive(t0, name, timeout, now=0.0)
    assert excinfo.value.reason is Reason.INVALID


@settings(max_examples=200, deadline=None)
@given(
    tasks=st.integers(min_value=1, max_value=5),
    calls=st.lists(st.integers(min_value=0, max_value=4), max_size=40),
)
def test_the_kth_instance_passes_exactly_when_every_task_made_k_calls(tasks: int, calls: list[int]) -> None:
    state = new_state(tasks)
    refs = register(state, range(tasks))
    made = [0] * tasks
    for task_id in (c % tasks for c in calls):
        joined = state.barrier_arrive(refs[task_id], "step", 60.0, now=0.0)
        made[task_id] += 1
        assert joined == BarrierId("step", made[task_id])
        for k in range(1, max(made) + 1):
            outcome = state.barrier_outcome(BarrierId("step", k), now=0.0)
            assert (outcome == k) == (min(made) >= k)
            assert isinstance(outcome, Pending) == (min(made) < k)


# --- key-value -----------------------------------------------------------------------------------------


def test_kv_set_get_and_overwrite() -> None:
    state = new_state()
    state.take_wakeup()
    state.kv_set("a/1", b"one", allow_overwrite=False, now=0.0)
    assert state.take_wakeup() == Wakeup(frozenset({kv_key("a/1")}))
    assert state.kv_get("a/1", started=0.0, timeout=0.0, now=0.0) == b"one"
    with pytest.raises(Refused) as excinfo:
        state.kv_set("a/1", b"uno", allow_overwrite=False, now=0.0)
    assert refusal(excinfo) == (Reason.KEY_EXISTS, "key 'a/1' already exists")
    state.kv_set("a/1", b"uno", allow_overwrite=True, now=0.0)
    assert state.kv_get("a/1", started=0.0, timeout=0.0, now=0.0) == b"uno"


def test_kv_get_waits_until_its_deadline_then_names_the_key() -> None:
    state = new_state()
    assert state.kv_get("later", started=1.0, timeout=2.0, now=1.5) == Pending(3.0)
    with pytest.raises(Refused) as excinfo:
        state.kv_get("later", started=1.0, timeout=2.0, now=3.0)
    assert refusal(excinfo) == (Reason.TIMED_OUT, "key 'later' was not set within 2.0 s")
    state.kv_set("later", b"", allow_overwrite=False, now=3.1)
    assert state.kv_get("later", started=1.0, timeout=2.0, now=3.2) == b""  # empty values are values


def test_kv_dir_is_a_sorted_prefix_scan() -> None:
    state = new_state()
    for key in ("cores/2", "cores/10", "cores/1", "corex", "other"):
        state.kv_set(key, key.encode(), allow_overwrite=False, now=0.0)
    assert state.kv_dir("cores/") == [("cores/1", b"cores/1"), ("cores/10", b"cores/10"), ("cores/2", b"cores/2")]
    assert [key for key, _ in state.kv_dir("")] == ["cores/1", "cores/10", "cores/2", "corex", "other"]


def test_empty_key_is_refused() -> None:
    with pytest.raises(Refused) as excinfo:
        new_state().kv_set("", b"x", allow_overwrite=False, now=0.0)
    assert excinfo.value.reason is Reason.INVALID


# --- status --------------------------------------------------------------------------------------------


def test_status_reports_every_task_by_the_service_clock() -> None:
    state = new_state(3, heartbeat_timeout=1.0)
    t0, _ = register(state, [0, 1], now=10.0)
    state.heartbeat(t0, now=10.5)
    state.expire(now=11.25)
    status = state.status(now=11.25)
    assert [(t.state, t.seconds_since_heartbeat) for t in status.tasks] == [
        (TaskState.CONNECTED, 0.75),
        (TaskState.FAILED, 1.25),
        (TaskState.WAITING, None),
    ]
    document = status.as_dict()
    assert document["service_incarnation"] == "77"
    assert "incarnation" not in document["tasks"][0]  # a task's own, never shown (status has its fingerprint)
    assert document["tasks"][0]["fingerprint"] == status.tasks[0].fingerprint and len(status.tasks[0].fingerprint) == 8
    assert document["tasks"][2] == {
        "task": 2,
        "address": "127.0.0.3",
        "state": "waiting",
        "fingerprint": None,
        "hostname": None,
        "peer": None,
        "heartbeat_age": None,
        "session_open": False,
        "cause": None,
        "role": "member",
        "rank": 2,
    }
    assert document["error"] == "task 1 (127.0.0.2) failed: no heartbeat for 1.2 s (timeout 1 s)"


def test_a_failure_wakes_every_parked_call() -> None:
    state = new_state()
    refs = register(state, range(4))
    state.take_wakeup()
    state.report_error(refs[0], "", now=0.0)
    assert state.take_wakeup().everyone
    assert str(state.failure) == "task 0 (127.0.0.1) failed: reported an error: no cause given"


def test_the_package_and_the_state_machine_import_neither_grpc_nor_asyncio() -> None:
    probe = (
        "import sys, tpuctl.coordination, tpuctl.coordination.state; "
        "print(sorted(m for m in ('grpc', 'asyncio', 'google.protobuf') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=True)
    assert result.stdout.strip() == "[]"


def test_status_lists_open_barriers_with_who_arrived_and_who_is_missing() -> None:
    state = new_state(4, barrier_timeout=30.0)
    refs = register(state, range(4))
    state.barrier_arrive(refs[2], "step", 0.0, now=1.0)
    state.barrier_arrive(refs[0], "step", 0.0, now=2.0)
    status = state.status(now=5.0)
    (barrier,) = status.barriers
    assert (barrier.name, barrier.instance, barrier.arrived, barrier.seconds_left) == ("step", 1, (0, 2), 26.0)
    assert [t.task_id for t in barrier.missing([s.task for s in status.tasks])] == [1, 3]
    assert status.as_dict()["barriers"] == [
        {"name": "step", "instance": 1, "arrived": [0, 2], "missing": [1, 3], "seconds_left": 26.0}
    ]
    for ref in (refs[1], refs[3]):
        state.barrier_arrive(ref, "step", 0.0, now=6.0)
    assert state.status(now=6.0).barriers == ()  # passed: no longer open


# --- who has heard the cluster's error ----------------------------------------------------------------


def test_untold_counts_the_hosts_that_have_not_heard_the_error_yet() -> None:
    """A host whose init fails keeps its service up until ``untold`` is 0: every other host answered the
    error (a refused registration, a registration wait, an error poll), failed, or left."""
    state = new_state(5, heartbeat_timeout=30.0)
    refs = register(state, [0, 1, 2, 3])  # task 4 still retrying to reach the coordinator
    assert state.untold() == (0, 0)  # no error: nothing to tell
    state.disconnect(refs[3], now=0.5)  # gone: nothing to tell it
    state.report_error(refs[0], "init failed on this host: read-only output", now=1.0)
    assert state.untold() == (2, 1)  # tasks 1 and 2, and task 4 (task 0 failed itself, task 3 left)
    with pytest.raises(Refused):
        state.registration_waiting(refs[1], now=1.1)  # parked in the registration wait: answered
    assert state.untold() == (1, 1)
    state.heartbeat(refs[2], now=1.2)  # a heartbeat does not carry the error
    assert state.untold() == (1, 1)
    assert state.poll_error(refs[2], now=1.3) is state.failure
    assert state.untold() == (0, 1)
    with pytest.raises(Refused) as excinfo:
        state.register(registration(4), now=1.4)
    assert refusal(excinfo)[1].startswith("cannot join: the cluster is in error: task 0 (127.0.0.1) failed")
    assert state.untold() == (0, 0)


def test_a_task_that_registers_again_after_leaving_must_hear_it_again() -> None:
    state = new_state(2, heartbeat_timeout=30.0)
    refs = register(state, [0, 1])
    state.disconnect(refs[1], now=0.5)
    again = state.register(registration(1, incarnation=5), now=0.6).task
    state.report_error(refs[0], "boom", now=0.7)
    assert state.untold() == (1, 0)  # the new registration of task 1 has not heard
    state.poll_error(again, now=0.8)
    assert state.untold() == (0, 0)
