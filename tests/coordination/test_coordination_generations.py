"""Generations on the pure state machine: restart policy rejoin, per-generation barriers and key-value,
old-generation calls refused, the restart timeout, the restart limit, and reclaiming a task id."""

from __future__ import annotations

import pytest
from test_coordination_state import credential, new_state, refusal, register, registration

from tpuctl.coordination.state import CoordinationState
from tpuctl.coordination.values import BarrierId, Pending, Reason, Refused, RestartPolicy, TaskRef, TaskState

REJOIN = RestartPolicy(rejoin=True, timeout=30.0, max_restarts=2)


def formed(policy: RestartPolicy = REJOIN, tasks: int = 4, **overrides: object) -> tuple[CoordinationState, list[TaskRef]]:
    state = new_state(tasks, restart=policy, **overrides)
    refs = register(state, range(tasks))
    assert state.registration_waiting(refs[0], now=0.0) is None
    return state, refs


def rejoin(state: CoordinationState, ref: TaskRef, now: float) -> TaskRef:
    """A survivor re-registering: same incarnation and retry secret, the generation it was in."""
    return state.register(
        registration(ref.task_id, ref.incarnation, generation=ref.generation, previous_credential=ref.credential),
        now=now,
    ).task


def test_policy_fail_keeps_the_first_failure_final() -> None:
    state, refs = formed(RestartPolicy())
    state.report_error(refs[2], "disk on fire", now=1.0)
    assert state.generation == 1
    failure = state.poll_error(refs[0], now=1.0)
    assert failure is not None and not failure.rejoin and failure.generation == 1
    assert str(failure) == "task 2 (127.0.0.3) failed: reported an error: disk on fire"
    with pytest.raises(Refused) as excinfo:
        state.register(registration(2, 999), now=2.0)
    assert refusal(excinfo)[0] is Reason.CLUSTER_FAILED


def test_a_failure_ends_the_generation_and_every_wait_of_it_fails_at_once() -> None:
    state, refs = formed()
    step = state.barrier_arrive(refs[0], "step", 10.0, now=0.5)
    assert isinstance(state.barrier_outcome(step, now=0.5), Pending)
    state.expire(now=0.9)  # nobody late yet
    failures = state.expire(now=1.6)  # every task silent for 1.6 s > 1 s
    assert {f.task.task_id for f in failures} == {0, 1, 2, 3}
    assert state.generation == 2 and state.failure is None
    ended = state.poll_error(refs[1], now=1.6)  # a generation-1 watcher learns why it ended
    assert ended is not None and ended.rejoin and ended.generation == 1
    assert "generation 1 is over, the cluster re-forms as generation 2" in str(ended)
    assert state.take_wakeup().everyone
    with pytest.raises(Refused) as excinfo:
        state.barrier_outcome(step, now=1.6)
    reason, message = refusal(excinfo)
    assert reason is Reason.CLUSTER_FAILED and "generation 1 ended" in message


def test_old_generation_calls_are_refused_naming_both_generations() -> None:
    state, refs = formed()
    state.report_error(refs[3], "preempted", now=1.0)
    for call in (
        lambda: state.heartbeat(refs[0], now=1.1),
        lambda: state.barrier_arrive(refs[0], "step", 5.0, now=1.1),
        lambda: state.kv_set("k", b"v", allow_overwrite=False, now=1.1, caller=refs[0]),
        lambda: state.report_error(refs[0], "late", now=1.1),
        lambda: state.rendezvous_progress(refs[0], "step", now=1.1),
    ):
        with pytest.raises(Refused) as excinfo:
            call()
        reason, message = refusal(excinfo)
        assert reason is Reason.OLD_GENERATION
        assert "generation 1, the cluster is at generation 2" in message
        assert "task 3 (127.0.0.4) failed: reported an error: preempted" in message
    state.disconnect(refs[0], now=1.1)  # leaving an ended generation: nothing to do, nothing refused
    assert state.generation == 2


