"""Detection with several TPU processes per machine: libtpu's process bounds (environment or tpu-env) make
tasks = processes; TPU_VISIBLE_CHIPS is checked against the task. Pure, plus one real `tpuctl detect`."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from harness.processes import TPUCTL

from tpuctl.errors import InputError, SpecError
from tpuctl.spec.detect import Detection, detect, identify

from .metadata_server import V4_32_TPU_ENV

NOWHERE: frozenset[str] = frozenset({"build-box"})

# The recorded GKE LeaderWorkerSet pod on tpu7x-16 with two TPU containers per machine (issue 27); this is
# the second container of the second machine.
LWS_7X_16 = {
    "TPU_ACCELERATOR_TYPE": "tpu7x-16",
    "TPU_PROCESS_BOUNDS": "2,1,2",
    "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,2,1",
    "TPU_PROCESS_ADDRESSES": "lws-0.lws:8476,lws-0.lws:8477,lws-0-1.lws:8476,lws-0-1.lws:8477",
    "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
    "TPU_HOST_BOUNDS": "1,1,2",
    "TPU_PROCESS_PORT": "8477",
    "TPU_WORKER_ID": "3",
    "TPU_VISIBLE_CHIPS": "1,3",
    "LWS_LEADER_ADDRESS": "lws-0.lws.default",
    "LWS_GROUP_SIZE": "2",
    "LWS_WORKER_INDEX": "1",
}


def sources(found: Detection) -> dict[str, tuple[str, str]]:
    return {s.key: (s.value, s.origin) for s in found.sources}


def test_the_recorded_leaderworkerset_pod_is_four_tasks_of_two_chips() -> None:
    found = detect(LWS_7X_16, None)
    tpu = found.spec.slice
    assert found.spec.hosts == ("lws-0.lws", "lws-0.lws", "lws-0-1.lws", "lws-0-1.lws")
    assert (tpu.num_hosts, tpu.chips_per_host, tpu.chips_per_host_bounds, tpu.machine_block) == (4, 2, (1, 2, 1), (2, 2, 1))
    got = sources(found)
    assert got["chips_per_host"] == ("2", "env TPU_CHIPS_PER_PROCESS_BOUNDS")
    assert got["processes_per_machine"] == (
        "2",
        "env TPU_CHIPS_PER_HOST_BOUNDS (2,2,1) over env TPU_CHIPS_PER_PROCESS_BOUNDS",
    )
    task = identify(found.spec, task_id=None, environ=found.values, local_names=frozenset({"lws-0-1.lws"}))
    assert (task.task_id, task.reason) == (3, "TPU_WORKER_ID=3")
    assert [d.coords for d in tpu.devices_of_task(3) if d.core == 0] == [(1, 0, 1), (1, 1, 1)]


def test_cloud_tpu_task_id_comes_before_the_worker_id() -> None:
    """torch_xla and libtpu read CLOUD_TPU_TASK_ID first: a pod's worker id may count machines."""
    env = {**LWS_7X_16, "CLOUD_TPU_TASK_ID": "3", "TPU_WORKER_ID": "1"}
    found = detect(env, None)
    task = identify(found.spec, task_id=None, environ=found.values, local_names=NOWHERE)
    assert (task.task_id, task.reason) == (3, "CLOUD_TPU_TASK_ID=3")


def test_visible_chips_of_another_task_are_refused_naming_both() -> None:
    found = detect({**LWS_7X_16, "TPU_VISIBLE_CHIPS": "0,2"}, None)
    with pytest.raises(InputError) as info:
        identify(found.spec, task_id=None, environ=found.values, local_names=NOWHERE)
    assert info.value.message == (
        "TPU_VISIBLE_CHIPS=0,2 are task 2's chips, but this process is task 3, whose chips on machine 1 are 1,3; "
        "expected 1,3 (TPU_WORKER_ID=3)"
    )


def test_process_bounds_alone_give_the_process_block() -> None:
    env = {k: v for k, v in LWS_7X_16.items() if k not in ("TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_CHIPS_PER_HOST_BOUNDS")}
    found = detect(env, None)
    assert found.spec.slice.chips_per_host_bounds == (1, 2, 1)
    assert sources(found)["chips_per_host"] == ("2", "env TPU_PROCESS_BOUNDS (the chip grid over it)")


