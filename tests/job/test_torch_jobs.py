"""PyTorch/XLA from tpuctl's environment, checked by torch_xla's own code (the ``torch`` extra: torch 2.9.0
and torch_xla 2.9.0; ``make test`` installs it).

* A tpu7x-16 slice of four TPU processes on two machines' worth of loopback addresses (two processes per
  address, on distinct ports), as the recorded GKE LeaderWorkerSet pod describes it, comes up through
  ``tpuctl init`` with no spec; ``tpuctl env`` gives each process its bounds and chips; then under
  ``tpuctl run`` torch_xla's topology functions read the environment and agree with the mapping, and a
  4-process ``torch.distributed`` gloo job rendezvouses with ``env://`` and with torch_xla's ``xla://``.
* One process (no cluster) runs torch_xla's functions, and its per-chip start-up (``configure_topology``,
  what ``xmp.spawn`` calls), on tpuctl's environment of several slices.

No TPU here: torch_xla's runtime is never started (``torch_xla._internal.tpu`` reads the environment only);
``job_torch.py`` says what stands in for the runtime's process count and index in the ``xla://`` test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Processes
from harness.processes import TPUCTL

from tpuctl.agent.protocol import AgentInfo
from tpuctl.job.env import job_environment
from tpuctl.mapping.model import DeviceMapping
from tpuctl.tpu.slice import TpuSlice, resolve_slice, with_blocks

from .mappings import agent_info, sim_mapping
from .simjobs import JOBS_DIR, result_line

pytestmark = pytest.mark.slow

if importlib.util.find_spec("torch_xla") is None:  # found without importing it (that takes seconds)
    if os.environ.get("TPUCTL_REQUIRE_TORCH"):
        raise RuntimeError("torch_xla is not installed: `make test` installs the torch extra (.[torch])")
    pytest.skip("the torch extra (torch 2.9.0, torch_xla 2.9.0) is not installed: pip install -e '.[torch]'",
                allow_module_level=True)  # fmt: skip

PYTHON = sys.executable
_PREFIXES = ("TPU_", "MEGASCALE_", "TPUCTL_", "GCE_METADATA_", "LWS_", "JOBSET_", "CLOUD_TPU_", "PJRT_")
LWS = resolve_slice(accelerator="tpu7x-16", chips_per_process_bounds=(1, 2, 1))


def clean_env(**given: str) -> dict[str, str]:
    """The suite's TPU / tpuctl variables blanked (empty counts as unset), then ``given``."""
    return {**{name: "" for name in os.environ if name.startswith(_PREFIXES)}, **given}


@pytest.fixture
def agents(processes: Processes, tmp_path: Path) -> Iterator[Processes]:
    try:
        yield processes
    finally:
        processes.stop_recorded(tmp_path.glob("*/agent.pid"))


