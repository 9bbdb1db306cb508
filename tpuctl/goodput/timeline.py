"""The cluster's timeline as the coordinator keeps it: one :class:`Generation` record per generation.

What a record holds, and who tells it (every time is wall-clock seconds since the epoch, handed in):

* ``start``: task 0's ``tpuctl init`` (the first generation), else the end of the one before;
* ``registered``: every host registered; ``formed``: every host passed init's final barrier (the
  mapping is committed everywhere);
* ``first_progress`` / ``last_progress`` / ``top_step`` / ``step_time``: from the hosts' pace reports
  (one per host per report interval while its job advances: O(1) each, never per step);
* ``checkpoint`` / ``checkpoint_at``: the latest step any host said was checkpointed
  (``tpuctl.job.checkpointed``), and when the cluster reached it (estimated from the top step's time
  and the step time when the report arrived);
* ``pauses``: no progress while a job should make it: a hang the watchdog declared (``hung``, from the
  last progress), or every host's job ended (``idle``, until a job progresses again);
* ``failed_at``, ``end``, ``cause``, ``failures``: what ended the generation, when the first failed host
  was last known alive, and the hosts named (at most ``MAX_NAMED``; ``failed_hosts`` counts them all);
  ``returns``: when a named host registered again;
* ``notices``, ``agreed``, ``saved``, ``lost``: preemption events (:data:`Event`), as plain records.

Bounded whatever the cluster's size or age: at most ``MAX_NAMED`` hosts named per list, ``MAX_PAUSES``
pauses (a further one merges into the last, counted in ``pauses_merged``), ``MAX_NOTES`` notes; the
generations beyond ``KEEP_GENERATIONS`` are folded into one :class:`Folded` sum by the ledger
(:func:`tpuctl.goodput.ledger.fold`). The set of hosts whose job reports progress is O(hosts) ints, kept
in memory only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

MAX_NAMED = 10
"""Hosts named per generation in each list (failures, returns, notices); the rest are counted."""
MAX_PAUSES = 16
"""Pauses kept per generation; a further one merges into the last (``Generation.pauses_merged``)."""
MAX_NOTES = 8
"""Notes kept (what the ledger could not see); the oldest go first."""
KEEP_GENERATIONS = 32
"""Generations kept in detail; the older ones are folded into one sum (``Timeline.folded``)."""
MAX_TEXT = 240
"""Longest cause or source kept (the service's own texts are bounded already; this bounds the journal)."""


# --- preemption events (the preemption notices' side calls ``ServiceLedger.record`` with these) ---------


@dataclass(frozen=True)
class PreemptionNotice:
    """A host was told it will be preempted: by ``source`` (``sigterm``, ``metadata: preempted``,
    ``metadata: maintenance-event``, ``tpuctl preempt``, ...), to go by ``deadline`` (wall seconds; 0.0:
    none given); ``at``: when the coordinator heard it."""

    task: int
    source: str
    deadline: float
    at: float


@dataclass(frozen=True)
class CheckpointAgreed:
    """The cluster agreed to checkpoint at ``step`` (the first step every host can still reach)."""

    step: int
    at: float


@dataclass(frozen=True)
class CheckpointSaved:
    """The job said the agreed checkpoint (``step``) is saved, at ``at``: the generation's productive
    time ends here, and what follows until the generation ends is its restart."""

    step: int
    at: float


@dataclass(frozen=True)
class StepsLost:
    """A notice's deadline passed before the agreed checkpoint was saved: ``steps`` steps since the last
    checkpoint are lost (``task``: the preempted host). ``at``: when the deadline passed (the notice's
    deadline), which places it in its generation even when it is told after that generation ended."""

    task: int
    steps: int
    at: float


Event = PreemptionNotice | CheckpointAgreed | CheckpointSaved | StepsLost


# --- the records -----------------------------------------------------------------------------------------


@dataclass
class HostMark:
    """A named host's failure (``cause``; ``at``: when it was last known alive) or return (``at``: its
    registration into a later generation)."""

    task: int
    at: float
    cause: str = ""
    address: str = ""


@dataclass
class Pause:
    """No progress while a job should make it: ``hung`` (the watchdog declared a hang at ``noticed``) or
    ``idle`` (every host's job ended, heard at ``noticed``), from the last progress (``start``) until
    progress again (``end``; None while it lasts). ``step``: the top step when it began."""

    kind: str
    start: float
    noticed: float
    step: int
    end: float | None = None


@dataclass
class Generation:
    """One generation's record (the module's docstring says who sets what)."""

    number: int
    start: float
    bring_up: bool
    """Started by task 0's init with nothing before it (the ledger's generation 1): the time until it
    formed is bring-up. Otherwise it followed an end: waiting for hosts, then restart."""
    registered: float | None = None
    formed: float | None = None
    first_progress: float | None = None
    last_progress: float | None = None
    top_step: int = -1
    step_time: float = 0.0
    checkpoint: int = -1
    checkpoint_at: float | None = None
    pauses: list[Pause] = field(default_factory=list)
    pauses_merged: int = 0
    notices: list[PreemptionNotice] = field(default_factory=list)
    notices_total: int = 0
    agreed: CheckpointAgreed | None = None
    saved: CheckpointSaved | None = None
    lost: StepsLost | None = None
    failed_at: float | None = None
    end: float | None = None
    cause: str = ""
    final: bool = False
    shutdown: bool = False
    failures: list[HostMark] = field(default_factory=list)
    failed_hosts: int = 0
    returns: list[HostMark] = field(default_factory=list)

    @property
    def open_pause(self) -> Pause | None:
        last = self.pauses[-1] if self.pauses else None
        return last if last is not None and last.end is None else None

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number, "start": self.start, "bring_up": self.bring_up,
            "registered": self.registered, "formed": self.formed,
            "first_progress": self.first_progress, "last_progress": self.last_progress,
            "top_step": self.top_step, "step_time": self.step_time,
            "checkpoint": self.checkpoint, "checkpoint_at": self.checkpoint_at,
            "pauses": [[p.kind, p.start, p.noticed, p.step, p.end] for p in self.pauses],
            "pauses_merged": self.pauses_merged,
            "notices": [[n.task, n.source, n.deadline, n.at] for n in self.notices],
            "notices_total": self.notices_total,
            "agreed": None if self.agreed is None else [self.agreed.step, self.agreed.at],
            "saved": None if self.saved is None else [self.saved.step, self.saved.at],
            "lost": None if self.lost is None else [self.lost.task, self.lost.steps, self.lost.at],
            "failed_at": self.failed_at, "end": self.end, "cause": self.cause,
            "final": self.final, "shutdown": self.shutdown,
            "failures": [[f.task, f.at, f.cause, f.address] for f in self.failures],
            "failed_hosts": self.failed_hosts,
            "returns": [[r.task, r.at, r.address] for r in self.returns],
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: object) -> Generation:
        """The record ``to_json`` wrote; ValueError naming the first field that is not what it wrote."""
        d = _Fields(data, "generation")
        pauses = [
            Pause(_text(p[0]), _num(p[1]), _num(p[2]), _int(p[3]), _opt_num(p[4])) for p in d.rows("pauses", 5)
        ]
        if any(p.kind not in ("hung", "idle") for p in pauses):
            raise ValueError("generation: a pause is neither 'hung' nor 'idle'")
        agreed, saved, lost = d.row("agreed", 2), d.row("saved", 2), d.row("lost", 3)
        return cls(
            number=d.integer("number"), start=d.number("start"), bring_up=d.flag("bring_up"),
            registered=d.opt_number("registered"), formed=d.opt_number("formed"),
            first_progress=d.opt_number("first_progress"), last_progress=d.opt_number("last_progress"),
            top_step=d.integer("top_step"), step_time=d.number("step_time"),
            checkpoint=d.integer("checkpoint"), checkpoint_at=d.opt_number("checkpoint_at"),
            pauses=pauses, pauses_merged=d.integer("pauses_merged"),
            notices=[PreemptionNotice(_int(n[0]), _text(n[1]), _num(n[2]), _num(n[3])) for n in d.rows("notices", 4)],
            notices_total=d.integer("notices_total"),
            agreed=None if agreed is None else CheckpointAgreed(_int(agreed[0]), _num(agreed[1])),
            saved=None if saved is None else CheckpointSaved(_int(saved[0]), _num(saved[1])),
            lost=None if lost is None else StepsLost(_int(lost[0]), _int(lost[1]), _num(lost[2])),
            failed_at=d.opt_number("failed_at"), end=d.opt_number("end"), cause=d.string("cause"),
            final=d.flag("final"), shutdown=d.flag("shutdown"),
            failures=[HostMark(_int(f[0]), _num(f[1]), _text(f[2]), _text(f[3])) for f in d.rows("failures", 4)],
            failed_hosts=d.integer("failed_hosts"),
            returns=[HostMark(_int(r[0]), _num(r[1]), "", _text(r[2])) for r in d.rows("returns", 3)],
        )  # fmt: skip


