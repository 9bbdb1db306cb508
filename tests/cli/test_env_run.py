"""``tpuctl env`` and ``tpuctl run`` against a real simulated cluster (one per module), as real processes.

The cluster's root is in a folder with a space, a quote and a dollar sign in its name, so every path tpuctl
hands to a shell exercises the quoting. Every process goes through the harness (``tests/harness``): log files
shown on failure, deadlines, SIGTERM then SIGKILL. The tests that use the cluster are marked slow.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import TPUCTL, Finished, Proc, Processes, state, stop_pids, wait_until
from harness.clusters import Clusters, SimCluster

from tpuctl.agent.protocol import AgentInfo
from tpuctl.job.env import job_environment
from tpuctl.mapping.file import read_mapping

JOBS = Path(__file__).resolve().parents[1] / "job"
HEAVY = ("grpc", "numpy", "tensorflow", "jax", "jaxlib", "yaml")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimCluster]:
    """One simulated v4-16 for the module's tests, under ``odd dir's $x/``; afterwards every process it
    started is stopped, by pid."""
    base = tmp_path_factory.mktemp("envrun")
    processes = Processes(base / "logs", name="the env/run cluster")
    clusters = Clusters(base / "odd dir's $x", processes)
    try:
        yield clusters.sim("v4-16")
    finally:
        try:
            clusters.close()
        finally:
            processes.close()


def host(cluster: SimCluster, task: int) -> str:
    """Host ``task``'s state dir, as the text tpuctl is given and prints."""
    return str(cluster.state(task))


def tpuctl(cluster: SimCluster, *args: str, env: dict[str, str] | None = None) -> Finished:
    return cluster.tpuctl(*args, env=env)


