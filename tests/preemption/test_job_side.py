"""``tpuctl.job.should_checkpoint`` against a stand-in agent on a real unix socket: the listener thread subscribes,
answers a notice at once with where the process stands (even while the job's main thread is busy elsewhere, as in
a collective), holds the next call until the agreed step, and is True exactly once, at that step."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuctl.job import steps


class FakeAgent:
    """Accepts the job's connection on ``DIR/progress.sock``; ``line()`` reads what the job said, ``send`` answers."""

    def __init__(self, folder: Path) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(folder / steps.SOCKET_NAME))
        self.server.listen(8)
        self.server.settimeout(5)
        self.conn: socket.socket | None = None
        self.buffer = b""

    def accept(self) -> None:
        self.conn, _ = self.server.accept()
        self.conn.settimeout(5)

    def line(self) -> bytes:
        assert self.conn is not None
        while b"\n" not in self.buffer:
            data = self.conn.recv(256)
            assert data, "the job closed its connection"
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line

    def send(self, line: bytes) -> None:
        assert self.conn is not None
        self.conn.sendall(line + b"\n")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.server.close()


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAgent]:
    monkeypatch.setenv("TPUCTL_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("TPUCTL_GENERATION", "3")
    steps._reset_for_tests()
    fake = FakeAgent(tmp_path)
    try:
        yield fake
    finally:
        fake.close()
        steps._reset_for_tests()


def in_thread(step: int) -> tuple[threading.Thread, list[bool]]:
    answers: list[bool] = []
    thread = threading.Thread(target=lambda: answers.append(steps.should_checkpoint(step)), daemon=True)
    thread.start()
    return thread, answers


def test_the_listener_answers_a_notice_while_the_job_is_busy_and_holds_its_next_call_until_the_agreed_step(
    agent: FakeAgent,
) -> None:
    import os

    assert steps.should_checkpoint(41) is False  # no notice: False; the listener connects
    agent.accept()
    assert agent.line() == b"S 0 3 %d" % os.getpid()
    agent.send(b"N 3.0")
    # the main thread does not call (it waits in a collective for a host that is behind): the thread answers
    assert agent.line() == b"Q 42 3 %d" % os.getpid()
    held, answers = in_thread(42)
    held.join(0.3)
    assert held.is_alive() and answers == []  # held: its step must stay where the thread said it was
    agent.send(b"A 43")  # another host was one step ahead
    held.join(5)
    assert answers == [False]  # 42 is before the agreed step
    assert steps.should_checkpoint(43) is True  # exactly at the agreed step
    assert steps.should_checkpoint(44) is False  # once


def test_no_agreement_is_false_for_good(agent: FakeAgent) -> None:
    steps.should_checkpoint(5)
    agent.accept()
    agent.line()
    agent.send(b"N 1.0")
    assert agent.line().startswith(b"Q 6 ")
    agent.send(b"X")
    time.sleep(0.1)
    assert [steps.should_checkpoint(s) for s in range(6, 10)] == [False] * 4


def test_an_agent_that_never_decides_releases_the_job_after_the_bound(agent: FakeAgent) -> None:
    steps.should_checkpoint(5)
    agent.accept()
    agent.line()
    agent.send(b"N 0.5")
    agent.line()
    started = time.monotonic()
    assert steps.should_checkpoint(6) is False  # held for at most 0.5 s + the margin, then no step
    assert time.monotonic() - started < 0.5 + steps.ANSWER_MARGIN_S + 1.0
    assert steps.should_checkpoint(7) is False


def test_a_process_that_starts_asking_after_the_agreement_hears_it(agent: FakeAgent) -> None:
    steps.should_checkpoint(1)
    agent.accept()
    agent.line()
    agent.send(b"A 3")  # the agent answers a late listener with the decision at once
    time.sleep(0.2)
    assert [steps.should_checkpoint(s) for s in (2, 3, 4)] == [False, True, False]


def test_bad_steps_are_false_and_said_once(agent: FakeAgent, capsys: pytest.CaptureFixture[str]) -> None:
    assert steps.should_checkpoint("7") is False  # type: ignore[arg-type]
    assert steps.should_checkpoint("8") is False  # type: ignore[arg-type]
    assert steps.should_checkpoint(-1) is False
    assert steps.should_checkpoint(10) is False
    assert steps.should_checkpoint(9) is False  # backwards
    err = capsys.readouterr().err
    assert err.count("a step must be an int") == 1 and err.count("between 0 and") == 1
    assert "step 9 is below step 10" in err


def test_without_tpuctl_it_is_always_false_and_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TPUCTL_STATE_DIR", raising=False)
    steps._reset_for_tests()
    before = threading.active_count()
    assert [steps.should_checkpoint(s) for s in range(100)] == [False] * 100
    assert threading.active_count() == before


@pytest.mark.parametrize(
    ("answers", "stdout"),
    [([b"G"], ""), ([b"W 1.0", b"C 7"], "checkpoint 7\n"), ([b"W 0.5", b"G"], "")],
    ids=["go-on", "held-then-checkpoint", "held-then-go-on"],
)
def test_tpuctl_progress_prints_checkpoint_at_the_agreed_step(
    tmp_path: Path, answers: list[bytes], stdout: str
) -> None:
    """A shell loop's `tpuctl progress STEP` (the light path): the agent's answer on stdout, `checkpoint STEP`
    only at the agreed step; a held answer (`W SECONDS`) waits that long, not the usual 2 s."""
    import os
    import subprocess

    from harness import TPUCTL

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    fake = FakeAgent(state)

    def answer() -> None:
        fake.accept()
        fake.line()
        for line in answers:
            time.sleep(0.3 if line != answers[0] else 0.0)  # a held answer comes later
            fake.send(line)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        proc = subprocess.run(
            [*TPUCTL, "progress", "7", "--state-dir", str(state)], capture_output=True, text=True, timeout=30,
            env={**os.environ, "TPUCTL_GENERATION": "2"},
        )  # fmt: skip
    finally:
        thread.join(5)
        fake.close()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == stdout and proc.stderr == ""
