"""The gRPC servicer: converts requests, asks the state machine, and parks calls that must wait.

All deciding happens in ``state.CoordinationState``; this module owns only what needs asyncio: a call
that gets ``Pending`` parks on its wait key until the state wakes that key or the deadline comes, then
asks again. A watchdog task calls ``expire`` every ``check_interval`` seconds so a silent task is
declared failed at most that long after its heartbeat timeout.

Answers that are the same for every caller (registration, "all registered", the cluster's error, a
passed gather, a key listing until the next write) are serialized once and sent as the same bytes:
``encode`` is the response serializer of every method (``server.py``) and passes bytes through.

Beside it: the calls waiting on session streams (``stream_answers.py``), the answers encoded once
(``shared.py``), the session streams' outboxes and the fan-out writers (``fanout.py``), the session answers
written as wire bytes (``wire.py``), the garbage collector's policy while serving (``heap.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

from google.protobuf.message import Message

from tpuctl.coordination import convert, wire
from tpuctl.coordination.dumps import BlackBox, report_document
from tpuctl.coordination.fanout import Fanned, FanOuts, SessionStream
from tpuctl.coordination.heap import Heap
from tpuctl.coordination.ledger import ServiceLedger
from tpuctl.coordination.logs import RateLimitedLog
from tpuctl.coordination.parking import Parking
from tpuctl.coordination.preempt import Preemptions
from tpuctl.coordination.shared import SharedAnswers, poll_seconds
from tpuctl.coordination.state import CoordinationState
from tpuctl.coordination.stream_answers import StreamAnswers
from tpuctl.coordination.values import (
    CREDENTIAL_BYTES,
    ERRORS,
    PROTOCOL_VERSION,
    REGISTRATION,
    SAMPLE,
    BarrierId,
    ClusterFailure,
    Gathered,
    Membership,
    Moved,
    Pending,
    Reason,
    Refused,
    TaskFailure,
    TaskRef,
    WaitKey,
    barrier_key,
    kv_key,
)
from tpuctl.coordination.watch import TICK_S as WATCH_TICK_S
from tpuctl.coordination.watch import ClusterWatch
from tpuctl.messages import shown
from tpuctl.proto import coordination_pb2 as pb
from tpuctl.protowire import length_delimited

log = logging.getLogger("tpuctl.coordination")
HANG_DUMP_AFTER_S = 2.0
"""How long after a hang's verdict its black box is ordered (the verdict reaches every host first)."""

