"""``tpuctl --version``/``-V``, ``tpuctl completion``, ``tpuctl logs`` and the log level, on real processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from harness import TPUCTL
from harness.clusters import LocalCluster

from tpuctl import __version__

BIN = str(Path(sys.executable).parent)


def tpuctl(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TPUCTL, *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_version_and_its_short_form() -> None:
    for flag in ("--version", "-V"):
        done = tpuctl(flag)
        assert (done.returncode, done.stdout, done.stderr) == (0, f"tpuctl {__version__}\n", "")


def test_bash_completion_script_is_printed_and_sources_cleanly() -> None:
    done = tpuctl("completion", "bash")
    assert done.returncode == 0, done.stderr
    assert "_TPUCTL_COMPLETE=bash_complete" in done.stdout and "complete -o nosort -F" in done.stdout
    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}
    sourced = subprocess.run(
        ["bash", "-c", 'set -e; eval "$(tpuctl completion bash)"; complete -p tpuctl'],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert (sourced.returncode, sourced.stderr) == (0, ""), sourced.stderr
    assert sourced.stdout.strip() == "complete -o nosort -F _tpuctl_completion tpuctl"


def test_the_script_gets_completions_from_tpuctl() -> None:
    """What the bash script runs on TAB: commands, then a command's options (not the light path's answer)."""
    for words, cword, expected in (("tpuctl sta", "1", "plain,status"), ("tpuctl status --fo", "2", "plain,--format")):
        env = {**os.environ, "COMP_WORDS": words, "COMP_CWORD": cword, "_TPUCTL_COMPLETE": "bash_complete"}
        done = tpuctl(env=env)
        assert (done.returncode, done.stdout.split()) == (0, [expected]), done.stderr


@pytest.mark.parametrize(
    ("shell", "marker"), [("zsh", "#compdef tpuctl"), ("fish", "complete --no-files --command tpuctl")]
)
def test_zsh_and_fish_scripts(shell: str, marker: str) -> None:
    done = tpuctl("completion", shell)
    assert done.returncode == 0 and marker in done.stdout, done.stderr
    if shell == "zsh" and shutil.which("zsh"):
        env = {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}
        sourced = subprocess.run(["zsh", "-fc", "autoload -U compinit; compinit -u; eval \"$(tpuctl completion zsh)\""],
                                 capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
        assert sourced.returncode == 0, sourced.stderr


def test_completion_for_an_unknown_shell_is_a_usage_error() -> None:
    done = tpuctl("completion", "bsh")
    assert (done.returncode, done.stdout) == (2, "")
    assert (
        done.stderr
        == "tpuctl: error: tpuctl completion: 'bsh' is not a shell tpuctl completes\nhint: did you mean 'bash'?\n"
    )


def test_logs_without_an_agent_log_says_so(tmp_path: Path) -> None:
    done = tpuctl("logs", "--state-dir", str(tmp_path))
    assert (done.returncode, done.stdout) == (5, "")
    assert done.stderr.startswith(f"tpuctl: error: no agent log in state dir {tmp_path} (agent.log is missing)\nhint: ")
    assert tpuctl("logs", "--timeout", "1s", "--state-dir", str(tmp_path)).returncode == 2  # --timeout needs --follow


def test_logs_tail_reads_the_last_lines(tmp_path: Path) -> None:
    lines = [f"2026-01-01 00:00:00 INFO tpuctl.agent: line {n} " + "x" * (n % 300) for n in range(5000)]
    (tmp_path / "agent.log").write_text("\n".join(lines) + "\n")
    done = tpuctl("logs", "-n", "3", "--state-dir", str(tmp_path))
    assert (done.returncode, done.stdout) == (0, "\n".join(lines[-3:]) + "\n")
    assert tpuctl("logs", "--lines", "0", "--state-dir", str(tmp_path)).stdout == ""
    assert tpuctl("logs", "-n", "9999", "--state-dir", str(tmp_path)).stdout.splitlines() == lines
    start = time.monotonic()
    followed = tpuctl("logs", "-n", "1", "--follow", "--timeout", "5s", "--state-dir", str(tmp_path))
    assert followed.returncode == 0 and followed.stdout == lines[-1] + "\n"
    assert time.monotonic() - start < 5  # no agent runs: nothing to follow, it returns at once


@pytest.fixture
def one_host(make_cluster: Callable[..., LocalCluster]) -> LocalCluster:
    """A one-host loopback cluster's spec (the shared ``make_cluster``: stopped by pid after the test)."""
    return make_cluster("v4-8")


def init(cluster: LocalCluster, *options: str) -> None:
    """``tpuctl init`` of host 0 to completion (the agent it leaves running: the cluster's to stop)."""
    cluster.state(0).mkdir(parents=True, mode=0o700)
    done = cluster.tpuctl("init", "--config", str(cluster.spec), "--task-id", "0", *options, task=0)
    assert done.code == 0, done.err


@pytest.mark.slow
def test_the_agent_logs_at_the_level_init_was_given_and_logs_follows_it_to_its_end(one_host: LocalCluster) -> None:
    init(one_host, "--log-level", "warning")
    log = one_host.state(0) / "agent.log"
    assert log.exists() and " INFO " not in log.read_text()  # the agent's own info lines are not written
    follower = one_host.start(
        "logs-follow", [*TPUCTL, "logs", "--follow", "--timeout", "60s", "--state-dir", str(one_host.state(0))]
    )
    time.sleep(0.5)
    assert one_host.tpuctl("down", task=0).code == 0
    done = one_host.wait(follower.label, timeout=30)  # ends with the agent, long before --timeout
    assert done.code == 0 and done.seconds < 30, done.err
    assert done.out == log.read_text()  # everything it wrote, to the end


@pytest.mark.slow
def test_the_agent_logs_info_by_default_and_debug_with_vv_via_the_environment(
    one_host: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the harness adds a command's env to this process's: the default level needs the variable gone here
    monkeypatch.delenv("TPUCTL_LOG_LEVEL", raising=False)
    init(one_host)
    text = (one_host.state(0) / "agent.log").read_text()
    assert " INFO " in text and " DEBUG " not in text
    status = one_host.tpuctl("status", "-vv", task=0)
    assert status.code == 0 and "tpuctl: debug: status: " in status.err and "agent socket" in status.err
    quiet = one_host.tpuctl("status", task=0)
    assert quiet.code == 0 and quiet.err == ""
