"""``tpuctl env`` and ``tpuctl run`` against a real simulated cluster (one per module), as real processes.

The cluster's root folder has a space, a quote and a dollar sign in its name, so every path tpuctl hands
to a shell exercises the quoting.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tpuctl.agent.protocol import AgentInfo
from tpuctl.job.env import job_environment
from tpuctl.mapping.file import read_mapping

TPUCTL = [sys.executable, "-m", "tpuctl"]
JOBS = Path(__file__).resolve().parents[1] / "job"
HEAVY = ("grpc", "numpy", "tensorflow", "jax", "jaxlib", "yaml")


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root

    def state(self, task: int) -> str:
        return str(self.root / f"host-{task}")

    def info(self, task: int) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.root / f"host-{task}" / "agent.json").read_text())
        return data


def tpuctl(*args: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TPUCTL, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("envrun") / "odd dir's $x"
    up = tpuctl("sim", "up", "v4-16", "--root", str(root), timeout=120)
    try:
        assert up.returncode == 0, up.stderr
        yield Cluster(root)
    finally:
        tpuctl("sim", "down", "--root", str(root), timeout=60)
        for pid_file in root.glob("host-*/agent.pid"):  # anything sim down could not stop
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


def parse_sh(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        words = shlex.split(line)
        assert words[0] == "export", line
        name, _, value = words[1].partition("=")
        out[name] = value
    return out


# --- tpuctl env ------------------------------------------------------------------------------------


def test_env_prints_the_agents_environment(cluster: Cluster) -> None:
    done = tpuctl("env", "--state-dir", cluster.state(1))
    assert done.returncode == 0, done.stderr
    printed = parse_sh(done.stdout)
    info = cluster.info(1)
    expected = job_environment(AgentInfo.from_json(info), read_mapping(info["mapping"]), state_dir=cluster.state(1))
    assert printed == expected.set
    ports = info["job_ports"]
    assert printed["DTENSOR_JOBS"] == f"127.0.0.2:{ports['dtensor'][0]},127.0.0.3:{ports['dtensor'][1]}"
    assert printed["JAX_COORDINATOR_ADDRESS"] == f"127.0.0.2:{ports['jax']}"
    assert (printed["DTENSOR_CLIENT_ID"], printed["JAX_PROCESS_ID"], printed["TPU_WORKER_ID"]) == ("1", "1", "1")
    assert printed["TPUCTL_MAPPING"] == str(cluster.root / "host-1" / "mapping.json")
    assert printed["TPU_ACCELERATOR_TYPE"] == "v4-16"

    as_json = tpuctl("env", "--format", "json", "--state-dir", cluster.state(1))
    assert as_json.returncode == 0
    assert json.loads(as_json.stdout) == printed


def test_eval_in_bash_sets_every_value_exactly(cluster: Cluster) -> None:
    script = (
        'eval "$(tpuctl env --state-dir "$D")" || exit 9\n'
        'printf "%s\\n" "$JAX_PROCESS_ID" "$DTENSOR_JOB_NAME" "$TPUCTL_STATE_DIR" "$TPUCTL_MAPPING"\n'
    )
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "D": cluster.state(0), "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["0", "worker", cluster.state(0), str(cluster.root / "host-0" / "mapping.json")]


def test_ports_never_collide_between_hosts_sharing_the_machine(cluster: Cluster) -> None:
    envs = [parse_sh(tpuctl("env", "--state-dir", cluster.state(t)).stdout) for t in range(2)]
    assert envs[0]["DTENSOR_JOBS"] == envs[1]["DTENSOR_JOBS"]
    assert envs[0]["JAX_COORDINATOR_ADDRESS"] == envs[1]["JAX_COORDINATOR_ADDRESS"]
    ports = [int(job.rsplit(":", 1)[1]) for job in envs[0]["DTENSOR_JOBS"].split(",")]
    ports.append(int(envs[0]["JAX_COORDINATOR_ADDRESS"].rsplit(":", 1)[1]))
    ports.append(int(cluster.info(0)["coordinator"].rsplit(":", 1)[1]))
    assert len(set(ports)) == len(ports) == 4, ports


def test_env_finds_the_state_dir_in_the_environment(cluster: Cluster) -> None:
    done = tpuctl("env", "-f", "json", env={**os.environ, "TPUCTL_STATE_DIR": cluster.state(1)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["TPUCTL_TASK_ID"] == "1"


def test_env_and_run_without_an_agent_exit_5(tmp_path: Path) -> None:
    for args in (["env"], ["run", "--", "true"]):
        done = (
            tpuctl(*args, "--state-dir", str(tmp_path))
            if args == ["env"]
            else tpuctl("run", "--state-dir", str(tmp_path), "--", "true")
        )
        assert done.returncode == 5, done.stderr
        assert f"no tpuctl agent is running for state dir {tmp_path}" in done.stderr


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


@pytest.mark.parametrize("command", [["env"], ["env", "-f", "json"], ["run", "--", "true"]])
def test_env_and_run_import_no_grpc_numpy_yaml_or_frameworks(cluster: Cluster, command: list[str]) -> None:
    args = [command[0], "--state-dir", cluster.state(0), *command[1:]]
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=(*HEAVY, "click", "asyncio") if command[0] == "env" else HEAVY), *args],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    lines = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line and line[:1].isupper())
    assert lines.get("EXIT") == "0", done.stdout + done.stderr
    loaded = set(lines["LOADED"].split(","))
    assert {"tpuctl.job.env", "tpuctl.agent.control"} <= loaded
    if command[0] == "env":  # answered by the agent: no click, no mapping file read, no protobuf
        assert "tpuctl.cli.light" in loaded and not {"tpuctl.cli.app", "tpuctl.mapping.model"} & loaded, loaded
    assert lines["HEAVY"] == "", f"tpuctl {command[0]} imported {lines['HEAVY']}"


# --- tpuctl run ------------------------------------------------------------------------------------


def test_run_returns_the_jobs_exit_code(cluster: Cluster) -> None:
    state = cluster.state(0)
    assert tpuctl("run", "--state-dir", state, "--", "true").returncode == 0
    assert tpuctl("run", "--state-dir", state, "--", sys.executable, "-c", "import sys; sys.exit(7)").returncode == 7
    assert tpuctl("run", "--state-dir", state, "--", "sh", "-c", "kill -9 $$").returncode == 128 + 9
    missing = tpuctl("run", "--state-dir", state, "--", "no-such-command-tpuctl")
    assert missing.returncode == 127
    assert "cannot run 'no-such-command-tpuctl'" in missing.stderr


def test_run_gives_the_job_its_environment_and_its_arguments(cluster: Cluster) -> None:
    state = cluster.state(1)
    expected = json.loads(tpuctl("env", "-f", "json", "--state-dir", state).stdout)
    code = "import json, os, sys; print(json.dumps({'env': dict(os.environ), 'argv': sys.argv[1:]}))"
    # without `--`, options after the command are the job's, not tpuctl's
    done = tpuctl("run", "--state-dir", state, sys.executable, "-c", code, "--grace", "1s", "--state-dir", "x")
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["argv"] == ["--grace", "1s", "--state-dir", "x"]
    assert {k: seen["env"].get(k) for k in expected} == expected
    # tpuctl inside the job talks to this host's agent without being told where it is
    status = tpuctl("run", "--state-dir", state, "--", *TPUCTL, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["task"] == 1


def start_signal_job(cluster: Cluster, tmp_path: Path, *job_args: str, grace: str = "10s") -> tuple[Any, Path]:
    pid_file = tmp_path / "job.pid"
    proc = subprocess.Popen(
        [*TPUCTL, "run", "--grace", grace, "--state-dir", cluster.state(0), "--",
         sys.executable, str(JOBS / "job_signals.py"), str(pid_file), *job_args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not pid_file.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    if not pid_file.exists():
        proc.kill()
        raise AssertionError(f"the job never started: {proc.communicate(timeout=10)}")
    return proc, pid_file


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_run_forwards_signals_to_the_jobs_process_group(cluster: Cluster, tmp_path: Path, sig: int) -> None:
    proc, pid_file = start_signal_job(cluster, tmp_path)
    try:
        job_pid, job_group = (int(v) for v in pid_file.read_text().split())
        assert job_group == job_pid != os.getpgid(proc.pid)  # its own process group
        proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        signals = Path(str(pid_file) + ".signals")
        while time.monotonic() < deadline and not (signals.exists() and "SIGUSR1\n" in signals.read_text()):
            time.sleep(0.02)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 40 + sig, err
    assert signals.read_text().split() == ["SIGUSR1", signal.Signals(sig).name]


def test_run_kills_a_job_that_ignores_a_forwarded_sigterm_after_the_grace(cluster: Cluster, tmp_path: Path) -> None:
    proc, pid_file = start_signal_job(cluster, tmp_path, "ignore-term", grace="1s")
    try:
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 128 + 9, err
    assert 0.9 < took < 6, took
    assert Path(str(pid_file) + ".signals").read_text().split() == ["SIGTERM"]


def test_run_on_a_terminal_gives_the_job_the_terminal(cluster: Cluster) -> None:
    """Under an interactive shell the job becomes the terminal's foreground group: it reads the terminal,
    Ctrl-Z stops it and then tpuctl run (so the shell gets the terminal back), SIGCONT (``fg``) resumes
    both, and Ctrl-C reaches the job once."""
    code = "while True: print('got', input(), flush=True)"
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session leader with the pty as its controlling terminal, like a shell's job
        try:
            os.execv(
                sys.executable, [*TPUCTL, "run", "--state-dir", cluster.state(0), "--", sys.executable, "-c", code]
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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, options | os.WNOHANG)
            if done:
                return status
            time.sleep(0.05)
        return None

    try:
        time.sleep(0.5)
        os.write(fd, b"hello\n")
        read_until(b"got hello", 30)
        assert b"got hello" in output, output
        os.write(fd, b"\x1a")  # Ctrl-Z: the job stops, then tpuctl run stops itself
        status = wait_status(os.WUNTRACED, 15)
        assert status is not None and os.WIFSTOPPED(status), output
        os.kill(pid, signal.SIGCONT)  # what the shell's `fg` does
        time.sleep(0.3)
        os.write(fd, b"again\n")
        read_until(b"got again", 15)
        assert b"got again" in output, output
        # Ctrl-C once the job is blocked reading again (a SIGINT just before Python's read() starts is only
        # acted on when the read returns: CPython's race, not tpuctl's)
        time.sleep(0.5)
        os.write(fd, b"\x03")
        read_until(b"KeyboardInterrupt", 15)
        status = wait_status(0, 15)
        assert status is not None and os.WIFEXITED(status), output
        assert os.WEXITSTATUS(status) == 128 + signal.SIGINT, output  # Python re-raises SIGINT at exit
        assert output.count(b"KeyboardInterrupt") == 1, output
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