@dataclass
class Folded:
    """Generations ``first`` to ``last`` (``count`` of them), folded into their bucket sums (integer
    milliseconds, :data:`tpuctl.goodput.ledger.BUCKETS`): from ``start`` to ``end``."""

    first: int
    last: int
    count: int
    start: float
    end: float
    totals_ms: dict[str, int]
    failed_hosts: int

    def to_json(self) -> dict[str, Any]:
        return {
            "first": self.first, "last": self.last, "count": self.count, "start": self.start, "end": self.end,
            "totals_ms": dict(self.totals_ms), "failed_hosts": self.failed_hosts,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: object) -> Folded:
        d = _Fields(data, "folded")
        totals = d.get("totals_ms")
        if not isinstance(totals, dict) or not all(isinstance(k, str) and _is_int(v) for k, v in totals.items()):
            raise ValueError("folded: 'totals_ms' is not a table of integer milliseconds")
        return cls(
            d.integer("first"), d.integer("last"), d.integer("count"), d.number("start"), d.number("end"), dict(totals), d.integer("failed_hosts")
        )


# --- the timeline --------------------------------------------------------------------------------------


class Timeline:
    """The generations of one cluster since task 0's init (``started``). Feed it as things happen; every
    method is O(1) (``ended`` is O(its bounded sample)). ``changed``: an event happened since the journal
    last wrote (write now); ``progressed``: only progress figures changed (a mark will do)."""

    def __init__(self, cluster: str, started: float, generation: int = 1, *, bring_up: bool = True) -> None:
        self.cluster = cluster
        self.started = started
        self.generations: list[Generation] = [Generation(generation, started, bring_up)]
        self.folded: Folded | None = None
        self.notes: list[str] = []
        self.checkpointing = False
        """A job of this cluster reported a checkpoint: a failure loses its progress since the last one."""
        self.seen = started
        """The latest time the timeline was known to be current (the journal's marks)."""
        self.changed = True
        self.progressed = False
        self._reporting: set[int] = set()  # hosts whose job reports progress (this generation; not journaled)

    @property
    def current(self) -> Generation:
        return self.generations[-1]

    def note(self, text: str) -> None:
        """Something the ledger cannot see or had to drop, said in its document (the newest ``MAX_NOTES``)."""
        if text not in self.notes:
            self.notes.append(text[:MAX_TEXT * 2])
            del self.notes[:-MAX_NOTES]
            self.changed = True

    # --- membership ---------------------------------------------------------------------------------

    def registered(self, at: float) -> None:
        """Every host registered into the current generation."""
        gen = self.current
        if gen.end is None and gen.registered is None:
            gen.registered = max(at, gen.start)
            self.changed = True

    def formed(self, at: float) -> None:
        """Every host passed init's final barrier: the current generation formed."""
        gen = self.current
        if gen.end is None and gen.formed is None:
            if gen.registered is None:
                gen.registered = max(at, gen.start)
            gen.formed = max(at, gen.registered)
            self.changed = True

    def returned(self, task: int, at: float, address: str = "") -> None:
        """Host ``task`` registered: if its failure ended the generation before, it is back."""
        if len(self.generations) < 2:
            return
        gen, before = self.current, self.generations[-2]
        if any(f.task == task for f in before.failures) and not any(r.task == task for r in gen.returns):
            gen.returns.append(HostMark(task, at, "", address[:MAX_TEXT]))
            self.changed = True

    def ended(
        self,
        at: float,
        *,
        failed_at: float | None,
        cause: str,
        failures: list[HostMark],
        total: int,
        final: bool = False,
        shutdown: bool = False,
    ) -> None:
        """The current generation ended at ``at``: ``failed_at`` is when the first failed host was last known
        alive (None: nothing failed, e.g. a shutdown); ``failures``: a sample of them; ``total``: all."""
        gen = self.current
        if gen.end is not None:
            return
        gen.end = max(at, gen.start)
        gen.failed_at = None if failed_at is None else min(max(failed_at, gen.start), gen.end)
        gen.cause = cause[:MAX_TEXT]
        gen.final, gen.shutdown = final, shutdown
        gen.failures = [HostMark(f.task, f.at, f.cause[:MAX_TEXT], f.address[:MAX_TEXT]) for f in failures[:MAX_NAMED]]
        gen.failed_hosts = max(total, len(gen.failures))
        self.changed = True

    def next_generation(self, number: int, at: float) -> None:
        """Generation ``number`` starts where the current one ended (at ``at`` if it has not)."""
        gen = self.current
        if gen.end is None:
            self.ended(at, failed_at=at, cause="ended", failures=[], total=0)
        self.generations.append(Generation(number, gen.end if gen.end is not None else at, bring_up=False))
        self._reporting.clear()
        self.changed = True

    def renumber(self, number: int) -> None:
        """This coordinator started without its predecessors' journal and learned from a host that the cluster
        is at generation ``number``: the current record is that generation's, and not a bring-up."""
        gen = self.current
        if gen.number == number:
            return
        if gen.bring_up and number > 1:
            span = "generation 1" if number == 2 else f"generations 1 to {number - 1}"
            self.note(
                f"{span} ran under an earlier coordinator whose timeline this one did not continue (task 0 came "
                "back with a new state dir, or after its agent had left cleanly: its journal is then "
                "goodput.previous.jsonl): not counted; the ledger starts at this coordinator's start"
            )
        gen.number, gen.bring_up = number, False
        self.changed = True

    def resumed(self, number: int, at: float) -> None:
        """A restarted coordinator (task 0's agent came back with its state dir) reloaded this timeline and
        serves generation ``number`` from ``at``: the generation the old one served ended when it was last
        seen; the time until now is that generation's restart."""
        gen = self.current
        if gen.end is None:
            last = max(self.seen, gen.last_progress or gen.start, gen.formed or gen.start)
            self.ended(
                at,
                failed_at=min(last, at),
                cause="the coordinator stopped (task 0's agent ended); a new one took over",
                failures=[HostMark(0, min(last, at), "the coordinator stopped")],
                total=1,
            )
        if number > gen.number + 1:
            span = f"generation {gen.number + 1}" if number == gen.number + 2 else f"generations {gen.number + 1} to {number - 1}"
            self.note(f"{span} are not in the journal: their time is counted as generation {gen.number}'s restart")
        self.next_generation(number, at)

    # --- the job ------------------------------------------------------------------------------------

    def progress(
        self,
        task: int,
        step: int,
        reached: float,
        *,
        checkpointed: int = -1,
        step_time: float = 0.0,
        ended: bool = False,
        at: float,
    ) -> None:
        """A host's pace report, heard at ``at``: its job reached ``step`` at ``reached``; ``ended``: its job's
        processes are gone. O(1)."""
        gen = self.current
        if gen.end is not None or gen.registered is None:
            return
        if gen.formed is None:  # a report before init's final barrier (a client that never calls it)
            self.formed(min(reached, at))
        assert gen.formed is not None
        if ended:
            self._reporting.discard(task)
            if not self._reporting and gen.last_progress is not None and gen.open_pause is None:
                self._pause("idle", gen.last_progress, at, gen.top_step)
            return
        reached = min(max(reached, gen.formed), at)
        self._reporting.add(task)
        pause = gen.open_pause
        if pause is not None and pause.kind == "idle":
            pause.end = max(reached, pause.start)  # a job progresses again: a new job, its own steps
            gen.top_step = step
            self.changed = True
        if gen.first_progress is None:
            gen.first_progress = reached
            self.changed = True  # an event: written at once
        elif reached < gen.first_progress:
            gen.first_progress = reached  # another host's earlier first step: a figure, written with the marks
        gen.top_step = max(gen.top_step, step)
        gen.last_progress = max(gen.last_progress or reached, reached)
        if pause is not None and pause.kind == "hung" and (step > pause.step or reached > pause.noticed):
            pause.end = max(reached, pause.start)  # a step beyond the hang, or any step after its verdict
            self.changed = True
        if step_time > 0:
            gen.step_time = step_time
        if checkpointed > gen.checkpoint:
            self._checkpointed(gen, checkpointed)  # a figure too: a job may checkpoint every step
        self.progressed = True

    def hang(self, at: float) -> None:
        """The watchdog declared the cluster hung at ``at``: hung since the last progress."""
        gen = self.current
        if gen.end is None and gen.last_progress is not None and gen.open_pause is None:
            self._pause("hung", gen.last_progress, at, gen.top_step)

    def record(self, event: Event) -> Generation | None:
        """A preemption event (the notices' side of the coordinator calls this through its ledger), put in the
        generation that was current at ``event.at``: a deadline's lost steps may be told after the preempted
        host's departure ended it. Returns that generation (None: older than the timeline, or no finite time)."""
        deadline = event.deadline if isinstance(event, PreemptionNotice) else 0.0
        if not (math.isfinite(event.at) and math.isfinite(deadline)):
            return None
        gen = next((g for g in reversed(self.generations) if g.start <= event.at), None)
        if gen is None:
            return None
        if isinstance(event, PreemptionNotice):
            gen.notices_total += 1
            if len(gen.notices) < MAX_NAMED:
                gen.notices.append(PreemptionNotice(event.task, event.source[:MAX_TEXT], event.deadline, event.at))
                self.changed = True
            else:
                self.progressed = True  # only the count changed: the next mark writes it
        elif isinstance(event, CheckpointAgreed):
            gen.agreed = event
            self.changed = True
        elif isinstance(event, CheckpointSaved):
            gen.saved = event
            if event.step > gen.checkpoint:
                self._checkpointed(gen, event.step)
            self.changed = True
        elif isinstance(event, StepsLost) and (gen.lost is None or event.steps > gen.lost.steps):
            gen.lost = event
            self.changed = True
        return gen

    def mark(self, at: float) -> None:
        """The timeline is current at ``at`` (the journal writes this now and then)."""
        self.seen = max(self.seen, at)

    # --- internals ----------------------------------------------------------------------------------

    def _checkpointed(self, gen: Generation, step: int) -> None:
        gen.checkpoint = step
        if gen.last_progress is not None and gen.first_progress is not None:
            behind = max(0, gen.top_step - step) * gen.step_time
            gen.checkpoint_at = max(gen.first_progress, gen.last_progress - behind)
        self.checkpointing = True
        self.progressed = True

    def _pause(self, kind: str, start: float, at: float, step: int) -> None:
        gen = self.current
        if len(gen.pauses) < MAX_PAUSES:
            gen.pauses.append(Pause(kind, start, max(at, start), step))
        else:  # bounded: the last pause stretches over the progress between (counted, and said)
            last = gen.pauses[-1]
            last.kind = "hung" if "hung" in (kind, last.kind) else last.kind
            last.end, last.step = None, step
            gen.pauses_merged += 1
            if gen.pauses_merged == 1:
                self.note(
                    f"generation {gen.number}: more than {MAX_PAUSES} pauses; the later ones are merged into the "
                    "last (the progress between them counts as paused)"
                )
        self.changed = True

    # --- journal lines ------------------------------------------------------------------------------

    def header(self) -> dict[str, Any]:
        return {"journal": JOURNAL_SCHEMA, "cluster": self.cluster, "started": self.started}

    def lines(self) -> list[dict[str, Any]]:
        """Everything, as the journal's lines (a compacted journal is exactly these)."""
        out: list[dict[str, Any]] = [self.header()]
        if self.folded is not None:
            out.append({"folded": self.folded.to_json()})
        if self.notes:
            out.append({"notes": list(self.notes)})
        if self.checkpointing:
            out.append({"checkpointing": True})
        out += [{"generation": g.to_json()} for g in self.generations]
        out.append({"seen": self.seen})
        return out

    @classmethod
    def from_lines(cls, lines: list[object]) -> Timeline:
        """The timeline a journal's lines describe (later lines win); ValueError naming the first bad line
        (1-based) and what is wrong with it."""
        if not lines:
            raise ValueError("line 1: the journal is empty")
        header = lines[0]
        if not isinstance(header, dict) or header.get("journal") != JOURNAL_SCHEMA:
            raise ValueError(f"line 1: not a tpuctl goodput journal (no {JOURNAL_SCHEMA!r} header)")
        d = _Fields(header, "header")
        timeline = cls(d.string("cluster"), d.number("started"))
        generations: dict[int, Generation] = {}
        for number, line in enumerate(lines[1:], start=2):
            try:
                if not isinstance(line, dict) or len(line) != 1:
                    raise ValueError("not one of the journal's records")
                (kind, value), = line.items()
                if kind == "generation":
                    gen = Generation.from_json(value)
                    generations[gen.number] = gen
                elif kind == "folded":
                    timeline.folded = Folded.from_json(value)
                elif kind == "notes":
                    if not isinstance(value, list):
                        raise ValueError("'notes' is not a list")
                    timeline.notes = [_text(n) for n in value][-MAX_NOTES:]
                elif kind == "checkpointing":
                    timeline.checkpointing = value is True
                elif kind == "seen":
                    timeline.seen = max(timeline.seen, _num(value))
                else:
                    raise ValueError(f"unknown record {kind!r}")
            except (ValueError, TypeError, IndexError) as exc:
                raise ValueError(f"line {number}: {exc}") from None
        if not generations:
            raise ValueError("the journal has no generation")
        timeline.generations = [generations[n] for n in sorted(generations)]
        if timeline.folded is not None:
            timeline.generations = [g for g in timeline.generations if g.number > timeline.folded.last]
            if not timeline.generations:
                raise ValueError("every generation of the journal is folded: the current one is missing")
        timeline.changed = timeline.progressed = False
        return timeline


