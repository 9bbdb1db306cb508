"""This host's job in the agreement on a checkpoint step: which of its processes ask, where each stands
when a notice comes, and their answers once the coordinator decided.

Two kinds of process ask, both on the progress socket (:mod:`tpuctl.agent.progress` hands their lines here):

* a Python process that calls ``tpuctl.job.should_checkpoint``: its listener thread keeps a connection
  (``S 0 GEN PID`` first). On a notice the agent pushes ``N SECONDS``; the thread answers ``Q NEXT GEN PID``
  at once, holding the job's next call until the agent pushes the agreed step (``A STEP``) or that there is
  none (``X``). The thread answers even while the job's main thread waits in a collective, so a host that
  is one step ahead never waits for one that is behind (as JAX's preemption sync does, with its agent's
  thread);
* a shell loop's ``tpuctl progress STEP``: one line ``K STEP GEN PID``, answered ``G`` (go on) or
  ``C STEP`` (checkpoint now), after ``W SECONDS`` when the answer waits for the agreement. The agent
  answered every earlier step of the host's shell loops itself, so it knows the furthest step they were
  told to go on from (whatever process asked: a loop's command substitutions may each be a new process).

The host's report is the largest ``next`` of its processes (each can still checkpoint at it); -1 when none
asks; ``unknown`` when one did not answer within half the agreement's bound (its step is unknown: no step
is safe). A process that starts asking after the report revises it while the agreement is pending.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from tpuctl.preemption.notice import AgreementHeard, NoticeHeard
from tpuctl.processes import pid_alive

log = logging.getLogger("tpuctl.agent.progress")

Report = Callable[..., Awaitable[bool]]
"""``Session.report_checkpoint``: (generation, next_step, unknown=, checkpointed=, saved=) -> sent."""
ANSWER_SHARE = 0.5
"""A process has this share of the agreement's bound to say where it stands (the host reports after)."""
MAX_SHELLS = 256
"""Shell processes (``tpuctl progress`` callers) remembered (a job that forks per step)."""


class Writer(Protocol):
    """What the agent writes to a job's connection (an ``asyncio.Transport``)."""

    def write(self, data: bytes) -> None: ...

    def is_closing(self) -> bool: ...


def _write(writer: Writer, data: bytes) -> None:
    if not writer.is_closing():  # a process that went away meanwhile: nothing to tell
        writer.write(data)


@dataclass
class _Round:
    """One generation's agreement as this host sees it."""

    generation: int
    asked: set[Writer] = field(default_factory=set)
    """Listeners pushed ``N`` that have not answered."""
    nexts: dict[Writer, int] = field(default_factory=dict)
    waiting: list[tuple[Writer, int]] = field(default_factory=list)
    """Shell loops' ``K`` lines held for the decision: (connection, step)."""
    reported: int | None = None
    """The ``next`` sent to the coordinator (None: not yet)."""
    unknown: bool = False
    step: int | None = None
    """The agreed step (-1: none), once decided."""
    seconds: float = 0.0
    timer: asyncio.TimerHandle | None = None