def test_survivors_rejoin_with_their_credential_and_the_failed_host_afresh() -> None:
    state, refs = formed()
    state.report_error(refs[2], "preempted", now=1.0)
    again = [rejoin(state, refs[t], 2.0) for t in (0, 1, 3)]
    assert all(r.generation == 2 for r in again)
    assert [r.credential for r in again] == [refs[t].credential for t in (0, 1, 3)]
    progress = state.registration_progress(again[0], now=2.0)
    assert progress.missing_count == 1 and progress.missing[0].task_id == 2
    assert progress.seconds_left == pytest.approx(29.0)
    # Nobody else may take a survivor's place while it has not re-registered yet, for the heartbeat timeout.
    state2, refs2 = formed()
    state2.heartbeat(refs2[1], now=0.9)
    state2.report_error(refs2[2], "x", now=1.0)
    with pytest.raises(Refused) as excinfo:
        state2.register(registration(1, 4242), now=1.5)
    reason, message = refusal(excinfo)
    assert reason is Reason.TASK_TAKEN and "for 0.4 s more" in message
    # The failed host's new process registers with a new incarnation and gets a new credential.
    new = state.register(registration(2, 5555), now=3.0).task
    assert new.generation == 2 and new.credential == credential(2, 5555)
    assert state.registration_waiting(new, now=3.0) is None
    assert state.status(now=3.0).generation == 2 and not state.status(now=3.0).forming


def test_barriers_gathers_and_key_value_are_per_generation() -> None:
    state, refs = formed()
    for ref in refs:
        state.kv_set(f"k{ref.task_id}", b"gen1", allow_overwrite=False, now=0.1, caller=ref)
        state.barrier_arrive(ref, "step", 5.0, now=0.1)
    assert state.kv_dir("k") == [(f"k{t}", b"gen1") for t in range(4)]
    state.report_error(refs[1], "gone", now=1.0)
    again = [rejoin(state, refs[t], 1.5) for t in (0, 2, 3)] + [state.register(registration(1, 77), now=1.5).task]
    assert state.kv_dir("k") == []  # a new generation starts with an empty store
    assert isinstance(state.kv_get("k0", started=1.5, timeout=1.0, now=1.5), Pending)  # not generation 1's
    with pytest.raises(Refused) as excinfo:
        state.kv_get("k0", started=1.5, timeout=1.0, now=1.5, generation=1)
    assert refusal(excinfo)[0] is Reason.OLD_GENERATION
    first = state.barrier_arrive(again[0], "step", 5.0, now=1.6)
    assert first == BarrierId("step", 1, "barrier", 2)  # #1 again: counts start over
    for ref in again[1:]:
        state.barrier_arrive(ref, "step", 5.0, now=1.6)
    assert state.barrier_outcome(first, now=1.6) == 1


def test_a_generation_that_does_not_form_in_the_restart_timeout_fails_for_good() -> None:
    state, refs = formed()
    state.report_error(refs[2], "preempted", now=1.0)
    survivors = [rejoin(state, refs[t], 2.0) for t in (0, 1, 3)]
    assert state.registration_waiting(survivors[0], now=30.9) == pytest.approx(0.1)
    state.expire(now=31.0)  # the watchdog: 30 s after generation 2 started
    failure = state.failure
    assert failure is not None and not failure.rejoin and failure.generation == 2
    text = str(failure)
    assert "task 2 (127.0.0.3) failed: did not rejoin generation 2 within the restart timeout (30 s)" in text
    assert "generation 1 ended: task 2 (127.0.0.3) failed: reported an error: preempted" in text
    with pytest.raises(Refused) as excinfo:
        state.registration_waiting(survivors[0], now=31.0)
    assert refusal(excinfo)[0] is Reason.CLUSTER_FAILED
    with pytest.raises(Refused):
        state.register(registration(2, 888), now=31.5)


def test_restarts_run_out_after_max_then_the_failure_is_final() -> None:
    state, refs = formed()
    now = 0.0
    for generation in (1, 2):
        now += 1.0
        state.report_error(refs[2], f"crash {generation}", now=now)
        refs = [rejoin(state, refs[t], now) if t != 2 else state.register(registration(2, 50 + generation), now=now).task
                for t in range(4)]  # fmt: skip
        assert state.generation == generation + 1
    state.report_error(refs[2], "crash 3", now=now + 1)
    failure = state.failure
    assert failure is not None and not failure.rejoin and failure.generation == 3
    text = str(failure)
    assert "crash 3" in text and "generation 1 ended" in text and "generation 2 ended" in text
    assert "no restarts left (2 of 2 used)" in text
    assert state.generations.restarts == 2


def test_a_registrant_that_fails_while_its_generation_forms_is_only_missing_again() -> None:
    state = new_state(4, restart=REJOIN)
    refs = register(state, range(3))
    state.report_error(refs[1], "died before the others came", now=0.5)
    assert state.generation == 1 and state.failure is None
    progress = state.registration_progress(refs[0], now=0.5)
    assert [t.task_id for t in progress.missing] == [1, 3]
    state.register(registration(1, 31), now=0.6)
    state.register(registration(3), now=0.6)
    assert state.registration_waiting(refs[0], now=0.6) is None


