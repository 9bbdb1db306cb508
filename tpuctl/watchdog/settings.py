"""The spec's ``watchdog:`` section as a value, with its defaults and bounds.

```yaml
watchdog:
  hang_timeout: 10m        # no host's job advanced for this long while every agent is alive: a hang
  on_hang: warn            # warn (report only) | restart (end the generation: tpuctl run restarts the job)
                           # | fail (fail the cluster)
  report_every: 10s        # each agent's summary to the coordinator, at least this far apart (more in big
                           # clusters: the coordinator takes at most SUMMARIES_PER_S summaries a second)
  straggler:               # `straggler: off` turns straggler detection off
    ratio: 1.25            # a host this much slower than the cluster's median is a straggler
    steps: 50              # over the last this many steps
```
"""

from __future__ import annotations

from dataclasses import dataclass

ON_HANG = ("warn", "restart", "fail")

HANG_TIMEOUT_S = 600.0
HANG_TIMEOUT_BOUNDS_S = (5.0, 7 * 24 * 3600.0)
REPORT_EVERY_S = 10.0
REPORT_EVERY_BOUNDS_S = (0.5, 600.0)
STRAGGLER_RATIO = 1.25
STRAGGLER_RATIO_BOUNDS = (1.05, 10.0)
STRAGGLER_STEPS = 50
STRAGGLER_STEPS_BOUNDS = (10, 10_000)

SUMMARIES_PER_S = 100.0
"""Summaries a second the whole cluster may send the coordinator: each costs the service about 0.2 ms, so
100 a second stay near 2 % of its core at any size (10,000 hosts: one summary per host every 100 s)."""


@dataclass(frozen=True)
class StragglerSettings:
    ratio: float = STRAGGLER_RATIO
    """How much slower than the cluster's median a host must be (1.25: 25 % slower)."""
    steps: int = STRAGGLER_STEPS
    """The window, in steps, that a host's pace is measured over."""


@dataclass(frozen=True)
class WatchdogSettings:
    hang_timeout: float = HANG_TIMEOUT_S
    on_hang: str = "warn"
    report_every: float = REPORT_EVERY_S
    straggler: StragglerSettings | None = StragglerSettings()
    """None: straggler detection is off."""

    def report_interval(self, hosts: int) -> float:
        """Seconds between one agent's summaries in a cluster of ``hosts``: ``report_every``, or longer in
        a cluster too big for every host to report that often."""
        return max(self.report_every, hosts / SUMMARIES_PER_S)

    def stall_after(self, step_time: float | None) -> float:
        """How long one host's job may go without a step before its agent says it stalled: 30 steps at its
        usual pace, within a tenth and a quarter of ``hang_timeout``, so every host's stall reaches the
        coordinator well before a hang is due (a pod's 10,000 stalled reports arrive in one burst that
        takes the service seconds to read)."""
        low, high = self.hang_timeout / 10, self.hang_timeout / 4
        if step_time is None:
            return high
        return min(high, max(low, 30 * step_time))
