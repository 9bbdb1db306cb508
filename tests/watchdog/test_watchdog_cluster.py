"""The watchdog on real processes: a 4-host simulated cluster (real ``tpuctl init`` on 127.0.0.x), a real
4-process JAX CPU job under ``tpuctl run`` on every host (``job_watched.py``: a cross-process all-gather
every step, ``tpuctl.job.progress`` before it), and one host's job frozen with SIGSTOP while its agent runs
on. Heartbeats say every host is fine; the watchdog must say otherwise.
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

JOB = Path(__file__).resolve().parent / "job_watched.py"
SPEC = {"heartbeat": "500ms", "heartbeat_timeout": "3s", "register_timeout": "60s", "barrier_timeout": "60s"}
HANG_S = 6.0
STEP_S = 0.1


def watched_spec(on_hang: str = "warn", restart: bool = False) -> dict[str, str]:
    extra = f"watchdog: {{hang_timeout: {HANG_S:g}s, on_hang: {on_hang}, report_every: 1s}}\n"
    if restart:
        extra += "restart: {policy: rejoin, timeout: 60s, max: 2}\n"
    return {**SPEC, "extra": extra}


def start_jobs(c: LocalCluster, folder: Path, steps: int, *extra: str, restarts: int = 0) -> dict[int, Proc]:
    env = {"JAX_PLATFORMS": "cpu"}
    return {
        t: c.start(f"run-{t}", [*TPUCTL, "run", "--max-restarts", str(restarts), "--grace", "2s", "--state-dir",
                                str(c.state(t)), "--", sys.executable, str(JOB), str(folder), str(steps),
                                str(STEP_S), *extra], env=env)
        for t in range(c.num_hosts)
    }  # fmt: skip


def job_pid(c: LocalCluster, task: int, timeout: float = 60.0) -> int:
    """The pid of host ``task``'s job process (the python child of its ``tpuctl run``)."""
    run_pid = c.processes.procs[f"run-{task}"].popen.pid
    found: list[int] = []

    def child() -> bool:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                    cmdline = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == run_pid and JOB.name.encode() in cmdline:
                    found.append(int(entry.name))
                    return True
        return False

    wait_until(child, timeout, f"task {task}'s job process", logs=c.logs)
    return found[0]


def step(folder: Path) -> int:
    text = (folder / "step").read_text().strip() if (folder / "step").exists() else ""
    return int(text or 0)


def agent_line(c: LocalCluster, task: int, needle: str) -> str | None:
    log = c.state(task) / "agent.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    return next((line for line in text.splitlines() if needle in line), None)


