"""The goodput ledger: every instant of the cluster's wall time in exactly one bucket, per generation and in
total, from the coordinator's timeline (:mod:`tpuctl.goodput.timeline`).

The buckets, in the order a generation goes through them (the docs' "Goodput" page says how each is
measured)::

    bring-up    task 0's init to formed (the ledger's first generation only)
    waiting     a later generation's start (the end of the one before) to every host registered
    restart     detection and restart: from a failure (the failed host's last sign of life) to its
                generation's end, and in the next generation from every host registered to formed
    startup     formed (or the end of a job) to the first progress: the job's start-up and compilation
    productive  steps advancing
    hung        the last progress before a declared hang to progress again (or the generation's end)
    lost        progress after the last checkpoint that a failure threw away (the time from when the
                cluster reached the checkpointed step to the failure)

A generation's picture (one failure; ``|`` are the times the timeline records)::

    start     registered  formed  first progress    checkpoint reached   failed   end
      |  waiting  |  restart  | startup |   productive   |      lost       | restart |

Exactness: every time becomes integer milliseconds once, a generation starts exactly where the one before
ended, and each generation is laid out left to right from its start to its end, so the buckets of a
generation add up to its wall and the totals to the ledger's wall, to the millisecond. Times out of order
(a wall clock stepped back) are clamped forward, never counted twice.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from tpuctl.goodput.timeline import KEEP_GENERATIONS, Folded, Generation, Timeline

BUCKETS = ("bring_up", "waiting", "startup", "productive", "hung", "restart", "lost")
LABELS = {
    "bring_up": "bring-up",
    "waiting": "waiting for hosts",
    "startup": "start-up and compilation",
    "productive": "productive",
    "hung": "hung",
    "restart": "detection and restart",
    "lost": "lost work",
}
SCHEMA = "tpuctl.goodput/v1"


def ms(seconds: float) -> int:
    """Wall seconds as integer milliseconds: the ledger's one rounding."""
    return round(seconds * 1000)


@dataclass(frozen=True)
class Segment:
    """``[start, end)`` in milliseconds, in ``bucket``."""

    start: int
    end: int
    bucket: str


@dataclass(frozen=True)
class GoodputSummary:
    """The ledger in one line (``tpuctl status``): the goodput fraction and the current bucket."""

    fraction: float
    bucket: str
    """The bucket the cluster is in now ("" when it is down: failed for good or shut down)."""
    wall_seconds: float
    productive_seconds: float
    generation: int

    def to_dict(self) -> dict[str, object]:
        return {
            "fraction": round(self.fraction, 4),
            "bucket": self.bucket or None,
            "wall_seconds": round(self.wall_seconds, 3),
            "productive_seconds": round(self.productive_seconds, 3),
            "generation": self.generation,
        }


@dataclass(frozen=True)
class GenerationAccount:
    gen: Generation
    start: int
    end: int
    live: bool
    segments: tuple[Segment, ...]

    @property
    def totals(self) -> dict[str, int]:
        return _sum(self.segments)


