"""Hosts come back: a cluster with ``restart: {policy: rejoin}`` re-forms as a new generation when a host's
agent is killed and its ``tpuctl init`` runs again, and ``tpuctl run --max-restarts`` restarts the job, which
resumes from its checkpoint. Real ``tpuctl`` processes on loopback (4 simulated hosts), a real 4-process JAX
CPU job; the time from the host's return to the job's restart is measured (docs/development/reliability.md, "Hosts come back").
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from harness import TPUCTL, Proc, wait_until
from harness.clusters import LocalCluster

pytestmark = pytest.mark.slow

PYTHON = sys.executable
JOB = Path(__file__).resolve().parent / "job_resume.py"
SPEC = {"heartbeat": "500ms", "heartbeat_timeout": "3s", "register_timeout": "60s", "barrier_timeout": "60s"}
MEASURED = Path(os.environ.get("TPUCTL_RESTART_MEASURE", "/tmp/tpuctl-restart-measure.jsonl"))


def rejoin_spec(timeout: str = "60s", most: int = 2) -> dict[str, str]:
    return {**SPEC, "extra": f"restart: {{policy: rejoin, timeout: {timeout}, max: {most}}}\n"}


def start_runs(c: LocalCluster, folder: Path, steps: int, kind: str, restarts: int = 2) -> dict[int, Proc]:
    env = {"JAX_PLATFORMS": "cpu"}
    return {
        t: c.start(f"run-{t}", [*TPUCTL, "run", "--max-restarts", str(restarts), "--grace", "2s", "--state-dir",
                                str(c.state(t)), "--", PYTHON, str(JOB), str(folder), str(steps), kind], env=env)
        for t in range(c.num_hosts)
    }  # fmt: skip


def starts(folder: Path, task: int) -> list[list[str]]:
    path = folder / f"starts-{task}"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def step(folder: Path) -> int:
    text = (folder / "step").read_text().strip() if (folder / "step").exists() else ""
    return int(text or 0)


def wait_step(c: LocalCluster, folder: Path, at_least: int, timeout: float = 90.0) -> None:
    wait_until(lambda: step(folder) >= at_least, timeout, f"the job to reach step {at_least}", logs=c.logs)


def result(proc: Proc) -> dict[str, int]:
    line = next(line for line in proc.out().splitlines() if line.startswith("RESULT "))
    data: dict[str, int] = json.loads(line[len("RESULT "):])
    return data


def kill_and_return(c: LocalCluster, victim: int, label: str) -> float:
    """kill -9 the victim's agent, then `tpuctl init` again on its host at once; returns when it returned."""
    os.kill(c.agent_pid(victim), signal.SIGKILL)
    back = time.time()
    c.start_init(victim, label=label)
    return back


def restarted_at(folder: Path, tasks: range, generation: int) -> dict[int, float]:
    """When each host's job started in ``generation`` (wall clock, from its own first line)."""
    found = {}
    for task in tasks:
        for entry in starts(folder, task):
            if entry[0] == "start" and int(entry[2]) == generation:
                found[task] = float(entry[1])
    return found


def record(case: str, back: float, folder: Path, tasks: range, generation: int) -> float:
    at = restarted_at(folder, tasks, generation)
    assert len(at) == len(tasks), at
    took = max(at.values()) - back
    with MEASURED.open("a") as handle:
        handle.write(json.dumps({"case": case, "return_to_restart_s": round(took, 3)}) + "\n")
    return took


