"""The cluster's watchdog, decided once in the coordinator from each host's ``PaceReport`` and the
barriers' arrival order.

* **Hang**: every armed host's job stalled (each agent says so once) and no host advanced for
  ``hang_timeout``. Named with the step the cluster reached and who is behind it, counts and a bounded
  sample: ``cluster hung at step 1,203 for 10 min: task 17 (10.0.0.9) at 1,202; 2,303 hosts at 1,203``.
* **Behind**: a host whose job stalled below the step others reached, named as soon as that is known
  (the host's stall report, long before the hang is due).
* **Straggler**: a host consistently slower than the cluster's median, by either measure: its own step
  time (hosts that do not advance in lockstep), or how late it reaches each step against the median host
  (hosts in lockstep all take the same time per step, the slow one arrives last); and, beside either, how
  often it arrived last at the cluster's barriers.

A host is armed by its first report: a job that never reports is never judged. Cost: a report is O(1);
``tick`` is O(1) unless something changed (then O(hosts)); the straggler pass is O(hosts log hosts) once
per report interval. Every message is bounded (a sample of hosts, counts for the rest).
"""

from __future__ import annotations

import heapq
import itertools
import statistics
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tpuctl.watchdog.pace import PaceReport
from tpuctl.watchdog.settings import WatchdogSettings

SAMPLE_HOSTS = 5
"""Hosts named in one verdict; the rest are counted."""
STRAGGLER_SAMPLES = 5
"""Evaluations (one per report interval) a lateness verdict looks back over."""
MAD_TO_SIGMA = 1.4826
LATE_NOISE_FACTOR = 3.5
"""A straggler's median lateness over ``STRAGGLER_SAMPLES`` samples must be this many single-sample
standard deviations (across hosts) late: about six standard deviations of a median of five."""
BARRIERS_SEEN = 10
"""The last barriers whose last arrival is remembered."""
LAST_AT_BARRIERS = 8
"""Last at this many of the last ``BARRIERS_SEEN`` barriers (and by a margin) is a straggler's sign."""
MIN_HOSTS_FOR_BARRIERS = 3
LOCKSTEP_SPREAD = 0.15
"""The hosts' median distance from the median host, in steps, below which they count as in lockstep
(uniform jitter of +-30 % of a step keeps it near 0.12; hosts with +-10 % that advance on their own
drift past it within about 20 steps)."""
BARRIER_ONLY = -2
"""``Verdict.step`` of a straggler named from barriers alone (it recovers when barriers stop naming it)."""


@dataclass(frozen=True)
class Verdict:
    """A finding of the watchdog: ``kind`` is "hang", "behind", "straggler" or "recovered"."""

    kind: str
    message: str
    tasks: tuple[int, ...] = ()
    """The hosts it names (a bounded sample)."""
    step: int = -1
    """The step the cluster reached (hang, behind)."""

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "message": self.message, "tasks": list(self.tasks), "step": self.step}


@dataclass
class _Host:
    step: int
    reached_at: float  # by the coordinator's clock
    step_time: float
    window: int
    stalled: bool
    checkpointed: int
    fresh: bool = True  # a report not yet used by the straggler pass
    pace: deque[float] = field(default_factory=lambda: deque(maxlen=STRAGGLER_SAMPLES))
    lateness: deque[float] = field(default_factory=lambda: deque(maxlen=STRAGGLER_SAMPLES))
    behind: bool = False  # named behind in this stall


@dataclass(frozen=True)
class SlowHost:
    task: int
    step: int
    step_age: float
    """Seconds since it reached ``step``."""