JOURNAL_SCHEMA = "tpuctl.goodput-journal/v1"


# --- reading the journal's values strictly (a field of the wrong type is a corrupt journal) --------------


class _Fields:
    def __init__(self, data: object, what: str) -> None:
        if not isinstance(data, dict):
            raise ValueError(f"{what}: not an object")
        self.data, self.what = data, what

    def get(self, key: str) -> object:
        if key not in self.data:
            raise ValueError(f"{self.what}: {key!r} is missing")
        return self.data[key]

    def _checked(self, key: str, check: Any) -> Any:
        try:
            return check(self.get(key))
        except ValueError as exc:
            raise ValueError(f"{self.what}: {key!r} {exc}") from None

    def integer(self, key: str) -> int:
        return int(self._checked(key, _int))

    def number(self, key: str) -> float:
        return float(self._checked(key, _num))

    def opt_number(self, key: str) -> float | None:
        value = self.get(key)
        return None if value is None else self.number(key)

    def flag(self, key: str) -> bool:
        value = self.get(key)
        if not isinstance(value, bool):
            raise ValueError(f"{self.what}: {key!r} is not true or false")
        return value

    def string(self, key: str) -> str:
        return str(self._checked(key, _text))

    def rows(self, key: str, width: int) -> list[list[object]]:
        value = self.get(key)
        if not isinstance(value, list) or not all(isinstance(r, list) and len(r) == width for r in value):
            raise ValueError(f"{self.what}: {key!r} is not a list of {width}-item rows")
        return value

    def row(self, key: str, width: int) -> list[object] | None:
        value = self.get(key)
        if value is not None and not (isinstance(value, list) and len(value) == width):
            raise ValueError(f"{self.what}: {key!r} is not a {width}-item row")
        return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(value: object) -> int:
    if not _is_int(value):
        raise ValueError("is not an integer")
    assert isinstance(value, int)
    return value


def _num(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) > 1e12:
        raise ValueError("is not a number of seconds")
    return float(value)


def _opt_num(value: object) -> float | None:
    return None if value is None else _num(value)


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("is not a string")
    return value