def test_four_processes_on_two_machines_come_up_and_run_torch_from_tpuctls_environment(
    agents: Processes, tmp_path: Path
) -> None:
    x, y = random.randrange(100, 250), random.randrange(1, 250)
    machines = [f"127.{x}.{y}.2", f"127.{x}.{y}.3"]  # a random /24: tpuctl's default port is free on them
    addresses = [f"{m}:{8476 + k}" for m in machines for k in range(2)]
    hosts = [m for m in machines for _ in range(2)]
    for task in range(4):
        env = clean_env(
            TPU_ACCELERATOR_TYPE="tpu7x-16",
            TPU_PROCESS_BOUNDS="2,1,2",
            TPU_CHIPS_PER_PROCESS_BOUNDS="1,2,1",
            TPU_CHIPS_PER_HOST_BOUNDS="2,2,1",
            TPU_HOST_BOUNDS="1,1,2",
            TPU_PROCESS_ADDRESSES=",".join(addresses),
            TPU_PROCESS_PORT=str(8476 + task % 2),
            TPU_WORKER_ID=str(task),
            TPU_VISIBLE_CHIPS=",".join(map(str, LWS.visible_chips(task))),
            TPU_SKIP_MDS_QUERY="true",
            TPUCTL_BACKEND="sim",
        )
        state = tmp_path / f"p{task}"
        state.mkdir(mode=0o700)
        command = [*TPUCTL, "init", "--state-dir", str(state), "--out", str(state / "mapping.json")]
        agents.start(f"init-{task}", command, env=env, cwd=tmp_path)
    results = agents.wait_all([f"init-{t}" for t in range(4)], timeout=120)
    assert [r.code for r in results] == [0, 0, 0, 0], agents.logs()
    for task in range(4):
        assert f"up: task {task} of 4, tpu7x-16 (2x2x2)" in results[task].out, results[task].out
        mapping = json.loads((tmp_path / f"p{task}" / "mapping.json").read_text())
        assert [t["address"] for t in mapping["tasks"]] == hosts
        assert mapping["slice"]["chips_per_host_bounds"] == [1, 2, 1]
        assert mapping["slice"]["chips_per_machine_bounds"] == [2, 2, 1]
        mine = mapping["tasks"][task]["devices"]  # the simulated backend gave each process its chips
        assert [d["id"] for d in mine] == [d.id for d in LWS.devices_of_task(task)]

    for task in range(4):
        printed = agents.run(f"env-{task}", [*TPUCTL, "env", "-o", "json", "--state-dir", str(tmp_path / f"p{task}")])
        assert printed.code == 0, printed.err
        got = json.loads(printed.out)["set"]
        assert (got["TPU_PROCESS_BOUNDS"], got["TPU_CHIPS_PER_PROCESS_BOUNDS"]) == ("2,1,2", "1,2,1")
        assert (got["TPU_HOST_BOUNDS"], got["TPU_CHIPS_PER_HOST_BOUNDS"]) == ("1,1,2", "2,2,1")
        assert got["TPU_VISIBLE_CHIPS"] == ",".join(map(str, LWS.visible_chips(task)))
        assert (got["CLOUD_TPU_TASK_ID"], got["TPU_PROCESS_PORT"]) == (str(task), str(8476 + task % 2))
        assert got["TPU_PROCESS_ADDRESSES"] == ",".join(addresses)
        assert (got["MASTER_ADDR"], got["WORLD_SIZE"], got["RANK"], got["LOCAL_RANK"]) == (
            machines[0], "4", str(task), str(task % 2)
        )  # fmt: skip

    shared = tmp_path / "shared"
    shared.mkdir()
    labels = []
    for task in range(4):
        run = [*TPUCTL, "run", "--state-dir", str(tmp_path / f"p{task}"), "--", PYTHON, str(JOBS_DIR / "job_torch.py")]
        labels.append(agents.start(f"torch-{task}", [*run, str(shared)], env={"PYTHONUNBUFFERED": "1"}).label)
    done = agents.wait_all(labels, timeout=240)
    assert [f.code for f in done] == [0, 0, 0, 0], agents.logs()
    for task, finished in enumerate(done):
        result = result_line(finished)
        assert result["torch"].startswith("2.9.0")
        assert result["xla"] == {
            "tpu_env": {
                "ACCELERATOR_TYPE": "tpu7x-16",
                "TPU_PROCESS_BOUNDS": "2,1,2",
                "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,2,1",
                "WORKER_ID": str(task),
            },
            "version": 7,
            "worker_id": task,
            "task_id": task,
            "worker_ips": hosts,  # torch_xla's worker i is task i: one entry per process
            "num_tpu_workers": 4,
            "process_bounds_size": 4,
            "one_chip_start_changed": [],  # tpuctl set everything torch_xla's one-chip start-up would
        }
        for group in ("env", "xla_rendezvous"):
            assert result[group]["sum"] == 10.0  # 1 + 2 + 3 + 4: every rank took part
            assert result[group]["views"] == [
                {
                    "group": "env" if group == "env" else "xla",
                    "rank": t,
                    "world": 4,
                    "task": t,
                    "local_rank": LWS.rank_on_machine(t),
                    "local_world_size": 2,
                    "visible_chips": ",".join(map(str, LWS.visible_chips(t))),
                    "local_devices": [d.id for d in LWS.devices_of_task(t)],
                }
                for t in range(4)
            ]
    down = agents.run("down", [*TPUCTL, "down", "--all", "--state-dir", str(tmp_path / "p0")], timeout=60)
    assert down.code == 0, down.err


# --- torch_xla's functions on tpuctl's environment of several slices, in one process ------------------------

