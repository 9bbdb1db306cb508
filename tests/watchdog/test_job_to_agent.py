"""The job's reports reach its agent: ``tpuctl.job.progress`` in a real job process (another Python,
the environment ``tpuctl run`` gives a job) sends lines to the agent's real socket; the agent's
``JobProgress`` counts them, refuses what is wrong once, and reports to the coordinator on time."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpuctl.agent.progress import JobProgress, parse_report
from tpuctl.job import steps
from tpuctl.watchdog.pace import PaceReport
from tpuctl.watchdog.settings import WatchdogSettings

REPO = Path(__file__).resolve().parents[2]


def job(state_dir: Path, code: str, generation: int = 1) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TPUCTL_STATE_DIR": str(state_dir), "TPUCTL_GENERATION": str(generation)}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-c", "import tpuctl.job as j\n" + code], env=env, capture_output=True, text=True, timeout=60
    )


def test_a_jobs_steps_reach_its_agent_and_are_reported_to_the_coordinator(tmp_path: Path) -> None:
    async def body() -> tuple[list[PaceReport], JobProgress]:
        sent: list[PaceReport] = []

        async def send(report: PaceReport) -> bool:
            sent.append(report)
            return True

        progress = JobProgress(WatchdogSettings(hang_timeout=20.0, report_every=0.5), tmp_path / "progress.sock")
        await progress.open()
        progress.start(1, 4, send)
        done = await asyncio.to_thread(
            job, tmp_path, "import time\nfor s in range(50):\n    j.progress(s)\n    time.sleep(0.02)\nj.checkpointed(40)"
        )
        assert done.returncode == 0 and done.stderr == "", done.stderr
        await asyncio.sleep(0.8)
        progress.close()
        return sent, progress

    sent, _ = asyncio.run(body())
    assert not (tmp_path / "progress.sock").exists()
    assert sent, "nothing reported"
    last = sent[-1]
    assert last.step == 49 and last.checkpointed == 40 and not last.stalled
    assert 0.015 <= last.step_time <= 0.1
    assert 1 <= len(sent) <= 4  # the first report, then one every 0.5 s: not one per step


def test_bad_steps_are_refused_once_by_the_job_and_never_counted(tmp_path: Path) -> None:
    async def body() -> int:
        async def send(report: PaceReport) -> bool:
            return True

        progress = JobProgress(WatchdogSettings(), tmp_path / "progress.sock")
        await progress.open()
        progress.start(1, 1, send)
        code = "for s in [5, 'x', 'y', 4, 3, -1, 10**16, 6]:\n    j.progress(s)\nimport numpy\nj.progress(numpy.int64(7))"
        done = await asyncio.to_thread(job, tmp_path, code)
        assert done.returncode == 0
        assert done.stderr.count("tpuctl.job.progress: a step must be an int, got 'x' (str)") == 1
        assert "'y'" not in done.stderr  # said once, not per step
        assert done.stderr.count("is below step 5") == 1
        assert "between 0 and 1,000,000,000,000,000, got -1" in done.stderr
        assert "got 10,000,000,000,000,000" not in done.stderr  # the same mistake (range) as -1: said once
        await asyncio.sleep(0.2)
        assert progress.pace is not None
        counted = progress.pace.step
        progress.close()
        return counted

    assert asyncio.run(body()) == 7  # 5, 6 and numpy's 7 counted; the rest refused by the job itself


def test_the_agent_counts_only_well_formed_reports_of_its_generation(caplog: pytest.LogCaptureFixture) -> None:
    progress = JobProgress(WatchdogSettings(), Path("/nonexistent/progress.sock"))

    async def body() -> None:
        async def send(report: PaceReport) -> bool:
            return True

        progress.start(2, 1, send)
        now = time.monotonic()
        with caplog.at_level(logging.WARNING, "tpuctl.agent.progress"):
            for data in (b"P 1 2 10", b"P 3 1 10", b"P 4 1 10", b"X 1 2 10", b"P 2", b"P 5 2 10", b"P 4 2 10", b"P 6 0 11"):
                progress.receive(data, now)
        assert progress.pace is not None and progress.pace.step == 5
        progress.stop()

    asyncio.run(body())
    text = caplog.text
    assert text.count("of a job of generation 1") == 1
    assert text.count("is not 'P|C|S|Q|K STEP GENERATION PID'") == 1  # two malformed reports, said once
    assert "process 10 reported step 4 after step 5" in text


def test_parse_report_bounds() -> None:
    assert parse_report(b"P 12 3 456") == ("P", 12, 3, 456)
    assert parse_report(b"C 0 0 1") == ("C", 0, 0, 1)
    assert isinstance(parse_report(b"P -1 0 1"), str)
    assert isinstance(parse_report(b"P 1 0 1 extra"), str)
    assert isinstance(parse_report(b"P " + b"9" * 70 + b" 0 1"), str)
    assert isinstance(parse_report(b"P 10000000000000000 0 1"), str)


def test_a_job_without_an_agent_costs_nothing_and_says_nothing(tmp_path: Path) -> None:
    done = job(tmp_path / "none", "import sys\nfor s in range(1000):\n    j.progress(s)\nprint(sorted(m for m in ('grpc', 'click', 'asyncio', 'numpy') if m in sys.modules))")
    assert done.returncode == 0 and done.stderr == "" and done.stdout.strip() == "[]"


def test_a_job_not_under_tpuctl_is_not_reporting_anywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TPUCTL_STATE_DIR", raising=False)
    steps._reset_for_tests()
    try:
        for s in range(3):
            steps.progress(s)
        assert steps._REPORTER.sock is None and steps._REPORTER.retry_at == float("inf")
    finally:
        steps._reset_for_tests()


def test_an_agent_that_reads_nothing_for_a_while_never_blocks_the_job_nor_garbles_a_line(tmp_path: Path) -> None:
    """100,000 reports into a socket nobody reads (its buffers fill, the kernel takes part of a line, then
    nothing): every call returns at once; once the agent reads, every line it gets is whole and the last
    one is the newest step."""
    import socket as socket_module

    path = str(tmp_path / "progress.sock")
    listener = socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    reporter = steps._Reporter(path, generation=1, pid=42)
    try:
        slowest = 0.0
        for step in range(100_000):
            started = time.perf_counter()
            reporter.send(b"P", step)
            slowest = max(slowest, time.perf_counter() - started)
        assert slowest < 1.0, slowest  # never blocked (a blocked send would wait for the agent, for good)
        connection, _ = listener.accept()
        with connection:
            connection.settimeout(5)
            received = b""
            connection.setblocking(False)
            while True:  # drain what the kernel holds
                try:
                    chunk = connection.recv(1 << 16)
                except BlockingIOError:
                    break
                received += chunk
            reporter.send(b"P", 100_000)  # the agent reads again: the cut line's rest, then the newest one
            connection.settimeout(5)
            while not received.endswith(b"P 100000 1 42\n"):
                received += connection.recv(1 << 16)
        lines = received.split(b"\n")[:-1]
        assert all(line.startswith(b"P ") and line.endswith(b" 1 42") and len(line.split()) == 4 for line in lines)
        steps_seen = [int(line.split()[1]) for line in lines]
        assert steps_seen == sorted(steps_seen) and steps_seen[-1] == 100_000
        assert len(steps_seen) < 100_000  # the kernel's buffers filled: some reports were not taken
    finally:
        reporter._close()
        listener.close()
