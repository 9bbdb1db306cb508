"""Which task this host is: --task-id, TPUCTL_TASK_ID, name/address match, TPU_WORKER_ID, single host."""

from __future__ import annotations

import pytest

from tpuctl.errors import InputError
from tpuctl.spec.detect import identify, matching_tasks, resolve_task_id
from tpuctl.spec.model import ClusterSpec, CoordinatorSpec
from tpuctl.tpu.slice import resolve_slice

POD = ClusterSpec(
    cluster="pod-a", slice=resolve_slice(accelerator="v4-32"), backend="jax",
    hosts=("w-0.example.com", "w-1.example.com", "10.0.0.3", "2001:db8::4"), coordinator=CoordinatorSpec(),
    source="pod.yaml",
)  # fmt: skip
LOCAL = ClusterSpec(
    cluster="local", slice=resolve_slice(accelerator="v4-32"), backend="sim",
    hosts=("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"), source="local.yaml",
)  # fmt: skip
MULTI = ClusterSpec(
    cluster="multi", slice=resolve_slice(accelerator="v5litepod-16", num_slices=2), backend="jax",
    hosts=tuple(f"10.0.{s}.{w}" for s in (3, 4) for w in range(4)), source="multi.yaml",
)  # fmt: skip
NOWHERE: frozenset[str] = frozenset({"build-box", "192.0.2.77"})


def task(spec: ClusterSpec, task_id: int | None = None, env: dict[str, str] | None = None,
         names: frozenset[str] = NOWHERE) -> int:  # fmt: skip
    return resolve_task_id(spec, task_id=task_id, environ=env or {}, local_names=names)


def test_flag_wins_over_everything() -> None:
    env = {"TPUCTL_TASK_ID": "1", "TPU_WORKER_ID": "2"}
    assert task(POD, 3, env, frozenset({"w-0.example.com"})) == 3
    assert identify(POD, task_id=3, environ=env, local_names=NOWHERE).reason == "--task-id"


def test_env_task_id_wins_over_names_and_tpu_variables() -> None:
    env = {"TPUCTL_TASK_ID": " 1 ", "TPU_WORKER_ID": "2"}
    assert task(POD, None, env, frozenset({"w-0.example.com"})) == 1
    assert identify(POD, task_id=None, environ=env, local_names=NOWHERE).reason == "TPUCTL_TASK_ID=1"


def test_empty_variables_count_as_unset() -> None:
    assert task(POD, None, {"TPUCTL_TASK_ID": "", "TPU_WORKER_ID": "2"}) == 2


def test_one_matching_name_wins_over_tpu_variables() -> None:
    env = {"TPU_WORKER_ID": "0"}
    assert task(POD, None, env, frozenset({"w-1", "W-1.Example.COM.", "10.9.9.9"})) == 1
    assert task(POD, None, env, frozenset({"2001:DB8:0::4"})) == 3
    found = identify(POD, task_id=None, environ=env, local_names=frozenset({"10.0.0.3"}))
    assert (found.task_id, found.reason) == (2, "this host is hosts[2] (10.0.0.3)")


def test_several_matches_ask_for_task_id() -> None:
    names = frozenset({"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"})
    assert matching_tasks(LOCAL.hosts, names) == [0, 1, 2, 3]
    with pytest.raises(InputError) as info:
        task(LOCAL, None, {}, names)
    assert info.value.message == (
        "this host matches several hosts of local.yaml: task 0 (127.0.0.2), task 1 (127.0.0.3), "
        "task 2 (127.0.0.4), task 3 (127.0.0.5)"
    )
    assert info.value.hint == (
        "several tasks share this machine; pass --task-id N (or set TPUCTL_TASK_ID=N), "
        "N = this host's position in hosts"
    )
    assert info.value.exit_code == 2


def test_tpu_worker_id_single_slice() -> None:
    found = identify(POD, task_id=None, environ={"TPU_WORKER_ID": "3"}, local_names=NOWHERE)
    assert (found.task_id, found.reason) == (3, "TPU_WORKER_ID=3")


def test_tpu_worker_id_plus_slice_id_multislice() -> None:
    env = {"TPU_WORKER_ID": "1", "MEGASCALE_SLICE_ID": "1", "MEGASCALE_NUM_SLICES": "2"}
    found = identify(MULTI, task_id=None, environ=env, local_names=NOWHERE)
    assert (found.task_id, found.reason) == (5, "TPU_WORKER_ID=1, MEGASCALE_SLICE_ID=1 (4 hosts per slice)")


def test_multislice_without_slice_id_is_refused_not_guessed() -> None:
    with pytest.raises(InputError, match="MEGASCALE_SLICE_ID is not set and the spec has 2 slices"):
        task(MULTI, None, {"TPU_WORKER_ID": "1"})


def test_single_host_spec_is_task_0() -> None:
    one = ClusterSpec(cluster="one", slice=resolve_slice(accelerator="v5litepod-8"), backend="sim", hosts=("10.0.0.1",))
    assert identify(one, task_id=None, environ={}, local_names=NOWHERE).reason == "the only host"
    assert task(one) == 0


@pytest.mark.parametrize(
    ("task_id", "env", "message"),
    [
        (4, {}, "--task-id 4 is out of range: pod.yaml has 4 hosts, tasks 0 to 3"),
        (None, {"TPUCTL_TASK_ID": "x"}, "TPUCTL_TASK_ID='x' is not an integer; expected a task id of pod.yaml from 0 to 3"),
        (None, {"TPUCTL_TASK_ID": "4"}, "TPUCTL_TASK_ID=4 is out of range; expected a task id of pod.yaml from 0 to 3"),
        # int() alone reads any script's digits: ARABIC-INDIC ONE was task 1 (issue 24)
        (None, {"TPUCTL_TASK_ID": "\u0661"},
         "TPUCTL_TASK_ID='\u0661' is not an integer; expected a task id of pod.yaml from 0 to 3"),
        (None, {"TPU_WORKER_ID": "\uff11"}, "TPU_WORKER_ID='\uff11' is not an integer; expected a worker index of v4-32 from 0 to 3"),
        (None, {"TPU_WORKER_ID": "4"}, "TPU_WORKER_ID=4 is out of range; expected a worker index of v4-32 from 0 to 3"),
        (None, {"TPU_WORKER_ID": "0", "MEGASCALE_NUM_SLICES": "2"},
         "MEGASCALE_NUM_SLICES=2, but the spec has 1 slice(s)"),
        (None, {"TPU_WORKER_ID": "0", "MEGASCALE_SLICE_ID": "1"},
         "MEGASCALE_SLICE_ID=1 is out of range; expected a slice index from 0 to 0"),
        (None, {},
         "cannot tell which of the 4 hosts of pod.yaml this is: none of this host's names (192.0.2.77, build-box) "
         "is in hosts, and TPU_WORKER_ID is not set"),
    ],
)  # fmt: skip
def test_errors_name_the_input_and_its_range(task_id: int | None, env: dict[str, str], message: str) -> None:
    with pytest.raises(InputError) as info:
        task(POD, task_id, env)
    assert info.value.message == message


def test_loopback_spec_on_a_machine_without_those_names_asks_for_task_id() -> None:
    with pytest.raises(InputError) as info:
        task(LOCAL)
    assert info.value.hint == "pass --task-id N (or set TPUCTL_TASK_ID=N), N = this host's position in hosts"
