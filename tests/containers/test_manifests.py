"""The JobSet and LeaderWorkerSet manifests and the systemd unit in configs/: parsed, and every command,
variable name, port and path in them is one tpuctl has (commands parsed by tpuctl's own click commands;
names and ports from tpuctl's constants, not copies). The unit's ExecStart / ExecStop also run for real."""

from __future__ import annotations

import configparser
import math
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from harness import TPUCTL, Processes, wait_until

from tpuctl.agent.statedir import DEFAULT_ROOT, STATE_DIR_ENV
from tpuctl.cli.app import cli
from tpuctl.spec import detect
from tpuctl.spec.model import DEFAULT_PORT
from tpuctl.tpu.slice import resolve_slice

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# every variable a manifest may set for tpuctl: the names tpuctl reads
TPUCTL_READS = {
    detect.CLUSTER_ENV, detect.TASK_ID_ENV, detect.BACKEND_ENV, detect.HOSTS_ENV, detect.TOKEN_FILE_ENV,
    detect.PORT_ENV, STATE_DIR_ENV,
}  # fmt: skip
GKE_ACCELERATORS = {"tpu-v5-lite-podslice": "v5litepod", "tpu-v6e-slice": "v6e", "tpu-v5p-slice": "v5p"}


def tpuctl_commands(script: str) -> list[list[str]]:
    """Every ``tpuctl ...`` command in a shell line (split at ; && || and $(...)), redirections dropped."""
    commands = []
    for part in re.split(r";|&&|\|\||\$\(|\)", script):
        words = [w for w in shlex.split(part) if not re.match(r"^\d*[<>]", w)]
        while words[:1] in (["exec"], ["do"], ["then"]):  # a shell keyword before the command
            words = words[1:]
        if words[:1] == ["tpuctl"]:
            commands.append(words)
    return commands


def parse_with_tpuctl(words: list[str]) -> click.Context:
    """Parse ``tpuctl ARGS`` with tpuctl's own commands: an unknown command or option raises UsageError."""
    assert words[0].endswith("tpuctl"), words
    ctx = click.Context(cli, info_name="tpuctl")
    command = cli.get_command(ctx, words[1])
    assert command is not None, f"no command {words[1]!r}: {words}"
    return command.make_context(words[1], list(words[2:]), parent=ctx)


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod["spec"]["containers"])


def check_pod(pod: dict[str, Any], hosts: int) -> list[list[str]]:
    """What every TPU pod template must hold; returns the tpuctl commands its containers run."""
    selector = pod["spec"]["nodeSelector"]
    generation = GKE_ACCELERATORS[selector["cloud.google.com/gke-tpu-accelerator"]]
    chips = math.prod(int(n) for n in selector["cloud.google.com/gke-tpu-topology"].split("x"))
    tpu = resolve_slice(accelerator=f"{generation}-{chips}")
    assert tpu.num_hosts == hosts, "one pod per host of the slice the node selector asks for"
    commands: list[list[str]] = []
    tpu_containers = 0
    for container in containers(pod):
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        assert set(env) <= TPUCTL_READS, f"{container['name']}: {set(env) - TPUCTL_READS} are not read by tpuctl"
        if STATE_DIR_ENV in env:
            assert Path(env[STATE_DIR_ENV]) == Path(DEFAULT_ROOT)  # root's default state dir, the unit's too
            mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
            assert not mounts or env[STATE_DIR_ENV] in mounts
        port = int(env.get(detect.PORT_ENV, DEFAULT_PORT))
        assert all(p["containerPort"] == port for p in container.get("ports", []))
        limit = container.get("resources", {}).get("limits", {}).get("google.com/tpu")
        if limit is not None:
            tpu_containers += 1
            assert int(limit) == tpu.chips_per_host
        command = container["command"]
        script = command[2] if command[:2] == ["bash", "-c"] else shlex.join(command)
        found = tpuctl_commands(script)
        assert found, f"{container['name']} runs no tpuctl command"
        for words in found:
            parse_with_tpuctl(words)
            grace = [w for w in words if w.startswith("--grace")]
            if grace:
                seconds = float(words[words.index("--grace") + 1].rstrip("s"))
                assert pod["spec"]["terminationGracePeriodSeconds"] > seconds  # SIGKILL comes after the grace
        commands += found
    assert tpu_containers == 1
    return commands


