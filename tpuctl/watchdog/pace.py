"""One host's job as its agent sees it: the steps its processes report, when each was reached, whether it
stalled; and when the agent should tell the coordinator (``PaceReport``).

The job's reports arrive as lines on a socket (:mod:`tpuctl.job.steps`), as often as every step; what leaves the
host is one small ``PaceReport`` per ``report_interval`` while the job advances, plus one at once when it
stalls or resumes. So the coordinator's cost is O(1) per host per interval whatever the step rate.

A host's step is the lowest of its processes' (a host with several job processes is as far as its slowest
one). Its step time is the median, over the last ``window`` steps, of the seconds per step between
advances (an advance of several steps at once counts as that many steps of equal length).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

from tpuctl.watchdog.settings import WatchdogSettings

MAX_STEP = 10**15
"""A step beyond this is a mistake (a timestamp, a token count), not a step (``tpuctl.job.steps.MAX_STEP``,
the job side, which imports nothing of tpuctl's)."""
MAX_PROCESSES = 256
"""Job processes tracked on one host; beyond it the oldest is forgotten (a job that forks per step)."""


@dataclass(frozen=True)
class PaceReport:
    """What one agent tells the coordinator about its job (fixed size: O(1) per host)."""

    step: int
    """The job's step (the lowest of its processes')."""
    step_age: float
    """Seconds since the job reached ``step``, when the report was made."""
    step_time: float
    """Median seconds per step over the last ``window`` steps (0.0 until two steps were seen)."""
    window: int
    """How many steps ``step_time`` covers."""
    stalled: bool
    """No step for the agent's stall threshold (``WatchdogSettings.stall_after``)."""
    checkpointed: int = -1
    """The latest step the job said was checkpointed (-1: none)."""
    ended: bool = False
    """The job's processes are gone: the host is not judged until a job reports again."""
    sent_at: float = 0.0
    """The agent's wall clock when it made the report (0.0: unknown)."""


class StepPace:
    """The agent's record of its job's steps. Feed it ``record`` as reports arrive; ask ``due`` on a timer
    (every second or so) for the report to send, if one is due."""

    def __init__(self, settings: WatchdogSettings, hosts: int) -> None:
        self.settings = settings
        self.interval = settings.report_interval(hosts)
        self.window = settings.straggler.steps if settings.straggler is not None else 50
        self._durations: deque[float] = deque(maxlen=self.window)  # seconds per step, oldest first
        self.start_over()

    def start_over(self) -> None:
        """Forget the job: nothing reported yet, not armed."""
        self._steps: dict[int, int] = {}  # pid -> its latest step
        self.step = -1
        """The host's step (-1: nothing reported yet: the watchdog is not armed)."""
        self.reached_at = 0.0
        self.checkpointed = -1
        self._durations.clear()
        self._sorted: list[float] = []  # the same, sorted (for the median)
        self._sent_at: float | None = None
        self._sent_stalled = False

    @property
    def armed(self) -> bool:
        return self.step >= 0

    def record(self, kind: str, step: int, pid: int, now: float) -> str | None:
        """A report from the job: ``kind`` "P" (progress) or "C" (checkpointed). Returns why it was not
        counted (a step below what that process said before), or None."""
        if kind == "C":
            if step < self.checkpointed:
                return f"checkpointed step {step:,} is below step {self.checkpointed:,}, reported before"
            self.checkpointed = step
            return None
        before = self._steps.get(pid)
        if before is not None and step < before:
            return f"process {pid} reported step {step:,} after step {before:,}"
        if before is None and len(self._steps) >= MAX_PROCESSES:
            del self._steps[next(iter(self._steps))]
        self._steps[pid] = step
        host_step = min(self._steps.values()) if len(self._steps) > 1 else step
        if host_step > self.step:
            if self.step >= 0:
                advanced = host_step - self.step
                per_step = (now - self.reached_at) / advanced
                for _ in range(min(advanced, self.window)):
                    self._add(per_step)
            self.step, self.reached_at = host_step, now
        return None

    def _add(self, seconds: float) -> None:
        if len(self._durations) == self._durations.maxlen:
            oldest = self._durations[0]
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
        self._durations.append(seconds)
        bisect.insort(self._sorted, seconds)

    @property
    def step_time(self) -> float | None:
        """Median seconds per step over the window (None until two steps were seen)."""
        n = len(self._sorted)
        if n == 0:
            return None
        return self._sorted[n // 2] if n % 2 else (self._sorted[n // 2 - 1] + self._sorted[n // 2]) / 2

    def stalled(self, now: float) -> bool:
        return self.armed and now - self.reached_at >= self.settings.stall_after(self.step_time)

    def report(self, now: float, wall: float = 0.0) -> PaceReport:
        return PaceReport(
            step=self.step,
            step_age=max(0.0, now - self.reached_at),
            step_time=self.step_time or 0.0,
            window=len(self._durations),
            stalled=self.stalled(now),
            checkpointed=self.checkpointed,
            sent_at=wall,
        )

    def ended(self, wall: float = 0.0) -> PaceReport:
        """The report that says the job ended (its processes are gone). Once it left, ``start_over``: the
        next job's first report arms the pace again."""
        return PaceReport(self.step, 0.0, 0.0, 0, False, self.checkpointed, ended=True, sent_at=wall)

    @property
    def pids(self) -> tuple[int, ...]:
        """The processes that reported (at most ``MAX_PROCESSES``)."""
        return tuple(self._steps)

    def unsent(self) -> None:
        """The report ``due`` returned did not leave this host: the next ``due`` returns one again."""
        self._sent_at = None

    def due(self, now: float, wall: float = 0.0) -> PaceReport | None:
        """The report to send now, if one is due: the first once armed, one at once when the job stalls
        or resumes, else one every ``interval`` while it advances (nothing more while it stays stalled)."""
        if not self.armed:
            return None
        stalled = self.stalled(now)
        sent_at = self._sent_at
        if sent_at is not None and stalled == self._sent_stalled and (stalled or now - sent_at < self.interval):
            return None
        self._sent_at, self._sent_stalled = now, stalled
        return self.report(now, wall)
