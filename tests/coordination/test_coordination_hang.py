"""What a declared hang does to the coordination state (``on_hang``): the hosts behind fail with the hang
as their cause, which ends the generation (re-formed under restart policy rejoin) or, with ``fail``, the
cluster for good; nobody behind means every connected host; an erring cluster is left alone."""

from __future__ import annotations

import pytest
from coordination_harness import make_config
from test_coordination_state import registration

from tpuctl.coordination.state import CoordinationState
from tpuctl.coordination.values import RestartPolicy, TaskState

HANG = "cluster hung at step 9 for 10 min: task 2 (127.0.0.3) at 8; 3 hosts at 9"


def formed(rejoin: bool) -> CoordinationState:
    state = CoordinationState(make_config(4, restart=RestartPolicy(rejoin, 60.0, 3)), service_incarnation=7)
    for task in range(4):
        state.register(registration(task), now=1.0)
    assert state.registration_complete
    return state


@pytest.mark.parametrize("rejoin", [True, False])
def test_restart_fails_the_hosts_behind_and_ends_the_generation(rejoin: bool) -> None:
    state = formed(rejoin)
    failures = state.hung((2,), HANG, final=False, now=5.0)
    assert [(f.task.task_id, f.cause) for f in failures] == [(2, f"hung: {HANG}")]
    if rejoin:  # the next generation forms: every host registers again
        assert state.failure is None and state.generation == 2
        assert state.generations.ended(1) is not None and "hung: cluster hung at step 9" in str(state.generations.ended(1))
    else:
        assert state.failure is not None and "task 2 (127.0.0.3) failed: hung: cluster hung" in str(state.failure)


def test_fail_is_final_even_under_rejoin() -> None:
    state = formed(rejoin=True)
    state.hung((2,), HANG, final=True, now=5.0)
    assert state.failure is not None and not state.failure.rejoin and state.generation == 1


def test_with_nobody_behind_every_connected_host_fails() -> None:
    state = formed(rejoin=False)
    failures = state.hung((), "cluster hung at step 9 for 10 min: 4 hosts at 9", final=False, now=5.0)
    assert sorted(f.task.task_id for f in failures) == [0, 1, 2, 3]
    assert all(s.state is TaskState.FAILED for s in state.status(now=5.0).tasks)


def test_a_cluster_already_in_error_is_left_alone() -> None:
    state = formed(rejoin=False)
    state.hung((1,), HANG, final=False, now=5.0)
    assert state.hung((3,), HANG, final=False, now=6.0) == ()
