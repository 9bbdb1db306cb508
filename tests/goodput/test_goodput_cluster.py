"""The ledger against the harness's own clock: a 4-host simulated cluster (real ``tpuctl init`` on 127.0.0.x,
``restart: {policy: rejoin}``) runs a lockstep job under ``tpuctl run --max-restarts 1`` that reports its
steps and checkpoints (``job_ledger.py``). The harness brings the cluster up, kills one host (its job, its
``tpuctl run`` and its agent, kill -9) at a time it notes, brings it back with ``tpuctl init`` and
``tpuctl run`` again, and notes when the restarted job first stepped. ``tpuctl goodput`` on another host must
put each of those spans in its buckets within one heartbeat interval, and add up to the wall within 1 %.
Then task 0's agent is killed and comes back with its state dir: the new coordinator continues the ledger
from its journal.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from harness import TPUCTL, wait_until
from harness.clusters import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.beside]  # `make test` runs it beside the rest (its budget)

JOB = Path(__file__).resolve().parent / "job_ledger.py"
HEARTBEAT_S = 2.0  # the spec's heartbeat interval: each bucket must match within it
STEP_S = 0.1
EVERY = 20  # steps between checkpoints
SPEC = {
    "heartbeat": f"{HEARTBEAT_S:g}s", "heartbeat_timeout": "6s", "register_timeout": "60s", "barrier_timeout": "60s",
    "extra": "restart: {policy: rejoin, timeout: 60s, max: 2}\nwatchdog: {report_every: 0.5s}\n",
}  # fmt: skip
MEASURED = Path(os.environ.get("TPUCTL_GOODPUT_MEASURE", "/tmp/tpuctl-goodput-measure.jsonl"))


def events(folder: Path, task: int) -> list[list[str]]:
    path = folder / f"events-{task}"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def first_step(folder: Path, hosts: int, generation: int) -> float | None:
    """When the job first stepped in ``generation``: the earliest host's first reported step."""
    found = [float(e[1]) for t in range(hosts) for e in events(folder, t) if e[0] == "first" and int(e[2]) == generation]
    return min(found) if len(found) == hosts else None


def step(folder: Path) -> int:
    text = (folder / "step").read_text().strip() if (folder / "step").exists() else ""
    return int(text or 0)


def run_job(c: LocalCluster, task: int, folder: Path, label: str) -> None:
    c.start(label, [*TPUCTL, "run", "--max-restarts", "1", "--grace", "2s", "--state-dir", str(c.state(task)), "--",
                    sys.executable, str(JOB), str(folder), str(STEP_S), str(EVERY), str(c.num_hosts)])  # fmt: skip


