"""The goodput ledger inside the coordination service: the cluster's timeline (:mod:`tpuctl.goodput.timeline`)
fed by what the servicer already sees, kept in a journal in task 0's state dir, answered by ``GetGoodput``
(the whole ledger) and ``GetStatus`` (its one line).

What feeds it, and what each costs the service: after every call that woke something (``observe``: O(1),
and O(failures sample) when a generation ends), a host's registration (``registered``: O(1)), a pace
report (``pace``: O(1); at most 100 a second at any cluster size), the watchdog's hang verdict
(``verdict``), a preemption event (``record``: the entry point of the notices' side), and the watchdog's
tick (``tick``: writes the journal's marks). Never anything per step or per host per interval beyond the
pace reports the watchdog already takes.

A restarted coordinator (task 0's agent came back with its state dir, ``restart: {policy: rejoin}``)
reloads the journal and goes on: the generation its predecessor served ended when the journal last saw it,
and the time until the new one started is that generation's restart. Task 0 back with a new state dir
has no journal: the ledger starts at the new coordinator's start, and says the earlier generations are not
counted. A journal that cannot be read is moved aside (``goodput.jsonl.corrupt``) and said in the ledger.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuctl.coordination.values import BarrierId, ClusterFailure, Refused, WaitKey, Wakeup, clip
from tpuctl.goodput.journal import COMPACT_AT, MARK_EVERY_S, Journal, JournalError, load
from tpuctl.goodput.ledger import GoodputSummary, Ledger, account, fold
from tpuctl.goodput.timeline import MAX_NAMED, Event, HostMark, Timeline

if TYPE_CHECKING:
    from tpuctl.coordination.state import CoordinationState
    from tpuctl.watchdog.pace import PaceReport

log = logging.getLogger("tpuctl.coordination")

FORMED_BARRIER = "tpuctl/init/done"
"""Init's final barrier (``tpuctl.agent.bringup.INIT_DONE_BARRIER``; a test checks they agree): a
generation has formed once every host passed it (barrier counts are per generation: its instance 1)."""
_FORMED = WaitKey("barrier", FORMED_BARRIER, 1)
_NOTHING = Wakeup()


class ServiceLedger:
    """The service's ledger. Build it with :meth:`open`; the servicer calls the rest, handing the wall clock
    (``wall``, seconds since the epoch) and, where it converts the state's times, its own clock (``now``)."""

    def __init__(self, timeline: Timeline, journal: Journal | None) -> None:
        self.timeline = timeline
        self.journal = journal
        self._marked = timeline.seen
        self._notes = tuple(timeline.notes)
        self._checkpointing = timeline.checkpointing
        self._failing: str | None = None  # the journal's last write error, until a write succeeds

    @classmethod
    def open(
        cls, cluster: str, *, generation: int, started: float, now: float, journal_path: Path | None = None
    ) -> ServiceLedger:
        """The ledger of a service starting at ``generation`` at ``now``, task 0's init having started at
        ``started``: its predecessor's journal at ``journal_path`` continued when this service restarts
        the cluster above generation 1 (``restart: rejoin``), else a new one (a journal of an earlier life
        of the cluster is kept as ``goodput.previous.jsonl``). No journal: in memory only."""
        notes: list[str] = []
        timeline = None
        if journal_path is not None:
            timeline = cls._reloaded(cluster, generation, now, journal_path, notes)
        if timeline is None:
            timeline = Timeline(cluster, min(started, now), generation, bring_up=generation == 1)
            if generation > 1:
                notes.append(
                    f"this coordinator started at generation {generation} without a journal of the earlier ones "
                    "(task 0's state dir is new, or its journal is gone): they are not counted"
                )
        for note in notes:
            timeline.note(note)
        fold(timeline)
        ledger = cls(timeline, None if journal_path is None else Journal(journal_path))
        ledger._flush(now, rewrite=True)
        return ledger

    @staticmethod
    def _reloaded(cluster: str, generation: int, now: float, path: Path, notes: list[str]) -> Timeline | None:
        try:
            old = load(path)
        except FileNotFoundError:
            return None
        except JournalError as exc:
            aside = path.with_name(path.name + ".corrupt")
            log.warning("goodput: %s; moved to %s, the ledger starts afresh", exc.message, aside)
            with contextlib.suppress(OSError):
                os.replace(path, aside)
            notes.append(f"{clip(exc.message, 300)}: moved to {aside}; the time before this coordinator is not counted")
            return None
        if generation > 1 and old.cluster == cluster and old.current.number < generation:
            old.resumed(generation, now)
            log.info("goodput: journal %s reloaded (generations up to %d)", path, old.current.number - 1)
            return old
        previous = path.with_name("goodput.previous.jsonl")
        with contextlib.suppress(OSError):
            os.replace(path, previous)
        log.info("goodput: a new ledger; the journal of cluster %r's earlier life is kept as %s", old.cluster, previous)
        return None

    # --- what the servicer tells it --------------------------------------------------------------------

    def observe(self, state: CoordinationState, wakeup: Wakeup, *, now: float, wall: float) -> None:
        """After a call that woke something: a generation ended or started, every host registered, the
        generation formed, the cluster failed for good. O(1), and O(``MAX_NAMED``) when a generation ended."""
        timeline = self.timeline
        gen = timeline.current
        if state.generation != gen.number and gen.end is None:
            ended = state.generations.ended(gen.number)
            if ended is None and gen.registered is None and state.generation > gen.number:
                timeline.renumber(state.generation)  # a new coordinator learned the generation from a host
            else:
                self._ended(state, ended, now=now, wall=wall)
                timeline.next_generation(state.generation, wall)
                if fold(timeline):
                    self._flush(wall, rewrite=True)
        failure = state.failure
        if failure is not None and timeline.current.end is None and failure.generation == timeline.current.number:
            self._ended(state, failure, now=now, wall=wall)
        if failure is None and state.registration_complete:
            timeline.registered(wall)
        if _FORMED in wakeup.keys and self._formed(state, now):
            timeline.formed(wall)
        self._flush(wall)

    def registered(self, state: CoordinationState, task: int, *, now: float, wall: float) -> None:
        """Host ``task`` registered into the state's current generation: a failed host's return is marked.
        Its registration may have ended the generation before (a new process with its predecessor's
        credential): that is observed first."""
        self.observe(state, _NOTHING, now=now, wall=wall)
        self.timeline.returned(task, wall, state.tasks[task].address if 0 <= task < len(state.tasks) else "")
        self._flush(wall)

    def pace(self, task: int, report: PaceReport, *, generation: int, wall: float, transit: float) -> None:
        """A host's pace report (``transit``: its time on the way, as the watchdog takes it). O(1)."""
        if generation != self.timeline.current.number:
            return
        self.timeline.progress(
            task, report.step, wall - report.step_age - transit, checkpointed=report.checkpointed,
            step_time=report.step_time, ended=report.ended, at=wall,
        )  # fmt: skip
        self._flush(wall)

    def verdict(self, kind: str, wall: float) -> None:
        """A watchdog verdict: a hang is hung time from the last progress on."""
        if kind == "hang":
            self.timeline.hang(wall)
            self._flush(wall)

    def record(self, event: Event, wall: float | None = None) -> None:
        """A preemption event (:data:`tpuctl.goodput.timeline.Event`, its ``at`` the service's wall clock): a
        notice, the agreed checkpoint step, its save, the steps lost when a deadline passed first. It goes to
        the generation current at ``event.at`` (also one that ended since), written to the journal at once."""
        gen = self.timeline.record(event)
        older = gen is not None and gen not in self.timeline.generations[-2:]
        self._flush(event.at if wall is None else wall, rewrite=older and self.timeline.changed)

    def tick(self, wall: float) -> None:
        """About once a second: the journal's mark when one is due."""
        self._flush(wall)

    def close(self, wall: float) -> None:
        """The service stops (task 0's agent leaves: ``tpuctl down``, a signal, a failed init): the ledger ends
        here, like a shutdown (nothing lost), written and synced. A coordinator that dies writes nothing: its
        successor ends the generation where the journal last saw it."""
        if self.timeline.current.end is None:
            cause = "the coordinator stopped (task 0's agent left)"
            self.timeline.ended(wall, failed_at=None, cause=cause, failures=[], total=0, final=True, shutdown=True)
        self._flush(wall, force=True)
        if self.journal is not None:
            self.journal.close()

    # --- what it answers -------------------------------------------------------------------------------

    def ledger(self, wall: float, error: str | None = None) -> Ledger:
        return account(self.timeline, wall, error=error)

    def summary(self, wall: float) -> GoodputSummary:
        return self.ledger(wall).summary()

    def document(self, wall: float, error: str | None = None) -> str:
        """The ledger's JSON document (``GetGoodput``): at most ``KEEP_GENERATIONS`` generations in detail."""
        return json.dumps(self.ledger(wall, error).to_json(), separators=(",", ":"), ensure_ascii=False)

    # --- internals -------------------------------------------------------------------------------------

    def _ended(self, state: CoordinationState, failure: ClusterFailure | None, *, now: float, wall: float) -> None:
        def at(mono: float | None) -> float | None:
            return None if mono is None else wall - max(0.0, now - mono)

        if failure is None:  # a generation ended without the state saying why (not expected)
            self.timeline.ended(wall, failed_at=wall, cause="ended", failures=[], total=0)
            return
        marks = [
            HostMark(f.task.task_id, at(state.failed_seen.get(f.task.task_id)) or wall, clip(f.cause, 240), f.task.address)
            for f in failure.failures[:MAX_NAMED]
        ]
        self.timeline.ended(
            wall,
            failed_at=at(state.failed_since),
            cause=clip(str(dataclasses.replace(failure, rejoin=False, earlier="")), 240),
            failures=marks,
            total=failure.total,
            final=not failure.rejoin,
            shutdown=failure.shutdown,
        )

    @staticmethod
    def _formed(state: CoordinationState, now: float) -> bool:
        try:
            outcome = state.rendezvous_outcome(BarrierId(FORMED_BARRIER, 1, "barrier", state.generation), now=now)
        except Refused:
            return False
        return isinstance(outcome, int)

    def _flush(self, wall: float, *, force: bool = False, rewrite: bool = False) -> None:
        """Write what changed: an event at once (synced), progress figures and ``seen`` when a mark is due."""
        timeline = self.timeline
        due = force or rewrite or wall - self._marked >= MARK_EVERY_S
        if self._failing is not None and not due:
            return  # a journal that cannot be written is tried again when a mark is due, not on every report
        if self.journal is None or not (timeline.changed or due):
            if self.journal is None:
                timeline.changed = timeline.progressed = False
            return
        records: list[dict[str, Any]] = []
        if timeline.changed or timeline.progressed:
            generations = timeline.generations[-2:] if timeline.changed else timeline.generations[-1:]
            records += [{"generation": g.to_json()} for g in generations]
        if tuple(timeline.notes) != self._notes:
            records.append({"notes": list(timeline.notes)})
        if timeline.checkpointing and not self._checkpointing:
            records.append({"checkpointing": True})
        timeline.mark(wall)
        records.append({"seen": timeline.seen})
        sync = timeline.changed or force
        try:
            if rewrite or self.journal.size > COMPACT_AT:
                self.journal.rewrite(timeline)
            else:
                self.journal.append(records, sync=sync)
        except OSError as exc:
            problem = f"the goodput journal {self.journal.path} cannot be written: {exc.strerror or exc}"
            if self._failing != problem:
                log.warning("goodput: %s (the ledger goes on in memory)", problem)
                self._failing = problem
            return
        self._failing = None
        self._notes, self._checkpointing = tuple(timeline.notes), timeline.checkpointing
        timeline.changed = timeline.progressed = False
        self._marked = wall


__all__ = ["FORMED_BARRIER", "ServiceLedger"]