def parse_sh(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        words = shlex.split(line)
        if words[0] == "unset":  # variables a job must not inherit (TPU_PROCESS_ADDRESSES, ...)
            continue
        assert words[0] == "export", line
        name, _, value = words[1].partition("=")
        out[name] = value
    return out


# --- tpuctl env ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_env_prints_the_agents_environment(cluster: SimCluster) -> None:
    done = tpuctl(cluster, "env", "--state-dir", host(cluster, 1))
    assert done.code == 0, done.err
    printed = parse_sh(done.out)
    info = cluster.info(1)
    expected = job_environment(AgentInfo.from_json(info), read_mapping(info["mapping"]), state_dir=host(cluster, 1))
    assert printed == expected.set
    ports = info["job_ports"]
    assert printed["DTENSOR_JOBS"] == f"127.0.0.2:{ports['dtensor'][0]},127.0.0.3:{ports['dtensor'][1]}"
    assert printed["JAX_COORDINATOR_ADDRESS"] == f"127.0.0.2:{ports['jax']}"
    assert (printed["DTENSOR_CLIENT_ID"], printed["JAX_PROCESS_ID"], printed["TPU_WORKER_ID"]) == ("1", "1", "1")
    assert printed["TPUCTL_MAPPING"] == str(cluster.root / "host-1" / "mapping.json")
    assert printed["TPU_ACCELERATOR_TYPE"] == "v4-16"

    as_json = tpuctl(cluster, "env", "--format", "json", "--state-dir", host(cluster, 1))
    assert as_json.code == 0
    assert json.loads(as_json.out) == {"schema": "tpuctl.env/v1", "set": printed, "unset": list(expected.unset)}


@pytest.mark.slow
def test_eval_in_bash_sets_every_value_exactly(cluster: SimCluster) -> None:
    script = (
        'eval "$(tpuctl env --state-dir "$D")" || exit 9\n'
        'printf "%s\\n" "$JAX_PROCESS_ID" "$DTENSOR_JOB_NAME" "$TPUCTL_STATE_DIR" "$TPUCTL_MAPPING"\n'
    )
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "D": host(cluster, 0), "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    done = cluster.processes.run("bash-eval", ["bash", "-c", script], env=env)
    assert done.code == 0, done.err
    assert done.out.splitlines() == ["0", "worker", host(cluster, 0), str(cluster.root / "host-0" / "mapping.json")]


@pytest.mark.slow
def test_ports_never_collide_between_hosts_sharing_the_machine(cluster: SimCluster) -> None:
    envs = [parse_sh(tpuctl(cluster, "env", "--state-dir", host(cluster, t)).out) for t in range(2)]
    assert envs[0]["DTENSOR_JOBS"] == envs[1]["DTENSOR_JOBS"]
    assert envs[0]["JAX_COORDINATOR_ADDRESS"] == envs[1]["JAX_COORDINATOR_ADDRESS"]
    ports = [int(job.rsplit(":", 1)[1]) for job in envs[0]["DTENSOR_JOBS"].split(",")]
    ports.append(int(envs[0]["JAX_COORDINATOR_ADDRESS"].rsplit(":", 1)[1]))
    ports.append(int(cluster.info(0)["coordinator"].rsplit(":", 1)[1]))
    assert len(set(ports)) == len(ports) == 4, ports


@pytest.mark.slow
def test_env_finds_the_state_dir_in_the_environment(cluster: SimCluster) -> None:
    done = tpuctl(cluster, "env", "-f", "json", env={**os.environ, "TPUCTL_STATE_DIR": host(cluster, 1)})
    assert done.code == 0, done.err
    assert json.loads(done.out)["set"]["TPUCTL_TASK_ID"] == "1"


def test_env_and_run_without_an_agent_exit_5(tmp_path: Path, processes: Processes) -> None:
    for args in (["env"], ["run", "--", "true"]):
        done = (
            processes.run("env", [*TPUCTL, *args, "--state-dir", str(tmp_path)])
            if args == ["env"]
            else processes.run("run", [*TPUCTL, "run", "--state-dir", str(tmp_path), "--", "true"])
        )
        assert done.code == 5, done.err
        assert f"no tpuctl agent is running for state dir {tmp_path}" in done.err


PROBE = """
import sys
from tpuctl.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    print("EXIT=%s" % exit.code)
print("LOADED=" + ",".join(sorted(m for m in sys.modules if m.startswith("tpuctl."))))
print("HEAVY=" + ",".join(sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})))
"""


@pytest.mark.slow
@pytest.mark.parametrize("command", [["env"], ["env", "-f", "json"], ["run", "--", "true"]])
def test_env_and_run_import_no_grpc_numpy_yaml_or_frameworks(cluster: SimCluster, command: list[str]) -> None:
    args = [command[0], "--state-dir", host(cluster, 0), *command[1:]]
    done = cluster.processes.run(
        f"probe-{command[0]}",
        [sys.executable, "-c", PROBE.format(heavy=(*HEAVY, "click", "asyncio") if command[0] == "env" else HEAVY), *args],
    )  # fmt: skip
    lines = dict(line.split("=", 1) for line in done.out.splitlines() if "=" in line and line[:1].isupper())
    assert lines.get("EXIT") == "0", done.out + done.err
    loaded = set(lines["LOADED"].split(","))
    assert {"tpuctl.job.env", "tpuctl.agent.control"} <= loaded
    if command[0] == "env":  # answered by the agent: no click, no mapping file read, no protobuf
        assert "tpuctl.cli.light" in loaded and not {"tpuctl.cli.app", "tpuctl.mapping.model"} & loaded, loaded
    assert lines["HEAVY"] == "", f"tpuctl {command[0]} imported {lines['HEAVY']}"


# --- tpuctl run ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_run_returns_the_jobs_exit_code(cluster: SimCluster) -> None:
    state = host(cluster, 0)
    assert tpuctl(cluster, "run", "--state-dir", state, "--", "true").code == 0
    assert tpuctl(cluster, "run", "--state-dir", state, "--", sys.executable, "-c", "import sys; sys.exit(7)").code == 7
    assert tpuctl(cluster, "run", "--state-dir", state, "--", "sh", "-c", "kill -9 $$").code == 128 + 9
    missing = tpuctl(cluster, "run", "--state-dir", state, "--", "no-such-command-tpuctl")
    assert missing.code == 127
    assert "cannot run 'no-such-command-tpuctl'" in missing.err


@pytest.mark.slow
def test_run_gives_the_job_its_environment_and_its_arguments(cluster: SimCluster) -> None:
    state = host(cluster, 1)
    expected = json.loads(tpuctl(cluster, "env", "-f", "json", "--state-dir", state).out)["set"]
    code = "import json, os, sys; print(json.dumps({'env': dict(os.environ), 'argv': sys.argv[1:]}))"
    # without `--`, options after the command are the job's, not tpuctl's
    done = tpuctl(cluster, "run", "--state-dir", state, sys.executable, "-c", code, "--grace", "1s", "--state-dir", "x")
    assert done.code == 0, done.err
    seen = json.loads(done.out)
    assert seen["argv"] == ["--grace", "1s", "--state-dir", "x"]
    assert {k: seen["env"].get(k) for k in expected} == expected
    # tpuctl inside the job talks to this host's agent without being told where it is
    status = tpuctl(cluster, "run", "--state-dir", state, "--", *TPUCTL, "status", "--json")
    assert status.code == 0, status.err
    assert json.loads(status.out)["task"] == 1


def start_signal_job(
    cluster: SimCluster, processes: Processes, tmp_path: Path, *job_args: str, grace: str = "10s"
) -> tuple[Proc, Path]:
    pid_file = tmp_path / "job.pid"
    proc = processes.start(
        "run-signals",
        [*TPUCTL, "run", "--grace", grace, "--state-dir", host(cluster, 0), "--",
         sys.executable, str(JOBS / "job_signals.py"), str(pid_file), *job_args],
    )  # fmt: skip
    wait_until(lambda: pid_file.exists() or proc.poll() is not None, 30, "the job to start", logs=processes.logs)
    assert pid_file.exists(), f"the job never started:\n{processes.logs()}"
    return proc, pid_file


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_run_forwards_signals_to_the_jobs_process_group(
    cluster: SimCluster, processes: Processes, tmp_path: Path, sig: int
) -> None:
    proc, pid_file = start_signal_job(cluster, processes, tmp_path)
    try:
        job_pid, job_group = (int(v) for v in pid_file.read_text().split())
        assert job_group == job_pid != os.getpgid(proc.pid)  # its own process group
        proc.send_signal(signal.SIGUSR1)
        signals = Path(str(pid_file) + ".signals")
        wait_until(lambda: signals.exists() and "SIGUSR1\n" in signals.read_text(), 10, "the job to get SIGUSR1")
        proc.send_signal(sig)
        done = processes.wait(proc, timeout=30)
    finally:
        processes.stop(proc)
        processes.stop_recorded([pid_file])  # the job, in its own process group
    assert done.code == 40 + sig, done.err
    assert signals.read_text().split() == ["SIGUSR1", signal.Signals(sig).name]


@pytest.mark.slow
def test_run_kills_a_job_that_ignores_a_forwarded_sigterm_after_the_grace(
    cluster: SimCluster, processes: Processes, tmp_path: Path
) -> None:
    proc, pid_file = start_signal_job(cluster, processes, tmp_path, "ignore-term", grace="1s")
    try:
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        done = processes.wait(proc, timeout=30)
        took = time.monotonic() - started
    finally:
        processes.stop(proc)
        processes.stop_recorded([pid_file])
    assert done.code == 128 + 9, done.err
    assert 0.9 < took < 6, took
    assert Path(str(pid_file) + ".signals").read_text().split() == ["SIGTERM"]


# the read(2) system call's number, to see a process blocked reading its terminal in /proc/PID/syscall
READ_SYSCALL = {"x86_64": "0", "aarch64": "63"}


def blocked_reading(pid: int) -> bool:
    """The process sleeps in read(2) (just its state where /proc/PID/syscall is not readable)."""
    try:
        number = Path(f"/proc/{pid}/syscall").read_text().split()[0]
    except (OSError, IndexError):
        return state(pid) == "S"
    return state(pid) == "S" and number == READ_SYSCALL.get(os.uname().machine, number)


@pytest.mark.slow
def test_run_on_a_terminal_gives_the_job_the_terminal(cluster: SimCluster) -> None:
    """Under an interactive shell the job becomes the terminal's foreground group: it reads the terminal,
    Ctrl-Z stops it and then tpuctl run (so the shell gets the terminal back), SIGCONT (``fg``) resumes
    both, and Ctrl-C reaches the job once."""
    code = "while True: print('got', input(), flush=True)"
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session leader with the pty as its controlling terminal, like a shell's job
        try:
            os.execv(
                sys.executable, [*TPUCTL, "run", "--state-dir", host(cluster, 0), "--", sys.executable, "-c", code]
            )
        finally:
            os._exit(111)
    output = b""

    def read_until(needle: bytes, timeout: float) -> None:
        nonlocal output
        deadline = time.monotonic() + timeout
        while needle not in output and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                with contextlib.suppress(OSError):
                    output += os.read(fd, 4096)

    def wait_status(options: int, timeout: float) -> int | None:
        def changed() -> tuple[int] | None:
            done, status = os.waitpid(pid, options | os.WNOHANG)
            return (status,) if done else None

        return wait_until(changed, timeout, "tpuctl run to change state", logs=lambda: repr(output))[0]

    def foreground() -> int | None:
        """The terminal's foreground process group once it is the job's (not tpuctl run's own)."""
        group = os.tcgetpgrp(fd)
        return group if group != pid else None

    job = 0
    try:
        job = wait_until(foreground, 30, "the job to get the terminal", logs=lambda: repr(output))  # its leader
        os.write(fd, b"hello\n")
        read_until(b"got hello", 30)
        assert b"got hello" in output, output
        os.write(fd, b"\x1a")  # Ctrl-Z: the job stops, then tpuctl run stops itself
        status = wait_status(os.WUNTRACED, 15)
        assert status is not None and os.WIFSTOPPED(status), output
        os.kill(pid, signal.SIGCONT)  # what the shell's `fg` does
        wait_until(
            lambda: state(pid) not in ("T", "t") and state(job) not in ("T", "t") and foreground() == job,
            15,
            "tpuctl run and the job to run again, the job in the foreground",
        )
        os.write(fd, b"again\n")
        read_until(b"got again", 15)
        assert b"got again" in output, output
        # Ctrl-C once the job is blocked reading again (a SIGINT just before Python's read() starts is only
        # acted on when the read returns: CPython's race, not tpuctl's)
        wait_until(lambda: blocked_reading(job), 15, "the job to read its terminal again")
        os.write(fd, b"\x03")
        read_until(b"KeyboardInterrupt", 15)
        status = wait_status(0, 15)
        assert status is not None and os.WIFEXITED(status), output
        assert os.WEXITSTATUS(status) == 128 + signal.SIGINT, output  # Python re-raises SIGINT at exit
        assert output.count(b"KeyboardInterrupt") == 1, output
    finally:
        stop_pids([p for p in (pid, job) if p], grace=2.0)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        os.close(fd)