@dataclass(frozen=True)
class Ledger:
    """The accounts of a timeline at one time (``until``; the end of the last generation when the cluster
    is down). Integer milliseconds throughout."""

    cluster: str
    since: int
    until: int
    generations: tuple[GenerationAccount, ...]
    earlier: Folded | None
    notes: tuple[str, ...]
    checkpointing: bool
    error: str | None = None

    @property
    def wall(self) -> int:
        return self.until - self.since

    @property
    def totals(self) -> dict[str, int]:
        totals = {b: 0 for b in BUCKETS}
        if self.earlier is not None:
            for bucket, value in self.earlier.totals_ms.items():
                totals[bucket] = totals.get(bucket, 0) + value
        for account in self.generations:
            for bucket, value in account.totals.items():
                totals[bucket] += value
        return totals

    @property
    def fraction(self) -> float:
        return self.totals["productive"] / self.wall if self.wall > 0 else 0.0

    @property
    def current(self) -> str:
        """The bucket the cluster is in now ("" when it is down)."""
        last = self.generations[-1]
        if not last.live:
            return ""
        if last.segments:
            return last.segments[-1].bucket
        return "bring_up" if last.gen.bring_up else "waiting"

    def summary(self) -> GoodputSummary:
        return GoodputSummary(
            self.fraction, self.current, self.wall / 1000, self.totals["productive"] / 1000, self.generations[-1].gen.number
        )

    def to_json(self) -> dict[str, Any]:
        """The ledger's document (schema ``tpuctl.goodput/v1``; docs/reference/json.md). Seconds with three
        decimals; times are wall-clock seconds since the epoch, segments are offsets from ``since``."""
        return {
            "schema": SCHEMA,
            "cluster": self.cluster,
            "since": self.since / 1000,
            "until": self.until / 1000,
            "wall_seconds": self.wall / 1000,
            "goodput": round(self.fraction, 4),
            "bucket": self.current or None,
            "generation": self.generations[-1].gen.number,
            "totals": {b: v / 1000 for b, v in self.totals.items()},
            "generations": [self._generation(a) for a in self.generations],
            "earlier": None if self.earlier is None else {
                "generations": [self.earlier.first, self.earlier.last], "count": self.earlier.count,
                "start": self.earlier.start, "end": self.earlier.end, "failed_hosts": self.earlier.failed_hosts,
                "totals": {b: self.earlier.totals_ms.get(b, 0) / 1000 for b in BUCKETS},
            },
            "notes": list(self.notes) + ([] if self.checkpointing or not self._any_failed() else [UNKNOWN_LOSS]),
            "error": self.error,
        }  # fmt: skip

    def _any_failed(self) -> bool:
        return any(a.gen.end is not None and not a.gen.shutdown for a in self.generations)

    def _generation(self, account: GenerationAccount) -> dict[str, Any]:
        gen, totals, wall = account.gen, account.totals, account.end - account.start
        return {
            "generation": gen.number,
            "start": account.start / 1000,
            "end": None if account.live else account.end / 1000,
            "wall_seconds": wall / 1000,
            "goodput": round(totals["productive"] / wall, 4) if wall > 0 else 0.0,
            "buckets": {b: v / 1000 for b, v in totals.items()},
            "segments": [[(s.start - self.since) / 1000, (s.end - self.since) / 1000, s.bucket] for s in account.segments],
            "ended": gen.cause or None,
            "final": gen.final,
            "shutdown": gen.shutdown,
            "failed_at": gen.failed_at,
            "failures": [{"task": f.task, "address": f.address or None, "at": f.at, "cause": f.cause} for f in gen.failures],
            "failed_hosts": gen.failed_hosts,
            "returns": [{"task": r.task, "address": r.address or None, "at": r.at} for r in gen.returns],
            "notices": [{"task": n.task, "source": n.source, "deadline": n.deadline or None, "at": n.at} for n in gen.notices],
            "notices_total": gen.notices_total,
            "steps": {
                "top": gen.top_step, "step_time": gen.step_time, "checkpointed": gen.checkpoint,
                "agreed": None if gen.agreed is None else gen.agreed.step,
                "saved": None if gen.saved is None else gen.saved.step,
                "lost_steps": None if gen.lost is None else gen.lost.steps,
            },
            "pauses_merged": gen.pauses_merged,
        }  # fmt: skip


UNKNOWN_LOSS = (
    "lost work is not counted: the job reported no checkpoint (tpuctl.job.checkpointed or tpuctl progress "
    "--checkpointed), so the ledger cannot tell what a failure threw away"
)


def account(timeline: Timeline, now: float, *, error: str | None = None) -> Ledger:
    """The timeline's ledger at ``now`` (wall seconds): the live generation runs until ``now``.
    O(generations x pauses): bounded (``KEEP_GENERATIONS``, ``MAX_PAUSES``)."""
    folded = timeline.folded
    cursor = ms(folded.end) if folded is not None else ms(timeline.generations[0].start)
    since = ms(folded.start) if folded is not None else cursor
    accounts = []
    for gen in timeline.generations:
        live = gen.end is None
        end = max(cursor, ms(now if gen.end is None else gen.end))
        accounts.append(GenerationAccount(gen, cursor, end, live, layout(gen, cursor, end, live=live, checkpointing=timeline.checkpointing)))
        cursor = end
    return Ledger(timeline.cluster, since, cursor, tuple(accounts), folded, tuple(timeline.notes), timeline.checkpointing, error)