def test_the_jobset_manifest_runs_tpuctl_init_then_tpuctl_run_as_the_main_process() -> None:
    doc = yaml.safe_load((CONFIGS / "k8s" / "jobset.yaml").read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    job = doc["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["parallelism"] == job["completions"] and job["completionMode"] == "Indexed"  # GKE's webhook needs it
    commands = check_pod(job["template"], job["parallelism"])
    assert [c[:2] for c in commands] == [["tpuctl", "init"], ["tpuctl", "run"]]
    script = containers(job["template"])[0]["command"][2]
    assert "exec tpuctl run" in script  # tpuctl run is PID 1: it forwards SIGTERM and reaps orphans


def test_the_leaderworkerset_manifest_runs_the_agent_as_a_sidecar() -> None:
    doc = yaml.safe_load((CONFIGS / "k8s" / "leaderworkerset.yaml").read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    template = doc["spec"]["leaderWorkerTemplate"]
    commands = check_pod(template["workerTemplate"], template["size"])
    assert ["tpuctl", "init", "--foreground"] in commands
    assert ["tpuctl", "status"] in commands and any(c[:2] == ["tpuctl", "run"] for c in commands)
    pod = template["workerTemplate"]["spec"]
    volumes = {v["name"] for v in pod["volumes"]}
    mounts = [{m["name"] for m in c["volumeMounts"]} for c in pod["containers"]]
    assert all(m == volumes for m in mounts), "both containers share the state dir"


def _unit() -> configparser.ConfigParser:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string((CONFIGS / "systemd" / "tpuctl.service").read_text())
    return unit


def test_the_systemd_unit_runs_init_in_the_foreground_with_root_s_state_dir() -> None:
    service = _unit()["Service"]
    start, stop = shlex.split(service["ExecStart"]), shlex.split(service["ExecStop"])
    assert parse_with_tpuctl(start).params["foreground"] is True
    assert parse_with_tpuctl(stop).info_name == "down"
    name, _, value = service["Environment"].partition("=")
    assert name in TPUCTL_READS and Path(value) == Path(DEFAULT_ROOT) == Path("/run") / service["RuntimeDirectory"]
    assert service["RuntimeDirectoryMode"] == "0700"  # a state dir is owner-only (StateDir.check)
    assert service["Type"] == "exec"
    if shutil.which("systemd-analyze"):
        done = subprocess.run(
            ["systemd-analyze", "verify", str(CONFIGS / "systemd" / "tpuctl.service")], capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        problems = [
            ln for ln in done.stderr.splitlines() if "tpuctl.service" in ln and "/usr/local/bin/tpuctl" not in ln
        ]
        assert not problems, done.stderr


@pytest.mark.slow
def test_the_units_start_and_stop_commands_bring_an_agent_up_and_down(tmp_path: Path, processes: Processes) -> None:
    """ExecStart as systemd runs it (no spec: a detected one-host cluster, simulated), then ExecStop."""
    service = _unit()["Service"]
    state = tmp_path / "run-tpuctl"
    env = {
        STATE_DIR_ENV: str(state), detect.BACKEND_ENV: "sim", detect.HOSTS_ENV: "127.0.0.2",
        "TPU_ACCELERATOR_TYPE": "v4-8", "TPU_WORKER_ID": "0", "TPU_SKIP_MDS_QUERY": "true",
        detect.PORT_ENV: str(_free_port()),
    }  # fmt: skip
    start = [*TPUCTL, *shlex.split(service["ExecStart"])[1:]]
    agent = processes.start("exec-start", start, env=env, cwd=tmp_path)
    wait_until(
        lambda: processes.run("status", [*TPUCTL, "status"], timeout=30, env=env).code == 0, 60, "the agent to be up",
        logs=processes.logs,
    )  # fmt: skip
    assert agent.poll() is None  # still in the foreground
    stop = processes.run("exec-stop", [*TPUCTL, *shlex.split(service["ExecStop"])[1:]], timeout=30, env=env)
    assert stop.code == 0, stop.err
    done = processes.wait(agent, timeout=float(service["TimeoutStopSec"]))
    assert done.code == 0, done.err


def _free_port() -> int:
    from tpuctl.sim.cluster import free_port

    return free_port("127.0.0.2")