class JobCheckpoints:
    """This host's job's processes that ask whether to checkpoint. ``start(generation, report)`` when a
    generation forms and ``stop()`` when it ends; ``notice`` and ``decided`` as the coordinator pushes
    them; the line handlers as the job's processes speak; ``checkpointed(step)`` from the job's reports."""

    def __init__(self) -> None:
        self.generation = 0
        self.listeners: dict[Writer, tuple[int, int]] = {}
        """Connections of processes that call ``should_checkpoint``: (pid, generation; 0: not said)."""
        self.shells: dict[int, None] = {}
        """The pids that asked with ``K`` (the latest ``MAX_SHELLS``), for whether a shell loop still runs."""
        self.shell_answered = -1
        """The furthest step a shell loop of this host was answered for (``G`` or ``C``)."""
        self.round: _Round | None = None
        self.checkpointed_step = -1
        self._report: Report | None = None
        self._saved_sent = False
        self.changed = asyncio.Event()
        """Set when a listener leaves or the decision comes (the noticed host's release waits on it)."""

    # --- generations --------------------------------------------------------------------------------

    def start(self, generation: int, report: Report) -> None:
        self.stop()
        self.generation, self._report, self.round = generation, report, None
        self.checkpointed_step, self._saved_sent, self.shell_answered = -1, False, -1
        self.shells.clear()

    def stop(self) -> None:
        """The generation ended: every process still waiting hears there is no agreement. A decided
        agreement stays the word for this generation's job (a host whose job is slower asks after the
        host going away left), until the next generation starts."""
        round_ = self.round
        if round_ is not None and round_.timer is not None:
            round_.timer.cancel()
            round_.timer = None
        if round_ is not None and round_.step is None:
            round_.step = -1
            self._answer_all(-1)
        self._report = None

    @property
    def taking_part(self) -> int:
        """Processes of this generation's job that ask (listeners, and shell loops still alive)."""
        listening = sum(1 for _, generation in self.listeners.values() if self._current(generation))
        return listening + sum(1 for pid in list(self.shells) if pid_alive(pid))

    def job_done(self) -> bool:
        """No process of the job asks any more (every listener's connection closed, every shell gone)."""
        for pid in [pid for pid in self.shells if not pid_alive(pid)]:
            del self.shells[pid]
        return self.taking_part == 0

    # --- the job's lines ----------------------------------------------------------------------------

    def subscribe(self, writer: Writer, pid: int, generation: int) -> None:
        """``S``: a process's listener connected."""
        self.listeners[writer] = (pid, generation)
        round_ = self.round
        if round_ is None or not self._current(generation):
            return
        if round_.step is not None:
            _write(writer, b"A %d\n" % round_.step if round_.step >= 0 else b"X\n")
            return
        round_.asked.add(writer)
        _write(writer, b"N %.1f\n" % round_.seconds)

    def _current(self, generation: int) -> bool:
        return generation in (0, self.generation)

    def answer(self, writer: Writer, next_step: int) -> None:
        """``Q``: a listener says where its process stands."""
        round_ = self.round
        if round_ is None or round_.step is not None or writer not in self.listeners:
            return
        round_.asked.discard(writer)
        round_.nexts[writer] = next_step
        self._maybe_report(round_)

    def ask(self, writer: Writer, step: int, pid: int) -> None:
        """``K``: a shell loop's ``tpuctl progress STEP`` wants to know whether to checkpoint at ``step``."""
        if pid not in self.shells:
            if len(self.shells) >= MAX_SHELLS:
                del self.shells[next(iter(self.shells))]
            self.shells[pid] = None
        round_ = self.round
        if round_ is None or round_.step is not None:
            self._answer_shell(writer, step, round_.step if round_ is not None else None)
            return
        round_.waiting.append((writer, step))  # its next is this step until the decision
        _write(writer, b"W %.1f\n" % max(0.1, round_.seconds))
        if round_.reported is not None:
            self._maybe_report(round_)

    def left(self, writer: Writer) -> None:
        """A connection closed (a process exited): it is no longer waited for."""
        if self.listeners.pop(writer, None) is not None:
            round_ = self.round
            if round_ is not None:
                round_.asked.discard(writer)
                round_.nexts.pop(writer, None)
                if round_.reported is None:
                    self._maybe_report(round_)
            self._changed()

    def checkpointed(self, step: int) -> None:
        """The job said it checkpointed ``step``: the coordinator hears it once the agreed step is saved."""
        self.checkpointed_step = max(self.checkpointed_step, step)
        round_ = self.round
        if round_ is not None and round_.step is not None and 0 <= round_.step <= step and not self._saved_sent:
            self._saved_sent = True
            self._send(round_.generation, -1, saved=True)

    # --- the coordinator's word ---------------------------------------------------------------------

    def notice(self, heard: NoticeHeard) -> None:
        """A notice for this generation: ask every listener where it stands, report once all answered (or
        half the bound passed). One round per generation: later notices join it."""
        if heard.generation != self.generation or self._report is None or self.round is not None:
            return
        asked = {w for w, (_, generation) in self.listeners.items() if self._current(generation)}
        round_ = self.round = _Round(self.generation, asked=asked, seconds=heard.agree_in)
        for writer in asked:
            _write(writer, b"N %.1f\n" % heard.agree_in)
        wait = max(0.05, heard.agree_in * ANSWER_SHARE)
        round_.timer = asyncio.get_running_loop().call_later(wait, self._answers_due, round_)
        self._maybe_report(round_)

    def decided(self, heard: AgreementHeard) -> None:
        round_ = self.round
        if heard.generation != self.generation:
            return
        if round_ is None:  # decided without this host's word (it had not heard the notice yet)
            round_ = self.round = _Round(self.generation)
        if round_.step is not None:
            return
        if round_.timer is not None:
            round_.timer.cancel()
        round_.step = heard.step
        self._answer_all(heard.step)
        if heard.step >= 0 and self.checkpointed_step >= heard.step:
            self.checkpointed(self.checkpointed_step)
        self._changed()

    # --- internals ----------------------------------------------------------------------------------

    def _answers_due(self, round_: _Round) -> None:
        round_.timer = None
        if round_ is not self.round or round_.reported is not None or round_.step is not None:
            return
        if round_.asked:
            pids = sorted(self.listeners.get(w, (0, 0))[0] for w in round_.asked)
            log.warning("preemption: %d process(es) of the job (pid %s) did not say where they stand in time",
                        len(pids), ", ".join(map(str, pids[:5])))  # fmt: skip
            round_.unknown = True
            round_.asked.clear()
        self._maybe_report(round_)

    def _host_next(self, round_: _Round) -> int:
        nexts = list(round_.nexts.values()) + [step for _, step in round_.waiting]
        if self.shell_answered >= 0:
            nexts.append(self.shell_answered + 1)
        return max(nexts, default=-1)

    def _maybe_report(self, round_: _Round) -> None:
        """Report when every asked listener answered; after that, again when a process raised the step."""
        if round_.step is not None or (round_.asked and not round_.unknown):
            return
        next_step = self._host_next(round_)
        if round_.reported is not None and next_step <= round_.reported:
            return
        round_.reported = next_step
        self._send(round_.generation, next_step, unknown=round_.unknown)

    def _send(self, generation: int, next_step: int, *, unknown: bool = False, saved: bool = False) -> None:
        report = self._report
        if report is None:
            return
        sending = report(generation, next_step, unknown=unknown, checkpointed=self.checkpointed_step, saved=saved)
        task = asyncio.ensure_future(sending)
        task.add_done_callback(_sent)

    def _answer_all(self, step: int) -> None:
        line = b"A %d\n" % step if step >= 0 else b"X\n"
        for writer, (_, generation) in list(self.listeners.items()):
            if self._current(generation):
                _write(writer, line)
        round_ = self.round
        if round_ is not None:
            waiting, round_.waiting = round_.waiting, []
            for writer, at in sorted(waiting, key=lambda held: held[1]):
                self._answer_shell(writer, at, step)

    def _answer_shell(self, writer: Writer, step: int, agreed: int | None) -> None:
        """``C`` at the agreed step (or, for a loop that asks every few steps, the first step past it no
        loop of this host was answered for), else ``G``."""
        if agreed is not None and agreed >= 0 and step >= agreed and (step == agreed or self.shell_answered < agreed):
            _write(writer, b"C %d\n" % agreed)
        else:
            _write(writer, b"G\n")
        self.shell_answered = max(self.shell_answered, step)

    def _changed(self) -> None:
        event, self.changed = self.changed, asyncio.Event()
        event.set()


def _sent(task: asyncio.Future[bool]) -> None:
    if task.cancelled():
        return
    failed = task.exception()
    if failed is not None:
        log.warning("preemption: could not send this host's checkpoint report: %s", failed)
    elif not task.result():
        log.warning("preemption: this host's checkpoint report did not leave (the session is reconnecting)")