@pytest.mark.parametrize("path", ["heartbeat", "expire"])
def test_a_registrant_dropped_while_its_generation_forms_is_told_so_and_takes_its_place_again(path: str) -> None:
    """Soak seeds 30019, 30042: a host frozen for the heartbeat timeout right after it registered into a
    generation that was still forming. Its own calls must say it was dropped (its agent registers again),
    not that it "was declared failed" (a final word) or "has not registered"; the same process registering
    again makes the generation form."""
    state = new_state(4, restart=REJOIN)
    refs = register(state, range(3))
    for ref in refs[:2]:
        state.heartbeat(ref, now=0.8)
    if path == "expire":
        state.expire(now=1.5)
    with pytest.raises(Refused) as excinfo:
        state.heartbeat(refs[2], now=1.5)
    reason, message = refusal(excinfo)
    assert reason is Reason.NOT_CONNECTED, message
    assert message.startswith("task 2 (127.0.0.3) was dropped from generation 1 while it formed: no heartbeat for ")
    with pytest.raises(Refused) as excinfo:
        state.poll_error(refs[2], now=1.6)
    assert refusal(excinfo) == (Reason.NOT_CONNECTED, message)
    assert state.generation == 1 and state.failure is None
    again = state.register(registration(2, generation=1, previous_credential=refs[2].credential), now=1.7).task
    state.register(registration(3), now=1.8)
    assert again.generation == 1 and state.registration_waiting(again, now=1.8) is None


@pytest.mark.parametrize("policy", [RestartPolicy(), REJOIN], ids=["fail", "rejoin"])
def test_a_new_process_with_the_credential_reclaims_its_task_at_once(policy: RestartPolicy) -> None:
    state, refs = formed(policy)
    dead = refs[2]
    # A stranger without the credential is still refused as another live process.
    with pytest.raises(Refused) as excinfo:
        state.register(registration(2, 4444), now=0.2)
    assert refusal(excinfo)[0] is Reason.TASK_TAKEN
    fresh = registration(2, 9999, previous_credential=dead.credential, generation=1)
    if not policy.rejoin:
        with pytest.raises(Refused) as excinfo:
            state.register(fresh, now=0.3)
        reason, message = refusal(excinfo)
        assert reason is Reason.CLUSTER_FAILED
        assert "task 2 (127.0.0.3) failed: restarted: a new process on host-2 replaced its registration" in message
        failure = state.poll_error(refs[0], now=0.3)
        assert failure is not None and "restarted" in str(failure)
        return
    new = state.register(fresh, now=0.3).task
    assert new.generation == 2 and state.generation == 2
    ended = state.generations.ended(1)
    assert ended is not None and "restarted" in str(ended)
    assert state.status(now=0.3).tasks[2].state is TaskState.CONNECTED


def test_a_restarted_coordinator_starts_above_the_last_generation() -> None:
    state = new_state(2, restart=REJOIN, first_generation=3)
    ref = state.register(registration(0), now=0.0).task
    assert ref.generation == 3 and state.generations.restarts == 2
    with pytest.raises(Refused) as excinfo:
        state.poll_error(TaskRef(1, 1001, b"x", 2), now=0.0)  # a worker still in generation 2
    reason, message = refusal(excinfo)
    assert reason is Reason.OLD_GENERATION and "it restarted" in message
    state.register(registration(1, generation=2), now=0.1)
    assert state.registration_waiting(ref, now=0.1) is None
    state.report_error(ref, "x", now=1.0)  # restarts already used: 2 of 2
    assert state.failure is not None and "generations 1 to 2 ended before this coordinator started" in str(
        state.failure
    )


def test_a_fresh_service_continues_above_a_generation_a_host_remembers() -> None:
    state = new_state(2, restart=REJOIN)
    ref = state.register(registration(1, generation=3), now=0.0).task
    assert ref.generation == 4 and state.generation == 4
    assert state.register(registration(0), now=0.0).task.generation == 4


