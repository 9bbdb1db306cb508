"""A lost slice does not stop the job (issue 26), on real processes: ``tpuctl init`` per host on loopback (the
sim backend), ``tpuctl run --max-restarts`` on every host (spares too), a real checkpointing JAX CPU job
(``tests/restart/job_resume.py``). A host is lost as a machine is: kill -9 of its agent, its ``tpuctl run``
and its job at once.

* a spare slice takes the lost slice's place; the next generation forms within the heartbeat timeout + 2 s;
* without a spare, ``policy: elastic`` goes on with 2 slices (the mesh's slice axis shrinks), then grows back
  to 3 when the lost slice's hosts run ``tpuctl init`` again;
* task 0's host lost: the successor coordinates the next generation, a spare slice takes slice 0's place.

Each job checks that JAX's view of the cluster agrees with its environment (``job_resume.py`` exits 5
otherwise); the tests check the step each generation resumes from is the checkpoint's. The times measured
(kill -> next generation formed, kill -> job restarted) are appended to ``$TPUCTL_RESTART_MEASURE``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from harness import TPUCTL, Proc, wait_until
from harness.clusters import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.beside]  # `make test` runs it beside the rest (its budget)

PYTHON = sys.executable
JOB = Path(__file__).resolve().parents[1] / "restart" / "job_resume.py"
HEARTBEAT_TIMEOUT_S = 3.0
SPEC = {"heartbeat": "500ms", "heartbeat_timeout": "3s", "register_timeout": "60s", "barrier_timeout": "60s"}
MEASURED = Path(os.environ.get("TPUCTL_RESTART_MEASURE", "/tmp/tpuctl-restart-measure.jsonl"))


def start_runs(c: LocalCluster, folder: Path, steps: int, tasks: range | None = None) -> dict[int, Proc]:
    """``tpuctl run --max-restarts 3 -- python job_resume.py FOLDER STEPS jax-detect`` on every host (spares too):
    plain ``jax.distributed.initialize()``, JAX's own cluster detection under ``tpuctl run``."""
    env = {"JAX_PLATFORMS": "cpu"}
    return {
        t: c.start(f"run-{t}", [*TPUCTL, "run", "--max-restarts", "3", "--grace", "2s", "--state-dir", str(c.state(t)),
                                "--", PYTHON, str(JOB), str(folder), str(steps), "jax-detect"], env=env)
        for t in (tasks if tasks is not None else range(c.num_hosts))
    }  # fmt: skip


def lines(folder: Path, task: int, kind: str) -> list[list[str]]:
    path = folder / f"starts-{task}"
    entries = [line.split() for line in path.read_text().splitlines()] if path.exists() else []
    return [e for e in entries if e[0] == kind]


def ready(folder: Path, task: int, generation: int) -> dict[str, object] | None:
    """The job's ``ready`` line in ``generation``: when, the step it resumed from, its rank, processes, slices, mesh."""
    for e in lines(folder, task, "ready"):
        if int(e[2]) == generation:
            return {"at": float(e[1]), "first": int(e[4]), "rank": int(e[5]), "processes": int(e[6]),
                    "slices": int(e[7]), "mesh": e[8]}  # fmt: skip
    return None


def started(folder: Path, task: int, generation: int) -> float | None:
    found = [float(e[1]) for e in lines(folder, task, "start") if int(e[2]) == generation]
    return found[0] if found else None


def step(folder: Path) -> int:
    text = (folder / "step").read_text().strip() if (folder / "step").exists() else ""
    return int(text or 0)


def wait_ready(c: LocalCluster, folder: Path, tasks: list[int], generation: int, timeout: float = 60.0) -> None:
    wait_until(lambda: all(ready(folder, t, generation) for t in tasks), timeout,
               f"the job of tasks {tasks} to be running in generation {generation}", logs=c.logs)  # fmt: skip


def kill_host(c: LocalCluster, folder: Path, task: int, runs: dict[int, Proc]) -> float:
    """kill -9 of the host's agent, its ``tpuctl run`` and its job, as a machine that is gone; returns when."""
    pids = [c.agent_pid(task), runs[task].popen.pid, int((folder / f"pid-{task}").read_text())]
    at = time.time()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return at