READ_ENVIRONMENTS = r"""
import json, os, sys
from torch_xla._internal import tpu

cases = json.load(sys.stdin)
out = []
for case in cases:
    os.environ.clear()
    os.environ.update(case["env"])
    got = {
        "tpu_env": dict(tpu.get_tpu_env()),
        "version": tpu.version(),
        "worker_id": tpu.worker_id(),
        "task_id": tpu.task_id(),
        "worker_ips": tpu.get_worker_ips(),
        "process_bounds_size": tpu.process_bounds_size(),
        "spawn": [],
    }
    for rank in range(case["spawn"]):  # xmp.spawn's per-chip start-up on this task's machine
        os.environ.clear()
        os.environ.update(case["env"])
        tpu.configure_topology(rank, case["spawn"])
        names = ("CLOUD_TPU_TASK_ID", "TPU_VISIBLE_CHIPS", "TPU_PROCESS_BOUNDS", "TPU_CHIPS_PER_PROCESS_BOUNDS",
                 "TPU_PROCESS_ADDRESSES", "TPU_PROCESS_PORT")
        got["spawn"].append({name: os.environ[name] for name in names})
    out.append(got)
print(json.dumps(out))
"""


def _case(mapping: DeviceMapping, task: int, spawn: bool) -> dict[str, Any]:
    env = job_environment(AgentInfo.from_json(agent_info(mapping, task)), mapping)
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    chips = mapping.slice.machine_block[0] * mapping.slice.machine_block[1] * mapping.slice.machine_block[2]
    return {"env": env.apply(base), "spawn": chips if spawn else 0}


def _expected_spawn(tpu: TpuSlice, mapping: DeviceMapping, task: int) -> list[dict[str, str]]:
    """What tpuctl's model says of one process per chip on ``task``'s machine: torch_xla must agree."""
    per_chip = with_blocks(tpu, (1, 1, 1), tpu.machine_block)
    chips = per_chip.tasks_per_machine
    grid = ",".join(map(str, per_chip.host_bounds)) + (",2" if tpu.generation.name == "7x" else "")
    ports = [8476 + r for r in range(chips)]
    addresses = ",".join(f"{t.address}:{p}" for t in mapping.tasks for p in ports)
    rows = []
    for rank in range(chips):
        process = task * chips + rank
        assert per_chip.machine_of(process) == task and per_chip.rank_on_machine(process) == rank
        rows.append({
            "CLOUD_TPU_TASK_ID": str(process),
            "TPU_VISIBLE_CHIPS": ",".join(map(str, per_chip.visible_chips(process))),
            "TPU_PROCESS_BOUNDS": grid,
            "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
            "TPU_PROCESS_ADDRESSES": addresses,
            "TPU_PROCESS_PORT": str(ports[rank]),
        })  # fmt: skip
    return rows


def test_torch_xla_reads_tpuctls_environment_of_several_slices() -> None:
    v4_32 = sim_mapping()  # 4 machines of 2x2x1, one task each
    two_slices = sim_mapping(accelerator="v5litepod-8", num_slices=2, chips_per_host=4)
    lws = sim_mapping(["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"], accelerator="tpu7x-16",
                      chips_per_process_bounds=(1, 2, 1))  # fmt: skip
    one_7x = sim_mapping(["10.0.0.1", "10.0.0.2"], accelerator="tpu7x-16")
    cases = [(v4_32, 2, True), (v4_32, 0, False), (two_slices, 3, False), (lws, 1, False), (one_7x, 1, True)]
    done = subprocess.run(
        [PYTHON, "-c", READ_ENVIRONMENTS],
        input=json.dumps([_case(m, t, spawn) for m, t, spawn in cases]),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for (mapping, task, spawn), seen in zip(cases, got, strict=True):
        tpu = mapping.slice
        per_slice = tpu.hosts_per_slice
        slice_index = task // per_slice
        in_slice = [t.address for t in mapping.tasks][slice_index * per_slice : (slice_index + 1) * per_slice]
        split = tpu.tasks_per_machine > 1
        assert seen["tpu_env"] == {
            "ACCELERATOR_TYPE": tpu.accelerator_type,
            # torch_xla falls back to the host bounds when the process bounds are unset, as libtpu does
            "TPU_PROCESS_BOUNDS": ",".join(map(str, tpu.host_bounds)),
            "TPU_CHIPS_PER_PROCESS_BOUNDS": ",".join(map(str, tpu.chips_per_host_bounds)),
            "WORKER_ID": str(task - slice_index * per_slice),
        }, (tpu.describe(), task)
        assert seen["version"] == int(tpu.generation.name.strip("v")[0])
        assert seen["worker_id"] == task - slice_index * per_slice
        assert seen["task_id"] == (task if split else None)
        assert seen["worker_ips"] == (in_slice if len(in_slice) > 1 else ["localhost"])
        assert seen["process_bounds_size"] == (tpu.num_hosts if split else None)
        assert seen["spawn"] == (_expected_spawn(tpu, mapping, task) if spawn else [])
