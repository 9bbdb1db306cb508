"""The soak's schedules: a seed in, a short list of timed steps out. Pure: no clock, no processes, no I/O,
the same steps for the same seed on every machine (``random.Random(seed)``, nothing else).

A schedule is one to three *episodes* that start at random moments within its first few seconds, so they
may overlap (a kill while another host is frozen, a ``tpuctl down`` while the cluster re-forms). Each
episode hits one host (distinct hosts within a schedule) and puts it right again:

========================  ===========================================================================
episode                   steps
========================  ===========================================================================
kill                      ``kill`` (kill -9 of the agent), then ``restart`` (``tpuctl init`` again, with
                          the same state dir or a fresh one) after 0.1-5 s
stop                      ``stop`` (SIGSTOP of the agent), ``cont`` (SIGCONT) after a time around the
                          heartbeat timeout: well under it (must be survived), around it, or well over it
partition                 ``cut`` (the host's port off the bridge), ``heal`` after a time as for stop
down                      ``down`` (``tpuctl down`` on the host), then ``restart`` as for kill
barrier                   ``barrier_some``: ``tpuctl barrier`` on some hosts only, with a short
                          ``--timeout`` (it times out, unless the calls of another barrier episode
                          that overlaps it complete its instance: calls join by count), then
                          ``barrier_all``, the retry on every host, which must pass when no other
                          episode overlaps it (``expect="pass"``)
down-all                  ``down_all`` (``tpuctl down --all`` on one host), then ``restart_all``; always
                          the schedule's last episode, after the others' steps
========================  ===========================================================================

The runner (``tools/soak/runner.py``) performs the steps and checks the invariants after the schedule.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from dataclasses import dataclass

HOSTS = 8
HEARTBEAT_TIMEOUT_S = 3.0
BARRIER = "step"
"""The one barrier name every soak barrier uses, the check round after each schedule too: a retry of the
same name is what has to work after a timeout."""
RETRY_TIMEOUT_S = 10.0  # the retry round's --timeout: a round of healthy hosts passes in well under a second
START_WITHIN_S = 4.0  # every episode starts within this many seconds of the schedule's start

# The steps' actions.
KILL, STOP, CONT, CUT, HEAL, DOWN, DOWN_ALL, RESTART, RESTART_ALL, BARRIER_SOME, BARRIER_ALL = (
    "kill", "stop", "cont", "cut", "heal", "down", "down_all", "restart", "restart_all", "barrier_some",
    "barrier_all",
)  # fmt: skip
BARRIERS = (BARRIER_SOME, BARRIER_ALL)

# What a stop or a cut is expected to do, by its length against the heartbeat timeout.
SURVIVE, MAYBE, FAIL = "survive", "maybe", "fail"
PASS = "pass"  # a barrier round every host calls, overlapping no other episode

FAULT_KINDS = (
    "kill", "stop", "partition", "restart-same", "restart-fresh", "barrier-timeout", "barrier-retry",
    "down", "down-all",
)  # fmt: skip
"""What the report counts, one per fault step (``Step.kind``)."""

EPISODES = {"kill": 3.0, "stop": 3.0, "partition": 2.5, "down": 1.5, "barrier": 2.0, "down-all": 0.4}
"""Episode weights. down-all is rare: the whole cluster has to start again after it."""
COORDINATOR_SHARE = 0.25  # how often a host-hitting episode hits task 0 (the coordinator), if still free
SLICE = (1560, 2035, 971, 2548)
"""The fixed seeds of `make test`'s slice (`tests/soak/test_slice.py`): together they inject every fault kind,
kill and freeze task 0, cut a host for about the heartbeat timeout, and have a retry round that must pass."""


@dataclass(frozen=True)
class Step:
    """One timed action of a schedule."""

    at: float
    """Seconds after the schedule's start."""
    action: str
    task: int = -1
    """The host acted on (-1: none, or every host)."""
    seconds: float = 0.0
    """stop, cut: how long until the cont / heal step; barrier: its ``--timeout``."""
    hosts: tuple[int, ...] = ()
    """barrier: the hosts that call it."""
    fresh: bool = False
    """restart, restart_all: a new, empty state dir (a replaced VM), not the one the agent had."""
    expect: str = ""
    """stop, cut: SURVIVE, MAYBE or FAIL; barrier: PASS when it must pass, else empty."""

    @property
    def kind(self) -> str | None:
        """The fault kind this step injects (``FAULT_KINDS``), or None for a step that puts things right."""
        return {
            KILL: "kill", STOP: "stop", CUT: "partition", DOWN: "down", DOWN_ALL: "down-all",
            RESTART: "restart-fresh" if self.fresh else "restart-same",
            RESTART_ALL: "restart-fresh" if self.fresh else "restart-same",
            BARRIER_SOME: "barrier-timeout", BARRIER_ALL: "barrier-retry",
        }.get(self.action)  # fmt: skip

    def describe(self) -> str:
        at = f"{self.at:5.2f}s"
        if self.action in BARRIERS:
            who = "every host" if self.action == BARRIER_ALL else "tasks " + ",".join(map(str, self.hosts))
            must = " (must pass)" if self.expect == PASS else ""
            return f"{at} barrier {BARRIER!r} --timeout {self.seconds:.1f}s on {who}{must}"
        if self.action in (STOP, CUT):
            return f"{at} {self.action} task {self.task} for {self.seconds:.2f}s ({self.expect})"
        if self.action in (RESTART, RESTART_ALL):
            state = "a fresh state dir" if self.fresh else "its state dir"
            who = "every host" if self.action == RESTART_ALL else f"task {self.task}"
            return f"{at} tpuctl init on {who} ({state})"
        if self.action == DOWN_ALL:
            return f"{at} tpuctl down --all on task {self.task}"
        return f"{at} {self.action} task {self.task}"