def test_the_ledger_s_buckets_match_the_harness_s_own_timings(make_cluster, tmp_path: Path) -> None:
    c = make_cluster("v4-32", **SPEC)
    folder = c.root / "job"  # under the cluster's root: the harness stops the jobs by their pid files
    folder.mkdir()
    began = time.time()
    c.up()
    up = time.time()
    for task in range(c.num_hosts):
        run_job(c, task, folder, f"run-{task}")
    first_1 = wait_until(lambda: first_step(folder, c.num_hosts, 1), 60, "the job's first step", logs=c.logs)
    # kill a host 12 steps after a checkpoint (the checkpoint's report has reached the coordinator by then)
    wait_until(lambda: step(folder) >= EVERY and step(folder) % EVERY == 12, 60, "step 12 after a checkpoint", logs=c.logs)
    victim = 2
    job = int((folder / f"job-{victim}.pids").read_text().split()[-1])
    os.kill(job, signal.SIGKILL)
    os.kill(c.processes.procs[f"run-{victim}"].pid, signal.SIGKILL)
    os.kill(c.agent_pid(victim), signal.SIGKILL)
    killed = time.time()
    checkpoint = max(float(e[1]) for e in events(folder, 0) if e[0] == "ckpt" and float(e[1]) < killed)
    time.sleep(7.0)  # the failure is detected within the heartbeat timeout; then the cluster waits for the host
    back = time.time()
    c.start_init(victim, label="init-again")
    assert c.wait_init("init-again", 60).code == 0, c.logs()
    returned = time.time()
    run_job(c, victim, folder, "run-again")
    first_2 = wait_until(lambda: first_step(folder, c.num_hosts, 2), 60, "the restarted job's first step", logs=c.logs)
    time.sleep(2.0)
    asked = time.time()
    done = c.tpuctl("goodput", "--json", task=1, timeout=30)
    answered = time.time()
    assert done.code == 0, done.err
    ledger = json.loads(done.out)
    one, two = ledger["generations"]
    b1, b2 = one["buckets"], two["buckets"]
    measured = {
        "bring-up": (b1["bring_up"], up - began),
        "job start to first step": (b1["startup"], first_1 - up),
        "first step to the kill": (b1["productive"] + b1["lost"], killed - first_1),
        "lost (the last checkpoint to the kill)": (b1["lost"], killed - checkpoint),
        "the kill to the host's return": (b1["restart"] + b2["waiting"] + b2["restart"], returned - killed),
        "its return to the restarted job's first step": (b2["startup"], first_2 - returned),
    }
    with MEASURED.open("a") as handle:
        handle.write(json.dumps({name: [round(a, 3), round(b, 3)] for name, (a, b) in measured.items()}) + "\n")
    for name, (bucket, harness) in measured.items():
        assert abs(bucket - harness) <= HEARTBEAT_S, f"{name}: ledger {bucket:.3f} s, harness {harness:.3f} s\n{ledger}"
    assert b1["hung"] == b2["hung"] == b2["lost"] == 0 and b1["waiting"] == b2["bring_up"] == 0
    # detection: the heartbeat timeout after the keepalive window before it (6 s - 2 s), not the whole wait
    assert 3.0 <= b1["restart"] <= 6.0 + HEARTBEAT_S, b1
    assert one["failures"][0]["task"] == victim and abs(one["failures"][0]["at"] - killed) <= HEARTBEAT_S
    assert two["returns"][0]["task"] == victim and back <= two["returns"][0]["at"] <= returned
    # the whole: the buckets add up to the wall exactly, which starts at task 0's init and ends at the answer
    assert abs(sum(ledger["totals"].values()) - ledger["wall_seconds"]) < 1e-6
    assert abs(ledger["since"] - began) <= 0.01 * ledger["wall_seconds"], (ledger["since"], began)
    assert asked <= ledger["until"] <= answered
    assert ledger["bucket"] == "productive" and ledger["generation"] == 2 and ledger["error"] is None
    # any host, and the status line; the picture
    status = json.loads(c.tpuctl("status", "--json", task=3, timeout=30).out)
    assert status["goodput"]["bucket"] == "productive" and status["goodput"]["generation"] == 2
    svg = tmp_path / "goodput.svg"
    assert c.tpuctl("goodput", "--format", "svg", "--out", str(svg), task=0, timeout=30).code == 0
    root = ET.fromstring(svg.read_bytes())
    assert [g.get("data-generation") for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "generation"] == ["1", "2"]
    # the coordinator dies and comes back with its state dir: the ledger goes on from its journal
    os.kill(c.agent_pid(0), signal.SIGKILL)
    c.start_init(0, label="init-0-again")
    assert c.wait_init("init-0-again", 60).code == 0, c.logs()
    later = json.loads(c.tpuctl("goodput", "--json", task=3, timeout=30).out)
    assert [g["generation"] for g in later["generations"]] == [1, 2, 3] and later["since"] == ledger["since"]
    assert "coordinator stopped" in later["generations"][1]["ended"]
    assert later["generations"][0]["buckets"] == ledger["generations"][0]["buckets"]
    assert later["generations"][2]["buckets"]["bring_up"] == 0 and later["generations"][2]["buckets"]["waiting"] > 0
    assert abs(sum(later["totals"].values()) - later["wall_seconds"]) < 1e-6
