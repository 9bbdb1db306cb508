"""Preemption notices inside the coordination service: each spread to every host at once, and the one
checkpoint step every host agrees on (:mod:`tpuctl.preemption.agreement`, decided here once).

A host raises a notice for itself on its session (``HeartbeatRequest.notice``): the service records it,
answers the host with it, and pushes it to every session that watches the cluster's error (one small
message per host per notice). A notice for a host that is no longer live (failed, gone, of an ended
generation) is refused and logged, never spread. The first notice of a formed generation opens its
agreement; later ones join it (the earliest deadline counts). Each host's agent answers with where its
job stands (``HeartbeatRequest.checkpoint``); the decision is pushed to every host the moment the last
live host reported, or at the bound. One agreement per generation, as JAX's sync point is set once.

The timeline: every notice, decision, first save of the agreed step and loss at a deadline is kept as a
:class:`~tpuctl.preemption.notice.PreemptionEvent` (``events``, the newest ``MAX_EVENTS``) and handed to
``on_event``, and goes to the goodput ledger as its own record (:func:`ledger_event`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from tpuctl.coordination import convert
from tpuctl.coordination.state import CoordinationState
from tpuctl.coordination.values import Reason, Refused, TaskRef, clip
from tpuctl.goodput.timeline import CheckpointAgreed, CheckpointSaved, Event, PreemptionNotice, StepsLost
from tpuctl.preemption.agreement import AGREED, PENDING, Agreement, Decision
from tpuctl.preemption.notice import (
    MAX_REASON,
    Notice,
    NoticeView,
    PreemptionEvent,
    PreemptionView,
    agree_seconds,
    source_problem,
)
from tpuctl.proto import coordination_pb2 as pb

log = logging.getLogger("tpuctl.coordination")

MAX_EVENTS = 1024
"""Timeline entries kept (a few per notice)."""
MAX_NOTICES = 10
"""Notices of one agreement kept in full (the rest counted): hosts going away together in a pod."""
MAX_DEADLINE_S = 7 * 86400.0
"""A notice further out than this is a mistake, not a notice."""

Push = Callable[[bytes], set[int]]
"""Writes one encoded ``HeartbeatResponse`` to every watching session; the tasks reached."""


class Preemptions:
    """The service's notices and agreements. ``notice`` and ``checkpoint`` as messages arrive, ``tick`` on
    the service's timer (the bound, the deadline, hosts gone), ``view`` for status."""

    def __init__(
        self, state: CoordinationState, push: Push, *, wall: Callable[[], float],
        record: Callable[[Event], None] | None = None,
    ) -> None:  # fmt: skip
        """``record``: the goodput ledger's entry point (each event as its record, :func:`ledger_event`)."""
        self._state = state
        self._push = push
        self._wall = wall
        self._record = record
        self.notices: list[Notice] = []
        """The current agreement's notices (the first ``MAX_NOTICES``)."""
        self.count = 0
        self.agreement: Agreement | None = None
        self.events: deque[PreemptionEvent] = deque(maxlen=MAX_EVENTS)
        self.on_event: Callable[[PreemptionEvent], None] | None = None
        """Called with every timeline entry as it is made (after the ledger took it)."""
        self._generation = 0

    def describe(self, task: int) -> str:
        return str(self._state.tasks[task]) if 0 <= task < len(self._state.tasks) else f"task {task}"

    # --- notices -------------------------------------------------------------------------------------

    def notice(self, caller: TaskRef, message: pb.PreemptionNotice, *, now: float) -> Notice:
        """Record the caller's own notice and push it to every host. Refused (and logged) when the caller
        is no longer a live host of the current generation, or the notice is malformed."""
        try:
            info = self._state.live_task(caller)
        except Refused as refused:
            log.warning("ignored a preemption notice from task %d: %s", caller.task_id, refused)
            raise
        problem = source_problem(message.source)
        seconds = float(message.deadline_seconds)
        if problem is None and not 0 < seconds <= MAX_DEADLINE_S:
            problem = f"a deadline of {seconds!r} s (expected more than 0 and at most {MAX_DEADLINE_S:g})"
        if problem is not None:
            raise Refused(Reason.INVALID, f"a preemption notice from {info} with {problem}")
        generation = self._state.generation
        if generation != self._generation:  # a new generation: its own notices and agreement
            self._generation, self.notices, self.count, self.agreement = generation, [], 0, None
        self.count += 1
        notice = Notice(info.task_id, message.source, clip(message.reason, MAX_REASON), now, now + seconds,
                        self._wall(), self.count, generation)  # fmt: skip
        if len(self.notices) < MAX_NOTICES:
            self.notices.append(notice)
        log.warning("preemption notice: %s", notice.describe(str(info), now))
        self._event(PreemptionEvent("notice", notice.wall, generation, notice.task, notice.source, notice.reason,
                                    notice.wall + seconds))  # fmt: skip
        agreement = self.agreement
        if agreement is None and self._state.formed:
            live = (t for t in range(len(self._state.tasks)) if self._state.is_live(t))  # O(hosts), once a generation
            agreement = self.agreement = Agreement.open(
                generation, live, agree_by=now + agree_seconds(seconds), deadline=notice.deadline, describe=self.describe
            )
        elif agreement is not None and notice.deadline < agreement.deadline:
            agreement.deadline = notice.deadline
        agree_by = agreement.agree_by if agreement is not None else now
        self._push(pb.HeartbeatResponse(notice=convert.notice_pb(notice, now, agree_by)).SerializeToString())
        if agreement is not None and agreement.state != PENDING:  # joined after the decision: say it again
            self._push_decision(agreement, now)
        return notice

    def replay(self, now: float) -> list[bytes]:
        """What a session that starts watching now missed of the current generation: its first notice and the
        decision, once made (O(1))."""
        agreement = self.agreement
        if not self.notices or self.notices[0].generation != self._state.generation:
            return []
        out = [pb.HeartbeatResponse(notice=convert.notice_pb(self.notices[0], now, agreement.agree_by if agreement
                                                               else now)).SerializeToString()]  # fmt: skip
        if agreement is not None and agreement.state != PENDING:
            out.append(self._decision_bytes(agreement, now))
        return out

    # --- the agreement -------------------------------------------------------------------------------

    def checkpoint(self, task: int, message: pb.CheckpointReport, *, now: float) -> None:
        """Host ``task``'s report: where its job stands, or that it saved the agreed step. O(1)."""
        report = convert.checkpoint_report(message)
        agreement = self.agreement
        if report is None or agreement is None:
            return
        generation, next_step, unknown, checkpointed, saved = report
        if generation != agreement.generation:
            return
        if saved:
            if agreement.save(task, checkpointed):
                self._event(PreemptionEvent("saved", self._wall(), generation, task, step=checkpointed))
            return
        self._decided(agreement, agreement.report(task, next_step, unknown=unknown, checkpointed=checkpointed), now)

    def tick(self, now: float) -> None:
        """On the service's timer: hosts gone while the agreement waits for them, its bound, its deadline."""
        agreement = self.agreement
        if agreement is None:
            return
        if agreement.state == PENDING:
            for task in list(agreement.asked - agreement.reported):
                if not self._state.is_live(task) or agreement.generation != self._state.generation:
                    self._decided(agreement, agreement.gone(task), now)
            self._decided(agreement, agreement.tick(now), now)
        lost = agreement.lost_at_deadline(now)
        if lost is not None:
            log.warning("preemption: the notice's deadline passed with no checkpoint of the agreed step: %d steps "
                        "after the last checkpoint are lost", lost)  # fmt: skip
            wall = self._wall()
            task = self.notices[0].task if self.notices else -1
            self._event(PreemptionEvent("lost", wall, agreement.generation, task, step=agreement.checkpointed,
                                        deadline=wall - (now - agreement.deadline), lost_steps=lost))  # fmt: skip

    def _decided(self, agreement: Agreement, decision: Decision | None, now: float) -> None:
        if decision is None:
            return
        if decision.state == AGREED:
            log.warning("preemption: every host checkpoints at step %d (%s)", decision.step, decision.reason)
        else:
            log.warning("preemption: no agreed checkpoint step: %s", decision.reason)
        kind = "agreed" if decision.state == AGREED else "no-agreement"
        self._event(PreemptionEvent(kind, self._wall(), agreement.generation, reason=decision.reason,
                                    step=decision.step))  # fmt: skip
        self._push_decision(agreement, now)

    def _decision_bytes(self, agreement: Agreement, now: float) -> bytes:
        return convert.agreement_pb(
            agreement.generation, agreement.step, agreement.reason, agreement.deadline - now
        ).SerializeToString()

    def _push_decision(self, agreement: Agreement, now: float) -> None:
        self._push(self._decision_bytes(agreement, now))

    def _event(self, event: PreemptionEvent) -> None:
        self.events.append(event)
        recorded = ledger_event(event) if self._record is not None else None
        if recorded is not None and self._record is not None:
            self._record(recorded)
        if self.on_event is not None:
            self.on_event(event)

    # --- status --------------------------------------------------------------------------------------

    def view(self, now: float) -> PreemptionView | None:
        if not self.notices:
            return None
        agreement = self.agreement
        notices = tuple(NoticeView(n.task, n.source, n.reason, n.seconds_left(now), n.notice_id) for n in self.notices)
        if agreement is None:
            return PreemptionView(self._generation, notices, self.count, "none", -1,
                                  "the generation had not formed: no job to agree with", 0, 0)  # fmt: skip
        return PreemptionView(
            agreement.generation, notices, self.count, agreement.state, agreement.step, agreement.reason,
            len(agreement.reported), len(agreement.asked), agreement.checkpointed, len(agreement.saved),
        )  # fmt: skip


def ledger_event(event: PreemptionEvent) -> Event | None:
    """``event`` as the goodput ledger's record (:mod:`tpuctl.goodput.timeline`), or None for a kind it does not
    count (no agreement: the jobs are stopped as after any failure). Lost steps are placed at the notice's
    deadline, the moment they were lost."""
    if event.kind == "notice":
        return PreemptionNotice(event.task, event.source, event.deadline, event.at)
    if event.kind == "agreed":
        return CheckpointAgreed(event.step, event.at)
    if event.kind == "saved":
        return CheckpointSaved(event.step, event.at)
    if event.kind == "lost":
        return StepsLost(event.task, event.lost_steps, event.deadline or event.at)
    return None