@dataclass(frozen=True)
class Schedule:
    seed: int
    steps: tuple[Step, ...]

    def swapped(self, a: int, b: int) -> Schedule:
        """The same schedule with tasks ``a`` and ``b`` exchanged (the runner maps the schedule's task 0, the
        coordinator's share of the faults, to whichever task serves the cluster when it starts)."""

        def other(task: int) -> int:
            return b if task == a else a if task == b else task

        steps = tuple(
            dataclasses.replace(step, task=other(step.task), hosts=tuple(sorted(other(t) for t in step.hosts)))
            for step in self.steps
        )
        return Schedule(self.seed, steps)

    def kinds(self) -> Counter[str]:
        """The faults this schedule injects, by kind."""
        return Counter(kind for step in self.steps if (kind := step.kind) is not None)

    @property
    def length(self) -> float:
        """When its last step happens (s after the start; a barrier's end counts too)."""
        return max((s.at + (s.seconds if s.action in BARRIERS else 0.0) for s in self.steps), default=0.0)

    def describe(self) -> str:
        return "\n".join([f"schedule seed {self.seed}:", *(f"  {s.describe()}" for s in self.steps)])


def generate(seed: int, *, hosts: int = HOSTS, heartbeat_timeout: float = HEARTBEAT_TIMEOUT_S) -> Schedule:
    """The schedule of ``seed``: one to three episodes, sorted by time (ties keep episode order)."""
    rng = random.Random(seed)
    count = rng.choices((1, 2, 3), weights=(3, 4, 2))[0]
    kinds = [rng.choices(list(EPISODES), weights=list(EPISODES.values()))[0] for _ in range(count)]
    if "down-all" in kinds:  # at most one, and last: the cluster starts again after it
        kinds = [k for k in kinds if k != "down-all"] + ["down-all"]
    free = list(range(hosts))
    episodes: list[list[Step]] = []
    for kind in kinds:
        start = round(rng.uniform(0.0, START_WITHIN_S), 2)
        if kind == "down-all":
            end = max((step.at for steps in episodes for step in steps), default=0.0)
            start = round(end + rng.uniform(0.0, 2.5), 2)
            episodes.append(_down_all(rng, start, hosts))
        elif kind == "barrier":
            episodes.append(_barrier(rng, start, hosts))
        else:
            episodes.append(_host_episode(rng, kind, start, _victim(rng, free), heartbeat_timeout))
    steps = [step for steps in episodes for step in steps]
    steps = [_expect_pass(step, episodes, heartbeat_timeout) for step in steps]
    order = sorted(range(len(steps)), key=lambda i: (steps[i].at, i))
    return Schedule(seed, tuple(steps[i] for i in order))


def _victim(rng: random.Random, free: list[int]) -> int:
    task = 0 if 0 in free and rng.random() < COORDINATOR_SHARE else rng.choice([t for t in free if t != 0] or free)
    free.remove(task)
    return task


