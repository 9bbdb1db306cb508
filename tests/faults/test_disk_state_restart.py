"""Faults of a host's own files and of its process: full disk and read-only or impossible output while
the mapping is written, a state dir deleted under a running agent, a host restarted with the same task id.

Required: the host that cannot go on says why and exits non-zero; every peer exits non-zero within heartbeat
timeout + 2 s naming that host and the real cause; no host keeps a mapping that loads as valid.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import TPUCTL, Proc, stop_pids, wait_until
from harness.clusters import LocalCluster

from tpuctl.mapping.file import read_mapping

from .conftest import MOUNTED
from .faultlib import (
    DEADLINE_S,
    SLACK_S,
    SPEC,
    Victim,
    agent_error_outcomes,
    check,
    outcomes,
    park_barriers,
    watch_exits,
)
from .recorder import HostOutcome, Measurement, first_error

pytestmark = pytest.mark.slow

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (CI runs as root)")


@contextlib.contextmanager
def tmpfs(path: Path, *, size: str, readonly: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (read-only if asked) for the test's life; unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size},mode=0755" + (",ro" if readonly else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tpuctl-fault", str(path)], check=True, timeout=30)
    MOUNTED.add(str(path))
    try:
        yield path
    finally:
        done = subprocess.run(["umount", str(path)], capture_output=True, timeout=30, check=False)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30, check=False)
        MOUNTED.discard(str(path))


def fill(folder: Path) -> None:
    """Write zeros into ``folder`` until its file system is full."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)


def init_with_output(c: LocalCluster, task: int, output: Path) -> Proc:
    state = c.state(task)
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    command = [*TPUCTL, "init", "--config", str(c.spec), "--task-id", str(task), "--state-dir", str(state),
               "--out", str(output)]  # fmt: skip
    return c.start(f"init-{task}", command)


def loadable_mappings(c: LocalCluster, outputs: dict[int, Path]) -> list[int]:
    """The hosts left with a mapping file that loads as valid."""
    valid = []
    for task, path in outputs.items():
        if path.exists():
            with contextlib.suppress(Exception):
                read_mapping(str(path))
                valid.append(task)
    return valid


def judge_inits(
    c: LocalCluster, procs: dict[int, Proc], victim: Victim, cause: tuple[str, ...], outputs: dict[int, Path]
) -> tuple[list[HostOutcome], list[str]]:
    """Every host's ``init`` after a fault of the victim's own files, from now: what each did (detection
    times from the victim's own exit) and what the catalogue finds wrong (``check``; the victim must say
    the cause; no host may keep a mapping that loads as valid)."""
    procs = dict(sorted(procs.items()))
    started = time.monotonic()
    exits = watch_exits(procs, started, 30 + SLACK_S)
    hosts = outcomes(procs, exits, victim.task, "init")
    failed_at = exits[victim.task][1] or 0.0
    for h in hosts:
        if h.role == "peer" and h.seconds is not None:
            h.seconds = max(0.0, h.seconds - failed_at)
    problems = check(hosts, c, victim, cause, DEADLINE_S)
    victim_said = next(h for h in hosts if h.role == "victim").text.lower()
    if not any(word in victim_said for word in cause):
        problems.append(f"the victim did not say the cause {list(cause)}")
    left = loadable_mappings(c, outputs)
    if left:
        problems.append(f"tasks {left} kept a mapping that loads as valid")
    return hosts, problems


