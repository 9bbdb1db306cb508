"""``tpuctl sim restart TASK``: one simulated host brought back as a new generation (a real v4-16 under
``restart: {policy: rejoin}``), and what it refuses without processes; ``sim up -c SPEC`` saying why the
spec's ``output:`` is not used (issue 24, item 7)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from harness.clusters import SimCluster

from tpuctl.agent.protocol import AgentInfo, JobPorts
from tpuctl.agent.statedir import StateDir
from tpuctl.cli import main
from tpuctl.sim.cluster import free_port, loopback_hosts, running_spec, sim_spec_text


def run(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


def sim_root(tmp_path: Path, *, rejoin: bool) -> Path:
    """A simulated cluster's folder as `sim up v4-16` leaves it, without its agents."""
    root = tmp_path / "sim"
    for task in range(2):
        (root / f"host-{task}").mkdir(parents=True, mode=0o700)
    hosts = loopback_hosts(2)
    (root / "cluster.yaml").write_text(sim_spec_text("v4-16", hosts, 8490, root, rejoin=rejoin))
    return root


def test_restart_refuses_a_cluster_whose_policy_is_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = sim_root(tmp_path, rejoin=False)
    code, _, err = run("sim", "restart", "1", "--root", str(root), capsys=capsys)
    assert code == 2, err
    assert f"tpuctl: error: {root}/cluster.yaml: restart policy is fail: a host that left ends the cluster" in err
    assert f"tpuctl sim up ACCELERATOR --rejoin --root {root}" in err


def test_restart_refuses_a_task_the_cluster_does_not_have(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = sim_root(tmp_path, rejoin=True)
    code, _, err = run("sim", "restart", "2", "--root", str(root), capsys=capsys)
    assert code == 2 and f"task 2 is not a host of the simulated cluster under {root}" in err and "tasks 0 to 1" in err
    code, _, err = run("sim", "restart", "\u0661", "--root", str(root), capsys=capsys)
    assert code == 2 and "is not a whole number" in err


def test_restart_without_a_cluster_is_a_state_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run("sim", "restart", "0", "--root", str(tmp_path / "none"), capsys=capsys)
    assert code == 5 and "no simulated cluster is running under" in err
    root = sim_root(tmp_path, rejoin=True)  # a rejoin spec, but no agent runs: nothing to rejoin
    code, _, err = run("sim", "restart", "1", "--root", str(root), capsys=capsys)
    assert code == 5 and "no host but task 1 has a running agent" in err


def test_the_running_spec_is_the_one_the_agents_were_started_with(tmp_path: Path) -> None:
    root = sim_root(tmp_path, rejoin=False)
    assert running_spec(root, 1) == root / "cluster.yaml"  # sim up ACCELERATOR's generated spec
    own = tmp_path / "own.yaml"  # sim up -c own.yaml writes no cluster.yaml: the agents know their spec
    info = AgentInfo(
        cluster="c", task=0, num_tasks=2, coordinator="127.0.0.2:8490", mapping="m.json", job_ports=JobPorts((1, 2), 3, 4),
        config=str(own),
    )  # fmt: skip
    StateDir(root / "host-0").write_info(info)
    assert running_spec(root, 1) == own


def test_help_has_an_example_and_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run("sim", "restart", "--help", capsys=capsys)
    assert code == 0 and "tpuctl sim restart 2" in out and "Exit codes: 0 back" in out


@pytest.mark.slow
def test_a_lost_host_comes_back_as_a_new_generation(sim_cluster: Callable[..., SimCluster], tmp_path: Path) -> None:
    hosts = loopback_hosts(2)
    elsewhere = tmp_path / "elsewhere" / "mapping.json"
    spec = tmp_path / "rejoin.yaml"
    text = sim_spec_text("v4-16", hosts, free_port(hosts[0]), tmp_path, cluster="sim-restart", rejoin=True)
    spec.write_text(text.replace(f"output: {tmp_path / 'mapping.json'}", f"output: {elsewhere}"))
    cluster = sim_cluster("v4-16", "-c", str(spec))  # the accelerator is the spec's
    up = cluster.brought_up
    assert up is not None
    # sim up -c says why the spec's output: is not used (each host writes ROOT/host-N/mapping.json)
    assert f"note: {spec}'s output: {elsewhere} is not used" in up.err and f"{cluster.root}/host-N/mapping.json" in up.err
    assert not elsewhere.exists()

    os.kill(cluster.agent_pid(1), signal.SIGKILL)  # task 1 lost
    back = cluster.tpuctl("sim", "restart", "1", "--root", str(cluster.root), timeout=120, env=cluster.env)
    assert back.code == 0, cluster.logs()
    assert "task 1 is back in" in back.err and "the cluster formed generation 2" in back.err
    assert [cluster.info(t)["generation"] for t in range(2)] == [2, 2]
    assert cluster.mapping(0).read_bytes() == cluster.mapping(1).read_bytes()
    assert json.loads(cluster.mapping(1).read_text())["generation"] == 2

    pid = cluster.agent_pid(0)  # a running host (the coordinator) is lost first
    again = cluster.tpuctl("sim", "restart", "0", "--root", str(cluster.root), timeout=120, env=cluster.env)
    assert again.code == 0, cluster.logs()
    assert f"killed task 0's agent (pid {pid}), as a lost host's" in again.err and "the cluster formed generation 3" in again.err
    status = cluster.tpuctl("sim", "status", "--root", str(cluster.root), "--json", env=cluster.env)
    assert status.code == 0, status.out
    assert json.loads(status.out)["healthy"] is True
