"""The calls that wait on a host's session stream (``HeartbeatStream``), and their answers.

A barrier or gather arrival, the wait for every host to register (``StreamWaitForAll``) and the error
watch arrive as messages on a host's session, not as calls of their own: nothing parks in the service
for them. ``StreamAnswers`` keeps each until the state decides it (the servicer hands it every wake-up)
or its deadline comes (one timer per barrier key, one per wait-for-all), then writes the answer on the
session: an answer that is the same for many hosts through the fan-out writers (``fanout.py``), encoded
once (``shared.py``) with each host's request id prepended (``wire.py``). An arrival whose caller gave up
is withdrawn (``StreamWithdraw``), and so is every arrival still waiting on a stream that ends: an
instance never passes with a host whose call is no longer there.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from tpuctl.coordination import convert, wire
from tpuctl.coordination.fanout import Answers, Fanned, FanOuts, SessionStream, fanout_width
from tpuctl.coordination.shared import SharedAnswers, poll_seconds
from tpuctl.coordination.state import CoordinationState
from tpuctl.coordination.values import (
    ERRORS,
    REGISTRATION,
    BarrierId,
    Gathered,
    Pending,
    Refused,
    RendezvousProgress,
    TaskRef,
    WaitKey,
    Wakeup,
    barrier_key,
)
from tpuctl.proto import coordination_pb2 as pb
from tpuctl.protowire import length_delimited

log = logging.getLogger("tpuctl.coordination")

RELEASE_WIDTH = 256
"""How many answers of a passed barrier are being written at once (a few bytes each)."""


class WaitForAll:
    """A session's ``StreamWaitForAll``: whose, its request id, when it answers with progress at the
    latest, and its timer."""

    __slots__ = ("answer_by", "caller", "request_id", "session", "timer")

    def __init__(self, session: SessionStream, caller: TaskRef, request_id: int, answer_by: float) -> None:
        self.session = session
        self.caller = caller
        self.request_id = request_id
        self.answer_by = answer_by
        self.timer: asyncio.TimerHandle | None = None


class StreamAnswers:
    """The session streams' waiting calls of one service. ``wake`` is the servicer's: called after a
    timer decided something (deciding may change the state, a timeout)."""

    def __init__(
        self,
        state: CoordinationState,
        *,
        clock: Callable[[], float],
        shared: SharedAnswers,
        fan_outs: FanOuts,
        wake: Callable[[], None],
    ) -> None:
        self._state = state
        self._clock = clock
        self.counters = state.counters
        self._shared = shared
        self._fan_outs = fan_outs
        self._wake = wake
        # Barrier arrivals on session streams, by wait key: {(session, request id): barrier}, answered once
        # each when the key is woken and decided; one timer per key for its deadline, not one per host.
        self._barriers: dict[WaitKey, dict[tuple[SessionStream, int], BarrierId]] = {}
        self._barrier_timers: dict[WaitKey, asyncio.TimerHandle] = {}
        self._arrivals: dict[SessionStream, tuple[int, WaitKey] | dict[int, WaitKey]] = {}
        """Each session's arrivals still waiting, (request id, key) or {request id: key} for more than one
        (rare: a host waits at one barrier at a time): how a withdrawal, or the end of the stream, finds
        its arrival in O(1), for about 130 bytes per waiting host."""
        self._watchers: set[SessionStream] = set()
        """Session streams watching for the cluster's error (pushed once, then dropped from here)."""
        self._waiting_for_all: set[SessionStream] = set()
        """Session streams waiting for every task to register (``StreamWaitForAll``), one wait each."""

    def closed(self, session: SessionStream) -> None:
        """``session``'s stream ended: it waits for nothing more, and its arrivals still waiting are
        withdrawn (the host's call cannot be answered on it: it fails there, and a retry comes on a new one)."""
        self._watchers.discard(session)
        self._drop_wait_for_all(session)
        arrivals = self._arrivals.pop(session, None)
        if arrivals is None or session.task is None:
            return
        for request_id, key in [arrivals] if isinstance(arrivals, tuple) else list(arrivals.items()):
            barrier = self._take(session, request_id, key)
            try:
                found = self._state.withdraw(session.task, barrier, now=self._clock())
            except Refused:
                continue  # decided (failed) or of an ended generation: nothing counts any more
            if isinstance(found, RendezvousProgress):
                task = session.task.task_id
                log.info("task %d: its session ended while it waited at %s: arrival withdrawn", task, barrier)
        self._wake()

    def woken(self, wakeup: Wakeup) -> None:
        """Answer the barriers, gathers and waits for every host that ``wakeup`` may have decided."""
        if self._barriers:
            self._answer_barriers(list(self._barriers) if wakeup.everyone else wakeup.keys)
        if self._waiting_for_all and (wakeup.everyone or REGISTRATION in wakeup.keys):
            self._answer_waits_for_all()

    def push_errors(self, wakeup: Wakeup) -> None:
        """Push the cluster's error to every watching session if ``wakeup`` may have brought one."""
        if self._watchers and (wakeup.everyone or ERRORS in wakeup.keys):
            # The error reaches every host at once: written by a few writer tasks in turn, as a passed
            # barrier is, not a task per host (a pod's worth, when it matters most).
            pushed: Answers = deque()
            for session in list(self._watchers):
                self.counters.touched += 1
                if session.task is not None:
                    self._push_error(session, session.task, pushed)
            if pushed:
                self._fan_outs.send(pushed, RELEASE_WIDTH)

    def push_verdict(self, data: bytes) -> set[int]:
        """Push a watchdog finding, a dump order, a preemption notice or the agreement on a checkpoint step
        (``data``: one ``HeartbeatResponse`` encoded once) to every session that watches the cluster's error,
        through the fan-out's few writers; the tasks reached."""
        pushed: Answers = deque((session, data) for session in self._watchers if session.task is not None)
        if pushed:
            self._fan_outs.send(pushed, RELEASE_WIDTH)
        return {session.task.task_id for session, _ in pushed if isinstance(session.task, TaskRef)}

    # --- the wait for every host -----------------------------------------------------------------------

    def wait_for_all(self, session: SessionStream, caller: TaskRef, request: pb.StreamWaitForAll) -> None:
        """``WaitForAllTasks`` on a session: answered at once when registration is complete (or refused),
        else when it completes (one answer encoded for every waiter), fails, or this wait's own
        ``max_wait_seconds`` passes (the progress so far, bounded). One wait per session."""
        self._drop_wait_for_all(session)
        now = self._clock()
        waiter = WaitForAll(session, caller, request.request_id, now + poll_seconds(request.max_wait_seconds))
        answer = self._answer_wait_for_all(waiter, now)
        if answer is not None:
            session.send(answer)
            return
        session.wait_for_all = waiter
        self._waiting_for_all.add(session)

    def _answer_wait_for_all(self, waiter: WaitForAll, now: float) -> bytes | None:
        """``waiter``'s answer if its wait is over (the caller sends it); else None, its timer (re)armed."""
        request_id = waiter.request_id
        try:
            left = self._state.registration_waiting(waiter.caller, now=now)
            if left is None:
                total = self._state.member_count
                complete = self._shared.share(
                    f"registered/stream/{total}",
                    lambda: pb.HeartbeatResponse(
                        registration=pb.WaitForAllTasksResponse(complete=True, registered=total, total=total)
                    ),
                )
                return wire.request_id_prefix(request_id) + complete
            if now >= waiter.answer_by:
                self.counters.built += 1
                progress = convert.progress_response(self._state.registration_progress(waiter.caller, now=now))
                response = pb.HeartbeatResponse(request_id=request_id, registration=progress)
                return response.SerializeToString()
        except Refused as refused:
            return wire.outcome_refused(request_id, refused)
        finally:
            self.counters.touched += 1
        if waiter.timer is not None:
            waiter.timer.cancel()
        delay = max(0.0, min(waiter.answer_by, now + left) - now)
        waiter.timer = asyncio.get_running_loop().call_later(delay, self._wait_for_all_due, waiter)
        return None

    def _wait_for_all_due(self, waiter: WaitForAll) -> None:
        waiter.timer = None
        session = waiter.session
        if session.wait_for_all is not waiter:
            return
        answer = self._answer_wait_for_all(waiter, self._clock())
        if answer is not None:
            session.send(answer)
            self._drop_wait_for_all(session)
        self._wake()  # deciding may have changed the state (the registration timeout)

    def _answer_waits_for_all(self) -> None:
        """Answer every wait that is over, the completion most of all (the same bytes for every host but
        its request id): written by a few writer tasks in turn, not a task per host (every host of a pod
        at once when its last host registers)."""
        now = self._clock()
        answers: Answers = deque()
        for session in list(self._waiting_for_all):
            waiter = session.wait_for_all
            answer = None if waiter is None else self._answer_wait_for_all(waiter, now)
            if answer is not None:
                answers.append((session, answer))
                self._drop_wait_for_all(session)
        if answers:
            self._fan_outs.send(answers, RELEASE_WIDTH)

    def _drop_wait_for_all(self, session: SessionStream) -> None:
        waiter = session.wait_for_all
        if waiter is None:
            return
        session.wait_for_all = None
        self._waiting_for_all.discard(session)
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None

    # --- barriers and gathers ------------------------------------------------------------------------

    def barrier(self, session: SessionStream, caller: TaskRef, arrival: pb.StreamBarrier) -> None:
        """A barrier arrival on a session: answered at once when decided, else when its key is woken (a
        pass, a failure) or at its deadline. Refusals answer the arrival; the stream goes on."""
        try:
            barrier = self._state.barrier_arrive(
                caller, arrival.name, arrival.timeout_seconds, now=self._clock(), request_id=arrival.request_id
            )
        except Refused as refused:
            session.send(wire.outcome_refused(arrival.request_id, refused))
            return
        self._rendezvous(session, arrival.request_id, barrier)

    def gather(self, session: SessionStream, caller: TaskRef, arrival: pb.StreamGather) -> None:
        """A gather arrival on a session: as a barrier's, answered with the table every host gets."""
        try:
            gather = self._state.gather_arrive(
                caller, arrival.name, arrival.value, arrival.timeout_seconds, now=self._clock(),
                request_id=arrival.request_id,
            )  # fmt: skip
        except Refused as refused:
            session.send(wire.outcome_refused(arrival.request_id, refused))
            return
        self._rendezvous(session, arrival.request_id, gather)

    def _rendezvous(self, session: SessionStream, request_id: int, barrier: BarrierId) -> None:
        """Answer an arrival that is decided; else keep it with its key's other waiting sessions, under
        one deadline timer per key (not one per host)."""
        key = barrier_key(barrier)
        waiting = self._barriers.get(key)
        if waiting is None:
            waiting = self._barriers[key] = {}
        waiting[session, request_id] = barrier
        mine = self._arrivals.get(session)
        if mine is None:
            self._arrivals[session] = (request_id, key)
        elif isinstance(mine, tuple):
            self._arrivals[session] = {mine[0]: mine[1], request_id: key}
        else:
            mine[request_id] = key
        if key in self._barrier_timers:
            return  # undecided: its timer is set (a decided key has none and is answered below)
        self._answer_barriers([key])

    def withdraw(self, session: SessionStream, caller: TaskRef, request: pb.StreamWithdraw) -> None:
        """Take back ``session``'s arrival sent with ``request.request_id``, answered once on that request id:
        its outcome if its instance was decided first (a pass wins), else ``withdrawn`` (where the instance
        stood). An arrival already answered, or unknown, is left alone: its answer is on the way. O(1)."""
        request_id = request.request_id
        key = self._answered(session, request_id)
        if key is None:
            return
        barrier = self._take(session, request_id, key)
        try:
            found = self._state.withdraw(caller, barrier, now=self._clock())
        except Refused as refused:
            session.send(wire.outcome_refused(request_id, refused))
            return
        if isinstance(found, RendezvousProgress):
            self.counters.built += 1
            answer = pb.HeartbeatResponse(request_id=request_id, withdrawn=convert.rendezvous_progress_response(found))
            session.send(answer.SerializeToString())
        elif isinstance(found, Gathered):
            data, gate = self._shared.gathered(barrier.name, found)
            session.send(Fanned(wire.request_id_prefix(request_id), length_delimited(wire.GATHERED_FIELD, data), gate))
        else:
            session.send(wire.outcome_passed(request_id, found))

    def _answered(self, session: SessionStream, request_id: int) -> WaitKey | None:
        """Forget ``session``'s arrival ``request_id`` (it is being answered); its key, None if not waiting."""
        mine = self._arrivals.get(session)
        if mine is None:
            return None
        if isinstance(mine, tuple):
            if mine[0] != request_id:
                return None
            del self._arrivals[session]
            return mine[1]
        key = mine.pop(request_id, None)
        if len(mine) == 1:
            self._arrivals[session] = next(iter(mine.items()))
        return key

    def _take(self, session: SessionStream, request_id: int, key: WaitKey) -> BarrierId:
        """Remove a waiting arrival from its key (and the key's timer with its last arrival); its barrier."""
        waiting = self._barriers[key]
        barrier = waiting.pop((session, request_id))
        if not waiting:
            del self._barriers[key]
            timer = self._barrier_timers.pop(key, None)
            if timer is not None:
                timer.cancel()
        return barrier

    def _barrier_due(self, key: WaitKey) -> None:
        self._barrier_timers.pop(key, None)
        self._answer_barriers([key])
        self._wake()

    def _answer_barriers(self, keys: list[WaitKey] | frozenset[WaitKey]) -> None:
        """Answer every session waiting on ``keys`` whose barrier or gather is decided: the outcome is
        decided and encoded once per key, then written to each waiting stream (O(1) each: a gather's
        table is the same bytes for every host, joined to each host's request id only as it is written)."""
        now = self._clock()
        for key in keys:
            waiting = self._barriers.get(key)
            if not waiting:
                continue
            barrier = next(iter(waiting.values()))
            gate: asyncio.Semaphore | None = None
            try:
                outcome = self._state.rendezvous_outcome(barrier, now=now)
            except Refused as refused:
                tail = wire.outcome_refused(0, refused)
            else:
                if isinstance(outcome, Pending):
                    timer = self._barrier_timers.pop(key, None)
                    if timer is not None:
                        timer.cancel()
                    self._barrier_timers[key] = asyncio.get_running_loop().call_later(
                        max(0.0, outcome.deadline - now), self._barrier_due, key
                    )
                    continue
                if isinstance(outcome, Gathered):
                    data, gate = self._shared.gathered(barrier.name, outcome)
                    tail = length_delimited(wire.GATHERED_FIELD, data)
                else:
                    tail = wire.outcome_passed(0, outcome)
            del self._barriers[key]
            timer = self._barrier_timers.pop(key, None)
            if timer is not None:
                timer.cancel()
            self.counters.touched += len(waiting)
            self.counters.woken += len(waiting)
            for session, request_id in waiting:
                self._answered(session, request_id)
            if gate is None:
                answers: Answers = deque(
                    (session, wire.request_id_prefix(request_id) + tail) for session, request_id in waiting
                )
                width = RELEASE_WIDTH
            else:
                answers = deque(
                    (session, Fanned(wire.request_id_prefix(request_id), tail, gate)) for session, request_id in waiting
                )
                width = fanout_width(len(tail))
            self._fan_outs.send(answers, width)

    # --- the error watch -------------------------------------------------------------------------------

    def watch(self, session: SessionStream, caller: TaskRef) -> None:
        """Push the cluster's error on ``session`` once there is one (at once if there is)."""
        if session.watching:
            return
        session.watching = True
        self._watchers.add(session)
        self._push_error(session, caller)

    def _push_error(self, session: SessionStream, caller: TaskRef, out: Answers | None = None) -> None:
        """Send ``session`` the cluster's error if there is one (with ``out``: add it there, for one
        fan-out to every watcher)."""
        try:
            failure = self._state.poll_error(caller, now=self._clock())
        except Refused as refused:
            self._watchers.discard(session)
            data = wire.outcome_refused(0, refused)
        else:
            if failure is None:
                return
            self._watchers.discard(session)
            data = self._shared.error(failure)[1]
        if out is None:
            session.send(data)
        else:
            out.append((session, data))
