"""``tpuctl init`` relays its agent's events and never waits past its deadline, even on a silent agent: the
whole of init, the phase the agent says it is in, and the agent's liveness (a stopped agent is named so)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tpuctl.agent.launch import PHASE_SLACK_S, _events, _stopped, _Wait
from tpuctl.agent.statedir import StateDir
from tpuctl.errors import DeadlineError, StateError
from tpuctl.spec.yamlfile import load_spec_text


def test_events_stop_at_the_deadline_when_the_agent_goes_silent() -> None:
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, b'{"event": "progress", "text": "a"}\n{"event": "progr')  # then nothing more
        started = time.monotonic()
        events = list(_events(read_fd, lambda: started + 0.3))
        waited = time.monotonic() - started
    finally:
        os.close(write_fd)
    assert events == [{"event": "progress", "text": "a"}]
    assert 0.25 <= waited < 2.0


def test_events_end_when_the_agent_closes_the_pipe() -> None:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b'{"event": "ready", "summary": {"task": 1}}\n')
    os.close(write_fd)
    started = time.monotonic()
    assert list(_events(read_fd, lambda: started + 30)) == [{"event": "ready", "summary": {"task": 1}}]
    assert time.monotonic() - started < 2.0


def test_the_deadline_is_asked_again_after_every_event() -> None:
    """An agent that keeps talking moves the liveness deadline; one that goes quiet meets it."""
    read_fd, write_fd = os.pipe()
    heard = [time.monotonic()]

    def until() -> float:
        return heard[0] + 0.3

    try:
        os.write(write_fd, b'{"event": "alive"}\n')
        started = time.monotonic()
        seen = []
        for event in _events(read_fd, until):
            heard[0] = time.monotonic()
            seen.append(event)
            if len(seen) < 3:
                time.sleep(0.2)
                os.write(write_fd, b'{"event": "alive"}\n')
        waited = time.monotonic() - started
    finally:
        os.close(write_fd)
    assert len(seen) == 3
    assert 0.65 <= waited < 2.5


SPEC = """
cluster: w
accelerator: v4-16
backend: sim
hosts: [127.0.0.1, 127.0.0.2]
coordinator: {heartbeat_interval: 500ms, heartbeat_timeout: 2s, register_timeout: 20s}
barrier_timeout: 40s
"""


def _wait(tmp_path, pid: int) -> _Wait:
    from tpuctl.agent.options import AgentOptions

    spec = load_spec_text(SPEC)
    options = AgentOptions(spec=spec, task=1, state=StateDir(tmp_path), output=tmp_path / "m.json", address="127.0.0.2")
    return _Wait(options, pid)


def test_the_wait_is_bounded_by_the_phase_and_by_silence(tmp_path) -> None:
    wait = _wait(tmp_path, os.getpid())
    now = time.monotonic()
    assert wait.until() <= now + 30.0  # before the first word: the start-up allowance
    wait.heard()
    assert abs(wait.until() - (time.monotonic() + 2.0)) < 0.1  # then: the heartbeat timeout of silence
    wait.enter("the final barrier", 0.5)
    wait.last_heard = time.monotonic() + 100  # a talkative agent: the phase decides
    assert abs(wait.until() - (time.monotonic() + 0.5 + PHASE_SLACK_S)) < 0.1
    wait.phase_deadline = time.monotonic() - 1
    overrun = wait.overrun()
    assert isinstance(overrun, DeadlineError)
    assert overrun.message.startswith(f"task 1: the final barrier did not end within {0.5 + PHASE_SLACK_S:.0f} s")
    wait.enter("merging core IDs", "nonsense")  # a bad limit is no limit beyond the slack
    assert wait.phase_limit == PHASE_SLACK_S


def test_a_silent_stopped_agent_is_named_frozen(tmp_path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not _stopped(sleeper.pid)
        os.kill(sleeper.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not _stopped(sleeper.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _stopped(sleeper.pid)
        wait = _wait(tmp_path, sleeper.pid)
        wait.enter("waiting for every host", 20.0)
        wait.last_heard = time.monotonic() - 2.5
        overrun = wait.overrun()
        assert isinstance(overrun, StateError)
        assert overrun.message.startswith(
            f"task 1: this host's tpuctl agent (pid {sleeper.pid}) is frozen (stopped by a signal: SIGSTOP, a "
            "debugger or job control): no word from it for 2.5 s during waiting for every host, more than the "
            "heartbeat timeout (2 s)"
        )
        os.kill(sleeper.pid, signal.SIGCONT)
        assert "is stuck" in wait.overrun().message
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not _stopped(sleeper.pid)  # gone: unknown, not stopped