def _output_fault(
    c: LocalCluster,
    victim: Victim,
    output: Path,
    fault: str,
    cause: tuple[str, ...],
    request,
    *,
    phase: str,
    workers_first: bool = False,
) -> None:
    outputs = {t: (output if t == victim.task else c.mapping(t)) for t in range(c.num_hosts)}
    procs: dict[int, Proc] = {}
    if workers_first:  # task 0 is the victim: the workers are up and retrying to reach the coordinator
        for w in range(1, c.num_hosts):
            procs[w] = c.start_init(w)
        for w in range(1, c.num_hosts):
            c.wait_for_log(w, "not answering yet", timeout=30)
        procs[0] = init_with_output(c, 0, outputs[0])
    else:  # every other host has registered (and waits) before the victim starts and fails
        for t in range(c.num_hosts):
            if t != victim.task:
                procs[t] = c.start_init(t)
        for t in list(procs):
            c.wait_for_log(t, "registered with", timeout=30)
        procs[victim.task] = init_with_output(c, victim.task, outputs[victim.task])
    # the fault is there from the start; it strikes when the victim writes its mapping, after the merge
    hosts, problems = judge_inits(c, procs, victim, cause, outputs)
    Measurement(
        test=request.node.nodeid, fault=fault, phase=phase, victim=victim.describe(c),
        detected_by="the victim's report, every `init`", limit_s=DEADLINE_S, hosts=hosts, problems=problems,
        notes="detection time from the victim's exit",
    ).write()  # fmt: skip
    assert not problems, "\n".join(problems)


@needs_root
def test_full_disk_while_writing_the_mapping(make_cluster, tmp_path: Path, request) -> None:
    c = make_cluster("v4-32", **SPEC)
    with tmpfs(tmp_path / "full", size="64k") as mnt:
        fill(mnt)
        _output_fault(c, Victim(2), mnt / "mapping.json", "full disk (output on a full tmpfs)",
                      ("no space left",), request, phase="writing")  # fmt: skip


@needs_root
def test_full_disk_under_the_state_dir(make_cluster, tmp_path: Path, request) -> None:
    """The victim's state dir is a small tmpfs, filled once it registered (and waits for the others): its
    description (agent.json), written after the merge, finds no space. The victim names the file and
    the cause and exits; every peer hears it from the coordinator, naming the victim (once: an agent
    crash nobody was told of, then "no heartbeat" or the register timeout)."""
    c = make_cluster("v4-32", **SPEC)
    victim = Victim(2)
    outputs = {t: c.mapping(t) for t in range(c.num_hosts)}
    outputs[victim.task] = tmp_path / "out" / "mapping.json"  # not on the full disk: the state dir is the fault
    with tmpfs(c.state(victim.task), size="512k") as mnt:
        os.chmod(mnt, 0o700)
        procs = {0: c.start_init(0), victim.task: init_with_output(c, victim.task, outputs[victim.task])}
        c.wait_for_log(victim.task, "registered with", timeout=30)
        fill(mnt)
        for t in (1, 3):
            procs[t] = c.start_init(t)
        hosts, problems = judge_inits(c, procs, victim, ("no space left",), outputs)
        said = next(h for h in hosts if h.role == "victim").text
        if "agent.json" not in said or "crashed" in said:
            problems.append(f"the victim did not name the file (or its agent crashed): {first_error(said)!r}")
        Measurement(
            test=request.node.nodeid, fault="full disk (state dir on a full tmpfs)", phase="writing agent.json",
            victim=victim.describe(c), detected_by="the victim's report, every `init`", limit_s=DEADLINE_S,
            hosts=hosts, problems=problems, notes="detection time from the victim's exit",
        ).write()  # fmt: skip
        stop_pids([pid for pid in _agent_pids(c) if c.processes.ours(pid)])
    assert not problems, "\n".join(problems)


def _agent_pids(c: LocalCluster) -> list[int]:
    pids = []
    for t in range(c.num_hosts):
        with contextlib.suppress(OSError, ValueError):
            pids.append(int((c.state(t) / "agent.pid").read_text()))
    return pids


CLEARING = "registered (clearing the last mapping)"
@needs_root
@pytest.mark.parametrize("victim", [pytest.param(2, id="worker"), pytest.param(0, id="coordinator")])
def test_read_only_output(make_cluster, tmp_path: Path, victim: int, request) -> None:
    """The cause reaches every peer, also when task 0 is the host that fails (its service stays up until
    every host has heard, instead of vanishing so the workers retry until the register timeout), and when
    a worker fails while a peer is between two calls (it once found the port closed: 1 run in 3)."""
    c = make_cluster("v4-32", **{**SPEC, "register_timeout": "8s"})
    with tmpfs(tmp_path / "ro", size="1m", readonly=True) as mnt:
        _output_fault(c, Victim(victim), mnt / "mapping.json", "read-only output (a read-only tmpfs)",
                      ("read-only",), request, phase=CLEARING, workers_first=victim == 0)  # fmt: skip


