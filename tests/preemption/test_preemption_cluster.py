"""Preemption notices end in a checkpoint on every host at the same step: real ``tpuctl`` processes on loopback
(4 simulated hosts), real jobs under ``tpuctl run``. Sources: the GCE metadata server (a loopback HTTP server
speaking its protocol), SIGTERM to one host's ``tpuctl run``, ``tpuctl preempt``. Jobs: a 4-process JAX CPU job,
a plain Python loop and a shell loop asking ``tpuctl progress``. Timings go to the measurement file
(docs/how-to/preemption.md quotes them).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from harness import TPUCTL, Proc, wait_until
from harness.clusters import LocalCluster

from preemption.gce_server import gce_server

pytestmark = [pytest.mark.slow, pytest.mark.beside]  # `make test` runs it beside the rest (its budget)

PYTHON = sys.executable
HERE = Path(__file__).resolve().parent
JOB = HERE / "job_checkpoint.py"
SHELL_JOB = HERE / "job_shell.sh"
SPEC = {"heartbeat": "500ms", "heartbeat_timeout": "3s", "register_timeout": "60s", "barrier_timeout": "60s",
        "extra": "restart: {policy: rejoin, timeout: 60s, max: 2}\n"}  # fmt: skip
MEASURED = Path(os.environ.get("TPUCTL_PREEMPT_MEASURE", "/tmp/tpuctl-preempt-measure.jsonl"))
GRACE_S = 20.0


def lines(folder: Path, task: int) -> list[list[str]]:
    path = folder / f"starts-{task}"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def at(folder: Path, task: int) -> int:
    path = folder / f"at-{task}"
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text.isdigit() else 0


def saved(folder: Path, tasks: range, generation: int) -> dict[int, tuple[float, int]]:
    """Each host's job's save in ``generation``: (wall time, step)."""
    found = {}
    for task in tasks:
        for entry in lines(folder, task):
            if entry[0] == "saved" and int(entry[2]) == generation:
                found[task] = (float(entry[1]), int(entry[3]))
    return found


def starts(folder: Path, task: int) -> list[tuple[int, int]]:
    """(generation, first step) of every start of the job on ``task``."""
    return [(int(e[2]), int(e[4])) for e in lines(folder, task) if e[0] == "start"]


def result(proc: Proc) -> dict[str, int]:
    line = next(line for line in proc.out().splitlines() if line.startswith("RESULT "))
    data: dict[str, int] = json.loads(line[len("RESULT "):])
    return data


def record(case: str, **figures: float) -> None:
    with MEASURED.open("a") as handle:
        handle.write(json.dumps({"case": case, **{k: round(v, 3) for k, v in figures.items()}}) + "\n")


def run_command(c: LocalCluster, task: int, folder: Path, steps: int, kind: str, restarts: int = 2) -> list[str]:
    if kind == "shell":
        job = ["sh", str(SHELL_JOB), str(folder), str(steps), "0.2"]
    else:
        job = [PYTHON, str(JOB), str(folder), str(steps), "0.25", kind]
    return [*TPUCTL, "run", "--max-restarts", str(restarts), "--grace", f"{GRACE_S:g}s", "--state-dir",
            str(c.state(task)), "--", *job]  # fmt: skip


JOB_ENV = {"JAX_PLATFORMS": "cpu", "TPUCTL": " ".join(TPUCTL)}


@pytest.mark.parametrize("trigger", ["tpuctl-preempt", "agent-sigterm"])
def test_plain_python_and_shell_loops_save_the_same_agreed_step(make_cluster, tmp_path, trigger) -> None:
    """Hosts 0 and 1 run a plain Python loop (tpuctl.job.should_checkpoint), hosts 2 and 3 a shell loop
    (tpuctl progress); host 1 gets the notice (`tpuctl preempt`, or SIGTERM to its agent): every host's job
    saves the same step and exits 0, and host 1's agent leaves once its job exited."""
    c = make_cluster("v4-32", **SPEC)
    c.up()
    folder = tmp_path / "job"
    folder.mkdir()
    kinds = {0: "plain", 1: "plain", 2: "shell", 3: "shell"}
    runs = {t: c.start(f"run-{t}", run_command(c, t, folder, 100000, kinds[t], restarts=0), env=JOB_ENV) for t in range(4)}
    wait_until(lambda: all(at(folder, t) >= 3 for t in range(4)), 60, "every job to reach step 3", logs=c.logs)
    noticed = time.time()
    if trigger == "tpuctl-preempt":
        preempt = c.tpuctl("preempt", "--in", "20s", "--reason", "drill", "--json", task=1)
        assert preempt.code == 0, preempt.err
        notice = json.loads(preempt.out)
        assert notice["schema"] == "tpuctl.preempt/v1" and notice["task"] == 1 and notice["source"] == "command"
        assert notice["taking_part"] == 1 and notice["reason"] == "drill"
        source = "command"
    else:
        os.kill(c.agent_pid(1), signal.SIGTERM)  # systemd or a person stopping the agent: a notice, not a leave
        source = "sigterm"
    wait_until(lambda: len(saved(folder, range(4), 1)) == 4, 30, "every host's job to save", logs=c.logs)
    got = saved(folder, range(4), 1)
    steps = {step for _, step in got.values()}
    assert len(steps) == 1, got  # the same step on every host, Python and shell alike
    done = {t: c.processes.wait(p.label, 30) for t, p in runs.items()}
    step = steps.pop()
    for t in range(4):  # no restarts: the job stopped for a host going away is not finished
        assert done[t].code == 3, done[t].err
        assert f"the job exited 0 after the agreed checkpoint (step {step}) for task 1's notice ({source})" in done[t].err
    assert all(f"ckpt-{t}" in os.listdir(folder) for t in range(4))
    record(f"{trigger}, plain Python + shell loops: notice to the last save",
           seconds=max(w for w, _ in got.values()) - noticed)  # fmt: skip
    c.wait_for_log(1, f"going away ({source})", 10)  # the noticed host's agent let its host go
    wait_until(lambda: agent_gone(c, 1), 10, "host 1's agent to exit", logs=c.logs)