def logged_at(line: str) -> float:
    """The wall time of an agent log line (its leading ``YYYY-mm-dd HH:MM:SS,mmm``)."""
    stamp = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[,.](\d{3})", line)
    assert stamp is not None, line
    return time.mktime(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")) + int(stamp.group(2)) / 1000


def test_a_frozen_job_is_named_on_every_host_within_the_hang_timeout(make_cluster, tmp_path: Path) -> None:
    c = make_cluster("v4-32", **watched_spec())
    c.up()
    runs = start_jobs(c, tmp_path, 100_000)
    wait_until(lambda: step(tmp_path) >= 20, 120, "the job to reach step 20", logs=c.logs)
    victim = 2
    pid = job_pid(c, victim)
    os.kill(pid, signal.SIGSTOP)
    frozen_at = time.time()
    try:
        for task in range(4):
            wait_until(
                lambda task=task: agent_line(c, task, "watchdog: cluster hung at step") is not None,
                HANG_S + 15, f"task {task} to log the hang", logs=c.logs,
            )  # fmt: skip
        for task in range(4):
            line = agent_line(c, task, "watchdog: cluster hung at step")
            assert line is not None
            assert re.search(r"cluster hung at step ([\d,]+) for \d+ s: task 2 \(127\.0\.0\.4\) at ([\d,]+); 3 hosts at \1", line), line
            # Named within the hang timeout + 2 s of the last step anywhere (the others' last step came
            # at most one step after the freeze).
            assert logged_at(line) - frozen_at <= HANG_S + 2 + 2 * STEP_S, (line, frozen_at)
            behind = agent_line(c, task, "is behind")
            assert behind is not None and "task 2 (127.0.0.4) at step" in behind, behind
            assert logged_at(behind) <= logged_at(line)
        status = c.tpuctl("status", "--json", "--state-dir", str(c.state(0)), timeout=30)
        assert status.code == 0, status.err
        watchdog = json.loads(status.out)["watchdog"]
        assert watchdog["armed"] == 4 and watchdog["stalled"] == 4
        assert watchdog["slowest"][0]["task"] == victim
        assert [v["kind"] for v in watchdog["verdicts"]] == ["hang"]
        text = c.tpuctl("status", "--state-dir", str(c.state(1)), timeout=30)
        assert "watchdog: cluster hung at step" in text.out and "furthest behind: task 2" in text.out, text.out
        assert all(runs[t].popen.poll() is None for t in range(4))  # on_hang: warn stops nothing
    finally:
        os.kill(pid, signal.SIGCONT)


def test_on_hang_restart_resumes_the_job_from_its_checkpoint(make_cluster, tmp_path: Path) -> None:
    c = make_cluster("v4-32", **watched_spec(on_hang="restart", restart=True))
    c.up()
    start_jobs(c, tmp_path, 60, restarts=1)
    wait_until(lambda: step(tmp_path) >= 15, 120, "the job to reach step 15", logs=c.logs)
    os.kill(job_pid(c, 1), signal.SIGSTOP)  # tpuctl run's SIGKILL after --grace ends it (SIGKILL works on a stopped process)
    frozen = step(tmp_path)
    results = {t: c.processes.wait(f"run-{t}", 240) for t in range(4)}
    for task, done in results.items():
        assert done.code == 0, f"task {task}: {done.err}\n{c.logs()}"
        line = next(ln for ln in done.out.splitlines() if ln.startswith("RESULT "))
        result = json.loads(line[len("RESULT "):])
        assert result["generation"] == 2 and result["last"] == 60, result
        assert frozen - 2 <= result["first"] <= frozen + 1, (result, frozen)  # resumed from the checkpoint
    err = results[0].err
    assert "hung: cluster hung at step" in err and "task 1 (127.0.0.3)" in err, err


def straggler_lines(c: LocalCluster) -> list[str]:
    return [line for t in range(c.num_hosts) for line in [agent_line(c, t, "is a straggler")] if line]


def test_a_host_slowed_to_1_4x_is_named_a_straggler_within_50_steps(make_cluster, tmp_path: Path) -> None:
    """From step 150 task 3's own work per step takes 1.4x as long; every host names it within 50 steps."""
    c = make_cluster("v4-32", **watched_spec())
    c.up()
    start_jobs(c, tmp_path, 100_000, "3:1.4:150", "0.1")
    wait_until(lambda: len(straggler_lines(c)) == 4, 150, "every host to name a straggler", logs=c.logs)
    named_at = step(tmp_path)
    # The verdict needs the pace window (50 steps) to show the lag and 5 reports of it: about step 200 at
    # best; on this shared 2-core machine the reports and the four hosts' log lines add up to ~35 steps more
    # (206-232 seen on 6 December, with this stop's code and with the previous stop's alike). A bound on
    # latency in a test is a guard against losing the verdict, not a measurement (docs/how-to/watchdog.md).
    assert named_at <= 150 + 100, f"named at step {named_at}"
    for line in straggler_lines(c):
        assert "task 3 (127.0.0.5) is a straggler: reaches each step" in line, line
    status = json.loads(c.tpuctl("status", "--json", "--state-dir", str(c.state(2)), timeout=30).out)
    assert [(v["kind"], v["tasks"]) for v in status["watchdog"]["verdicts"]] == [("straggler", [3])]


@pytest.mark.beside  # a minute of steps: `make test` runs it beside the rest (its budget)
def test_a_healthy_run_of_500_steps_with_jitter_raises_no_alarm(make_cluster, tmp_path: Path) -> None:
    """No finding while 500 jittered steps run, nor after the job ends (its processes gone: not a hang)."""
    c = make_cluster("v4-32", **watched_spec())
    c.up()
    start_jobs(c, tmp_path, 500, "-", "0.15")
    for task in range(4):
        done = c.processes.wait(f"run-{task}", 300)
        assert done.code == 0, done.err
    time.sleep(HANG_S + 4)  # past the hang timeout after the job's last step
    for task in range(4):
        log = (c.state(task) / "agent.log").read_text()
        findings = [line for line in log.splitlines() if "watchdog:" in line]
        assert not findings, findings
        assert "the job's processes are gone at step 500" in log, log
    status = json.loads(c.tpuctl("status", "--json", "--state-dir", str(c.state(0)), timeout=30).out)
    assert status["watchdog"] is None  # every host's job ended: nobody is judged