def test_a_new_service_continues_above_a_generation_a_host_remembers_even_after_task_0_registered() -> None:
    """Task 0 stopped (``tpuctl down`` on it alone) and started again: its own registration comes first, at
    generation 1; task 1, which stayed, remembers generation 2. The service continues at 3 (no host's
    generation goes back); task 0's call of generation 1 is refused naming why, and its process registers
    again, keeping its place and credential."""
    state = new_state(2, restart=REJOIN)
    first = state.register(registration(0), now=0.0).task
    assert first.generation == 1
    assert state.register(registration(1, generation=2), now=0.1).task.generation == 3
    assert state.generation == 3 and state.generations.first == 3
    assert state.take_wakeup().everyone  # task 0's parked wait is refused at once
    with pytest.raises(Refused) as excinfo:
        state.registration_waiting(first, now=0.2)
    reason, message = refusal(excinfo)
    assert reason is Reason.OLD_GENERATION
    assert "generation 1 gave way to generation 3 before it formed: a host remembered generation 2" in message
    again = state.register(registration(0, generation=1), now=0.3).task
    assert again.generation == 3 and again.credential == first.credential
    assert state.registration_waiting(again, now=0.3) is None
    assert state.generation == 3


def test_a_remembered_generation_beyond_the_restart_limit_is_not_continued() -> None:
    """REJOIN allows 2 restarts: generation 3 is the last one a cluster can reach. A claim of 10**9 (a
    stranger on an auth-none port, a stale file) would make the first failure final."""
    state = new_state(2, restart=REJOIN)
    ref = state.register(registration(1, generation=10**9), now=0.0).task
    assert ref.generation == 1 and state.generation == 1 and state.generations.restarts == 0


def test_a_survivor_silent_for_the_heartbeat_timeout_while_re_forming_frees_its_place() -> None:
    """Two hosts lost 0.5 s apart (heartbeat timeout 1 s): the first ends generation 1, the second is still
    a survivor then. Once silent for the timeout its place is free, a new process (a replaced VM, no
    credential) takes it, and its death is named in what ended generation 1."""
    state, refs = formed()
    for t in (0, 1, 3):
        state.heartbeat(refs[t], now=0.5)  # task 2 is silent from 0.0 on, task 3 from 0.5 on
    assert [f.task.task_id for f in state.expire(now=1.05)] == [2]  # generation 1 ends
    assert state.generation == 2
    again = [rejoin(state, refs[t], 1.1) for t in (0, 1)]
    assert state.expire(now=1.4) == ()  # task 3 silent 0.9 s: still held
    with pytest.raises(Refused) as excinfo:
        state.register(registration(3, 7777), now=1.4)
    reason, message = refusal(excinfo)
    assert reason is Reason.TASK_TAKEN and "for 0.1 s more" in message
    assert "retry `tpuctl init` for task 3 after 0.1 s" in (excinfo.value.hint or "")
    state.expire(now=1.6)  # silent 1.1 s: released
    assert state.generation == 2 and state.failure is None  # still re-forming, not failed
    new = state.register(registration(3, 7777), now=1.7).task
    assert new.generation == 2 and new.credential == credential(3, 7777)
    ended = state.generations.ended(1)
    assert ended is not None and ended.total == 2 and [f.task.task_id for f in ended.failures] == [2, 3]
    assert "no heartbeat for 1.1 s (timeout 1 s), while generation 2 formed" in str(ended)
    # the old process of task 3, if it was alive after all, finds its place taken
    with pytest.raises(Refused) as excinfo:
        rejoin(state, refs[3], 1.8)
    assert refusal(excinfo)[0] is Reason.TASK_TAKEN
    state.register(registration(2, 5555), now=1.9)
    assert state.registration_waiting(again[0], now=1.9) is None


def test_a_fresh_registration_frees_a_silent_survivors_place_without_waiting_for_expire() -> None:
    state, refs = formed()
    state.report_error(refs[2], "preempted", now=0.5)  # generation 1 ends; task 3 last heard at 0.0
    new = state.register(registration(3, 8888), now=1.2).task  # no expire ran since: decided on the spot
    assert new.generation == 2 and new.credential == credential(3, 8888)
    ended = state.generations.ended(1)
    assert ended is not None and "task 3 (127.0.0.4): no heartbeat for 1.2 s" in str(ended)


def test_a_released_survivor_that_never_returns_is_named_at_the_restart_timeout() -> None:
    state, refs = formed(RestartPolicy(rejoin=True, timeout=5.0, max_restarts=2))
    state.heartbeat(refs[3], now=0.3)
    for t in (0, 1):
        state.heartbeat(refs[t], now=0.8)
    state.expire(now=1.05)  # task 2 fails (silent 1.05 s); generation 1 ends, 3 is a survivor
    for t in (0, 1):
        rejoin(state, refs[t], 1.1)
    state.expire(now=1.4)  # task 3 silent 1.1 s: released
    state.expire(now=6.1)  # the restart timeout
    failure = state.failure
    assert failure is not None and {f.task.task_id for f in failure.failures} == {2, 3}
    assert "generation 1 ended: 2 tasks failed" in failure.earlier and "while generation 2 formed" in failure.earlier


