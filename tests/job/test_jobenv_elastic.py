"""The job environment of a generation with a plan of its own (spares, policy elastic): rank-based variables
follow the rank, ``TPUCTL_TASK_ID`` stays the host's task id; the mapping records the plan and each rank's
task id, through the file too. Built as ``tpuctl init`` builds them: the generation's spec
(``for_plan``), the sim backend's core ids per rank, ``build_mapping``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuctl.agent.protocol import AgentInfo
from tpuctl.backends.sim import SimBackend
from tpuctl.coordination.plan import Plan
from tpuctl.errors import StateError
from tpuctl.job.env import job_environment
from tpuctl.mapping.file import read_mapping, write_mapping
from tpuctl.mapping.model import DeviceMapping, build_mapping
from tpuctl.spec.elastic import for_plan, roster_of
from tpuctl.spec.model import ClusterSpec
from tpuctl.spec.yamlfile import check_spec_text
from tpuctl.tpu.topology import build_topologies, merge_core_ids

from .mappings import CREATED, agent_info

SPEC = """\
cluster: pod-a
accelerator: v4-16
num_slices: 3
backend: sim
hosts: [10.0.0.1, 10.0.0.2, 10.0.0.3, 10.0.0.4, 10.0.0.5, 10.0.0.6]
spares: [10.0.1.1, 10.0.1.2]
restart: {policy: elastic, min_slices: 2}
"""


def _generation(plan: Plan) -> tuple[ClusterSpec, DeviceMapping]:
    spec = check_spec_text(SPEC, "c.yaml").unwrap()
    gen = for_plan(spec, plan)
    tpu = gen.slice
    sim = SimBackend(tpu)
    merged = merge_core_ids({rank: sim.local_core_ids(rank) for rank in range(tpu.num_hosts)}, tpu)
    mapping = build_mapping(
        slice=tpu, cluster=gen.cluster, incarnation=7, hosts=list(gen.hosts), merged=merged,
        topology=build_topologies(merged, tpu), created=CREATED, generation=4,
        task_ids=plan.members(roster_of(spec)), plan=plan.runs,
    )  # fmt: skip
    return gen, mapping


def _env(mapping: DeviceMapping, task: int) -> dict[str, str]:
    info = agent_info(mapping, 0)
    info["task"], info["rank"] = task, mapping.rank_of(task)
    info["address"] = next(t.address for t in mapping.tasks if t.host_task == task)
    return job_environment(AgentInfo.from_json(info), mapping).set


def test_shrunk_to_slices_0_and_2_task_4_is_rank_2() -> None:
    _, mapping = _generation(Plan.of([0, 2]))
    env = _env(mapping, 4)
    assert env["TPUCTL_TASK_ID"] == "4" and env["TPUCTL_RANK"] == "2"
    assert (env["JAX_PROCESS_ID"], env["JAX_NUM_PROCESSES"]) == ("2", "4")
    assert (env["RANK"], env["WORLD_SIZE"], env["DTENSOR_CLIENT_ID"], env["DTENSOR_NUM_CLIENTS"]) == ("2", "4", "2", "4")
    assert (env["MEGASCALE_SLICE_ID"], env["MEGASCALE_NUM_SLICES"]) == ("1", "2")
    assert (env["TPU_WORKER_ID"], env["TPU_WORKER_HOSTNAMES"]) == ("0", "10.0.0.5,10.0.0.6")
    assert env["JAX_COORDINATOR_ADDRESS"].startswith("10.0.0.1:") and env["MASTER_ADDR"] == "10.0.0.1"
    assert env["TPUCTL_GENERATION"] == "4"


def test_a_spare_slice_in_slice_1s_place() -> None:
    _, mapping = _generation(Plan.of([0, 3, 2]))
    env = _env(mapping, 7)  # the second host of spare slice 3, at position 1
    assert (env["TPUCTL_TASK_ID"], env["TPUCTL_RANK"], env["JAX_PROCESS_ID"]) == ("7", "3", "3")
    assert (env["MEGASCALE_SLICE_ID"], env["MEGASCALE_NUM_SLICES"]) == ("1", "3")
    assert (env["TPU_WORKER_ID"], env["TPU_WORKER_HOSTNAMES"]) == ("1", "10.0.1.1,10.0.1.2")
    env4 = _env(mapping, 4)
    assert (env4["TPUCTL_TASK_ID"], env4["TPUCTL_RANK"], env4["MEGASCALE_SLICE_ID"]) == ("4", "4", "2")


def test_the_coordinator_moves_with_rank_0() -> None:
    _, mapping = _generation(Plan.of([3, 1, 2]))
    env = _env(mapping, 6)
    assert (env["TPUCTL_TASK_ID"], env["TPUCTL_RANK"]) == ("6", "0")
    assert env["JAX_COORDINATOR_ADDRESS"].startswith("10.0.1.1:") and env["MEGASCALE_COORDINATOR_ADDRESS"] == "10.0.1.1"


def test_a_standby_host_gets_no_environment() -> None:
    _, mapping = _generation(Plan.of([0, 2]))
    with pytest.raises(StateError, match="task 2 is not a member of generation 4 \\(a standby host"):
        _env_standby(mapping, 2)


def _env_standby(mapping: DeviceMapping, task: int) -> None:
    info = agent_info(mapping, 0)
    info["task"] = task
    job_environment(AgentInfo.from_json(info), mapping)


def test_the_mapping_file_keeps_the_plan_and_task_ids(tmp_path: Path) -> None:
    _, mapping = _generation(Plan.of([0, 3, 2]))
    assert [(t.id, t.host_task) for t in mapping.tasks] == [(0, 0), (1, 1), (2, 6), (3, 7), (4, 4), (5, 5)]
    path = write_mapping(tmp_path / "mapping.json", mapping)
    again = read_mapping(path)
    assert again.plan == ((0, 1), (3, 1), (2, 1)) and again == mapping
    assert again.rank_of(7) == 3 and again.rank_of(2) is None


def test_generation_one_records_no_plan(tmp_path: Path) -> None:
    spec = check_spec_text(SPEC, "c.yaml").unwrap()
    assert for_plan(spec, roster_of(spec).identity()) is spec
    _, mapping = _generation(Plan.of([0, 1, 2]))
    assert mapping.plan == ((0, 3),)


def test_the_job_loads_its_own_ranks_task_from_the_mapping_by_its_host_task_id(tmp_path: Path) -> None:
    """``tpuctl.load_mapping()`` in a job on spare task 7 (rank 3) picks rank 3's devices, not task 7 (out of
    range in a 6-rank mapping: the job of every spare that took a place failed), nor task 4's rank for task 4."""
    from tpuctl.errors import MappingError
    from tpuctl.job.api import load_mapping

    _, mapping = _generation(Plan.of([0, 3, 2]))
    path = write_mapping(tmp_path / "mapping.json", mapping)
    loaded = load_mapping(environ={"TPUCTL_MAPPING": str(path), "TPUCTL_TASK_ID": "7"})
    assert (loaded.task, loaded.this_task.host_task) == (3, 7)
    assert loaded.local_devices == mapping.tasks[3].devices
    assert load_mapping(path, task=4, environ={}).this_task.id == 4
    with pytest.raises(MappingError, match=r"task 2 is not a member of generation 4 .*tasks 0, 1, 4, 5, 6, 7\)"):
        load_mapping(path, environ={"TPUCTL_MAPPING": str(path), "TPUCTL_TASK_ID": "2"})
    shrunk = write_mapping(tmp_path / "shrunk.json", _generation(Plan.of([0, 2]))[1])
    assert load_mapping(shrunk, task=5, environ={}).task == 3  # slice 2 at position 1