CHECK_INTERVAL_S = 0.25
"""How often the watchdog looks for silent tasks: failure detection lags the timeout by at most this."""
STALL_S = 0.1
"""A watchdog wake-up later than this counts as the service stalled (its own backlog) for that long."""
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
        ledger: ServiceLedger | None = None,
    ) -> None:
        """``ledger``: the goodput ledger (task 0's, with its journal); default: one in memory, from now."""
        self._state = state
        self.heap = Heap(freeze_heap)
        self._clock = clock
        self._check_interval = check_interval
        self.counters = state.counters
        self._parking = Parking(self.counters)
        self._watchdog: asyncio.Task[None] | None = None
        self._shared = SharedAnswers(self.counters)
        self._kv_dirs: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        self.refusal_log = RateLimitedLog(log)
        self._fan_outs = FanOuts()
        self._streams = StreamAnswers(state, clock=clock, shared=self._shared, fan_outs=self._fan_outs, wake=self._wake)
        self.watch = ClusterWatch(state.config.watchdog, len(state.tasks), lambda t: str(state.tasks[t]))
        self._watching: asyncio.Task[None] | None = None
        self._session_ids = itertools.count(1)
        self.black_box = BlackBox(len(state.tasks), lambda t: str(state.tasks[t]), self._streams.push_verdict)
        """Dump orders to every host and their digests (``tpuctl dump``, and a declared hang)."""
        self.ledger = ledger or ServiceLedger.open(
            state.config.cluster, generation=state.generation, started=time.time(), now=time.time()
        )
        """The goodput ledger: the cluster's timeline (``record`` takes the preemption events)."""
        self.preemptions = Preemptions(state, self._streams.push_verdict, wall=time.time, record=self.ledger.record)
        """Preemption notices, the agreed checkpoint step, and their timeline (``preemptions.events``); each
        event goes to the goodput ledger as it is made."""
        self.on_stalled: Callable[[float], None] | None = None
        """Called (on the event loop) with how long the service could not run, when that was at least half
        the heartbeat timeout (its host frozen, or starved): the hosts may have judged it lost meanwhile,
        and a successor may serve in its place (the agent looks, :mod:`tpuctl.agent.succession`)."""

    @property
    def state(self) -> CoordinationState:
        return self._state

    def start(self) -> None:
        self.heap.start()
        self._watchdog = asyncio.create_task(self._watch_heartbeats(), name="tpuctl-coordination-watchdog")
        self._watching = asyncio.create_task(self._watch_progress(), name="tpuctl-coordination-progress")

    async def stop(self) -> None:
        """Stop the service's own tasks. Answers a fan-out has not written yet (a passed barrier, the
        cluster's error: task 0's agent stops the service right after hearing the error itself) go to
        their sessions' own outboxes, which the streams' handlers flush during the server's grace; the
        writers' writes in progress get as long to finish."""
        self.heap.stop()
        self.ledger.close(time.time())
        await self._fan_outs.stop()
        for task in (self._watchdog, self._watching):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._watchdog = self._watching = None

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
        self.ledger.registered(self._state, membership.task.task_id, now=self._clock(), wall=time.time())
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
        key = f"register{'+tasks' if request.with_tasks else ''}{'+standby' if membership.standby else ''}/{membership.generation}"
        shared = self._shared.share(key, lambda: convert.register_response(membership, with_tasks=request.with_tasks))
        return membership, shared + convert.credential_answer(membership.task.credential)

    @_refusals_as_status
    async def WaitForAllTasks(self, request: pb.WaitForAllTasksRequest, context: Any) -> Answer:
        caller = convert.task_ref(request.task)
        answer_by = self._clock() + poll_seconds(request.max_wait_seconds)

        def check(now: float) -> bool | Pending:
            left = self._state.registration_waiting(caller, now=now)
            if left is None or now >= answer_by:
                return left is None
            return Pending(min(answer_by, now + left))

        if await self._wait(REGISTRATION, check):
            total = self._state.member_count
            return self._shared.share(
                f"registered/{total}",
                lambda: pb.WaitForAllTasksResponse(complete=True, registered=total, total=total),
            )
        self.counters.built += 1
        return convert.progress_response(self._state.registration_progress(caller, now=self._clock()))

    @_refusals_as_status
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> Answer:
        self._state.heartbeat(
            convert.task_ref(request.task), now=self._clock(), service_incarnation=request.service_incarnation
        )
        return self._shared.heartbeat(self._state.service_incarnation)

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
                        try:
                            membership, answer = self._register(request.register, context.peer())
                        except Refused as refused:
                            if refused.failure is None:
                                raise
                            # The cluster failed for good: the answer carries the failure (a shutdown or not),
                            # so the host need not ask again (the service may be gone by then).
                            log.info("refused %s's registration: %s", context.peer(), refused.message)
                            await session.write(wire.outcome_refused(0, refused))
                            break
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
                    self._streams.barrier(session, caller, request.barrier)
                    self._wake()  # the last arrival passes the barrier for every waiting session now
                elif request.HasField("gather"):
                    self._streams.gather(session, caller, request.gather)
                    self._wake()
                elif request.HasField("withdraw"):  # its caller gave up: O(1)
                    self._streams.withdraw(session, caller, request.withdraw)
                    self._wake()
                elif request.HasField("wait_for_all"):
                    self._streams.wait_for_all(session, caller, request.wait_for_all)
                    self._wake()
                elif request.watch_errors:
                    self._streams.watch(session, caller)
                    for missed in self.preemptions.replay(clock()):  # a notice this session was not there for
                        session.send(missed)
                    self._wake()
                elif request.HasField("notice"):  # this host is going away: O(1), then one push per host
                    self._notice(session, caller, request.notice)
                elif request.HasField("checkpoint"):  # no answer: O(1), a few per host per notice
                    if session.vouched is not None:
                        self.preemptions.checkpoint(caller.task_id, request.checkpoint, now=clock())
                elif request.HasField("stacks"):  # an answer to a dump order: O(1)
                    if session.vouched is not None:
                        self.black_box.answer(caller.task_id, request.stacks)
                elif request.HasField("dump"):
                    self._dump(session, request.dump)
                elif request.HasField("pace"):  # no answer: O(1), a few per host per report interval
                    report = convert.pace(request.pace)
                    if report is not None and session.vouched is not None:
                        wall = time.time()
                        self.watch.report(caller.task_id, report, generation=state.generation, now=clock(), wall=wall)
                        self.ledger.pace(
                            caller.task_id, report, generation=state.generation, wall=wall,
                            transit=self.watch.transit(report, wall),
                        )  # fmt: skip
                else:
                    state.heartbeat(caller, now=clock(), service_incarnation=request.service_incarnation)
                    if session.vouched is None:  # the stream proved whose it is: it keeps the task alive now
                        state.session_opened(caller, session.id, now=clock())
                        session.vouched = caller
                    if request.ack:
                        await session.write(self._shared.heartbeat(self._state.service_incarnation))
        except Refused:
            await session.flush()
            raise
        finally:
            session.closed = True
            self._streams.closed(session)
            if session.vouched is not None:
                state.session_closed(session.vouched, session.id, now=clock())
        await session.flush()

    @_refusals_as_status
    async def ReportError(self, request: pb.ReportErrorRequest, context: Any) -> Answer:
        failures = self._state.report_error(
            convert.task_ref(request.task), request.cause, now=self._clock(), shutdown=request.shutdown
        )
        self._log_failures(failures)
        return self._shared.share("empty", lambda: pb.ReportErrorResponse())

    @_refusals_as_status
    async def PollForError(self, request: pb.PollForErrorRequest, context: Any) -> Answer:
        caller = convert.task_ref(request.task)
        answer_by = self._clock() + poll_seconds(request.max_wait_seconds)

        def check(now: float) -> ClusterFailure | Pending | None:
            failure = self._state.poll_error(caller, now=now)
            if failure is not None or now >= answer_by:
                return failure
            return Pending(answer_by)

        failure = await self._wait(ERRORS, check)
        if failure is None:
            return b""  # an empty PollForErrorResponse
        return self._shared.error(failure)[0]

    @_refusals_as_status
    async def Barrier(self, request: pb.BarrierRequest, context: Any) -> Answer:
        caller = convert.task_ref(request.task)
        barrier = self._state.barrier_arrive(caller, request.name, request.timeout_seconds, now=self._clock())
        instance = await self._outcome(caller, barrier, lambda now: self._state.barrier_outcome(barrier, now=now))
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
        gathered = await self._outcome(caller, gather, lambda now: self._state.gather_outcome(gather, now=now))
        data, gate = self._shared.gathered(gather.name, gathered)
        async with gate:
            await context.write(data)

    @_refusals_as_status
    async def RendezvousProgress(self, request: pb.RendezvousProgressRequest, context: Any) -> Answer:
        caller, kind = convert.task_ref(request.task), convert.kind(request.kind)
        self.counters.built += 1
        if request.request_id:  # what became of an arrival whose answer its session lost
            outcome = self._state.call_outcome(caller, request.name, request.request_id, kind=kind, now=self._clock())
            if isinstance(outcome, Gathered):  # with the table its lost answer carried, encoded once for all
                return self._shared.lost_gather(request.name, outcome)
            if kind == "gather" and isinstance(outcome, int):  # never "passed" without the table
                raise Refused(Reason.INVALID, f"gather {shown(request.name)} #{outcome} passed, and its table is gone")
            return convert.call_outcome_response(outcome)
        found = self._state.rendezvous_progress(caller, request.name, kind=kind, now=self._clock())
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
        self._state.generations.check_kv(request.generation)  # the cached listing is the current generation's
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
        now = self._clock()
        if request.brief:  # a probe for a live coordinator (``agent/succession.py``): O(1)
            self.counters.built += 1
            brief = pb.GetStatusResponse(
                cluster_name=self._state.config.cluster, service_incarnation=self._state.service_incarnation,
                protocol_version=PROTOCOL_VERSION, generation=self._state.generation,
                forming=not self._state.registration_complete and self._state.failure is None,
            )  # fmt: skip
            failure = self._state.failure
            if failure is not None and failure.moved is not None:  # stepped down: no longer this cluster's service
                brief.failure.CopyFrom(convert.cluster_failure_pb(failure))
            return brief
        status = self._state.status(now=now)
        self.counters.built += 1 + len(status.tasks)
        response = convert.status_response(status)
        view = self.watch.view(now, self._state.generation)
        if view is not None:
            response.watchdog.CopyFrom(convert.watchdog_pb(view))
        response.goodput.CopyFrom(convert.goodput_pb(self.ledger.summary(time.time())))
        preemption = self.preemptions.view(now)
        if preemption is not None:
            response.preemption.CopyFrom(convert.preemption_pb(preemption))
        return response

    @_refusals_as_status
    async def GetGoodput(self, request: pb.GetGoodputRequest, context: Any) -> Answer:
        """The goodput ledger's document: bounded (``KEEP_GENERATIONS`` in detail), O(1) in the cluster's size."""
        failure = self._state.failure
        self.counters.built += 1
        return pb.GetGoodputResponse(document=self.ledger.document(time.time(), None if failure is None else str(failure)))

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

    async def _outcome(self, caller: TaskRef, barrier: BarrierId, check: Callable[[float], _T | Pending]) -> _T:
        """A unary arrival's outcome; a call cancelled while it waits (its caller gave up: its deadline, a
        cancel, a broken connection) withdraws the arrival, unless its instance was decided first."""
        try:
            return await self._wait(barrier_key(barrier), check)
        except asyncio.CancelledError:
            with contextlib.suppress(Refused):
                self._state.withdraw(caller, barrier, now=self._clock())
            self._wake()
            raise

    def _wake(self) -> None:
        wakeup = self._state.take_wakeup()
        if not wakeup.everyone and not wakeup.keys:
            return
        self.ledger.observe(self._state, wakeup, now=self._clock(), wall=time.time())
        self._parking.wake(wakeup)
        self._streams.woken(wakeup)
        self.heap.check(self._state)  # a generation that ended: its sessions' leftovers may be garbage now
        self._streams.push_errors(wakeup)

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
                if late >= self._state.config.heartbeat_timeout:  # silent past the timeout itself
                    self._log_failures(self._state.coordinator_stalled(late, now=self._clock()))
                if self.on_stalled is not None and late >= self._state.config.heartbeat_timeout / 2:
                    self.on_stalled(late)
            due = loop.time() + self._check_interval
            self._log_failures(self._state.expire(now=self._clock()))
            self._wake()

    async def _watch_progress(self) -> None:
        """Ask the watchdog about every ``TICK_S``: push what it finds to every host, and act on a hang as
        ``on_hang`` says (the hosts behind fail, which ends the generation or the cluster)."""
        state = self._state
        while True:
            await asyncio.sleep(WATCH_TICK_S)
            now = self._clock()
            self.ledger.tick(time.time())
            self.preemptions.tick(now)
            for last, lag in state.take_last_arrivals():
                self.watch.barrier_passed(last, lag, generation=state.generation, now=now)
            if state.failure is not None:
                continue
            verdicts, hang = self.watch.tick(now, state.generation)
            for verdict in verdicts:
                self.ledger.verdict(verdict.kind, time.time())
                self._streams.push_verdict(pb.HeartbeatResponse(watchdog=convert.verdict_pb(verdict)).SerializeToString())
                if verdict.kind == "hang":
                    self._on_hang(verdict.message)
            if hang is not None:
                self._log_failures(state.hung(hang.tasks, hang.cause, final=hang.final, now=now))
                self._wake()

    def _notice(self, session: SessionStream, caller: TaskRef, request: pb.PreemptionNotice) -> None:
        """A host's own notice: recorded and pushed to every host, answered with the notice as recorded (or
        refused: a host that is no longer live, a malformed notice; the stream goes on)."""
        try:
            notice = self.preemptions.notice(caller, request, now=self._clock())
        except Refused as refused:
            session.send(wire.outcome_refused(request.request_id, refused))
            return
        answer = pb.HeartbeatResponse(request_id=request.request_id, notice=convert.notice_pb(notice, self._clock(), 0.0))
        session.send(answer.SerializeToString())

    def _dump(self, session: SessionStream, request: pb.StreamDump) -> None:
        """A dump asked for on a session: order it (or join the one being collected), answer with the report."""
        report = self.black_box.order(request.timeout_seconds, request.reason or "asked with `tpuctl dump`")
        request_id = request.request_id

        def answer(done: asyncio.Future[dict[str, object]]) -> None:
            if done.cancelled():
                return
            document = report_document(done.result())
            session.send(
                pb.HeartbeatResponse(request_id=request_id, black_box=pb.BlackBoxReport(document=document))
                .SerializeToString()
            )

        report.add_done_callback(answer)

    def order_dump(self, reason: str, timeout: float = 0.0) -> asyncio.Future[dict[str, object]]:
        """Order every host's black-box dump now (the entry point of a bench); the future report."""
        return self.black_box.order(timeout, reason)

    def _on_hang(self, message: str) -> None:
        """A hang declared: every host's stacks, the report in this log, ordered ``HANG_DUMP_AFTER_S`` after
        the verdict (whose push to every host goes first: a pod's digests would compete with it). Never on
        the step path."""

        def order() -> None:
            if self._watching is None:  # stopped meanwhile
                return
            report = self.black_box.order(0.0, f"watchdog: {message[:120]}")
            report.add_done_callback(lambda done: None if done.cancelled() else self.black_box.log_report(done.result()))

        asyncio.get_running_loop().call_later(HANG_DUMP_AFTER_S, order)

    def step_down(self, moved: Moved, cause: str) -> bool:
        """Step down for task ``moved.task``'s service (``CoordinationState.step_down``): every host hears
        where the cluster went, now. False when the cluster was in error already (nothing sent)."""
        if self._state.step_down(moved, cause) is None:
            return False
        log.warning("the coordinator steps down: %s", cause)
        self._wake()
        return True

    def _log_failures(self, failures: tuple[TaskFailure, ...]) -> None:
        for failure in failures[:SAMPLE]:
            log.warning("%s failed: %s", failure.task, failure.cause)
        if len(failures) > SAMPLE:
            log.warning("... and %d more tasks failed (`tpuctl status --json` lists all)", len(failures) - SAMPLE)
