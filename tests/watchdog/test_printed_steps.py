"""``tpuctl run --progress-regex``: a real job's output passes through byte for byte while the steps it
prints reach a real unix stream socket as the agent's, in order, never backwards."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tpuctl.job.printed import PrintedSteps, compile_pattern

JOB = r"""
import sys
out, err = sys.stdout.buffer, sys.stderr.buffer
for step in range(1, 6):
    out.write(b"step %d loss 0.%d\n" % (step, step)); out.flush()
    err.write(b"INFO step=%d \xff not utf-8\n" % step); err.flush()
out.write(b"step 3 (a re-print: not backwards counted)\n")
out.write(b"x" * 100000 + b" step 7\n")
out.write(b"eval at step 6 done")  # no newline at the end
"""


def test_the_job_output_passes_through_and_its_steps_are_reported(tmp_path: Path) -> None:
    path = str(tmp_path / "progress.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    listener.settimeout(5)
    try:
        printed = PrintedSteps(compile_pattern(r"step[ =](\d+)"), path, generation=2)
        proc = subprocess.Popen([sys.executable, "-c", JOB], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        out, err = io.BytesIO(), io.BytesIO()
        printed.follow(proc.stdout, out, proc.pid)
        printed.follow(proc.stderr, err, proc.pid)
        connection, _ = listener.accept()
        assert proc.wait(30) == 0
        printed.join(5)  # closes its socket: the stream ends
        expected = subprocess.run([sys.executable, "-c", JOB], capture_output=True, timeout=30, check=True)
        assert out.getvalue() == expected.stdout and err.getvalue() == expected.stderr
        received = b""
        with connection:
            connection.settimeout(5)
            while chunk := connection.recv(4096):
                received += chunk
        got = received.decode().splitlines()
        steps = [int(r.split()[1]) for r in got]
        # Each step printed on stdout and stderr (the same step twice is allowed); the re-printed 3 and the
        # 6 after the 100 kB line's 7 (matched in 64 KiB pieces) would go backwards: not reported.
        assert steps == sorted(steps) and steps[-1] == 7, got
        assert set(steps) == {1, 2, 3, 4, 5, 7}
        assert all(r.split()[0] == "P" and r.split()[2:] == ["2", str(proc.pid)] for r in got)
        assert printed.matched == len(got)
    finally:
        listener.close()


def test_without_an_agent_the_output_still_passes_through(tmp_path: Path) -> None:
    printed = PrintedSteps(compile_pattern(r"(?P<step>\d+)/\d+"), str(tmp_path / "nobody.sock"), generation=1)
    proc = subprocess.Popen(
        [sys.executable, "-c", "print('1/10'); print('2/10')"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert proc.stdout is not None
    out = io.BytesIO()
    printed.follow(proc.stdout, out, proc.pid)
    assert proc.wait(30) == 0
    printed.join(5)
    assert out.getvalue().replace(os.linesep.encode(), b"\n") == b"1/10\n2/10\n" and printed.matched == 2


@pytest.mark.parametrize(
    ("regex", "problem"), [("step", "has no group for the step"), ("st(ep", "is not a regular expression")]
)
def test_a_pattern_without_a_step_group_is_refused(regex: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        compile_pattern(regex)
