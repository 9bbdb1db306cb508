"""The CLI convention on real ``tpuctl`` processes: exit codes, files and modes, JSON documents, and the one
health verdict of ``status``, ``run`` and ``barrier`` after a host left (``tpuctl down`` on it)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from harness import TPUCTL
from harness.clusters import LocalCluster, SimCluster

LEFT_1 = "task 1 (127.0.0.3) left the cluster: it disconnected (tpuctl down, or its agent stopped)"


def tpuctl(*args: str, cwd: Path, umask: int = 0o022) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TPUCTL, *args], cwd=cwd, capture_output=True, text=True, timeout=60, preexec_fn=lambda: os.umask(umask)
    )


def test_o_json_is_json_and_out_writes_the_file_with_the_mappings_mode(tmp_path: Path) -> None:
    for args in (["-o", "json"], ["--output", "json"], ["--json"], ["--format=json"]):
        done = tpuctl("topology", "show", "-a", "v4-8", *args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["schema"] == "tpuctl.topology/v2"
    assert list(tmp_path.iterdir()) == []  # no file named json
    target = tmp_path / "plan.json"
    target.write_text("old")
    target.chmod(0o600)
    done = tpuctl("mesh", "plan", "-a", "v4-8", "--shape", "x=4", "-o", "json", "--out", str(target), cwd=tmp_path,
                  umask=0o077)  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (0, "", f"wrote {target}\n")
    assert json.loads(target.read_text())["schema"] == "tpuctl.mesh/v1"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # the mapping's mode, whatever the umask or the old file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]  # no temp file left


def test_a_path_given_as_the_format_is_a_usage_error(tmp_path: Path) -> None:
    done = tpuctl("topology", "show", "-a", "v4-8", "-o", "slice.json", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "tpuctl: error: tpuctl topology show: 'slice.json' is not an output format\n"
        "hint: -o/--output names a format (formats: text, json, svg), never a file: to write slice.json, "
        "use --out slice.json\n"
    )
    assert list(tmp_path.iterdir()) == []
    light = tpuctl("status", "--format", "txt", "--state-dir", str(tmp_path), cwd=tmp_path)
    assert (light.returncode, light.stdout) == (2, "")
    assert light.stderr == (
        "tpuctl: error: tpuctl status: 'txt' is not an output format\nhint: did you mean 'text'? formats: text, json\n"
    )


@pytest.mark.slow
def test_status_run_and_barrier_agree_that_a_host_that_left_is_not_healthy(
    sim_cluster: Callable[..., SimCluster], tmp_path: Path
) -> None:
    sim = sim_cluster("v4-16")
    healthy = sim.tpuctl("status", "-o", "json", task=0)
    assert healthy.code == 0, healthy.err
    document = json.loads(healthy.out)
    assert document["schema"] == "tpuctl.status/v1"
    assert document["health"] == {"verdict": "healthy", "problems": []}
    assert [t["task"] for t in document["tasks"]] == [0, 1]

    assert sim.tpuctl("down", task=1).code == 0
    status = sim.tpuctl("status", task=0)
    assert status.code == 3, status.err
    assert f"health       failed\n             {LEFT_1}\n" in status.out
    # the cause once: stdout names it under health; stderr says the verdict (issue 24 item 4)
    assert status.err == "tpuctl: error: cluster 'sim-v4-16' is not healthy: failed (1 problem, under health above)\n"
    as_json = sim.tpuctl("status", "--json", task=0)
    assert as_json.code == 3
    assert json.loads(as_json.out)["health"] == {
        "verdict": "failed",
        "problems": [{"task": 1, "address": "127.0.0.3", "state": "disconnected", "problem": LEFT_1}],
    }

    marker = tmp_path / "job-ran"
    job = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    here = str(sim.state(0))
    refused = sim.tpuctl("run", "--state-dir", here, "--", *job)
    assert refused.code == 3, refused.err
    assert f"tpuctl: error: cluster 'sim-v4-16' is not healthy: failed: {LEFT_1}\n" in refused.err
    assert "the job was not started (`tpuctl run --force` starts it anyway)" in refused.err
    assert not marker.exists()
    forced = sim.tpuctl("run", "--force", "--state-dir", here, "--", *job)
    assert forced.code == 0, forced.err
    assert marker.exists() and "starting the job anyway (--force)" in forced.err

    barrier = sim.tpuctl("barrier", "after-down", "--timeout", "20s", task=0)
    assert barrier.code == 3
    assert barrier.err == f"tpuctl: error: barrier 'after-down' #1 cannot pass: {LEFT_1}\n"


@pytest.mark.slow
def test_init_and_env_and_sim_up_print_documents_with_a_schema(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = make_cluster("v4-8")
    state = cluster.state(0)
    state.mkdir(mode=0o700)
    mapping = tmp_path / "elsewhere" / "mapping.json"
    done = cluster.tpuctl(
        "init", "--config", str(cluster.spec), "--task-id", "0", "--out", str(mapping), "-o", "json", task=0
    )
    assert done.code == 0, done.err
    document = json.loads(done.out)
    assert document["schema"] == "tpuctl.init/v1"
    assert (document["num_hosts"], document["tasks"]) == (1, [{"task": 0, "address": cluster.hosts[0]}])
    assert (document["topology"], document["topology_name"]) == ([2, 2, 1], "2x2x1")
    assert document["mapping"] == str(mapping) and stat.S_IMODE(mapping.stat().st_mode) == 0o644
    env = cluster.tpuctl("env", "-o", "json", task=0)
    assert env.code == 0, env.err
    assert set(json.loads(env.out)) == {"schema", "set", "unset"}
    assert json.loads(env.out)["set"]["TPUCTL_MAPPING"] == str(mapping)
    assert cluster.tpuctl("down", task=0).code == 0


@pytest.mark.slow
def test_sim_up_prints_its_document(sim_cluster: Callable[..., SimCluster]) -> None:
    cluster = sim_cluster("v4-16", "-o", "json")  # `sim down` and the agents' pids after the test
    root = cluster.root
    assert cluster.brought_up is not None
    document = json.loads(cluster.brought_up.out)
    assert (document["schema"], document["num_hosts"], document["root"]) == ("tpuctl.sim.up/v1", 2, str(root))
    assert [(t["task"], t["address"], t["state_dir"]) for t in document["tasks"]] == [
        (0, "127.0.0.2", str(root / "host-0")),
        (1, "127.0.0.3", str(root / "host-1")),
    ]
    assert all(Path(t["mapping"]).is_file() for t in document["tasks"])
    status = cluster.tpuctl("sim", "status", "--root", str(root), "--json", env=cluster.env)
    assert status.code == 0 and json.loads(status.out)["schema"] == "tpuctl.sim.status/v1"
