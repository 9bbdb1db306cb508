"""``tpuctl run --progress-regex REGEX``: the step a job prints, read from its output lines, for jobs that
change no code to report progress.

The job's stdout and stderr become pipes; a thread per stream copies every byte through to ``tpuctl
run``'s own stream unchanged (line by line, flushed) and matches each line against REGEX: its group
``step`` (or its first group) is the step, reported to this host's agent as ``tpuctl.job.progress`` would
(one line, the job's pid). A step that is not a whole number, or goes backwards, is not reported.
A line longer than ``MAX_MATCHED_BYTES`` is matched in pieces of that size (and passes through whole).
"""

from __future__ import annotations

import contextlib
import re
import threading
from typing import IO

from tpuctl.job.steps import MAX_STEP, _Reporter

MAX_MATCHED_BYTES = 64 * 1024


def compile_pattern(text: str) -> re.Pattern[bytes]:
    """REGEX as ``--progress-regex`` takes it; ``ValueError`` saying what is wrong (a group is needed)."""
    try:
        pattern = re.compile(text.encode())
    except re.error as exc:
        raise ValueError(f"{text!r} is not a regular expression: {exc}") from None
    if "step" not in pattern.groupindex and pattern.groups < 1:
        raise ValueError(f"{text!r} has no group for the step")
    return pattern


class PrintedSteps:
    """Copies a job's output through while reporting the steps it prints."""

    def __init__(self, pattern: re.Pattern[bytes], socket_path: str, generation: int) -> None:
        self.pattern = pattern
        self.group: str | int = "step" if "step" in pattern.groupindex else 1
        self.socket_path = socket_path
        self.generation = generation
        self.matched = 0
        """Steps matched and handed to the agent (sent, or dropped when no agent listens)."""
        self._lock = threading.Lock()  # stdout and stderr threads report through one reporter, in step order
        self._reporter: _Reporter | None = None
        self._threads: list[threading.Thread] = []

    def follow(self, source: IO[bytes], sink: IO[bytes], pid: int) -> None:
        if self._reporter is None:
            self._reporter = _Reporter(self.socket_path, self.generation, pid)
        thread = threading.Thread(target=self._copy, args=(source, sink), name="tpuctl-run-output", daemon=True)
        thread.start()
        self._threads.append(thread)

    def join(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s for each stream) for the output the job wrote before it ended."""
        for thread in self._threads:
            thread.join(timeout)
        self._threads = []
        if self._reporter is not None:
            self._reporter._close()

    def _copy(self, source: IO[bytes], sink: IO[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):
            for line in iter(lambda: source.readline(MAX_MATCHED_BYTES), b""):
                with contextlib.suppress(OSError, ValueError):
                    sink.write(line)
                    sink.flush()
                match = self.pattern.search(line)
                if match is not None:
                    self._report(match.group(self.group))

    def _report(self, text: bytes | None) -> None:
        if text is None or not text.isdigit() or len(text) > 16 or self._reporter is None:
            return
        step = int(text)
        with self._lock:
            if self._reporter.last[b"P"] <= step <= MAX_STEP:  # backwards or absurd: not reported, and not said
                self._reporter.send(b"P", step)
                self.matched += 1