def layout(gen: Generation, start: int, end: int, *, live: bool, checkpointing: bool) -> tuple[Segment, ...]:
    """Generation ``gen`` from ``start`` to ``end`` (ms) as consecutive segments, left to right: every
    millisecond in exactly one bucket. ``live``: the generation is the current one (``end`` is now): nothing
    is lost yet. ``checkpointing``: the cluster's job reports checkpoints (else nothing counts as lost)."""
    out: list[Segment] = []
    cursor = start

    def upto(t: int, bucket: str) -> None:
        nonlocal cursor
        t = min(max(t, cursor), end)
        if t > cursor:
            if out and out[-1].bucket == bucket:
                out[-1] = Segment(out[-1].start, t, bucket)
            else:
                out.append(Segment(cursor, t, bucket))
            cursor = t

    formed = end if gen.formed is None else ms(gen.formed)
    if gen.bring_up:
        upto(formed, "bring_up")
    else:
        upto(formed if gen.registered is None else ms(gen.registered), "waiting")
        upto(formed, "restart")
    if gen.formed is None:
        return tuple(out)
    stop = min(max(end if live else ms(progress_stop(gen)), cursor), end)
    if gen.first_progress is None:
        upto(stop, "startup")
    else:
        upto(min(ms(gen.first_progress), stop), "startup")
        first = cursor

        def inside(t: int) -> int:
            return min(max(t, first), stop)

        pauses = [(inside(ms(p.start)), inside(stop if p.end is None else ms(p.end)), p.kind) for p in gen.pauses]
        lost = None if live else lost_from(gen, checkpointing)
        lost_ms = None if lost is None else inside(ms(lost))
        points = sorted({first, stop, *(a for a, _, _ in pauses), *(b for _, b, _ in pauses)} | ({lost_ms} if lost_ms is not None else set()))
        for a, b in itertools.pairwise(points):
            kinds = {kind for pa, pb, kind in pauses if pa <= a and b <= pb}
            if "idle" in kinds:
                upto(b, "startup")  # no job progressing: the next job's start-up
            elif "hung" in kinds:
                upto(b, "hung")
            elif lost_ms is not None and a >= lost_ms:
                upto(b, "lost")
            else:
                upto(b, "productive")
    upto(end, "restart")
    return tuple(out)


def progress_stop(gen: Generation) -> float:
    """When an ended generation's progress stopped counting: its first failed host's last sign of life (or
    its end); after a preemption's agreed checkpoint was saved, when the cluster reached that step."""
    assert gen.end is not None
    stop = gen.end if gen.failed_at is None else gen.failed_at
    if gen.saved is not None:
        stop = min(stop, gen.saved.at, gen.checkpoint_at if gen.checkpoint_at is not None else stop)
    return stop


def lost_from(gen: Generation, checkpointing: bool) -> float | None:
    """Where an ended generation's lost work starts (None: nothing lost, or nothing known): the progress after
    the last checkpoint, up to ``progress_stop``. A preemption's ``StepsLost`` (its deadline came first)
    counts those steps at the measured step time; a saved agreed checkpoint loses nothing."""
    if gen.end is None or gen.shutdown or gen.first_progress is None or gen.saved is not None:
        return None
    stop = progress_stop(gen)
    if gen.lost is not None and gen.step_time > 0:
        return stop - gen.lost.steps * gen.step_time
    if gen.checkpoint >= 0 and gen.checkpoint_at is not None:
        return gen.checkpoint_at
    return gen.first_progress if checkpointing else None


def fold(timeline: Timeline) -> bool:
    """Fold the generations beyond the newest ``KEEP_GENERATIONS`` into ``timeline.folded`` (their bucket sums,
    exact): the timeline stays bounded however many restarts. True when something was folded."""
    excess = len(timeline.generations) - KEEP_GENERATIONS
    if excess <= 0:
        return False
    old, before = timeline.generations[:excess], timeline.folded
    cursor = ms(before.end) if before is not None else ms(old[0].start)
    totals = dict(before.totals_ms) if before is not None else {b: 0 for b in BUCKETS}
    failed = before.failed_hosts if before is not None else 0
    for gen in old:
        end = max(cursor, ms(gen.end if gen.end is not None else gen.start))
        for bucket, value in _sum(layout(gen, cursor, end, live=False, checkpointing=timeline.checkpointing)).items():
            totals[bucket] = totals.get(bucket, 0) + value
        failed += gen.failed_hosts
        cursor = end
    timeline.folded = Folded(
        first=before.first if before is not None else old[0].number,
        last=old[-1].number,
        count=(before.count if before is not None else 0) + len(old),
        start=before.start if before is not None else old[0].start,
        end=cursor / 1000,
        totals_ms=totals,
        failed_hosts=failed,
    )
    del timeline.generations[:excess]
    timeline.changed = True
    return True


def _sum(segments: tuple[Segment, ...]) -> dict[str, int]:
    totals = {b: 0 for b in BUCKETS}
    for s in segments:
        totals[s.bucket] += s.end - s.start
    return totals