def test_one_process_per_machine_bounds_change_nothing() -> None:
    """A Cloud TPU VM's tpu-env carries TPU_PROCESS_BOUNDS = HOST_BOUNDS (v4): one task per machine, as before."""

    class Metadata:
        def __init__(self, tpu_env: str) -> None:
            self.values = {
                "agent-worker-number": "1",
                "accelerator-type": "v4-32",
                "worker-network-endpoints": ",".join(f"w-{i}:1:10.0.0.{i + 1}" for i in range(4)),
                "tpu-env": tpu_env,
            }

        def get(self, key: str) -> str | None:
            return self.values.get(key)

        def describe(self) -> str:
            return "recorded"

    recorded = V4_32_TPU_ENV.format(worker=1)
    found = detect({}, Metadata(recorded))
    assert found.values.origin("TPU_PROCESS_BOUNDS") == "metadata tpu-env TPU_PROCESS_BOUNDS"
    assert found.values.origin("TPU_HOST_BOUNDS") == "metadata tpu-env HOST_BOUNDS"
    assert (found.spec.slice.num_hosts, found.spec.slice.tasks_per_machine) == (4, 1)
    assert "processes_per_machine" not in sources(found)
    with pytest.raises(SpecError) as info:
        detect({}, Metadata(recorded.replace("HOST_BOUNDS: '1,1,4'", "HOST_BOUNDS: '1,2,2'")))
    assert info.value.problems == [
        "metadata tpu-env HOST_BOUNDS=1,2,2, but 2,2,1 machines tile the v4-32's 2x2x4 chip grid as 1,1,4; "
        "expected 1,1,4"
    ]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            {"TPU_PROCESS_BOUNDS": "2,2,2"},
            "TPU_PROCESS_BOUNDS=2,2,2 times TPU_CHIPS_PER_PROCESS_BOUNDS=1,2,1 is 2x4x2 chips; expected the "
            "tpu7x-16's 2x2x2 chip grid (processes x chips per process, axis by axis)",
        ),
        (
            {
                "TPU_ACCELERATOR_TYPE": "v5litepod-16",
                "TPU_PROCESS_BOUNDS": "4,4,1",
                "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
                "TPU_HOST_BOUNDS": "2,2,1",
                "TPU_PROCESS_ADDRESSES": ",".join(f"m{m}:{8476 + k}" for m in range(4) for k in range(4)),
            },
            "TPU_CHIPS_PER_PROCESS_BOUNDS=1,1,1 on 2,2,1 machines: a 2,2,1 machine of 1,1,1 processes would run "
            "processes that are not consecutive in the runtime's order (x fastest over the 4,4,1 process grid)",
        ),
        ({"TPU_PROCESS_BOUNDS": "2,x,2"}, "TPU_PROCESS_BOUNDS='2,x,2' is not x,y,z; expected positive counts"),
        (
            {"TPU_CHIPS_PER_PROCESS_BOUNDS": "", "TPU_PROCESS_BOUNDS": "3,1,1"},
            "TPU_PROCESS_BOUNDS=3,1,1 does not divide the 2x2x2 chip grid",
        ),
        (
            {"TPU_HOST_BOUNDS": "2,1,1"},
            "TPU_HOST_BOUNDS=2,1,1, but 2,2,1 machines tile the tpu7x-16's 2x2x2 chip grid as 1,1,2; expected 1,1,2",
        ),
        (
            {"TPU_VISIBLE_CHIPS": "1,4"},
            "TPU_VISIBLE_CHIPS='1,4': chip 4 is not on this machine, which has chips 0 to 3; expected 2 distinct chip "
            "numbers from 0 to 3, comma separated (this process's chips of its 2,2,1 machine)",
        ),
        ({"TPU_VISIBLE_CHIPS": "1,1"}, "TPU_VISIBLE_CHIPS='1,1' names 1 chip(s); expected 2 distinct chip numbers"),
        ({"TPU_VISIBLE_CHIPS": "one"}, "TPU_VISIBLE_CHIPS='one' is not a list of chip numbers"),
        (
            {"TPU_PROCESS_ADDRESSES": "a:8476,a:8477,b:8476,b:8477,c:8476,c:8477"},
            "TPU_PROCESS_ADDRESSES: 6 entries, but tpu7x-16 has 4 TPU processes, 2 on each of 2 machines (2x2x2 "
            "chips, 2 chips per process); expected one entry per process",
        ),
        (
            {"TPU_PROCESS_BOUNDS": "", "TPU_CHIPS_PER_PROCESS_BOUNDS": ""},
            "the host list runs 2 TPU processes per machine, but TPU_PROCESS_BOUNDS and TPU_CHIPS_PER_PROCESS_BOUNDS "
            "are not set; expected both",
        ),
        (
            {"TPU_PROCESS_BOUNDS": "2,2,2", "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1"},
            "the host list runs 2 TPU processes per machine, but 1,1,1 processes on 2,2,1 machines are 4 per "
            "machine; expected each machine's processes side by side",
        ),
    ],
)
def test_bad_bounds_name_the_variable_and_the_expected_form(change: dict[str, str], problem: str) -> None:
    with pytest.raises(SpecError) as info:
        detect({**LWS_7X_16, **change}, None)
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems


def _tpuctl_detect(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    blank = {name: "" for name in os.environ if name.startswith(("TPU_", "MEGASCALE_", "TPUCTL_", "LWS_", "CLOUD_TPU"))}
    return subprocess.run(
        [*TPUCTL, "detect", "--format", "json"],
        env={**os.environ, **blank, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_tpuctl_detect_on_the_recorded_leaderworkerset_pod() -> None:
    done = _tpuctl_detect(LWS_7X_16)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert (document["tasks"], document["chips_per_task"], document["tasks_per_machine"], document["machines"]) == (
        4,
        2,
        2,
        2,
    )
    assert (document["task"], document["task_reason"]) == (3, "TPU_WORKER_ID=3")
    assert document["task_chips"] == [[1, 0, 1], [1, 1, 1]]
    assert document["visible_chips"] == [1, 3]
    bad = _tpuctl_detect({**LWS_7X_16, "TPU_PROCESS_BOUNDS": "2,2,2"})
    assert bad.returncode == 2
    assert "TPU_PROCESS_BOUNDS=2,2,2 times TPU_CHIPS_PER_PROCESS_BOUNDS=1,2,1 is 2x4x2 chips" in bad.stderr
    assert "Traceback" not in bad.stderr