def test_output_under_a_regular_file(make_cluster, tmp_path: Path, request) -> None:
    c = make_cluster("v4-32", **SPEC)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    _output_fault(c, Victim(1), blocker / "mapping.json", "unwritable output (its folder is a regular file)",
                  ("not a directory",), request, phase=CLEARING)  # fmt: skip


def test_state_dir_deleted_under_a_running_agent(make_cluster, request) -> None:
    c = make_cluster("v4-32", **SPEC)
    c.up()
    victim = Victim(2)
    pid = c.agent_pid(victim.task)
    peers = [t for t in range(4) if t != victim.task]
    procs = park_barriers(c, peers)
    try:
        shutil.rmtree(c.state(victim.task))
        at = time.monotonic()
        exits = watch_exits(procs, at, DEADLINE_S + SLACK_S)
        gone = wait_until(lambda: not c.processes.ours(pid) and time.monotonic(), DEADLINE_S + SLACK_S,
                          "the agent to leave") - at  # fmt: skip
    except AssertionError:
        gone = None
    finally:
        stop_pids([pid] if c.processes.ours(pid) else [])
    hosts = outcomes(procs, exits, victim.task, "barrier")
    hosts.append(HostOutcome(victim.task, "victim", "agent", 0 if gone is not None else None,
                             "agent left the cluster" if gone is not None else "agent still running", gone))  # fmt: skip
    problems = check(hosts, c, victim, ("disconnected", "left", "state dir"), DEADLINE_S, victim_must_exit=False)
    if gone is None:
        problems.append("the victim's agent was still running")
    Measurement(
        test=request.node.nodeid, fault="state dir deleted (rm -rf)", phase="steady", victim=victim.describe(c),
        detected_by="the agent's state-dir check, parked `tpuctl barrier`", limit_s=DEADLINE_S, hosts=hosts,
        problems=problems,
    ).write()  # fmt: skip
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "victim_task",
    [pytest.param(2, id="worker"), pytest.param(0, id="coordinator")],
)  # fmt: skip
def test_restart_with_the_same_task_id(make_cluster, victim_task: int, request) -> None:
    """kill -9 of a host's agent, then `tpuctl init` again at once on that host (same task id, same state
    dir), as a supervisor would: it must not be refused as "another live process", and every peer's agent
    learns that the host (or the coordinator) failed or restarted, naming it."""
    c = make_cluster("v4-32", **SPEC)
    c.up()
    victim = Victim(victim_task)
    peers = [t for t in range(4) if t != victim.task]
    os.kill(c.agent_pid(victim.task), signal.SIGKILL)
    wall, at = time.time(), time.monotonic()
    again = c.start_init(victim.task, label=f"restart-{victim.task}")
    hosts = agent_error_outcomes(c, peers, wall, DEADLINE_S + SLACK_S)
    exits = watch_exits({victim.task: again}, at, 1.0)
    hosts += outcomes({victim.task: again}, exits, victim.task, "init again")
    causes = ("restarted",) if victim.task == 0 else ("restarted", "no heartbeat", "registered again", "replaced")
    problems = check(hosts, c, victim, causes, DEADLINE_S, victim_must_exit=False)
    if "another live process" in again.err():
        problems.append(f"init again was refused: {first_error(again.err())!r}")
    Measurement(
        test=request.node.nodeid, fault="kill -9, then init again with the same task id", phase="steady",
        victim=victim.describe(c), detected_by="the agents (their log), then `tpuctl status`", limit_s=DEADLINE_S,
        hosts=hosts, problems=problems, notes="the victim row: the second `init` (still running: waiting)",
    ).write()  # fmt: skip
    assert not problems, "\n".join(problems)