@dataclass(frozen=True)
class WatchdogView:
    """The watchdog's view of the cluster, for ``tpuctl status``: O(1) in size whatever the cluster's."""

    armed: int
    """Hosts whose jobs reported progress."""
    low: int
    median: int
    high: int
    stalled: int
    slowest: tuple[SlowHost, ...] = ()
    """The hosts furthest behind (a few)."""
    verdicts: tuple[Verdict, ...] = ()
    """The hang, when one is declared, and the stragglers not recovered (a few)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "armed": self.armed,
            "steps": {"low": self.low, "median": self.median, "high": self.high},
            "stalled": self.stalled,
            "slowest": [{"task": h.task, "step": h.step, "step_age": round(h.step_age, 3)} for h in self.slowest],
            "verdicts": [v.to_dict() for v in self.verdicts],
        }


class Watchdog:
    """Create one per generation (``hosts``: the cluster's size; ``describe(task)``: ``task 17
    (10.0.0.9)``). Feed ``report`` and ``barrier_passed``; call ``tick(now)`` about once a second and act
    on the verdicts it returns (each is returned once)."""

    def __init__(self, settings: WatchdogSettings, hosts: int, describe: Callable[[int], str]) -> None:
        self.settings = settings
        self.hosts = hosts
        self.describe = describe
        self.interval = settings.report_interval(hosts)
        self._hosts: dict[int, _Host] = {}
        self._stalled = 0
        self._dirty = False
        self._hang: Verdict | None = None
        self._stragglers: dict[int, Verdict] = {}
        self._next_straggler_pass = 0.0
        self._last_at: deque[tuple[int, float]] = deque(maxlen=BARRIERS_SEEN)  # (task, its lag)
        self._released: deque[float] = deque(maxlen=BARRIERS_SEEN + 1)
        self._noise = 0.0  # the spread of one lateness sample across hosts, in steps
        self._noises: deque[float] = deque(maxlen=4 * STRAGGLER_SAMPLES)
        self._lockstep_from: int | None = None  # the step since which the hosts keep within LOCKSTEP_SPREAD

    # --- input ---------------------------------------------------------------------------------------

    def report(self, task: int, report: PaceReport, now: float, transit: float = 0.0) -> None:
        """``transit``: how long the report was on its way (queued behind a burst of others), taken off
        its step's age so a late-read report does not push a hang out."""
        host = self._hosts.get(task)
        if report.ended:  # the job ended: this host is not judged until its next job reports
            if host is not None:
                self._stalled -= host.stalled
                del self._hosts[task]
                self._stragglers.pop(task, None)
                self._dirty = True
            return
        reached_at = now - report.step_age - transit
        if host is None:
            host = self._hosts[task] = _Host(
                report.step, reached_at, report.step_time, report.window, False, report.checkpointed
            )
        else:
            if report.step != host.step:
                host.behind = False
            host.step, host.reached_at = report.step, reached_at
            host.step_time, host.window, host.checkpointed = report.step_time, report.window, report.checkpointed
            host.fresh = True
        if report.stalled != host.stalled:
            self._stalled += 1 if report.stalled else -1
            host.stalled = report.stalled
            if not report.stalled:
                host.behind = False
                if self._hang is not None:
                    self._hang = None  # a step again: a later hang is a new one
        self._dirty = True

    def barrier_passed(self, last_task: int, lag: float, now: float) -> None:
        """A barrier of every host passed: ``last_task`` arrived last, ``lag`` s after the one before it."""
        self._last_at.append((last_task, lag))
        self._released.append(now)

    # --- verdicts ------------------------------------------------------------------------------------

    def tick(self, now: float) -> list[Verdict]:
        verdicts: list[Verdict] = []
        if self._dirty and self._hosts:
            self._dirty = False
            verdicts += self._behind(now)
        if self._hang is None and self._hosts and self._stalled == len(self._hosts):
            latest = max(h.reached_at for h in self._hosts.values())
            if now - latest >= self.settings.hang_timeout:
                self._hang = self._hang_verdict(now - latest)
                verdicts.append(self._hang)
        if now >= self._next_straggler_pass and self.settings.straggler is not None:
            self._next_straggler_pass = now + self.interval
            verdicts += self._straggler_pass()
        return verdicts

    @property
    def hang(self) -> Verdict | None:
        return self._hang

    def view(self, now: float) -> WatchdogView | None:
        """The step range, the hosts furthest behind and the standing verdicts; None before any report.
        O(hosts log hosts): asked by ``tpuctl status``, whose answer lists every host anyway."""
        if not self._hosts:
            return None
        steps = sorted(h.step for h in self._hosts.values())
        ranked = heapq.nsmallest(SAMPLE_HOSTS, self._hosts.items(), key=lambda item: (item[1].step, item[1].reached_at, item[0]))
        slowest = tuple(SlowHost(task, h.step, max(0.0, now - h.reached_at)) for task, h in ranked)
        standing = ((self._hang,) if self._hang is not None else ()) + tuple(self._stragglers.values())[:SAMPLE_HOSTS]
        return WatchdogView(len(steps), steps[0], steps[len(steps) // 2], steps[-1], self._stalled, slowest, standing)

    def _hang_verdict(self, quiet: float) -> Verdict:
        top = max(h.step for h in self._hosts.values())
        behind = sorted((h.step, task) for task, h in self._hosts.items() if h.step < top)
        at_top = len(self._hosts) - len(behind)
        parts = [f"{self.describe(task)} at {step:,}" for step, task in behind[:SAMPLE_HOSTS]]
        if len(behind) > SAMPLE_HOSTS:
            parts.append(f"{len(behind) - SAMPLE_HOSTS:,} more hosts below {top:,}")
        parts.append(f"{at_top:,} {'host' if at_top == 1 else 'hosts'} at {top:,}")
        message = f"cluster hung at step {top:,} for {_span(quiet)}: " + "; ".join(parts)
        named = tuple(task for _, task in behind[:SAMPLE_HOSTS])  # none when every host is at the top step
        return Verdict("hang", message, named, top)

    def _behind(self, now: float) -> list[Verdict]:
        """Stalled hosts below the highest step any host reached, not named yet in this stall."""
        top = max(h.step for h in self._hosts.values())
        late = sorted(
            (h.step, task) for task, h in self._hosts.items() if h.stalled and h.step < top and not h.behind
        )
        if not late:
            return []
        for _, task in late:
            self._hosts[task].behind = True
        at_top = sum(1 for h in self._hosts.values() if h.step == top)
        named = [
            f"{self.describe(task)} at step {step:,} (no step for {_span(now - self._hosts[task].reached_at)})"
            for step, task in late[:SAMPLE_HOSTS]
        ]
        if len(late) > SAMPLE_HOSTS:
            named.append(f"{len(late) - SAMPLE_HOSTS:,} more")
        who = "is" if len(late) == 1 else "are"
        message = f"{'; '.join(named)} {who} behind: {at_top:,} {'host' if at_top == 1 else 'hosts'} reached {top:,}"
        return [Verdict("behind", message, tuple(task for _, task in late[:SAMPLE_HOSTS]), top)]

    # --- stragglers ----------------------------------------------------------------------------------

    def _straggler_pass(self) -> list[Verdict]:
        assert self.settings.straggler is not None
        ratio = self.settings.straggler.ratio
        late_limit = (ratio - 1) / ratio  # in lockstep a host ratio x slower arrives this share of a step late
        enough = max(2, self.settings.straggler.steps // 2)
        measured = {t: h for t, h in self._hosts.items() if not h.stalled and h.step_time > 0 and h.window >= enough}
        median_time, reference = self._sample_pace(measured) if len(measured) >= 2 else (0.0, 0)
        steps = self.settings.straggler.steps
        barrier_last = self._barrier_stragglers(late_limit)
        verdicts = []
        for task, host in measured.items():
            if median_time <= 0 or not host.pace:
                continue
            pace, late = host.pace[-1], statistics.median(host.lateness)
            in_lockstep = self._lockstep_from is not None and reference - self._lockstep_from >= steps
            # Slow: the window's median step time over the ratio (a median of ``steps`` steps: jitter does
            # not move it far, a host slowed for half the window does).
            # Late in lockstep: the median of the last samples over the limit and clear of the noise (one
            # step's jitter moves a single sample; ``self._noise`` is how much, across the hosts).
            slow_pace = pace >= ratio
            late_enough = late >= max(late_limit, LATE_NOISE_FACTOR * self._noise)
            slow = slow_pace or (in_lockstep and len(host.lateness) >= STRAGGLER_SAMPLES and late_enough)
            # Recovered: back under half the limits, the lateness in every one of the last samples.
            recovered = pace < 1 + (ratio - 1) / 2 and max(host.lateness) < late_limit / 2 and task not in barrier_last
            if slow and task not in self._stragglers:
                self._stragglers[task] = self._straggler_verdict(
                    task, pace, late, median_time, barrier_last.get(task), ratio
                )
                verdicts.append(self._stragglers[task])
            elif recovered and task in self._stragglers:
                del self._stragglers[task]
                verdicts.append(Verdict("recovered", f"{self.describe(task)} keeps pace again", (task,)))
        for task, times_last in barrier_last.items():  # jobs that meet at barriers only (or report no steps)
            if task not in self._stragglers:
                self._stragglers[task] = self._straggler_verdict(task, 0.0, None, median_time, times_last, ratio)
                verdicts.append(self._stragglers[task])
        if len(self._last_at) == BARRIERS_SEEN:
            for task in [t for t, v in self._stragglers.items() if v.step == BARRIER_ONLY and t not in barrier_last]:
                del self._stragglers[task]
                verdicts.append(Verdict("recovered", f"{self.describe(task)} keeps pace again", (task,)))
        return verdicts

    def _sample_pace(self, measured: dict[int, _Host]) -> tuple[float, int]:
        """One sample of each freshly reported host's pace (its step time against the median) and
        lateness (when it reaches a common step against the median host, in steps); returns the median
        step time and the common step.

        Lateness means something only in lockstep (every step ends with a collective, so every host
        starts the next one together and the slow one reaches each step last, by the same margin): then
        the hosts reach a step within a fraction of a step of each other, however long they run. Hosts that
        advance on their own drift apart like random walks, and their lateness says nothing a step time
        does not; so lateness counts only once the hosts' median distance from the median host stayed
        within ``LOCKSTEP_SPREAD`` of a step for the last ``straggler.steps`` steps."""
        median_time = statistics.median(h.step_time for h in measured.values())
        reference = statistics.median_low([h.step for h in measured.values()])
        due = {t: h.reached_at + (reference - h.step) * h.step_time for t, h in measured.items()}
        median_due = statistics.median(due.values())
        spread = statistics.median(abs(d - median_due) for d in due.values()) / median_time
        if spread > LOCKSTEP_SPREAD:
            self._lockstep_from = None
        elif self._lockstep_from is None:
            self._lockstep_from = reference
        # One sample's noise: the hosts' spread around the median host (MAD, so a straggler does not count).
        self._noises.append(MAD_TO_SIGMA * spread)
        self._noise = statistics.median(self._noises)  # one pass's MAD over a few hosts is noisy itself
        for task, host in measured.items():
            if host.fresh:
                host.fresh = False
                host.pace.append(host.step_time / median_time)
                host.lateness.append((due[task] - median_due) / median_time)
        return median_time, reference

    def _straggler_verdict(
        self, task: int, pace: float, late: float | None, step_time: float, last_at: int | None, ratio: float
    ) -> Verdict:
        host = self._hosts.get(task)
        window = host.window if host is not None else 0
        if late is None:
            text = f"{self.describe(task)} is a straggler: last at {last_at} of the last {len(self._last_at)} barriers"
            return Verdict("straggler", text, (task,), BARRIER_ONLY)
        elif pace >= ratio:
            figure = f"{pace:.2f}x the median step time over the last {window} steps"
        else:
            figure = (
                f"reaches each step {late * step_time:.2f} s ({late:.0%} of a step) after the median host, "
                f"over the last {len(host.lateness) if host is not None else 0} reports"
            )
        if last_at is not None:
            figure += f"; last at {last_at} of the last {len(self._last_at)} barriers"
        return Verdict("straggler", f"{self.describe(task)} is a straggler: {figure}", (task,))

    def _barrier_stragglers(self, late_limit: float) -> dict[int, int]:
        """Hosts last at most of the last barriers, each time by a margin: task -> how many times last."""
        if self.hosts < MIN_HOSTS_FOR_BARRIERS or len(self._last_at) < BARRIERS_SEEN:
            return {}
        times = list(self._released)
        intervals = [b - a for a, b in itertools.pairwise(times)]
        if not intervals:
            return {}
        margin = late_limit * statistics.median(intervals)
        counts = Counter(task for task, lag in self._last_at if lag >= margin)
        return {task: n for task, n in counts.items() if n >= LAST_AT_BARRIERS}


def _span(seconds: float) -> str:
    """``45 s``, ``10 min``, ``2 h 5 min``: a duration in a verdict."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
