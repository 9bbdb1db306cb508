"""``tpuctl sim status``, ``tpuctl sim run`` and the hints around a simulated cluster, on a real v4-16.

One simulated cluster for the module (its state dirs under a temp root, ``TPUCTL_STATE_DIR`` pointing at a
temp folder so the default state dir has no agent and the sim registry is the test's own); the test
that stops an agent runs last.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness import TPUCTL, Finished, Processes
from harness.clusters import Clusters

pytestmark = pytest.mark.slow


@dataclass
class Sim:
    root: Path
    env: dict[str, str]
    processes: Processes
    up: Finished

    def tpuctl(self, *args: str, timeout: float = 60.0, label: str = "tpuctl") -> Finished:
        return self.processes.run(label, [*TPUCTL, *args], timeout=timeout, env=self.env)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    base = tmp_path_factory.mktemp("simcmds")
    processes = Processes(base / "logs", name="sim-commands")
    clusters = Clusters(base, processes)
    try:
        cluster = clusters.sim("v4-16")
        assert cluster.brought_up is not None
        yield Sim(cluster.root, cluster.env, processes, cluster.brought_up)
    finally:
        try:
            clusters.close()
        finally:
            processes.close()


def test_sim_status_shows_every_host_healthy(sim: Sim) -> None:
    text = sim.tpuctl("sim", "status", "--root", str(sim.root))
    assert text.code == 0, text.err
    rows = [line.split() for line in text.out.splitlines() if re.match(r"^\d+\s", line)]
    assert [(r[0], r[1], r[2], r[4]) for r in rows] == [("0", "127.0.0.2", "running", "connected"),
                                                       ("1", "127.0.0.3", "running", "connected")]  # fmt: skip
    assert rows[1][-1] == str(sim.root / "host-1")
    for flags in (["--format", "json"], ["--json"], ["-o", "json"]):
        done = sim.tpuctl("sim", "status", "--root", str(sim.root), *flags)
        assert done.code == 0, done.err
        doc = json.loads(done.out)
        assert doc["schema"] == "tpuctl.sim.status/v1" and doc["healthy"] is True
        assert doc["cluster"] == "sim-v4-16" and doc["accelerator"] == "v4-16"
        assert [(h["task"], h["agent"], h["state"]) for h in doc["tasks"]] == [(0, "running", "connected"),
                                                                              (1, "running", "connected")]  # fmt: skip
        assert all(isinstance(h["agent_pid"], int) for h in doc["tasks"])


def test_sim_run_prefixes_each_line_with_its_task_and_returns_the_worst_code(sim: Sim) -> None:
    script = 'echo "out $TPUCTL_TASK_ID $JAX_PLATFORMS $JAX_NUM_CPU_DEVICES"; echo "err $TPUCTL_TASK_ID" >&2; exit $((TPUCTL_TASK_ID * 5))'
    done = sim.tpuctl("sim", "run", "--root", str(sim.root), "--", "sh", "-c", script, timeout=60)
    assert done.code == 5, done.err
    assert sorted(line for line in done.out.splitlines()) == ["[task 0] out 0 cpu 4", "[task 1] out 1 cpu 4"]
    assert {"[task 0] err 0", "[task 1] err 1"} <= set(done.err.splitlines())
    assert "1 of 2 tasks failed (task 1: exit 5)" in done.err
    ok = sim.tpuctl("sim", "run", "--root", str(sim.root), "--", "true")
    assert ok.code == 0 and "all 2 tasks exited 0" in ok.err, ok.err
    missing = sim.tpuctl("sim", "run", "--root", str(sim.root), "--", "no-such-command-here")
    assert missing.code == 127, missing.err  # `tpuctl run`'s code for a command not found, on every host


def test_sim_run_forwards_sigterm_to_every_job_and_bounds_the_wait(sim: Sim, tmp_path: Path) -> None:
    job = f'trap "echo stopped > {tmp_path}/$TPUCTL_TASK_ID; exit 9" TERM; echo ready; while :; do sleep 0.1; done'
    proc = sim.processes.start("sim-run-term", [*TPUCTL, "sim", "run", "--root", str(sim.root), "--", "sh", "-c", job],
                               env=sim.env)  # fmt: skip
    sim.processes.wait_for_output(proc, "ready", count=2, stream="out", timeout=30)
    proc.send_signal(signal.SIGTERM)
    done = sim.processes.wait(proc, timeout=30)
    assert done.code == 9, done.err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["0", "1"]
    # a job that ignores SIGTERM: SIGKILL after --grace (+ tpuctl run's margin), not a hang
    stubborn = 'trap "" TERM; echo ready; while :; do sleep 0.1; done'
    started = time.monotonic()
    timed = sim.tpuctl("sim", "run", "--root", str(sim.root), "--timeout", "2s", "--grace", "1s", "--", "sh", "-c",
                       stubborn, timeout=60)  # fmt: skip
    assert timed.code == 4, timed.err  # the deadline's exit code
    assert time.monotonic() - started < 20
    assert "--timeout 2s reached" in timed.err


def _commands(text: str) -> list[list[str]]:
    """Every `tpuctl ...` command line quoted in backticks or on a line of its own in ``text``."""
    found = re.findall(r"`(tpuctl [^`]+)`", text)
    found += [m.strip() for m in re.findall(r"^\s*(tpuctl [^#\n(]+)", text, flags=re.M)]
    return [shlex.split(c) for c in found]


def _check_exists(sim: Sim, command: list[str]) -> None:
    """The command's words up to its first option (``tpuctl sim status``) answer --help; each path it names
    under the temp folder exists."""
    words = []
    for word in command[1:]:
        if word.startswith("-"):
            break
        words.append(word)
    if words and words[-1].isupper():  # a placeholder (ACCELERATOR, NAME) ends the command name
        words.pop()
    helped = sim.tpuctl(*words, "--help", label="help")
    assert helped.code == 0, f"{' '.join(command)}: `tpuctl {' '.join(words)} --help` exit {helped.code}: {helped.err}"
    for word in command:
        if Path(word).is_relative_to(sim.root):  # not its sibling, the state dir (c0-state)
            assert Path(word).exists(), f"{' '.join(command)} names {word}, which does not exist"


def test_sim_run_times_the_jobs_not_the_output_a_left_behind_child_holds(sim: Sim) -> None:
    """A job leaving a background child that holds its stdout: sim run waits (bounded) for the last output,
    but says how long the jobs took."""
    pids = sim.root / "left-behind.pids"
    script = f"sleep 30 & echo $! >> {pids}; echo bg"
    try:
        done = sim.tpuctl("sim", "run", "--root", str(sim.root), "--", "sh", "-c", script, timeout=60)
        assert done.code == 0, done.err
        took = re.search(r"all 2 tasks exited 0 in ([0-9.]+) s", done.err)
        assert took is not None and float(took.group(1)) < 3.0, done.err
    finally:
        sim.processes.stop_recorded([pids])


def test_a_plain_status_points_at_the_running_sim_with_exact_commands(sim: Sim) -> None:
    done = sim.tpuctl("status")
    assert done.code == 5, done.err  # no agent for this user's default state dir
    assert "a simulated cluster of 2 hosts is running under " + str(sim.root) in done.err
    commands = _commands(done.err)
    assert ["tpuctl", "status", "--state-dir", str(sim.root / "host-0")] in commands
    assert ["tpuctl", "sim", "status", "--root", str(sim.root)] in commands
    for command in commands:
        if command[1:3] == ["status", "--state-dir"] or command[1:3] == ["sim", "status"]:
            follow = sim.tpuctl(*command[1:])
            assert follow.code == 0, f"{command}: {follow.err}"


def test_every_hint_names_commands_that_exist_with_real_paths(sim: Sim) -> None:
    texts = [sim.up.err]
    for args in (["sim", "--help"], ["sim", "up", "--help"], ["sim", "run", "--help"], ["sim", "status", "--help"]):
        helped = sim.tpuctl(*args, label="help")
        assert helped.code == 0, helped.err
        texts.append(helped.out)
    assert "--state-dir ... status" not in texts[2] and "tpuctl --state-dir" not in texts[2]
    again = sim.tpuctl("sim", "up", "v4-16", "--root", str(sim.root))
    assert again.code == 5 and "already running" in again.err
    texts.append(again.err)
    texts.append(sim.tpuctl("status").err)
    commands = [c for text in texts for c in _commands(text)]
    assert len(commands) >= 10, texts
    assert ["tpuctl", "sim", "run", "--root", str(sim.root), "--", "python", "job.py"] in commands  # from sim up
    for command in commands:
        _check_exists(sim, command)


def test_a_stopped_agent_makes_sim_status_unhealthy_and_sim_run_refuse(sim: Sim) -> None:
    pid = int((sim.root / "host-1" / "agent.pid").read_text())
    done = sim.tpuctl("down", "--state-dir", str(sim.root / "host-1"))
    assert done.code == 0, done.err
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode == 0:
        time.sleep(0.1)
    status = sim.tpuctl("sim", "status", "--root", str(sim.root), "--json")
    assert status.code == 3, status.err
    doc = json.loads(status.out)
    assert doc["healthy"] is False
    assert doc["tasks"][1]["agent"] == "stopped" and doc["tasks"][1]["agent_pid"] is None
    # The shared verdict (tpuctl.health), in the words tpuctl status, run and barrier use for a host that left.
    assert doc["health"]["verdict"] == "failed"
    assert [p["task"] for p in doc["health"]["problems"]] == [1], doc["health"]
    assert doc["health"]["problems"][0]["problem"].startswith("task 1 (127.0.0.3) left the cluster"), doc["health"]
    text = sim.tpuctl("sim", "status", "--root", str(sim.root))
    assert text.code == 3 and "health: failed\n  task 1 (127.0.0.3) left the cluster" in text.out, text.out
    refused = sim.tpuctl("sim", "run", "--root", str(sim.root), "--", "true")
    assert refused.code == 5 and "task(s) 1" in refused.err, refused.err
    gone = sim.tpuctl("sim", "status", "--root", str(sim.root / "nowhere"))
    assert gone.code == 5 and "no simulated cluster is running" in gone.err

