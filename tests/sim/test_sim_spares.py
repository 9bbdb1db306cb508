"""``tpuctl sim up --num-slices N --spares K``: the spec it writes, the spares' ``init --spare``, and ``sim status``
listing each host with its role. (A whole simulated cluster with spares needs the coordinator's standby side:
the real-process tests of it live with the service's.)"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tpuctl.cli import main
from tpuctl.sim import cluster as sc
from tpuctl.sim.status import render
from tpuctl.spec.yamlfile import load_spec_text


def test_a_generated_spec_with_slices_and_spares_names_the_roster_and_brings_policy_rejoin(tmp_path: Path) -> None:
    addresses = sc.loopback_hosts(8)
    text = sc.sim_spec_text("v4-16", addresses[:6], 40000, tmp_path, num_slices=3, spares=addresses[6:])
    spec = load_spec_text(text, "cluster.yaml")
    assert (len(spec.hosts), spec.spares, spec.slice.num_slices) == (6, ("127.0.0.8", "127.0.0.9"), 3)
    assert spec.restart.policy == "rejoin"  # spares need rejoin (or elastic)
    assert [spec.is_spare(t) for t in range(8)] == [False] * 6 + [True] * 2
    plain = load_spec_text(sc.sim_spec_text("v4-16", addresses[:2], 40000, tmp_path), "cluster.yaml")
    assert (plain.spares, plain.restart.policy, plain.slice.num_slices) == ((), "fail", 1)  # as before


def test_the_spares_are_started_with_init_spare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[tuple[str, ...]] = []

    def spawn(*args: str) -> Any:
        started.append(args)
        return None

    monkeypatch.setattr(sc, "_spawn", spawn)
    sc.start_inits(tmp_path, tmp_path / "cluster.yaml", 4, 2)
    tasks = [(a[a.index("--task-id") + 1], "--spare" in a) for a in started]
    assert tasks == [("0", False), ("1", False), ("2", False), ("3", False), ("4", True), ("5", True)]
    assert all((tmp_path / f"host-{t}").is_dir() for t in range(6))


def test_init_spare_as_sim_up_starts_it_is_refused_for_a_host_that_is_not_a_spare(tmp_path: Path) -> None:
    """The flag sim up passes is the real `tpuctl init --spare`: on a task of the cluster's it names the ranges."""
    addresses = sc.loopback_hosts(4)
    spec = tmp_path / "cluster.yaml"
    spec.write_text(sc.sim_spec_text("v4-16", addresses[:2], sc.free_port(addresses[0]), tmp_path, spares=addresses[2:]))
    done = subprocess.run(
        [*sc.tpuctl_command(), "init", "--config", str(spec), "--task-id", "1", "--spare", "--state-dir",
         str(tmp_path / "host-1")], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "spare" in done.stderr and "2" in done.stderr, done.stderr


@pytest.mark.parametrize("given", [["--spares", "1"], ["--num-slices", "2"], ["--rejoin"]])
def test_sim_up_with_a_spec_of_ones_own_refuses_the_options_that_write_one(
    tmp_path: Path, given: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "mine.yaml"
    spec.write_text(sc.sim_spec_text("v4-8", sc.loopback_hosts(1), 40000, tmp_path))
    with pytest.raises(SystemExit) as exited:
        main(["sim", "up", "--config", str(spec), "--root", str(tmp_path / "sim"), *given])
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert f"{given[0]} go(es) with ACCELERATOR" in err


def _doc(roles: list[str | None]) -> dict[str, Any]:
    tasks = [
        {"task": t, "address": f"127.0.0.{t + 2}", "agent": "running", "agent_pid": 100 + t, "state": "connected",
         "heartbeat_age": 0.5, "session_open": True, "cause": None, "state_dir": f"/sim/host-{t}", "role": role}
        for t, role in enumerate(roles)
    ]  # fmt: skip
    return {"cluster": "sim", "accelerator": "v4-8", "num_hosts": len(tasks), "root": "/sim", "asked_task": 0,
            "coordinator": "127.0.0.2:1", "error": None, "healthy": True, "health": {"verdict": "healthy",
            "problems": []}, "tasks": tasks}  # fmt: skip


def test_sim_status_lists_each_host_with_its_role_when_the_cluster_has_spares() -> None:
    text = render(_doc(["member", "member", "standby"]))
    header = next(line for line in text.splitlines() if line.startswith("TASK"))
    assert header.split() == ["TASK", "ADDRESS", "AGENT", "PID", "STATE", "HEARTBEAT", "ROLE", "STATE", "DIR"]
    rows = [line.split() for line in text.splitlines() if line[:1].isdigit()]
    assert [(row[0], row[-2]) for row in rows] == [("0", "member"), ("1", "member"), ("2", "standby")]
    assert "ROLE" not in render(_doc(["member", "member"]))  # a cluster without spares: the table as before
    assert "ROLE" not in render(_doc([None, None]))
