"""The gRPC servicer: converts requests, asks the state machine, and parks calls that must wait.

All deciding happens in ``state.CoordinationState``; this module owns only what needs asyncio: a call
that gets ``Pending`` parks on its wait key until the state wakes that key or the deadline comes, then
asks again. A watchdog task calls ``expire`` every ``check_interval`` seconds so a silent task is
declared failed at most that long after its heartbeat timeout.

Answers that are the same for every caller (registration, "all registered", the cluster's error, a
passed gather, a key listing until the next write) are serialized once and sent as the same bytes:
``encode`` is the response serializer of every method (``server.py``) and passes bytes through.

Beside it: the session streams' outboxes and the fan-out writers (``fanout.py``), the session answers
written as wire bytes (``wire.py``), the garbage collector's policy while serving (``heap.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import math
import secrets
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

from google.protobuf.message import Message

from tpuctl.coordination import convert, wire
from tpuctl.coordination.fanout import Answers, Fanned, FanOuts, SessionStream, fanout_width
from tpuctl.coordination.heap import Heap
from tpuctl.coordination.logs import RateLimitedLog
from tpuctl.coordination.parking import Parking
from tpuctl.coordination.state import (
    ERRORS,
    REGISTRATION,
    BarrierId,
    ClusterFailure,
    CoordinationState,
    Gathered,
    Pending,
    Reason,
    Refused,
    TaskFailure,
    TaskRef,
    WaitKey,
    barrier_key,
    kv_key,
)
from tpuctl.coordination.values import CREDENTIAL_BYTES, SAMPLE, Membership
from tpuctl.proto import coordination_pb2 as pb
from tpuctl.protowire import length_delimited

log = logging.getLogger("tpuctl.coordination")

MAX_POLL_S = 60.0
"""Longest a long poll (registration progress, error poll) is held before answering "nothing yet"."""
CHECK_INTERVAL_S = 0.25
"""How often the watchdog looks for silent tasks: failure detection lags the timeout by at most this."""
STALL_S = 0.1
"""A watchdog wake-up later than this counts as the service stalled (its own backlog) for that long."""
_RELEASE_WIDTH = 256
"""How many answers of a passed barrier are being written at once (a few bytes each)."""
_KV_DIR_CACHE = 64
"""Key listings kept encoded (by prefix) until the next key-value write."""

# Refusals that mean a host is misconfigured or a process is duplicated: worth a warning in the log.
_MEMBERSHIP_REFUSALS = {
    Reason.VERSION_MISMATCH,
    Reason.WRONG_CLUSTER,
    Reason.UNKNOWN_TASK,
    Reason.TASK_TAKEN,
    Reason.STALE_INCARNATION,
    Reason.NOT_PERMITTED,
}

_T = TypeVar("_T")
_Request = TypeVar("_Request")
_Response = TypeVar("_Response")
_Method = Callable[["CoordinationServicer", _Request, Any], Awaitable[_Response]]
Answer = Message | bytes
"""What a handler returns: a message, or an answer already serialized (shared by many callers)."""


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


def _refusals_as_status(method: _Method[_Request, _Response]) -> _Method[_Request, _Response]:
    """Send a ``Refused`` as its gRPC status; wake whatever the call changed, however it ended."""

    @functools.wraps(method)
    async def handler(self: CoordinationServicer, request: _Request, context: Any) -> _Response:
        self.counters.calls += 1
        try:
            return await method(self, request, context)
        except Refused as refused:
            # One line per peer and reason every 10 s at most, whoever the caller (a stranger's flood).
            level = logging.WARNING if refused.reason in _MEMBERSHIP_REFUSALS else logging.INFO
            peer = context.peer()
            self.refusal_log.log(
                level, peer, refused.reason.name, "refused %s from %s: %s", method.__name__, peer, refused.message
            )
            await self._abort(context, refused)
        finally:
            self._wake()

    return handler


class CoordinationServicer:
    """One cluster's coordination service. ``start`` the watchdog before serving, ``stop`` it after.

    ``counters`` (shared with the state) counts the work done, for tests and the bench."""

    def __init__(
        self,
        state: CoordinationState,
        *,
        clock: Callable[[], float],
        check_interval: float,
        freeze_heap: bool = False,
    ) -> None:
        self._state = state
        self.heap = Heap(freeze_heap)
        self._clock = clock
        self._check_interval = check_interval
        self.counters = state.counters
        self._parking = Parking(self.counters)
        self._watchdog: asyncio.Task[None] | None = None
        self._shared: dict[str, bytes] = {}
        self._error: tuple[ClusterFailure, bytes, bytes] | None = None
        """The cluster's error as an error poll's answer and as a session's push, encoded once."""
        self._gathered: dict[str, tuple[Gathered, bytes, asyncio.Semaphore]] = {}
        self._kv_dirs: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        self.refusal_log = RateLimitedLog(log)
        # Barrier arrivals on session streams, by wait key: (session, request id, barrier), answered once
        # each when the key is woken and decided; one timer per key for its deadline, not one per host.
        self._stream_barriers: dict[WaitKey, list[tuple[SessionStream, int, BarrierId]]] = {}
        self._barrier_timers: dict[WaitKey, asyncio.TimerHandle] = {}
        self._watchers: set[SessionStream] = set()
        self._fan_outs = FanOuts()
        self._session_ids = itertools.count(1)
        self._waiting_for_all: set[SessionStream] = set()
        """Session streams waiting for every task to register (``StreamWaitForAll``), one wait each."""
        """Session streams watching for the cluster's error (pushed once, then dropped from here)."""

    @property
    def state(self) -> CoordinationState:
        return self._state

    def start(self) -> None:
        self.heap.start()
        self._watchdog = asyncio.create_task(self._watch_heartbeats(), name="tpuctl-coordination-watchdog")

    async def stop(self) -> None:
        """Stop the service's own tasks. Answers a fan-out has not written yet (a passed barrier, the
        cluster's error: task 0's agent stops the service right after hearing the error itself) go to
        their sessions' own outboxes, which the streams' handlers flush during the server's grace; the
        writers' writes in progress get as long to finish."""
        self.heap.stop()
        await self._fan_outs.stop()
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None

    def encode(self, answer: Answer | Fanned) -> bytes:
        """The response serializer of every method: counts what is sent, passes shared bytes through."""
        if isinstance(answer, bytes):
            data = answer
        elif isinstance(answer, Fanned):
            data = answer.join()
        else:
            data = answer.SerializeToString()
            self.counters.encoded += 1
        self.counters.sent_bytes += len(data)
        return data

    # --- RPCs ----------------------------------------------------------------------------------------

    @_refusals_as_status
    async def RegisterTask(self, request: pb.RegisterTaskRequest, context: Any) -> Answer:
        return self._register(request, context.peer())[1]

    def _register(self, request: pb.RegisterTaskRequest, peer: str) -> tuple[Membership, bytes]:
        """A registration (``RegisterTask``, or the first message of a session stream): the membership
        and the ``RegisterTaskResponse`` as sent."""
        # The credential is generated here, at the edge; the state keeps it (a retry gets the first one).
        credential = secrets.token_bytes(CREDENTIAL_BYTES)
        registration = convert.registration(request, peer=peer, credential=credential)
        membership = self._state.register(registration, now=self._clock())
        if self._state.registration_complete and self._state.failure is None:
            self.heap.formed(self._state.generation)
        log.info(
            "task %d registered into generation %d from %s (%s), fingerprint %s",
            request.task_id,
            membership.generation,
            request.hostname[:255],
            peer,
            self._state.status_fingerprint(request.task_id),
        )
        key = f"register+tasks/{membership.generation}" if request.with_tasks else f"register/{membership.generation}"
        shared = self._share(key, lambda: convert.register_response(membership, with_tasks=request.with_tasks))
        return membership, shared + convert.credential_answer(membership.task.credential)

    @_refusals_as_status
    async def WaitForAllTasks(self, request: pb.WaitForAllTasksRequest, context: Any) -> Answer:
        caller = convert.task_ref(request.task)
        answer_by = self._clock() + _poll_seconds(request.max_wait_seconds)

        def check(now: float) -> bool | Pending:
            left = self._state.registration_waiting(caller, now=now)
            if left is None or now >= answer_by:
                return left is None
            return Pending(min(answer_by, now + left))

        if await self._wait(REGISTRATION, check):
            total = len(self._state.tasks)
            return self._share(
                "registered",
                lambda: pb.WaitForAllTasksResponse(complete=True, registered=total, total=total),
            )
        self.counters.built += 1
        return convert.progress_response(self._state.registration_progress(caller, now=self._clock()))

    @_refusals_as_status
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> Answer:
        self._state.heartbeat(
            convert.task_ref(request.task), now=self._clock(), service_incarnation=request.service_incarnation
        )
        return self._heartbeat_answer()

    @_refusals_as_status
    async def HeartbeatStream(self, requests: AsyncIterator[pb.HeartbeatRequest], context: Any) -> None:
        """One task's session for its lifetime; O(1) per message. A heartbeat is answered only when asked;
        a barrier or gather arrival once it is decided; the error watch once there is an error.
        The first message names the stream's task, checked as every task-scoped call is; later messages
        are of that task (one naming another is refused, ending the stream)."""
        state, clock, counters = self._state, self._clock, self.counters
        session = SessionStream(context, counters, next(self._session_ids))
        read = context.read  # not ``async for`` over ``requests``: its async generator stays with every idle session
        try:
            while True:
                request = await read()
                if not isinstance(request, pb.HeartbeatRequest):  # EOF: the host closed its side
                    break
                counters.calls += 1
                counters.stream_in += 1
                caller = session.task
                if caller is None:
                    if request.HasField("register"):  # the session's first answer
                        membership, answer = self._register(request.register, context.peer())
                        session.task = membership.task
                        session.wire = convert.task_ref_pb(membership.task)
                        state.session_opened(membership.task, session.id, now=clock())
                        session.vouched = membership.task
                        await session.write(length_delimited(wire.REGISTERED_FIELD, answer))
                        self._wake()  # the last host's registration completes everyone's wait
                        continue
                    session.wire = request.task
                    caller = session.task = convert.task_ref(request.task)
                elif request.HasField("register"):
                    raise Refused(
                        Reason.NOT_PERMITTED,
                        f"a session stream registers once, with its first message (task {caller.task_id}'s "
                        "stream sent another registration)",
                        hint="open a new stream to register again",
                    )
                elif request.HasField("task") and request.task != session.wire:
                    raise Refused(
                        Reason.NOT_PERMITTED,
                        f"a session stream carries the calls of the task that opened it (task {caller.task_id}); "
                        f"a message for task {request.task.task_id} was refused",
                        hint="open one stream per task",
                    )
                if request.HasField("barrier"):
                    self._stream_barrier(session, caller, request.barrier)
                    self._wake()  # the last arrival passes the barrier for every waiting session now
                elif request.HasField("gather"):
                    self._stream_gather(session, caller, request.gather)
                    self._wake()
                elif request.HasField("wait_for_all"):
                    self._stream_wait_for_all(session, caller, request.wait_for_all)
                    self._wake()
                elif request.watch_errors:
                    self._watch(session, caller)
                    self._wake()
                else:
                    state.heartbeat(caller, now=clock(), service_incarnation=request.service_incarnation)
                    if session.vouched is None:  # the stream proved whose it is: it keeps the task alive now
                        state.session_opened(caller, session.id, now=clock())
                        session.vouched = caller
                    if request.ack:
                        await session.write(self._heartbeat_answer())
        except Refused:
            await session.flush()
            raise
        finally:
            session.closed = True
            self._watchers.discard(session)
            self._drop_wait_for_all(session)
            if session.vouched is not None:
                state.session_closed(session.vouched, session.id, now=clock())
        await session.flush()

    def _stream_wait_for_all(self, session: SessionStream, caller: TaskRef, request: pb.StreamWaitForAll) -> None:
        """``WaitForAllTasks`` on a session: answered at once when registration is complete (or refused),
        else when it completes (one answer encoded for every waiter), fails, or this wait's own
        ``max_wait_seconds`` passes (the progress so far, bounded). One wait per session."""
        self._drop_wait_for_all(session)
        now = self._clock()
        waiter = WaitForAll(session, caller, request.request_id, now + _poll_seconds(request.max_wait_seconds))
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
                total = len(self._state.tasks)
                complete = self._share(
                    "registered/stream",
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
            self._fan_outs.send(answers, _RELEASE_WIDTH)

    def _drop_wait_for_all(self, session: SessionStream) -> None:
        waiter = session.wait_for_all
        if waiter is None:
            return
        session.wait_for_all = None
        self._waiting_for_all.discard(session)
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None

    def _stream_barrier(self, session: SessionStream, caller: TaskRef, arrival: pb.StreamBarrier) -> None:
        """A barrier arrival on a session: answered at once when decided, else when its key is woken (a
        pass, a failure) or at its deadline. Refusals answer the arrival; the stream goes on."""
        try:
            barrier = self._state.barrier_arrive(caller, arrival.name, arrival.timeout_seconds, now=self._clock())
        except Refused as refused:
            session.send(wire.outcome_refused(arrival.request_id, refused))
            return
        self._stream_rendezvous(session, arrival.request_id, barrier)

    def _stream_gather(self, session: SessionStream, caller: TaskRef, arrival: pb.StreamGather) -> None:
        """A gather arrival on a session: as a barrier's, answered with the table every host gets."""
        try:
            gather = self._state.gather_arrive(
                caller, arrival.name, arrival.value, arrival.timeout_seconds, now=self._clock()
            )
        except Refused as refused:
            session.send(wire.outcome_refused(arrival.request_id, refused))
            return
        self._stream_rendezvous(session, arrival.request_id, gather)

    def _stream_rendezvous(self, session: SessionStream, request_id: int, barrier: BarrierId) -> None:
        """Answer an arrival that is decided; else keep it with its key's other waiting sessions, under
        one deadline timer per key (not one per host)."""
        key = barrier_key(barrier)
        waiting = self._stream_barriers.get(key)
        if waiting is None:
            waiting = self._stream_barriers[key] = []
        waiting.append((session, request_id, barrier))
        if key in self._barrier_timers:
            return  # undecided: its timer is set (a decided key has none and is answered below)
        self._answer_barriers([key])

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
            waiting = self._stream_barriers.get(key)
            if not waiting:
                continue
            barrier = waiting[0][2]
            gate: asyncio.Semaphore | None = None
            try:
                if barrier.kind == "gather":
                    outcome: int | Gathered | Pending = self._state.gather_outcome(barrier, now=now)
                else:
                    outcome = self._state.barrier_outcome(barrier, now=now)
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
                    _, data, gate = self._gathered_answer(barrier.name, outcome)
                    tail = length_delimited(wire.GATHERED_FIELD, data)
                else:
                    tail = wire.outcome_passed(0, outcome)
            del self._stream_barriers[key]
            timer = self._barrier_timers.pop(key, None)
            if timer is not None:
                timer.cancel()
            self.counters.touched += len(waiting)
            self.counters.woken += len(waiting)
            if gate is None:
                answers: Answers = deque(
                    (session, wire.request_id_prefix(request_id) + tail) for session, request_id, _ in waiting
                )
                width = _RELEASE_WIDTH
            else:
                answers = deque(
                    (session, Fanned(wire.request_id_prefix(request_id), tail, gate)) for session, request_id, _ in waiting
                )
                width = fanout_width(len(tail))
            self._fan_outs.send(answers, width)

    def _gathered_answer(self, name: str, gathered: Gathered) -> tuple[Gathered, bytes, asyncio.Semaphore]:
        """A passed gather's ``GatherResponse``, encoded once for every caller (unary and stream alike),
        and the gate that bounds how many bytes of its copies are being written at once."""
        cached = self._gathered.get(name)
        if cached is None or cached[0] is not gathered:
            self.counters.built += 1
            self.counters.encoded += 1
            self.counters.touched += len(gathered.values)
            data = convert.gather_response(gathered.instance, gathered.values).SerializeToString()  # once, for all
            gate = asyncio.Semaphore(fanout_width(len(data)))
            cached = self._gathered[name] = (gathered, data, gate)
        return cached

    def _watch(self, session: SessionStream, caller: TaskRef) -> None:
        """Push the cluster's error on ``session`` once there is one (at once if there is)."""
        if session.watching:
            return
        session.watching = True
        self._watchers.add(session)
        self._push_error(session, caller)

    def _push_error(
        self, session: SessionStream, caller: TaskRef, out: Answers | None = None
    ) -> None:
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
            if self._error is None or self._error[0] is not failure:
                self._encode_error(failure)
            assert self._error is not None
            data = self._error[2]
        if out is None:
            session.send(data)
        else:
            out.append((session, data))

    def _encode_error(self, failure: ClusterFailure) -> None:
        self.counters.built += 1
        self.counters.encoded += 2
        message = convert.cluster_failure_pb(failure)
        self._error = (
            failure,
            pb.PollForErrorResponse(failure=message).SerializeToString(),
            pb.HeartbeatResponse(failure=message).SerializeToString(),
        )

    @_refusals_as_status
    async def ReportError(self, request: pb.ReportErrorRequest, context: Any) -> Answer:
        failures = self._state.report_error(
            convert.task_ref(request.task), request.cause, now=self._clock(), shutdown=request.shutdown
        )
        self._log_failures(failures)
        return self._share("empty", lambda: pb.ReportErrorResponse())

    @_refusals_as_status
    async def PollForError(self, request: pb.PollForErrorRequest, context: Any) -> Answer:
        caller = convert.task_ref(request.task)
        answer_by = self._clock() + _poll_seconds(request.max_wait_seconds)

        def check(now: float) -> ClusterFailure | Pending | None:
            failure = self._state.poll_error(caller, now=now)
            if failure is not None or now >= answer_by:
                return failure
            return Pending(answer_by)

        failure = await self._wait(ERRORS, check)
        if failure is None:
            return b""  # an empty PollForErrorResponse
        if self._error is None or self._error[0] is not failure:
            self._encode_error(failure)
        assert self._error is not None
        return self._error[1]

    @_refusals_as_status
    async def Barrier(self, request: pb.BarrierRequest, context: Any) -> Answer:
        caller = convert.task_ref(request.task)
        barrier = self._state.barrier_arrive(caller, request.name, request.timeout_seconds, now=self._clock())
        instance = await self._wait(barrier_key(barrier), lambda now: self._state.barrier_outcome(barrier, now=now))
        return wire.barrier_answer(instance)

    @_refusals_as_status
    async def Gather(self, request: pb.GatherRequest, context: Any) -> None:
        """One answer on a server stream, so the service knows when it has gone: at most
        ``fanout.FANOUT_BYTES`` of table answers are in flight at once, and a pod's worth of tables is
        never buffered in the service at the same time."""
        caller = convert.task_ref(request.task)
        gather = self._state.gather_arrive(
            caller, request.name, request.value, request.timeout_seconds, now=self._clock()
        )
        gathered = await self._wait(barrier_key(gather), lambda now: self._state.gather_outcome(gather, now=now))
        _, data, gate = self._gathered_answer(gather.name, gathered)
        async with gate:
            await context.write(data)

    @_refusals_as_status
    async def RendezvousProgress(self, request: pb.RendezvousProgressRequest, context: Any) -> Answer:
        found = self._state.rendezvous_progress(
            convert.task_ref(request.task), request.name, kind=convert.kind(request.kind), now=self._clock()
        )
        self.counters.built += 1
        return convert.rendezvous_progress_response(found)

    @_refusals_as_status
    async def KeyValueSet(self, request: pb.KeyValueSetRequest, context: Any) -> Answer:
        entry = request.entry
        if not request.HasField("task"):
            raise Refused(
                Reason.NOT_PERMITTED,
                "a key-value write must name its task and carry its credential",
                hint="register first and pass the TaskRef register() returned",
            )
        self._state.kv_set(
            entry.key,
            entry.value,
            allow_overwrite=request.allow_overwrite,
            now=self._clock(),
            caller=convert.task_ref(request.task),
        )
        return b""

    @_refusals_as_status
    async def KeyValueGet(self, request: pb.KeyValueGetRequest, context: Any) -> Answer:
        key, timeout, started, generation = request.key, request.timeout_seconds, self._clock(), request.generation
        value = await self._wait(
            kv_key(key),
            lambda now: self._state.kv_get(key, started=started, timeout=timeout, now=now, generation=generation),
        )
        self.counters.built += 1
        return pb.KeyValueGetResponse(value=value)

    @_refusals_as_status
    async def KeyValueDir(self, request: pb.KeyValueDirRequest, context: Any) -> Answer:
        prefix, version = request.prefix, self._state.kv_version
        self._state.check_kv_generation(request.generation)  # the cached listing is the current generation's
        cached = self._kv_dirs.get(prefix)
        if cached is not None and cached[0] == version:
            self._kv_dirs.move_to_end(prefix)
            return cached[1]
        entries = self._state.kv_dir(prefix)
        self.counters.built += 1 + len(entries)
        self.counters.encoded += 1
        data = pb.KeyValueDirResponse(entries=[pb.KeyValue(key=k, value=v) for k, v in entries]).SerializeToString()
        self._kv_dirs[prefix] = (version, data)
        self._kv_dirs.move_to_end(prefix)
        while len(self._kv_dirs) > _KV_DIR_CACHE:
            self._kv_dirs.popitem(last=False)
        return data

    @_refusals_as_status
    async def GetStatus(self, request: pb.GetStatusRequest, context: Any) -> Answer:
        status = self._state.status(now=self._clock())
        self.counters.built += 1 + len(status.tasks)
        return convert.status_response(status)

    @_refusals_as_status
    async def Disconnect(self, request: pb.DisconnectRequest, context: Any) -> Answer:
        caller = convert.task_ref(request.task)
        self._state.disconnect(caller, now=self._clock())
        log.info("task %d disconnected", caller.task_id)
        return b""

    # --- waiting and sharing -------------------------------------------------------------------------

    async def _wait(self, key: WaitKey, check: Callable[[float], _T | Pending]) -> _T:
        """Ask ``check`` until it decides; in between, park on ``key`` until woken or its deadline."""
        while True:
            now = self._clock()
            outcome = check(now)
            self._wake()  # deciding may have changed the state (a timeout) before this call parks
            if not isinstance(outcome, Pending):
                return outcome
            await self._parking.park(key, outcome.deadline - now)

    def _wake(self) -> None:
        wakeup = self._state.take_wakeup()
        if not wakeup.everyone and not wakeup.keys:
            return
        self._parking.wake(wakeup)
        if self._stream_barriers:
            self._answer_barriers(list(self._stream_barriers) if wakeup.everyone else wakeup.keys)
        if self._waiting_for_all and (wakeup.everyone or REGISTRATION in wakeup.keys):
            self._answer_waits_for_all()
        self.heap.check(self._state)  # a generation that ended: its sessions' leftovers may be garbage now
        if self._watchers and (wakeup.everyone or ERRORS in wakeup.keys):
            # The error reaches every host at once: written by a few writer tasks in turn, as a passed
            # barrier is, not a task per host (a pod's worth, when it matters most).
            pushed: Answers = deque()
            for session in list(self._watchers):
                self.counters.touched += 1
                if session.task is not None:
                    self._push_error(session, session.task, pushed)
            if pushed:
                self._fan_outs.send(pushed, _RELEASE_WIDTH)

    def _share(self, key: str, build: Callable[[], Message]) -> bytes:
        """An answer that is the same for every caller, serialized once."""
        data = self._shared.get(key)
        if data is None:
            self.counters.built += 1
            self.counters.encoded += 1
            data = self._shared[key] = build().SerializeToString()
        return data

    def _heartbeat_answer(self) -> bytes:
        incarnation = self._state.service_incarnation
        return self._share("heartbeat", lambda: pb.HeartbeatResponse(service_incarnation=incarnation))

    async def _abort(self, context: Any, refused: Refused) -> NoReturn:
        details = convert.status_details(refused.message)
        trailers = convert.hint_metadata(refused.hint)
        self.counters.sent_bytes += len(details.encode()) + sum(len(value) for _, value in trailers)
        await context.abort(convert.STATUS_CODES[refused.reason], details, trailing_metadata=trailers)
        raise RuntimeError("grpc.aio's context.abort returned instead of raising")

    async def _watch_heartbeats(self) -> None:
        """Look for silent tasks every ``check_interval`` s. A wake-up that comes late measures the
        service's own backlog (the event loop was busy with a wave of calls, and heartbeats waited in
        the same queue): that time is not counted against the tasks (``service_stalled``)."""
        loop = asyncio.get_running_loop()
        due = loop.time() + self._check_interval
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            late = loop.time() - due
            if late > STALL_S:
                self._state.service_stalled(late)
            due = loop.time() + self._check_interval
            self._log_failures(self._state.expire(now=self._clock()))
            self._wake()

    def _log_failures(self, failures: tuple[TaskFailure, ...]) -> None:
        for failure in failures[:SAMPLE]:
            log.warning("%s failed: %s", failure.task, failure.cause)
        if len(failures) > SAMPLE:
            log.warning("... and %d more tasks failed (`tpuctl status --json` lists all)", len(failures) - SAMPLE)


def _poll_seconds(requested: float) -> float:
    return min(max(requested, 0.0), MAX_POLL_S) if math.isfinite(requested) else MAX_POLL_S