def _length(rng: random.Random, heartbeat_timeout: float) -> tuple[float, str]:
    """How long a stop or a cut lasts, against the heartbeat timeout, and what it must do."""
    expect = rng.choices((SURVIVE, MAYBE, FAIL), weights=(1, 2, 1))[0]
    low, high = {SURVIVE: (0.15, 0.45), MAYBE: (0.8, 1.25), FAIL: (1.5, 2.5)}[expect]
    return round(rng.uniform(low, high) * heartbeat_timeout, 2), expect


def _restart_delay(rng: random.Random) -> float:
    # Sometimes before the failure is detected (the new process replaces the registration), mostly after.
    return round(rng.uniform(0.1, 1.0) if rng.random() < 0.3 else rng.uniform(1.0, 5.0), 2)


def _host_episode(rng: random.Random, kind: str, start: float, task: int, heartbeat_timeout: float) -> list[Step]:
    if kind in ("stop", "partition"):
        seconds, expect = _length(rng, heartbeat_timeout)
        fault, back = (STOP, CONT) if kind == "stop" else (CUT, HEAL)
        return [Step(start, fault, task, seconds, expect=expect), Step(round(start + seconds, 2), back, task)]
    fault = KILL if kind == "kill" else DOWN
    fresh = rng.random() < 0.35
    return [Step(start, fault, task), Step(round(start + _restart_delay(rng), 2), RESTART, task, fresh=fresh)]


def _barrier(rng: random.Random, start: float, hosts: int) -> list[Step]:
    callers = tuple(sorted(rng.sample(range(hosts), rng.randint(1, hosts - 1))))
    timeout = round(rng.uniform(1.0, 2.5), 2)
    retry_at = round(start + timeout + rng.uniform(0.3, 1.5), 2)
    return [
        Step(start, BARRIER_SOME, seconds=timeout, hosts=callers),
        Step(retry_at, BARRIER_ALL, seconds=RETRY_TIMEOUT_S, hosts=tuple(range(hosts))),
    ]


def _down_all(rng: random.Random, start: float, hosts: int) -> list[Step]:
    back = round(start + rng.uniform(0.5, 2.0), 2)
    return [Step(start, DOWN_ALL, rng.randrange(hosts)), Step(back, RESTART_ALL, fresh=rng.random() < 0.2)]


def _danger(steps: list[Step], heartbeat_timeout: float) -> tuple[float, float] | None:
    """When an episode may make a barrier fail: from its fault to its recovery plus the time to notice and
    re-form; another barrier episode's rounds of the same name, while they last (None: it cannot, a stop or
    cut well under the heartbeat timeout)."""
    first = steps[0]
    if first.action in BARRIERS:
        return first.at - 0.5, max(step.at + step.seconds for step in steps)
    if first.action in (STOP, CUT) and first.expect == SURVIVE:
        return None
    if first.action == DOWN_ALL:
        return first.at - 0.5, float("inf")
    return first.at - 0.5, steps[-1].at + heartbeat_timeout + 6.0


def _expect_pass(step: Step, episodes: list[list[Step]], heartbeat_timeout: float) -> Step:
    """A full barrier round must pass when no other episode's danger overlaps it."""
    if step.action != BARRIER_ALL:
        return step
    end = step.at + step.seconds
    for steps in episodes:
        if step in steps:
            continue
        danger = _danger(steps, heartbeat_timeout)
        if danger is not None and danger[0] < end and step.at < danger[1]:
            return step
    return Step(step.at, step.action, step.task, step.seconds, step.hosts, step.fresh, PASS)


def covering_seeds(candidates: range | list[int]) -> list[int]:
    """A few of ``candidates`` that together inject every fault kind: greedy, each pick the seed adding the
    most kinds not yet covered (ties: the shorter schedule, then the lower seed). How the fixed slice of
    ``make test`` was chosen. ValueError when the candidates do not cover every kind."""
    schedules = [generate(seed) for seed in candidates]
    chosen: list[int] = []
    covered: set[str] = set()
    while not covered >= set(FAULT_KINDS):
        best = max(schedules, key=lambda s: (len(set(s.kinds()) - covered), -s.length, -s.seed), default=None)
        if best is None or not set(best.kinds()) - covered:
            raise ValueError(f"the candidates do not cover every fault kind (covered {sorted(covered)})")
        chosen.append(best.seed)
        covered |= set(best.kinds())
    return chosen