def formed_at(c: LocalCluster, task: int, generation: int) -> float | None:
    """When task's agent logged that ``generation`` formed (its log's wall clock)."""
    needle = f"task {task}: generation {generation} formed"
    log = c.state(task) / "agent.log"
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if needle in line:
            return datetime.strptime(" ".join(line.split()[:2]), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def measure(
    case: str, killed: float, c: LocalCluster, folder: Path, members: list[int], generation: int
) -> dict[str, float]:
    """Kill -> the last member's agent saw ``generation`` form, and kill -> the last member's job restarted."""
    formed = [formed_at(c, t, generation) for t in members]
    jobs = [started(folder, t, generation) for t in members]
    assert None not in formed and None not in jobs, (formed, jobs)
    figures = {"kill_to_formed_s": round(max(f for f in formed if f) - killed, 3),
               "kill_to_job_restart_s": round(max(j for j in jobs if j) - killed, 3)}  # fmt: skip
    with MEASURED.open("a") as handle:
        handle.write(json.dumps({"case": case, **figures}) + "\n")
    return figures


def result(proc: Proc) -> dict[str, int]:
    line = next(line for line in proc.out().splitlines() if line.startswith("RESULT "))
    data: dict[str, int] = json.loads(line[len("RESULT ") :])
    return data


def finish(
    c: LocalCluster, runs: dict[int, Proc], members: list[int], timeout: float = 90.0
) -> dict[int, dict[str, int]]:
    """Wait for the members' runs to end; each exits 0 with its job's RESULT."""
    done = {t: c.processes.wait(runs[t].label, timeout) for t in members}
    assert all(done[t].code == 0 for t in members), {t: (done[t].code, runs[t].err()[-800:]) for t in members}
    return {t: result(runs[t]) for t in members}


def running(make_cluster, tmp_path: Path, steps: int, extra: str, spares: int = 0) -> tuple[LocalCluster, Path, dict[int, Proc]]:
    """3 slices of v4-16 (and ``spares`` spare slices) up, the JAX job under ``tpuctl run`` on every host of
    the 3 slices (``steps`` steps), past its checkpoint of step 2."""
    pytest.importorskip("jax")
    c: LocalCluster = make_cluster("v4-16", num_slices=3, spares=spares, **SPEC, extra=extra)
    c.up()
    folder = tmp_path / "job"
    folder.mkdir()
    runs = start_runs(c, folder, steps=steps)
    wait_ready(c, folder, list(range(6)), 1)
    wait_until(lambda: step(folder) >= 2, 30, "the job to checkpoint step 2", logs=c.logs)
    return c, folder, runs


def test_a_spare_slice_takes_a_lost_slices_place_and_the_jax_job_resumes_from_its_checkpoint(
    make_cluster, tmp_path
) -> None:
    c, folder, runs = running(make_cluster, tmp_path, 30, "restart: {policy: rejoin, timeout: 2m, max: 3}\n", spares=1)
    killed = kill_host(c, folder, 2, runs)
    members = [0, 1, 6, 7, 4, 5]  # rank order: the spare slice (tasks 6, 7) in slice 1's place
    wait_ready(c, folder, members, 2)
    checkpoint = step(folder)  # nothing writes it between generations: rank 0's job waits for every rank
    figures = measure("spare slice replaces slice 1 (kill -9 of task 2's host)", killed, c, folder, members, 2)
    for rank, task in enumerate(members):
        got = ready(folder, task, 2)
        assert got is not None and got["rank"] == rank and got["processes"] == 6 and got["slices"] == 3, (task, got)
        assert got["first"] == checkpoint >= 2, (task, got, checkpoint)  # resumed from the checkpoint
    assert figures["kill_to_formed_s"] <= HEARTBEAT_TIMEOUT_S + 2.0, figures
    results = finish(c, runs, members)
    assert all(r["generation"] == 2 and r["last"] == 30 for r in results.values()), results
    mapping = json.loads(c.mapping(6).read_text())
    assert mapping["generation"] == 2 and [t.get("task_id", t["id"]) for t in mapping["tasks"]] == members
    assert "in place of slice 1" in (c.state(0) / "agent.log").read_text()


def test_without_a_spare_an_elastic_cluster_goes_on_with_2_slices_then_grows_back_to_3(make_cluster, tmp_path) -> None:
    mesh = "meshes: [{name: m, shape: {data: 6, model: 4}, options: {dcn_shape: {data: 3}}}]\n"
    restart = "restart: {policy: elastic, min_slices: 2, timeout: 2m, max: 3}\n"
    c, folder, runs = running(make_cluster, tmp_path, 45, restart + mesh)
    assert ready(folder, 0, 1) == {**(ready(folder, 0, 1) or {}), "processes": 6, "slices": 3, "mesh": "data=6,model=4"}
    killed = kill_host(c, folder, 2, runs)
    shrunk = [0, 1, 4, 5]  # slice 1 dropped: slice 2 moves to position 1
    wait_ready(c, folder, shrunk, 2)
    checkpoint = step(folder)
    figures = measure("elastic: shrinks to 2 slices (kill -9 of task 2's host)", killed, c, folder, shrunk, 2)
    for rank, task in enumerate(shrunk):
        got = ready(folder, task, 2)
        assert got is not None and (got["rank"], got["processes"], got["slices"]) == (rank, 4, 2), (task, got)
        assert got["mesh"] == "data=4,model=4" and got["first"] == checkpoint >= 2, (task, got, checkpoint)
    assert figures["kill_to_formed_s"] <= HEARTBEAT_TIMEOUT_S + 2.0, figures
    assert "generation 2 shrinks to 2 slices (slice 1 dropped" in (c.state(0) / "agent.log").read_text()

    # The slice comes back whole: task 3's machine restarted too (its standby agent stopped), then `tpuctl
    # init` on both hosts and `tpuctl run` on both, as on any host.
    wait_until(lambda: step(folder) >= checkpoint + 2, 30, "the shrunk job to advance", logs=c.logs)
    assert c.tpuctl("down", task=3, timeout=30).code == 0
    c.processes.wait(runs[3].label, 30)  # its `tpuctl run` ends with its agent
    back = time.time()
    for task in (2, 3):
        c.start_init(task, label=f"init-again-{task}")
    inits = c.processes.wait_all(["init-again-2", "init-again-3"], 60)
    assert [i.code for i in inits] == [0, 0], c.logs()
    runs.update(start_runs(c, folder, steps=45, tasks=range(2, 4)))
    wait_ready(c, folder, list(range(6)), 3)
    checkpoint = step(folder)
    order = [0, 1, 4, 5, 2, 3]  # slice 1 is appended: the others keep their ranks
    grown = measure("elastic: grows back to 3 slices (from init of slice 1's hosts)", back, c, folder, order, 3)
    for rank, task in enumerate(order):
        got = ready(folder, task, 3)
        assert got is not None and (got["rank"], got["processes"], got["slices"]) == (rank, 6, 3), (task, got)
        assert got["mesh"] == "data=6,model=4" and got["first"] == checkpoint > 2, (task, got, checkpoint)
    assert "generation 3 grows to 3 slices" in (c.state(0) / "agent.log").read_text()
    results = finish(c, runs, list(range(6)))
    assert all(r["generation"] == 3 and r["last"] == 45 for r in results.values()), results
    assert grown["kill_to_job_restart_s"] < 30, grown


def test_task_0s_host_lost_the_successor_coordinates_and_a_spare_slice_takes_slice_0s_place(
    make_cluster, tmp_path
) -> None:
    c, folder, runs = running(make_cluster, tmp_path, 30, "restart: {policy: rejoin, timeout: 2m, max: 3}\n", spares=1)
    killed = kill_host(c, folder, 0, runs)
    members = [6, 7, 2, 3, 4, 5]  # the spare slice at position 0: task 6 is rank 0 (JAX's coordinator)
    # Task 2's new service starts generation 2 waiting for slice 0 (no standby slice is known ready to it yet),
    # and gives way to generation 3 as soon as the spare slice has registered: the job runs in generation 3.
    wait_ready(c, folder, members, 3)
    checkpoint = step(folder)
    figures = measure(
        "task 0's host lost: successor task 2, spare slice replaces slice 0", killed, c, folder, members, 3
    )
    for rank, task in enumerate(members):
        got = ready(folder, task, 3)
        assert got is not None and (got["rank"], got["processes"], got["slices"]) == (rank, 6, 3), (task, got)
        assert got["first"] == checkpoint >= 2, (task, got, checkpoint)
    assert figures["kill_to_formed_s"] <= HEARTBEAT_TIMEOUT_S + 2.0, figures
    log = (c.state(2) / "agent.log").read_text()
    assert "coordination service listening" in log, log[-3000:]  # task 2, the first successor, serves
    assert "generation 3 forms with spare slice 3 (tasks 6, 7) in place of slice 0" in log, log[-3000:]
    results = finish(c, runs, members)
    assert all(r["generation"] == 3 and r["last"] == 30 for r in results.values()), results
    assert c.info(6)["generation"] == 3 and c.info(6)["rank"] == 0