def test_a_job_that_never_asks_gets_sigterm_and_the_grace_at_once(make_cluster, tmp_path) -> None:
    """Jobs that never call should_checkpoint: SIGTERM to a host's `tpuctl run` is forwarded at once (no notice,
    its agent stays); a notice (`tpuctl preempt --in 60s`) finds nothing to agree on, so its host leaves at once
    and every job gets SIGTERM and --grace then, not at the deadline."""
    c = make_cluster("v4-32", **SPEC)
    c.up()
    sleeper = [PYTHON, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(143)); "
               "print('up', flush=True); time.sleep(600)"]  # fmt: skip
    runs = {t: c.start(f"run-{t}", [*TPUCTL, "run", "--grace", "5s", "--state-dir", str(c.state(t)), "--", *sleeper])
            for t in range(4)}  # fmt: skip
    wait_until(lambda: all("up" in p.out() for p in runs.values()), 60, "every job to start", logs=c.logs)
    os.kill(runs[3].popen.pid, signal.SIGTERM)
    stopped = c.processes.wait(runs[3].label, 10)
    assert stopped.code == 143, stopped.err  # forwarded at once: the job's own exit on SIGTERM
    assert "SIGTERM" not in c.state(3).joinpath("agent.log").read_text()  # no notice: nothing asks
    assert not agent_gone(c, 3)
    noticed = time.monotonic()
    assert c.tpuctl("preempt", "--in", "60s", task=1).code == 0
    done = {t: c.processes.wait(runs[t].label, 30) for t in (0, 1, 2)}
    took = time.monotonic() - noticed
    assert all(done[t].code == 3 for t in done), c.logs()
    assert took < 15, f"{took:.1f} s: the jobs were stopped at the deadline, not at once"
    c.wait_for_log(1, "there is no agreed checkpoint step", 10)
    c.wait_for_log(0, "no host's job asks whether to checkpoint", 10)


