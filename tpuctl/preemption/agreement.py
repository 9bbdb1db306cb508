"""The agreement on one checkpoint step, decided once in the coordinator for every host.

After a notice, every live host reports where its job stands: the lowest step every process of its job
can still checkpoint at, one past the last step each process answered (``next``). The agreed step is the
largest of those: no process has answered it yet, and every process still reaches it. Each process then
gets True from ``tpuctl.job.should_checkpoint`` at its first call at or past that step: the same step on
every host, since every host's job calls with the same steps. It is JAX's ``PreemptionSyncManager``
(xla/tsl/distributed_runtime/preemption/: each task's current call counter through the coordination
service, the sync point one past the largest) for any framework.

Decided once per generation, when every live host reported, or else at the bound (``agree_by``, a third of
the notice's time, :func:`tpuctl.preemption.notice.agree_seconds`): then there is no agreement, and every
process gets False. So does a host whose job could not say where it stands (a process that did not answer
in time: no step is safe for it), and a cluster where no job asks. Without an agreement, jobs get SIGTERM
and the grace as they would without tpuctl's help.

A worked example, three hosts, the notice arriving as they run lock-step steps::

    host   last step answered   next    reported
    0      41                   42      42
    1      42 (it is ahead)     43      43
    2      41                   42      42
                                        agreed: 43 (hosts 0 and 2 answer 42 False, then 43 True)

O(1) per report; the hosts asked are kept once (O(hosts) per generation with a notice).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

PENDING, AGREED, NONE = "pending", "agreed", "none"
SAMPLE = 5
"""Hosts named in a reason (the rest counted)."""


@dataclass(frozen=True)
class Decision:
    state: str
    """``agreed`` or ``none``."""
    step: int
    """The agreed step (-1: none)."""
    reason: str


@dataclass
class Agreement:
    """One generation's agreement: ``report`` as hosts report, ``gone`` as hosts fail or leave, ``tick`` on a
    timer. Each returns the decision the first time one is made, else None. ``describe(task)`` names a host
    (``task 2 (10.0.0.3)``)."""

    generation: int
    asked: set[int]
    """The live hosts when the first notice came, less those gone since without reporting."""
    agree_by: float
    deadline: float
    """The earliest notice's deadline (the service's clock)."""
    describe: Callable[[int], str] = str
    state: str = PENDING
    step: int = -1
    reason: str = ""
    high: int = -1
    """The largest ``next`` reported (-1: none)."""
    checkpointed: int = -1
    """The latest step a host's job said it checkpointed."""
    reported: set[int] = field(default_factory=set)
    unknown: list[int] = field(default_factory=list)
    saved: set[int] = field(default_factory=set)
    deadline_passed: bool = False

    @classmethod
    def open(
        cls, generation: int, hosts: Iterable[int], *, agree_by: float, deadline: float,
        describe: Callable[[int], str] = str,
    ) -> Agreement:  # fmt: skip
        return cls(generation, set(hosts), agree_by, deadline, describe)

    @property
    def furthest(self) -> int:
        """The furthest step a process answered (-1: none reported)."""
        return self.high - 1 if self.high > 0 else -1

    def report(self, task: int, next_step: int, *, unknown: bool = False, checkpointed: int = -1) -> Decision | None:
        """Host ``task``'s job can still checkpoint at ``next_step`` (-1: none of its processes asks);
        ``unknown``: one of them did not say where it stands. A host may report again (a process that
        started asking late) until the decision; reports of hosts not asked are not counted."""
        self.checkpointed = max(self.checkpointed, checkpointed)
        if self.state != PENDING or task not in self.asked:
            return None
        self.high = max(self.high, next_step)
        if unknown and task not in self.unknown:
            self.unknown.append(task)
        self.reported.add(task)
        return self._decide_if_all()

    def gone(self, task: int) -> Decision | None:
        """Host ``task`` failed or left: it is not waited for (a report it made still counts: a step past
        every live host's is reachable by them all)."""
        if self.state != PENDING or task in self.reported:
            return None
        self.asked.discard(task)
        return self._decide_if_all()

    def tick(self, now: float) -> Decision | None:
        """The bound passed without every report: no agreement."""
        if self.state != PENDING or now < self.agree_by:
            return None
        missing = sorted(self.asked - self.reported)
        names = ", ".join(self.describe(t) for t in missing[:SAMPLE])
        more = f" and {len(missing) - SAMPLE:,} more" if len(missing) > SAMPLE else ""
        return self._decide(
            NONE, -1, f"{len(missing):,} of {len(self.asked):,} hosts did not say where their jobs stand in time: "
            f"{names}{more}",
        )  # fmt: skip

    def save(self, task: int, checkpointed: int) -> bool:
        """Host ``task``'s job said it checkpointed ``checkpointed``: True the first time any host's job
        saved the agreed step (or past it)."""
        self.checkpointed = max(self.checkpointed, checkpointed)
        if self.state != AGREED or checkpointed < self.step or task in self.saved:
            return False
        self.saved.add(task)
        return len(self.saved) == 1

    def lost_at_deadline(self, now: float) -> int | None:
        """Once, when the deadline passed: the steps lost (after the last checkpoint a host reported, up to
        the furthest step a process answered), or None when the agreed step was saved or nothing was lost."""
        if self.deadline_passed or now < self.deadline:
            return None
        self.deadline_passed = True
        if self.saved:
            return None
        furthest = self.furthest
        if furthest < 0:
            return None
        return max(0, furthest - self.checkpointed) if self.checkpointed >= 0 else furthest

    def _decide_if_all(self) -> Decision | None:
        if self.asked - self.reported:
            return None
        if self.unknown:
            names = ", ".join(self.describe(t) for t in self.unknown[:SAMPLE])
            more = f" and {len(self.unknown) - SAMPLE:,} more" if len(self.unknown) > SAMPLE else ""
            return self._decide(NONE, -1, f"a process of the job on {names}{more} did not say where it stands: no step is safe")
        if self.high < 0:
            return self._decide(
                NONE, -1, "no host's job asks whether to checkpoint (tpuctl.job.should_checkpoint, tpuctl progress)"
            )
        return self._decide(AGREED, self.high, f"every process's next step is at most {self.high:,} "
                            f"({len(self.reported):,} hosts reported)")  # fmt: skip

    def _decide(self, state: str, step: int, reason: str) -> Decision:
        self.state, self.step, self.reason = state, step, reason
        return Decision(state, step, reason)
