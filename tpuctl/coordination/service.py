"""The gRPC servicer: converts requests, asks the state machine, and parks calls that must wait.

All deciding happens in ``state.CoordinationState``; this module owns only what needs asyncio: a call
that gets ``Pending`` parks on its wait key until the state wakes that key or the deadline comes, then
asks again. A watchdog task calls ``expire`` every ``check_interval`` seconds so a silent task is
declared failed at most that long after its heartbeat timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from tpuctl.coordination import convert
from tpuctl.coordination.state import (
    ERRORS,
    REGISTRATION,
    ClusterFailure,
    CoordinationState,
    Pending,
    Reason,
    Refused,
    RegistrationProgress,
    TaskFailure,
    WaitKey,
    Wakeup,
    barrier_key,
    kv_key,
)
from tpuctl.proto import coordination_pb2 as pb
from tpuctl.proto import coordination_pb2_grpc as pb_grpc

log = logging.getLogger("tpuctl.coordination")

MAX_POLL_S = 60.0
"""Longest a long poll (registration progress, error poll) is held before answering "nothing yet"."""
CHECK_INTERVAL_S = 0.25
"""How often the watchdog looks for silent tasks: failure detection lags the timeout by at most this."""

# Refusals that mean a host is misconfigured or a process is duplicated: worth a warning in the log.
_MEMBERSHIP_REFUSALS = {
    Reason.VERSION_MISMATCH,
    Reason.WRONG_CLUSTER,
    Reason.UNKNOWN_TASK,
    Reason.TASK_TAKEN,
    Reason.STALE_INCARNATION,
}

_T = TypeVar("_T")
_Request = TypeVar("_Request")
_Response = TypeVar("_Response")
_Method = Callable[["CoordinationServicer", _Request, Any], Awaitable[_Response]]


@dataclass
class _Slot:
    event: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: int = 0


class _Parking:
    """Where waiting calls sleep: one event per wait key, set and dropped when the key is woken."""

    def __init__(self) -> None:
        self._slots: dict[WaitKey, _Slot] = {}

    async def park(self, key: WaitKey, timeout: float) -> None:
        """Sleep until ``key`` is woken or ``timeout`` seconds pass."""
        if timeout <= 0:
            return
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot()
        slot.waiters += 1
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(slot.event.wait(), timeout)
        finally:
            slot.waiters -= 1
            if not slot.waiters and self._slots.get(key) is slot:
                del self._slots[key]

    def wake(self, wakeup: Wakeup) -> None:
        keys = list(self._slots) if wakeup.everyone else wakeup.keys
        for key in keys:
            slot = self._slots.pop(key, None)
            if slot is not None:
                slot.event.set()


def _refusals_as_status(method: _Method[_Request, _Response]) -> _Method[_Request, _Response]:
    """Send a ``Refused`` as its gRPC status; wake whatever the call changed, however it ended."""

    @functools.wraps(method)
    async def handler(self: CoordinationServicer, request: _Request, context: Any) -> _Response:
        try:
            return await method(self, request, context)
        except Refused as refused:
            level = logging.WARNING if refused.reason in _MEMBERSHIP_REFUSALS else logging.INFO
            log.log(level, "refused %s from %s: %s", method.__name__, context.peer(), refused.message)
            await _abort(context, refused)
        finally:
            self._wake()

    return handler


async def _abort(context: Any, refused: Refused) -> NoReturn:
    await context.abort(
        convert.STATUS_CODES[refused.reason], refused.message, trailing_metadata=convert.hint_metadata(refused.hint)
    )
    raise RuntimeError("grpc.aio's context.abort returned instead of raising")


class CoordinationServicer(pb_grpc.CoordinationServiceServicer):
    """One cluster's coordination service. ``start`` the watchdog before serving, ``stop`` it after."""

    def __init__(self, state: CoordinationState, *, clock: Callable[[], float], check_interval: float) -> None:
        self._state = state
        self._clock = clock
        self._check_interval = check_interval
        self._parking = _Parking()
        self._watchdog: asyncio.Task[None] | None = None

    @property
    def state(self) -> CoordinationState:
        return self._state

    def start(self) -> None:
        self._watchdog = asyncio.create_task(self._watch_heartbeats(), name="tpuctl-coordination-watchdog")

    async def stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None

    # --- RPCs ----------------------------------------------------------------------------------------

    @_refusals_as_status
    async def RegisterTask(self, request: pb.RegisterTaskRequest, context: Any) -> pb.RegisterTaskResponse:
        membership = self._state.register(convert.registration(request, peer=context.peer()), now=self._clock())
        log.info(
            "task %d registered from %s (%s), incarnation %d",
            request.task_id,
            request.hostname,
            context.peer(),
            request.incarnation,
        )
        return convert.register_response(membership)

    @_refusals_as_status
    async def WaitForAllTasks(self, request: pb.WaitForAllTasksRequest, context: Any) -> pb.WaitForAllTasksResponse:
        caller = convert.task_ref(request.task)
        answer_by = self._clock() + _poll_seconds(request.max_wait_seconds)

        def check(now: float) -> RegistrationProgress | Pending:
            progress = self._state.registration_progress(caller, now=now)
            if progress.complete or now >= answer_by:
                return progress
            return Pending(min(answer_by, now + progress.seconds_left))

        return convert.progress_response(await self._wait(REGISTRATION, check))

    @_refusals_as_status
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatResponse:
        incarnation = self._state.heartbeat(convert.task_ref(request.task), now=self._clock())
        return pb.HeartbeatResponse(service_incarnation=incarnation)

    @_refusals_as_status
    async def ReportError(self, request: pb.ReportErrorRequest, context: Any) -> pb.ReportErrorResponse:
        failures = self._state.report_error(convert.task_ref(request.task), request.cause, now=self._clock())
        self._log_failures(failures)
        return pb.ReportErrorResponse()

    @_refusals_as_status
    async def PollForError(self, request: pb.PollForErrorRequest, context: Any) -> pb.PollForErrorResponse:
        caller = convert.task_ref(request.task)
        answer_by = self._clock() + _poll_seconds(request.max_wait_seconds)

        def check(now: float) -> ClusterFailure | Pending | None:
            failure = self._state.poll_error(caller, now=now)
            if failure is not None or now >= answer_by:
                return failure
            return Pending(answer_by)

        failure = await self._wait(ERRORS, check)
        if failure is None:
            return pb.PollForErrorResponse()
        return pb.PollForErrorResponse(failure=convert.cluster_failure_pb(failure))

    @_refusals_as_status
    async def Barrier(self, request: pb.BarrierRequest, context: Any) -> pb.BarrierResponse:
        caller = convert.task_ref(request.task)
        barrier = self._state.barrier_arrive(caller, request.name, request.timeout_seconds, now=self._clock())
        log.debug("task %d arrived at %s", caller.task_id, barrier)
        instance = await self._wait(barrier_key(barrier), lambda now: self._state.barrier_outcome(barrier, now=now))
        return pb.BarrierResponse(instance=instance)

    @_refusals_as_status
    async def KeyValueSet(self, request: pb.KeyValueSetRequest, context: Any) -> pb.KeyValueSetResponse:
        entry = request.entry
        self._state.kv_set(entry.key, entry.value, allow_overwrite=request.allow_overwrite, now=self._clock())
        return pb.KeyValueSetResponse()

    @_refusals_as_status
    async def KeyValueGet(self, request: pb.KeyValueGetRequest, context: Any) -> pb.KeyValueGetResponse:
        key, timeout, started = request.key, request.timeout_seconds, self._clock()
        value = await self._wait(
            kv_key(key), lambda now: self._state.kv_get(key, started=started, timeout=timeout, now=now)
        )
        return pb.KeyValueGetResponse(value=value)

    @_refusals_as_status
    async def KeyValueDir(self, request: pb.KeyValueDirRequest, context: Any) -> pb.KeyValueDirResponse:
        entries = self._state.kv_dir(request.prefix)
        return pb.KeyValueDirResponse(entries=[pb.KeyValue(key=k, value=v) for k, v in entries])

    @_refusals_as_status
    async def GetStatus(self, request: pb.GetStatusRequest, context: Any) -> pb.GetStatusResponse:
        return convert.status_response(self._state.status(now=self._clock()))

    @_refusals_as_status
    async def Disconnect(self, request: pb.DisconnectRequest, context: Any) -> pb.DisconnectResponse:
        caller = convert.task_ref(request.task)
        self._state.disconnect(caller, now=self._clock())
        log.info("task %d disconnected", caller.task_id)
        return pb.DisconnectResponse()

    # --- waiting -------------------------------------------------------------------------------------

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
        self._parking.wake(self._state.take_wakeup())

    async def _watch_heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self._check_interval)
            self._log_failures(self._state.expire(now=self._clock()))
            self._wake()

    def _log_failures(self, failures: tuple[TaskFailure, ...]) -> None:
        for failure in failures:
            log.warning("%s failed: %s", failure.task, failure.cause)


def _poll_seconds(requested: float) -> float:
    return min(max(requested, 0.0), MAX_POLL_S) if math.isfinite(requested) else MAX_POLL_S
