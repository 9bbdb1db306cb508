"""Zero-config bring-up: ``tpuctl init`` with no spec file and no hand-set variable, on a recorded Cloud TPU VM
(a real metadata server per host on 127.0.0.1, reached through GCE_METADATA_HOST) and on a recorded
LeaderWorkerSet pod environment (two TPU processes per machine). The only other variable is the documented
TPUCTL_BACKEND=sim (no TPU here). Hosts are random loopback addresses, so tpuctl's default coordinator
port can be used as is."""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from harness import Processes
from harness.processes import TPUCTL

from .metadata_server import closed_port, metadata_server, v4_32_attributes

_PREFIXES = ("TPU_", "MEGASCALE_", "TPUCTL_", "GCE_METADATA_", "LWS_", "JOBSET_", "REPLICATED_JOB_")


def clean_env(**given: str) -> dict[str, str]:
    """The suite's TPU / tpuctl variables blanked (empty counts as unset), then ``given``."""
    blank = {name: "" for name in os.environ if name.startswith(_PREFIXES)}
    return {**blank, **given}


def loopback_hosts(count: int) -> list[str]:
    """``count`` addresses in a random 127.x.y.0/24, so the default port is free on them."""
    x, y = random.randrange(100, 250), random.randrange(1, 250)
    return [f"127.{x}.{y}.{2 + i}" for i in range(count)]


@pytest.fixture
def stack(processes: Processes, tmp_path: Path) -> Iterator[ExitStack]:
    with ExitStack() as resources:
        try:
            yield resources
        finally:
            processes.stop_recorded(tmp_path.glob("*/agent.pid"))


def init(processes: Processes, tmp_path: Path, label: str, env: dict[str, str]) -> None:
    state = tmp_path / label
    state.mkdir(mode=0o700)
    command = [*TPUCTL, "init", "--state-dir", str(state), "--out", str(state / "mapping.json")]
    processes.start(label, command, env=env, cwd=tmp_path)


def test_a_recorded_v4_32_tpu_vm_comes_up_from_its_metadata_server(
    processes: Processes, tmp_path: Path, stack: ExitStack
) -> None:
    hosts = loopback_hosts(4)
    servers = [stack.enter_context(metadata_server(v4_32_attributes(hosts, w))) for w in range(4)]
    for worker, server in enumerate(servers):
        init(processes, tmp_path, f"w{worker}", clean_env(GCE_METADATA_HOST=server.address, TPUCTL_BACKEND="sim"))
    results = processes.wait_all([f"w{w}" for w in range(4)], timeout=90)
    assert [r.code for r in results] == [0, 0, 0, 0], processes.logs()
    for worker, result in enumerate(results):
        assert f"up: task {worker} of 4, v4-32 (2x2x4)" in result.out, result.out
        mapping = json.loads((tmp_path / f"w{worker}" / "mapping.json").read_text())
        assert [t["address"] for t in mapping["tasks"]] == hosts
    env_out = processes.run("env-2", [*TPUCTL, "env", "--state-dir", str(tmp_path / "w2")], timeout=30)
    assert "unset TPU_PROCESS_ADDRESSES" in env_out.out and "export TPU_WORKER_ID=2" in env_out.out
    down = processes.run("down", [*TPUCTL, "down", "--all", "--state-dir", str(tmp_path / "w0")], timeout=60)
    assert down.code == 0, down.err


def test_detect_shows_every_source_of_a_tpu_vm(processes: Processes, tmp_path: Path, stack: ExitStack) -> None:
    hosts = loopback_hosts(4)
    server = stack.enter_context(metadata_server(v4_32_attributes(hosts, 1)))
    done = processes.run(
        "detect", [*TPUCTL, "detect", "--json"], env=clean_env(GCE_METADATA_HOST=server.address), timeout=30
    )
    assert done.code == 0, done.err
    document = json.loads(done.out)
    assert document["schema"] == "tpuctl.detect/v1"
    assert (document["task"], document["task_reason"]) == (1, "metadata agent-worker-number=1")
    assert {s["key"]: s["source"] for s in document["sources"]}["hosts"] == "metadata worker-network-endpoints"
    assert document["coordinator"] == f"{hosts[0]}:8490"


def test_no_metadata_server_fails_fast_naming_what_was_tried(processes: Processes, tmp_path: Path) -> None:
    where = closed_port()
    started = time.monotonic()
    done = processes.run(
        "init-nothing",
        [*TPUCTL, "init", "--state-dir", str(tmp_path / "s")],
        env=clean_env(GCE_METADATA_HOST=where),
        timeout=30,
    )
    assert done.code == 2
    assert time.monotonic() - started < 15  # interpreter start included; the metadata part is instant
    assert f"no metadata server answered: {where} (from GCE_METADATA_HOST): connection refused" in done.err
    assert "Traceback" not in done.err


def test_a_recorded_leaderworkerset_pod_with_two_tpu_processes_per_machine_comes_up(
    processes: Processes, tmp_path: Path, stack: ExitStack
) -> None:
    machines = loopback_hosts(2)
    addresses = [f"{m}:{8476 + k}" for m in machines for k in range(2)]
    for worker in range(4):
        env = clean_env(
            TPU_ACCELERATOR_TYPE="v5litepod-16",
            TPU_TOPOLOGY="4x4",
            TPU_WORKER_ID=str(worker),
            TPU_WORKER_HOSTNAMES=",".join(a.rsplit(":", 1)[0] for a in addresses),
            TPU_PROCESS_ADDRESSES=",".join(addresses),
            TPU_PROCESS_PORT=str(8476 + worker % 2),
            TPU_SKIP_MDS_QUERY="true",
            LWS_LEADER_ADDRESS=f"{machines[0]}",
            LWS_GROUP_SIZE="2",
            LWS_WORKER_INDEX=str(worker // 2),
            GCE_METADATA_HOST=closed_port(),  # never asked: the pod lists its hosts
            TPUCTL_BACKEND="sim",
        )
        init(processes, tmp_path, f"p{worker}", env)
    results = processes.wait_all([f"p{w}" for w in range(4)], timeout=90)
    assert [r.code for r in results] == [0, 0, 0, 0], processes.logs()
    assert "up: task 3 of 4, v5litepod-16 (4x4)" in results[3].out
    env_out = processes.run(
        "env-1", [*TPUCTL, "env", "--format", "json", "--state-dir", str(tmp_path / "p1")], timeout=30
    )
    printed = json.loads(env_out.out)["set"]
    assert printed["TPU_PROCESS_ADDRESSES"] == ",".join(addresses)
    assert printed["TPU_PROCESS_PORT"] == "8477"
    down = processes.run("down", [*TPUCTL, "down", "--all", "--state-dir", str(tmp_path / "p0")], timeout=60)
    assert down.code == 0, down.err