def test_a_shutdown_after_a_restart_is_a_shutdown_of_its_generation_and_the_old_failure_is_history() -> None:
    """Issue 24 item 2: after a rejoin, `tpuctl down --all` is named as the shutdown of generation 2; what
    ended generation 1 is labelled history, and no task row of generation 2 carries generation 1's cause."""
    state, refs = formed()
    state.report_error(refs[2], "preempted", now=1.0)
    assert state.generation == 2
    waiting = {t.task.task_id: t for t in state.status(now=1.5).tasks}
    assert waiting[2].state is TaskState.WAITING and waiting[2].cause == ""  # generation 1's cause is history
    again = [rejoin(state, refs[t], 2.0) for t in (0, 1, 3)]
    state.register(registration(2, 5555), now=2.5)
    assert state.registration_waiting(again[0], now=2.5) is None  # generation 2 formed
    state.report_error(again[0], "tpuctl down --all", now=3.0, shutdown=True)
    failure = state.failure
    assert failure is not None and failure.shutdown and failure.generation == 2
    assert str(failure) == (
        "task 0 (127.0.0.1) shut the cluster down: tpuctl down --all (in generation 2; earlier: generation 1 ended: "
        "task 2 (127.0.0.3) failed: reported an error: preempted)"
    )
    rows = {t.task.task_id: t for t in state.status(now=3.0).tasks}
    assert rows[2].state is TaskState.CONNECTED and rows[2].cause == ""
    assert state.status(now=3.0).ended == (
        "generation 1: task 2 (127.0.0.3) failed: reported an error: preempted; generation 1 is over, the cluster "
        "re-forms as generation 2",
    )


def test_a_host_that_lost_a_frozen_coordinator_and_registers_again_ends_the_formed_generation() -> None:
    """The coordinator froze (SIGSTOP, a stalled VM) longer than the heartbeat timeout, then resumed: its
    own clock saw nobody late, but a worker gave its generation up ("the coordinator stopped answering"),
    stopped its job, removed its mapping and registers again, the same process, naming the generation it
    left. That is no retry of a registration: the generation ends (naming the host and why) and the next
    one forms, every host's core-ID merge with it (found by the soak, seed 138: the worker was taken back
    into generation 1 and waited in a merge the others had finished, until the barrier timeout)."""
    state, refs = formed()
    assert rejoin(state, refs[2], 0.5) == refs[2]  # before any barrier of the generation: a retry, as before
    assert state.generation == 1
    for ref in refs:  # every host's core-ID merge (a gather) and final barrier: generation 1 is up everywhere
        state.barrier_arrive(ref, "merged", 10.0, now=1.0)
    again = rejoin(state, refs[2], 5.0)
    assert state.generation == 2 and again.generation == 2
    ended = state.generations.ended(1)
    assert ended is not None and [f.task.task_id for f in ended.failures] == [2]
    assert "task 2 (127.0.0.3) failed: left generation 1: it lost contact with the coordinator, task 0 (127.0.0.1)" in str(ended)
    for t in (0, 1, 3):
        assert rejoin(state, refs[t], 5.1).generation == 2
    assert state.registration_waiting(again, now=5.1) is None  # generation 2 formed: a merge for everyone
    # A retry of a registration into a generation (the answer lost) stays a retry.
    assert rejoin(state, refs[1], 5.2) == rejoin(state, refs[1], 5.3)
    assert state.generation == 2


def test_a_successors_service_names_its_own_task_as_the_coordinator() -> None:
    """Task 2 took the service over after task 0's host was lost (``coordinator.successors``): it starts
    at the next generation, the survivors register with the generation they left, and its messages name
    task 2, not task 0, as the coordinator."""
    state = new_state(4, restart=REJOIN, first_generation=2, coordinator_task=2)
    refs = [state.register(registration(t, 100 + t, generation=1), now=0.0).task for t in range(4)]
    assert state.generation == 2 and all(r.generation == 2 for r in refs)
    assert state.registration_waiting(refs[0], now=0.0) is None
    assert "generation 1 ended before this coordinator started (task 2 took the service over)" in (
        state.generations.earlier()
    )
    for ref in refs:
        state.barrier_arrive(ref, "merged", 10.0, now=1.0)
    rejoin(state, refs[1], 5.0)  # task 1 lost contact with task 2's service and came back
    ended = state.generations.ended(2)
    assert ended is not None
    assert "left generation 2: it lost contact with the coordinator, task 2 (127.0.0.3)" in str(ended)