def agent_gone(c: LocalCluster, task: int) -> bool:
    pid_file = c.state(task) / "agent.pid"
    if not pid_file.exists():
        return True
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (ProcessLookupError, ValueError):
        return True
    return False


@pytest.mark.parametrize("source", ["gce-metadata", "sigterm", "tpuctl-preempt"])
def test_a_jax_job_saves_the_same_step_on_every_host_and_resumes_from_it(make_cluster, tmp_path, source) -> None:
    """One host of four gets the notice (its GCE metadata server flips instance/preempted to TRUE, its
    `tpuctl run` gets SIGTERM, or `tpuctl preempt` runs on it): every host's JAX job saves the same step and
    exits 0 within --grace; the host's agent leaves; after `tpuctl init` on it again, the job resumes from
    that step on every host (--max-restarts)."""
    pytest.importorskip("jax")
    victim = 2
    c = make_cluster("v4-32", **SPEC)
    folder = tmp_path / "job"
    folder.mkdir()
    with gce_server() as server:
        metadata = {"GCE_METADATA_HOST": server.address} if source == "gce-metadata" else None
        for t in range(4):
            c.start_init(t, env=metadata if t == victim else None)
        assert all(r.code == 0 for r in c.wait_all([f"init-{t}" for t in range(4)], 90)), c.logs()
        runs = {t: c.start(f"run-{t}", run_command(c, t, folder, 24, "jax"), env=JOB_ENV) for t in range(4)}
        wait_until(lambda: all(at(folder, t) >= 3 for t in range(4)), 120, "every job to reach step 3", logs=c.logs)
        noticed = time.time()
        if source == "gce-metadata":
            server.set("instance/preempted", "TRUE")
        elif source == "sigterm":
            os.kill(runs[victim].popen.pid, signal.SIGTERM)
        else:
            assert c.tpuctl("preempt", "--in", f"{GRACE_S:g}s", task=victim).code == 0
        wait_until(lambda: len(saved(folder, range(4), 1)) == 4, GRACE_S, "every host's job to save", logs=c.logs)
        got = saved(folder, range(4), 1)
        steps = {step for _, step in got.values()}
        assert len(steps) == 1, got  # every host saved the same step
        step = steps.pop()
        last_save = max(w for w, _ in got.values()) - noticed
        assert last_save < GRACE_S
        wait_until(lambda: agent_gone(c, victim), GRACE_S, "the host going away to leave", logs=c.logs)
        left = time.time() - noticed
        status = json.loads(c.tpuctl("status", "--json", task=0).out)
        assert status["preemption"]["notices"][0]["task"] == victim
        assert status["preemption"]["agreement"]["step"] == step
        if source == "sigterm":  # that host's container is gone: its `tpuctl run` exits with the job's code
            stopped = c.processes.wait(runs[victim].label, 30)
            assert stopped.code == 0 and f"after the agreed checkpoint (step {step})" in stopped.err, stopped.err
        server.set("instance/preempted", "FALSE")  # a VM back from preemption
        back = time.time()
        c.start_init(victim, env=metadata, label=f"init-again-{victim}")
        if source == "sigterm":  # as GKE restarts the pod: `tpuctl init && exec tpuctl run ...`
            assert c.wait_init(f"init-again-{victim}", 90).code == 0, c.logs()
            runs[victim] = c.start("run-again", run_command(c, victim, folder, 24, "jax"), env=JOB_ENV)
        done = {t: c.processes.wait(p.label, 180) for t, p in runs.items()}
    assert [done[t].code for t in range(4)] == [0, 0, 0, 0], c.logs()
    for t in range(4):
        got_result = result(runs[t])
        assert got_result["generation"] == 2 and got_result["first"] == step and got_result["last"] == 24, got_result
        assert starts(folder, t) == [(1, 0), (2, step)] or (t == victim and source == "sigterm")
    resumed = max(float(e[1]) for t in range(4) for e in lines(folder, t) if e[0] == "start" and e[2] == "2") - back
    record(f"{source}, 4-process JAX job", notice_to_last_save_s=last_save, notice_to_host_left_s=left,
           return_to_resume_s=resumed)  # fmt: skip