@pytest.mark.parametrize("victim", [2, 0], ids=["worker", "coordinator"])
def test_a_killed_host_comes_back_the_cluster_re_forms_and_the_jax_job_resumes(make_cluster, tmp_path, victim) -> None:
    pytest.importorskip("jax")
    c = make_cluster("v4-32", **rejoin_spec())
    c.up()
    folder = tmp_path / "job"
    folder.mkdir()
    runs = start_runs(c, folder, steps=40, kind="jax")
    wait_step(c, folder, 5)
    back = kill_and_return(c, victim, f"init-again-{victim}")
    done = {t: c.processes.wait(p.label, 150) for t, p in runs.items()}
    assert [done[t].code for t in range(4)] == [0, 0, 0, 0], c.logs()
    for t in range(4):
        got = result(runs[t])
        assert got["generation"] == 2 and got["restarts"] == 1 and got["last"] == 40, got
        assert got["first"] >= 5, got  # resumed from the checkpoint, not from 0
        assert "restarting the job (restart 1 of 2)" in runs[t].err(), runs[t].err()
        assert [e[2] for e in starts(folder, t) if e[0] == "start"] == ["1", "2"]
    mapping = json.loads(c.mapping(1).read_text())
    assert mapping["generation"] == 2
    assert json.loads(c.tpuctl("status", "--json", task=1).out)["generation"] == 2
    took = record(f"kill -9 of task {victim}'s agent, init again (JAX job)", back, folder, range(4), 2)
    assert took < 2.0 + 10.0, f"{took:.1f} s from the host's return to the job's restart"  # + the job's start
    text = (c.state(1) / "agent.log").read_text()
    cause = "the coordinator restarted" if victim == 0 else "restarted: a new process"
    assert cause in text or (victim == 0 and "stopped answering" in text), text[-2000:]


def test_a_third_failure_exhausts_the_restarts_and_exits_3_with_the_table(make_cluster, tmp_path) -> None:
    c = make_cluster("v4-32", **rejoin_spec())
    c.up()
    folder = tmp_path / "job"
    folder.mkdir()
    runs = start_runs(c, folder, steps=100000, kind="plain")
    for generation in (1, 2, 3):
        wait_until(lambda g=generation: len(restarted_at(folder, range(4), g)) == 4, 60,
                   f"the job to run in generation {generation}", logs=c.logs)  # fmt: skip
        kill_and_return(c, 3, f"init-{generation}")
    done = {t: c.processes.wait(p.label, 60) for t, p in runs.items()}
    assert all(done[t].code == 3 for t in range(4)), c.logs()
    err = runs[1].err()
    assert "no restarts left (2 of 2 used)" in err, err
    assert "restarted 2 of at most 2 times" in err, err
    table = err[err.index("GENERATION"):]
    assert re.search(r"^\s*1\s", table, re.M) and re.search(r"^\s*2\s", table, re.M) and re.search(r"^\s*3\s", table, re.M)
    assert "task 3 (127.0.0.5) failed: restarted" in err


def test_a_host_that_never_comes_back_fails_the_cluster_at_the_restart_timeout(make_cluster, tmp_path) -> None:
    c = make_cluster("v4-32", **rejoin_spec(timeout="6s"))
    c.up()
    folder = tmp_path / "job"
    folder.mkdir()
    runs = start_runs(c, folder, steps=100000, kind="plain")
    wait_until(lambda: len(restarted_at(folder, range(4), 1)) == 4, 60, "every job to start", logs=c.logs)
    os.kill(c.agent_pid(2), signal.SIGKILL)
    killed = time.monotonic()
    # While the cluster re-forms, a job's barrier of the ended generation fails at once, naming both.
    c.wait_for_log(1, "re-forming as the next generation", 15)
    barrier = c.processes.run("barrier-old", [*TPUCTL, "barrier", "step", "--state-dir", str(c.state(1))],
                              timeout=20, env={"TPUCTL_GENERATION": "1"})  # fmt: skip
    assert barrier.code == 3 and "generation 1 is over" in barrier.err, barrier.err
    survivors = [0, 1, 3]
    done = {t: c.processes.wait(runs[t].label, 60) for t in survivors}
    took = time.monotonic() - killed
    assert all(done[t].code == 3 for t in survivors), c.logs()
    for t in survivors:
        err = runs[t].err()
        assert "task 2 (127.0.0.4) failed: did not rejoin generation 2 within the restart timeout (6 s)" in err, err
        assert "generation 1 ended: task 2 (127.0.0.4) failed: no heartbeat" in err, err
    assert took < 3 + 6 + 8, f"{took:.1f} s"
