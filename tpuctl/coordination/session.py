"""One host's session with the coordinator: a single stream for its heartbeats, barriers, gathers, the wait
for every host and the cluster's error (``Session``, made by ``CoordinationClient.open_session`` or
``CoordinationClient.session``)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn

import grpc

from tpuctl.coordination import convert
from tpuctl.coordination.calls import (
    CONFIRM_GRACE_S,
    RETRY_DELAYS_S,
    STATUS_BY_VALUE,
    WITHDRAW_ANSWER_S,
    WITHDRAW_GRACE_S,
    Waiting,
    finished,
    progress_interval,
    report,
    seconds_until,
    within,
)
from tpuctl.coordination.values import (
    ClusterFailure,
    Membership,
    RegistrationProgress,
    RendezvousKind,
    RendezvousProgress,
    keepalive_window,
    sample_text,
)
from tpuctl.errors import ClusterError, CoordinatorUnreachable, DeadlineError, TpuctlError
from tpuctl.messages import count, shown
from tpuctl.proto import coordination_pb2 as pb

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from tpuctl.coordination.client import CoordinationClient
    from tpuctl.preemption.notice import AgreementHeard, NoticeHeard
    from tpuctl.watchdog.judge import Verdict
    from tpuctl.watchdog.pace import PaceReport

log = logging.getLogger("tpuctl.coordination")

LOST_ANSWER_S = 2.0
"""How long a barrier whose answer a broken stream lost asks the service what became of it, at least (its
own timeout may be longer), while its arrival still counts in an open instance: the service withdraws it
once it sees the old stream end."""
LOST_ANSWER_POLL_S = 0.2
REARRIVALS = 3
"""How many times a barrier arrival withdrawn with a broken stream arrives again on the session's next one
(within the call's own timeout): a blip the session rides out does not fail the barriers waiting on it."""
MIN_LEFT_S = 0.05
"""The least timeout an arrival sent again asks for (its call's own is nearly out)."""


class Session:
    """One host's session with the coordinator: one stream (``HeartbeatStream``) carries
    its heartbeats, its barrier arrivals and its error watch, so the service holds one call per host
    instead of a stream, a parked error poll and a parked barrier, and answers a passed barrier with one
    write per host. Made by ``CoordinationClient.session``.

    ``run()`` heartbeats until cancelled, exactly as ``heartbeat_loop`` (the same confirmations, the same
    deadlines: a frozen or cut-off coordinator is noticed within ``give_up_after + CONFIRM_GRACE_S`` s of
    the last confirmation; an unreachable one is ridden out for ``give_up_after`` s by reopening the
    stream) and raises as it does. One reader task per stream sorts what comes back: confirmations,
    barrier outcomes (by request id) and the cluster's error.

    While it runs: ``barrier`` and ``gather`` (as ``CoordinationClient.barrier`` and ``gather``; an
    arrival in flight when the stream breaks is never counted twice: a barrier's asks what became of it
    (``_lost_answer``) and, withdrawn with the old stream, arrives again on the new one; one
    whose own timeout runs out, or that is cancelled, is withdrawn: ``_arrive_or_withdraw``) and
    ``watch_errors`` (the cluster's
    error, pushed once; sent again on a reopened stream). When ``run`` ends, every waiting call fails
    with its error."""

    def __init__(
        self,
        client: CoordinationClient,
        membership: Membership,
        *,
        interval: float | None = None,
        give_up_after: float | None = None,
    ) -> None:
        self._client = client
        self.membership = membership
        self.interval = interval or membership.heartbeat_timeout / 3
        self.give_up_after = give_up_after or membership.heartbeat_timeout
        keepalive = client.keepalive
        self.keepalive_window = keepalive_window(keepalive) if keepalive else None
        """Once a stream's first heartbeat is confirmed, the channel's pings vouch for the coordinator
        (no more heartbeat messages) when they notice a dead one within half of ``give_up_after``; None:
        heartbeat messages every ``interval`` s, every few confirmed."""
        if self.keepalive_window is not None and self.keepalive_window > self.give_up_after / 2:
            self.keepalive_window = None
        self._call: Any = None
        self._adopted: Any = None
        """The stream ``open_session`` registered on: the first stream ``run`` uses (already confirmed)."""
        self._write_lock = asyncio.Lock()  # gRPC: one write at a time on a call
        self._opened = asyncio.Event()  # set while a stream is up (its first message sent)
        self._pending: dict[int, asyncio.Future[pb.HeartbeatResponse]] = {}
        self._calls: dict[int, str] = {}  # what each pending request is, for its refusal's message
        self._ids = itertools.count(1)
        self._confirm: asyncio.Future[None] | None = None
        self._watching = False
        self._failure: asyncio.Future[ClusterFailure] = asyncio.get_running_loop().create_future()
        self._ended: TpuctlError | None = None
        self._broke: TpuctlError | None = None  # why the last stream broke (its waiting barriers wait)
        self.on_verdict: Callable[[Verdict], None] | None = None
        """Called with each watchdog finding the service pushes (to a session that watches errors)."""
        self.on_dump: Callable[[pb.DumpOrder], None] | None = None
        """Called with each black-box dump order the service pushes (answered with ``answer_dump``)."""
        self.on_notice: Callable[[NoticeHeard], None] | None = None
        """Called with each preemption notice the service pushes (any host's, this one's too)."""
        self.on_agreement: Callable[[AgreementHeard], None] | None = None
        """Called with the agreement on a checkpoint step, once the service decided it."""
        self._reopened = 0  # how many times ``_broken`` failed the requests of a broken stream
        self._withdrawing: set[asyncio.Task[None]] = set()  # withdrawals of cancelled arrivals, until answered

    @property
    def ended(self) -> TpuctlError | None:
        """Why ``run`` ended (None while it runs)."""
        return self._ended

    async def run(self) -> NoReturn:
        client, membership = self._client, self.membership
        interval, give_up_after = self.interval, self.give_up_after
        confirmed = [time.monotonic()]
        attempt = 0
        try:
            while True:
                try:
                    await self._stream(max(1, int(give_up_after / (3 * interval))), confirmed)
                except (ClusterError, DeadlineError) as exc:
                    if isinstance(exc, ClusterError) and not isinstance(exc, CoordinatorUnreachable):
                        await client.raise_if_restarted(membership.service_incarnation, exc)
                        raise
                    silent = time.monotonic() - confirmed[0]
                    if silent > give_up_after:
                        raise client.unconfirmed(silent, give_up_after, exc) from exc
                    log.warning("heartbeat failed (will retry): %s", exc.message)
                    await asyncio.sleep(min(interval, RETRY_DELAYS_S[min(attempt, len(RETRY_DELAYS_S) - 1)]))
                    attempt += 1
        except TpuctlError as exc:
            self._end(exc)
            raise
        except BaseException:
            self._end(ClusterError(f"task {membership.task.task_id}: the session with {client.target} was closed"))
            raise

    async def barrier(self, name: str, **waiting: Unpack[Waiting]) -> int:
        """``CoordinationClient.barrier`` for this session's task, on the stream: the same outcomes and
        errors. Waits up to ``rpc_timeout`` for the stream to be up."""
        arrival = _barrier_arrival(name)
        response = await self._rendezvous("barrier", name, arrival, waiting)
        return int(response.instance)

    async def gather(self, name: str, value: bytes, **waiting: Unpack[Waiting]) -> list[bytes]:
        """``CoordinationClient.gather`` for this session's task, on the stream: the same
        values, checks, progress and errors, without a call of its own in the service while it waits."""
        arrival = _gather_arrival(name, value)
        response = await self._rendezvous("gather", name, arrival, waiting)
        if not response.HasField("gathered"):
            raise ClusterError(f"the coordinator at {self._client.target} answered gather {shown(name)} without its table")
        return convert.gather_values(response.gathered)  # inflated to at most the size the service allows

    async def _rendezvous(
        self, kind: RendezvousKind, name: str, arrival: Callable[[int, float], pb.HeartbeatRequest], waiting: Waiting
    ) -> pb.HeartbeatResponse:
        """A barrier or gather arrival on the stream, with the unary calls' deadline and progress polls."""
        response: pb.HeartbeatResponse = await self._client.with_progress(
            self._arrive_or_withdraw(arrival, kind, name, waiting.get("timeout")),
            f"{kind} {shown(name)}", self.membership.task, name, kind, waiting,
        )  # fmt: skip
        return response

    async def watch_errors(self) -> ClusterFailure:
        """The cluster's error, once there is one (the service pushes it on the stream). Raises the
        session's error if it ends first."""
        if not self._watching:
            self._watching = True
            if self._opened.is_set() and self._ended is None:
                await self._send_watch()
        return await asyncio.shield(self._failure)

    # --- plumbing ------------------------------------------------------------------------------------

    async def report_pace(self, report: PaceReport) -> bool:
        """Send this host's job pace to the watchdog (never answered). False when it did not leave: the
        stream is reconnecting or broke under the write (the caller sends it again later)."""
        return await self._send_unanswered(convert.pace_pb(report), "StepReport")

    async def report_checkpoint(
        self, generation: int, next_step: int, *, unknown: bool = False, checkpointed: int = -1, saved: bool = False
    ) -> bool:
        """Send where this host's job stands in generation ``generation``'s agreement (never answered);
        False when it did not leave."""
        request = convert.checkpoint_report_pb(
            generation, next_step, unknown=unknown, checkpointed=checkpointed, saved=saved
        )
        return await self._send_unanswered(request, "CheckpointReport")

    async def send_notice(self, source: str, reason: str, deadline_seconds: float) -> NoticeHeard:
        """This host is going away: the service records the notice, pushes it to every host and answers
        with it as recorded. Raises the service's refusal (this host is no longer live: it failed, left, or
        its generation ended)."""

        def notice(request_id: int) -> pb.HeartbeatRequest:
            return convert.notice_request(source, reason, deadline_seconds, request_id)

        response = await self._arrive(notice, "PreemptionNotice", self._client.rpc_timeout)
        heard = convert.notice_heard(response.notice)
        if heard is None:
            raise ClusterError(f"the coordinator at {self._client.target} answered a preemption notice with bad times")
        return heard

    async def answer_dump(self, message: pb.StackDigest) -> bool:
        """Send this host's answer to a dump order (never answered); False when it did not leave."""
        return await self._send_unanswered(pb.HeartbeatRequest(stacks=message), "StackDigest")

    async def _send_unanswered(self, request: pb.HeartbeatRequest, call: str) -> bool:
        """Write a message the service does not answer; False (logged at debug) when it did not leave."""
        if not self._opened.is_set() or self._ended is not None:
            return False
        try:
            return await self._write(request, self._client.rpc_timeout, call, answer_if_ended=True)
        except TpuctlError as exc:
            log.debug("%s not sent: %s", call, exc.message)
            return False

    async def dump(self, timeout: float, reason: str = "") -> str:
        """Order every host's black-box dump and wait for the report (a JSON document, at most 64 KiB):
        every host answered, or ``timeout`` s passed in the service."""

        def asking(request_id: int) -> pb.HeartbeatRequest:
            return pb.HeartbeatRequest(dump=pb.StreamDump(request_id=request_id, timeout_seconds=timeout, reason=reason))

        response = await self._arrive(asking, "Dump", timeout + self._client.rpc_timeout)
        return response.black_box.document

    async def _arrive(
        self, build: Callable[[int], pb.HeartbeatRequest], call: str, wait: float
    ) -> pb.HeartbeatResponse:
        """A barrier or gather arrival on the stream, answered by request id within ``wait`` s."""
        started = time.monotonic()
        if self._ended is not None:
            raise self._ended
        if not self._opened.is_set():
            await self._until_open(self._client.rpc_timeout, call)
        return await self._request(build, call, started, started + wait)

    async def _arrive_or_withdraw(
        self, build: Callable[[int, float], pb.HeartbeatRequest], kind: RendezvousKind, name: str, timeout: float | None
    ) -> pb.HeartbeatResponse:
        """A barrier or gather arrival, answered by request id. It waits for its outcome for its own
        ``timeout`` (None or 0: the service's default, ``wait_bound``), and ``WITHDRAW_GRACE_S`` more for the
        service's verdict of an instance that ends then too; then it withdraws the arrival (``_withdraw``).
        Cancelled while it waits (its caller gave up), it withdraws it too, in the background
        (``_withdraw_abandoned``): an instance never passes with a host whose call is no longer there."""
        client = self._client
        call = f"{kind} {shown(name)}"
        started = time.monotonic()
        if self._ended is not None:
            raise self._ended
        if not self._opened.is_set():
            await self._until_open(client.rpc_timeout, call)
        own = timeout or client.wait_bound(None)
        request_id = next(self._ids)
        future: asyncio.Future[pb.HeartbeatResponse] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self._calls[request_id] = call
        stream, handed_off = self._call, False
        try:
            for again in range(REARRIVALS + 1):
                reopened = self._reopened
                write_by = seconds_until(started + own, client.rpc_timeout)
                # Arriving again, it asks for what is left of its own timeout: the service counts a round's
                # deadline from its first arrival, and this one may be the first to reach it (soak seed
                # 100316: every arrival was sent while the coordinator was cut off, and arrived again 1.8 s
                # later with its whole 2.3 s: the round stayed open past every caller's timeout).
                asked = (timeout or 0.0) if again == 0 else max(MIN_LEFT_S, started + own - time.monotonic())
                if not await self._write(build(request_id, asked), write_by, call, answer_if_ended=True):
                    if self._ended is not None:
                        raise self._ended
                    if self._reopened != reopened:
                        raise self._broke_while_sending(call)
                left = started + own + WITHDRAW_GRACE_S - time.monotonic()
                done, _ = await asyncio.wait({future}, timeout=max(0.01, left))  # never cancels the future
                if not done:
                    return await self._withdraw(request_id, future, stream, kind, name, own)
                try:
                    return future.result()
                except CoordinatorUnreachable as broke:
                    if self._ended is not None or self._reopened == reopened:
                        raise
                    answer = await self._lost_answer(request_id, kind, name, broke, started + own + WITHDRAW_GRACE_S)
                    if answer is not None:
                        return answer
                    if again == REARRIVALS or self._ended is not None or time.monotonic() >= started + own:
                        raise
                # Withdrawn as the old stream ended, while the session lives on (it rode out the break on a
                # new stream): arrive again there, as the caller's retry would, within the call's own timeout.
                log.info("%s: the session's stream broke under this host's arrival, which was withdrawn; arriving again", call)
                self._forget(request_id, future)
                request_id = next(self._ids)
                future = asyncio.get_running_loop().create_future()
                self._pending[request_id] = future
                self._calls[request_id] = call
                stream = self._call
            raise AssertionError("unreachable: the last re-arrival returns or raises")
        except asyncio.CancelledError:
            if not future.done() and self._call is stream and stream is not None:
                handed_off = True  # the background withdrawal owns the request id from here
                withdrawing = self._withdraw_abandoned(request_id, future, stream, call)
                task = asyncio.get_running_loop().create_task(withdrawing)
                self._withdrawing.add(task)
                task.add_done_callback(self._withdrawing.discard)
            raise
        finally:
            if not handed_off:
                self._forget(request_id, future)

    def _broke_while_sending(self, call: str) -> CoordinatorUnreachable:
        """The error of a request whose stream ended under its write (the session reopened since)."""
        return CoordinatorUnreachable(
            f"the session with the coordinator at {self._client.target} broke while sending {call}",
            hint="it may have restarted or been cut off; `tpuctl status` shows what it sees",
        )

    async def _lost_answer(
        self, request_id: int, kind: RendezvousKind, name: str, broke: CoordinatorUnreachable, deadline: float
    ) -> pb.HeartbeatResponse | None:
        """The stream broke under a barrier or gather arrival before its answer came, and a new one is up:
        ask the service what became of it, by its request id. Passed (the answer was on its way when the
        stream broke): the instance number (and a gather's table), as every host hears. Failed: that failure.
        No longer counted (the service withdrew it as the stream ended): None, and the caller arrives again
        on the new stream, joining the instance where the others wait. Still counted and open (the service
        has not seen the old stream end yet): asked again, until ``deadline`` (the call's own) and
        ``LOST_ANSWER_S`` at least. One small call per try, and only after a break."""
        deadline = max(deadline, time.monotonic() + LOST_ANSWER_S)
        while True:
            try:
                outcome = await self._client.call_outcome(self.membership.task, name, request_id, kind=kind)
            except CoordinatorUnreachable:
                raise broke from None
            if outcome.passed:
                if kind == "gather" and not outcome.HasField("gathered"):
                    raise broke  # an older v17 service answers without the table: fail as before
                log.info("%s %s #%d passed as this host's session broke: its answer was asked again", kind, shown(name),
                         outcome.instance)  # fmt: skip
                answer = pb.HeartbeatResponse(request_id=request_id, instance=outcome.instance)
                if kind == "gather":
                    answer.gathered.CopyFrom(outcome.gathered)
                return answer
            if not outcome.counted:
                return None
            if time.monotonic() >= deadline:
                raise broke
            await asyncio.sleep(LOST_ANSWER_POLL_S)

    async def _withdraw(
        self, request_id: int, future: asyncio.Future[pb.HeartbeatResponse], stream: Any, kind: RendezvousKind,
        name: str, timeout: float,
    ) -> pb.HeartbeatResponse:  # fmt: skip
        """The arrival's own timeout ran out unanswered: withdraw it. The service's one answer to the arrival
        decides: the outcome if the instance was decided first (a pass wins: returned; a failure: raised),
        else ``withdrawn``, raised as this call's timeout, naming who was still missing."""
        call = f"{kind} {shown(name)}"
        if self._call is stream:  # else the stream it was sent on ended, and the service withdrew it then
            await self._send_withdraw(request_id, call)
        done, _ = await asyncio.wait({future}, timeout=WITHDRAW_ANSWER_S)
        if not done:
            raise DeadlineError(
                f"the coordinator at {self._client.target} did not answer {call} within {timeout:.1f} s, this "
                f"call's timeout, nor the withdrawal of this host's arrival within {WITHDRAW_ANSWER_S:.0f} s more",
                hint="it may be overloaded, frozen or cut off from this host; the arrival is withdrawn when this "
                "host's session ends; `tpuctl status` shows what the coordinator sees",
            )
        response = future.result()  # raises a failure decided first, or the broken session's error
        if response.HasField("withdrawn"):
            found = convert.rendezvous_progress(response.withdrawn, kind=kind, name=name)
            assert found is not None
            raise withdrawn_error(found, timeout)
        return response

    async def _withdraw_abandoned(
        self, request_id: int, future: asyncio.Future[pb.HeartbeatResponse], stream: Any, call: str
    ) -> None:
        """The arrival's caller went away (cancelled): withdraw it, and log what became of it (a pass that
        reached the service first still stands: the log says so, as nobody is listening any more)."""
        try:
            if self._call is stream:
                await self._send_withdraw(request_id, call)
            done, _ = await asyncio.wait({future}, timeout=WITHDRAW_ANSWER_S)
            if not done:
                log.warning("%s: its caller gave up; the withdrawal of this host's arrival was not answered", call)
                return
            try:
                response = future.result()
            except TpuctlError as exc:
                log.info("%s: its caller gave up: %s", call, exc.message)
                return
            if response.HasField("withdrawn"):
                instance = response.withdrawn.instance
                log.info("%s #%d: its caller gave up; this host's arrival was withdrawn", call, instance)
            else:
                instance = response.gathered.instance if response.HasField("gathered") else response.instance
                log.warning(
                    "%s #%d passed after its caller gave up (every host was there before the withdrawal reached "
                    "the coordinator): it counts, and this host's next call to the name joins #%d",
                    call, instance, instance + 1,
                )  # fmt: skip
        finally:
            self._forget(request_id, future)

    async def _send_withdraw(self, request_id: int, call: str) -> None:
        """Ask the service to take back the arrival sent with ``request_id``; a stream that ended under the
        write withdrew it anyway (the service withdraws a closed stream's arrivals)."""
        request = pb.HeartbeatRequest(withdraw=pb.StreamWithdraw(request_id=request_id))
        with contextlib.suppress(TpuctlError):
            await self._write(request, self._client.rpc_timeout, f"the withdrawal of {call}", answer_if_ended=True)

    def _forget(self, request_id: int, future: asyncio.Future[pb.HeartbeatResponse]) -> None:
        self._pending.pop(request_id, None)
        self._calls.pop(request_id, None)
        if future.done() and not future.cancelled():
            future.exception()  # retrieved: no "never retrieved" warning for an abandoned wait

    async def wait_for_all(
        self,
        *,
        timeout: float,
        progress: Callable[[RegistrationProgress], Awaitable[None] | None] | None = None,
        progress_every: float = 1.0,
    ) -> None:
        """``CoordinationClient.wait_for_all`` for this session's task, on the stream: the
        same progress, pacing, answers and errors, without a call per host in the service."""
        started = time.monotonic()
        every = progress_interval(progress_every, self.membership.num_tasks)
        while True:
            left = started + timeout - time.monotonic()
            if left <= 0:
                raise DeadlineError(f"registration not complete after waiting {timeout:.1f} s")
            poll = min(every, left)
            if self._ended is not None:
                raise self._ended
            if not self._opened.is_set():  # reopening: the session rides out a cut for give_up_after
                await self._until_open(max(0.01, min(left, self.give_up_after + CONFIRM_GRACE_S)), "WaitForAllTasks")

            def waiting(request_id: int, poll: float = poll) -> pb.HeartbeatRequest:
                return pb.HeartbeatRequest(wait_for_all=pb.StreamWaitForAll(request_id=request_id, max_wait_seconds=poll))

            now = time.monotonic()
            try:
                response = await self._request(waiting, "WaitForAllTasks", now, now + poll + self._client.rpc_timeout)
            except CoordinatorUnreachable:
                if self._ended is not None:
                    raise self._ended from None
                await asyncio.sleep(RETRY_DELAYS_S[0])
                continue  # the stream broke under the wait (it is idempotent): ask again on the next one
            if response.registration.complete:
                return
            current = convert.progress(response.registration)
            every = progress_interval(progress_every, current.total)
            if progress is not None:
                await report(progress(current))

    async def _request(
        self, build: Callable[[int], pb.HeartbeatRequest], call: str, started: float, deadline: float
    ) -> pb.HeartbeatResponse:
        """Send ``build(request_id)`` (a new request id) and await its answer until ``deadline``."""
        client = self._client
        request_id = next(self._ids)
        request = build(request_id)
        future: asyncio.Future[pb.HeartbeatResponse] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self._calls[request_id] = call
        try:
            reopened = self._reopened
            if not await self._write(request, seconds_until(deadline, client.rpc_timeout), call, answer_if_ended=True):
                # The stream ended under the write, as under an arrival already sent: the answer is the
                # session's verdict (``_broken``, ``_end``), unless that came before the write failed.
                if self._ended is not None:
                    raise self._ended
                if self._reopened != reopened:
                    raise self._broke_while_sending(call)
            left = deadline - time.monotonic()
            try:
                return await within(future, max(0.01, left))  # the future is this call's alone
            except asyncio.TimeoutError:
                raise DeadlineError(
                    f"the coordinator at {client.target} did not answer {call} within "
                    f"{time.monotonic() - started:.1f} s",
                    hint="it may be overloaded or stuck; `tpuctl status` shows what it sees",
                ) from None
        finally:
            self._pending.pop(request_id, None)
            self._calls.pop(request_id, None)
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: no "never retrieved" warning for an abandoned wait

    async def _until_open(self, limit: float, call: str) -> None:
        ended: asyncio.Future[Any] = asyncio.ensure_future(asyncio.shield(self._failure))
        opened: asyncio.Future[Any] = asyncio.ensure_future(self._opened.wait())
        try:
            await asyncio.wait({ended, opened}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
            opened.cancel()
        if self._ended is not None:
            raise self._ended
        if not self._opened.is_set():
            raise CoordinatorUnreachable(
                f"{call}: no session with the coordinator at {self._client.target} within {limit:.1f} s",
                hint="check that task 0's agent runs and is reachable from this host",
            )

    async def _send_watch(self) -> None:
        with contextlib.suppress(TpuctlError):  # a broken stream: the next one sends it again
            await self._write(pb.HeartbeatRequest(watch_errors=True), self._client.rpc_timeout, "HeartbeatStream")

    async def _write(
        self, request: pb.HeartbeatRequest, timeout: float, call: str, *, answer_if_ended: bool = False
    ) -> bool:
        """Write ``request`` on the current stream (True). A stream that ended under the write raises its
        call's status as an error, or with ``answer_if_ended`` returns False: the stream's reader tells
        the session why it ended (gRPC's own status for such a write can be a bare INTERNAL)."""
        stream = self._call
        if stream is None:
            raise CoordinatorUnreachable(f"{call}: the session with {self._client.target} is reconnecting")
        try:
            async with self._write_lock:
                await within(stream.write(request), timeout)
            return True
        except grpc.aio.AioRpcError as exc:
            if answer_if_ended:
                return False
            raise self._client.error_of(exc, call, self._client.rpc_timeout) from exc
        except asyncio.InvalidStateError as exc:  # written to a call the service already ended
            if answer_if_ended:
                return False
            raise self._client.error_of(await finished(stream), call, self._client.rpc_timeout) from exc
        except asyncio.TimeoutError as exc:
            raise DeadlineError(
                f"the coordinator at {self._client.target} took no {call} message within {timeout:.1f} s",
                hint="it may be frozen, overloaded or cut off from this host; check task 0's host and its agent log",
            ) from exc

    async def _stream(self, confirm_every: int, confirmed: list[float]) -> NoReturn:
        """One stream until it fails: heartbeats every ``interval`` s, every ``confirm_every``-th one
        confirmed (the first too); ``confirmed[0]``: when the service last confirmed one."""
        client, membership, give_up = self._client, self.membership, self.give_up_after
        adopted, self._adopted = self._adopted, None
        call = adopted or client.stub.HeartbeatStream(metadata=client.metadata, wait_for_ready=False)
        self._call = call
        reader: asyncio.Future[Any] = asyncio.ensure_future(self._read(call))
        loop = asyncio.get_running_loop()
        first = pb.HeartbeatRequest(
            task=convert.task_ref_pb(membership.task), service_incarnation=membership.service_incarnation, ack=True
        )
        sent = 0
        waited_from = time.monotonic()
        try:
            if adopted is not None:  # registered on it (``open_session``): its first heartbeat, confirmed
                sent = 1
                self._opened.set()
                if self._watching:
                    await self._send_watch()
                if self.keepalive_window is not None:
                    await self._kept_alive(reader, confirmed)
                done, _ = await asyncio.wait({reader}, timeout=self.interval)
                if done:
                    reader.result()
            while True:
                now = time.monotonic()
                ask = sent % confirm_every == 0
                if sent == 0:
                    request = first
                else:
                    request = pb.HeartbeatRequest(ack=ask, service_incarnation=membership.service_incarnation)
                sent += 1
                # Due by the last confirmation + give_up (+ grace); a heartbeat sent long after it (an
                # interval over the timeout) gets half the timeout. Never more than the rpc_timeout.
                deadline = max(confirmed[0] + give_up + CONFIRM_GRACE_S, now + give_up / 2)
                waited_from = now
                if ask:
                    self._confirm = loop.create_future()
                await self._write(request, seconds_until(deadline, client.rpc_timeout), "HeartbeatStream")
                if sent == 1:
                    self._broken()  # arrivals of the broken stream: their outcomes went with it
                    self._opened.set()
                    if self._watching:
                        await self._send_watch()
                if ask:
                    assert self._confirm is not None
                    either: set[asyncio.Future[Any]] = {self._confirm, reader}
                    done, _ = await asyncio.wait(
                        either, timeout=seconds_until(deadline, client.rpc_timeout),
                        return_when=asyncio.FIRST_COMPLETED,
                    )  # fmt: skip
                    if reader in done:
                        reader.result()  # raises why the stream ended
                    if not self._confirm.done():
                        raise asyncio.TimeoutError
                    confirmed[0] = time.monotonic()
                    if self.keepalive_window is not None:
                        await self._kept_alive(reader, confirmed)
                done, _ = await asyncio.wait({reader}, timeout=self.interval)
                if done:
                    reader.result()
        except asyncio.TimeoutError as exc:
            self._broke = DeadlineError(
                f"the coordinator at {client.target} did not confirm a heartbeat within "
                f"{time.monotonic() - waited_from:.1f} s",
                hint="it may be frozen, overloaded or cut off from this host; check task 0's host and its agent log",
            )
            raise self._broke from exc
        except TpuctlError as exc:
            self._broke = exc
            raise
        finally:
            self._opened.clear()
            self._call = None
            reader.cancel()
            call.cancel()

    async def _kept_alive(self, reader: asyncio.Future[Any], confirmed: list[float]) -> NoReturn:
        """The stream is confirmed and the channel's keepalive pings vouch for the coordinator: no
        heartbeat messages, only the reader, until the stream ends (gRPC closes the connection when a
        ping goes unanswered). The coordinator was last vouched for a keepalive window before that at
        the latest: ``confirmed[0]``, from which ``give_up_after`` counts."""
        assert self.keepalive_window is not None
        try:
            await reader
        finally:
            confirmed[0] = max(confirmed[0], time.monotonic() - self.keepalive_window)
        raise AssertionError("the stream's reader returned")  # it only ever raises

    async def _read(self, call: Any) -> NoReturn:
        """Sort what the stream answers until it ends; raises why it ended (a ``TpuctlError``)."""
        client, pending = self._client, self._pending
        expected = self.membership.service_incarnation
        try:
            while True:
                response = await call.read()
                if not isinstance(response, pb.HeartbeatResponse):  # EOF: the service ended the stream
                    ended = await finished(call)
                    if ended.code() is not grpc.StatusCode.OK:
                        raise client.error_of(ended, "HeartbeatStream", client.rpc_timeout)
                    raise ClusterError(f"the coordinator at {client.target} ended the heartbeat stream")
                if response.request_id:
                    future = pending.pop(response.request_id, None)
                    if future is not None and not future.done():
                        if response.code:
                            future.set_exception(self._refusal(response, self._calls.get(response.request_id, "")))
                        else:
                            future.set_result(response)
                elif response.HasField("notice"):
                    heard = convert.notice_heard(response.notice)
                    if heard is not None and self.on_notice is not None:
                        self.on_notice(heard)
                elif response.HasField("agreement"):
                    if self.on_agreement is not None:
                        self.on_agreement(convert.agreement_heard(response.agreement))
                elif response.HasField("dump_order"):
                    if self.on_dump is not None:
                        self.on_dump(response.dump_order)
                elif response.HasField("watchdog"):
                    if self.on_verdict is not None:
                        self.on_verdict(convert.verdict(response.watchdog))
                elif response.HasField("failure"):
                    if not self._failure.done():
                        self._failure.set_result(convert.cluster_failure(response.failure))
                elif response.code:  # the error watch was refused
                    if not self._failure.done():
                        error = self._refusal(response, "the error watch")
                        await client.raise_if_restarted(expected, error)
                        self._failure.set_exception(error)
                else:  # a heartbeat confirmation
                    if response.service_incarnation != expected:
                        raise client.restart_error(int(response.service_incarnation), expected)
                    if self._confirm is not None and not self._confirm.done():
                        self._confirm.set_result(None)
        except grpc.aio.AioRpcError as exc:
            raise client.error_of(exc, "HeartbeatStream", client.rpc_timeout) from exc

    def _refusal(self, response: pb.HeartbeatResponse, call: str) -> TpuctlError:
        code = STATUS_BY_VALUE.get(response.code, grpc.StatusCode.UNKNOWN)
        client = self._client
        return convert.error_from_status(
            code, response.details, response.hint or None, target=client.target, call=call, timeout=client.rpc_timeout,
            failure=response.failure if response.HasField("failure") else None,
        )  # fmt: skip

    def _broken(self, error: TpuctlError | None = None) -> None:
        """A stream broke and a new one is up (or the session ended, ``error``): the barriers that waited
        on the broken one fail (their arrivals may have been counted; never sent twice). Until then they
        wait, so that a coordinator that stays unreachable or frozen fails them with the session's verdict."""
        broke, self._broke = self._broke, None
        if error is None and broke is None:
            return
        self._reopened += 1
        pending = list(self._pending.values())
        self._pending.clear()  # in place: the reader holds this dict
        if error is None and broke is not None:
            error = CoordinatorUnreachable(
                f"the session with the coordinator at {self._client.target} broke while the call waited: "
                f"{broke.message}",
                hint=broke.hint,
            )
        for future in pending:
            if not future.done() and error is not None:
                future.set_exception(error)

    def _end(self, error: TpuctlError) -> None:
        self._ended = error
        self._broken(error)
        if not self._failure.done():
            self._failure.set_exception(error)
            self._failure.exception()  # retrieved here: nobody may be watching


def withdrawn_error(found: RendezvousProgress, timeout: float) -> DeadlineError:
    """A call whose own timeout ran out before its instance passed, its arrival withdrawn (exit 4)."""
    label = f"{found.kind} {shown(found.name)}"
    return DeadlineError(
        f"{label} #{found.instance} did not pass within this call's timeout of {timeout:.1f} s: "
        f"{count(found.arrived)} of {count(found.total)} hosts had arrived, this one included; missing: "
        f"{sample_text(found.missing, found.missing_count)}; this host's arrival was withdrawn",
        hint=f"the other hosts wait at #{found.instance} for up to {found.seconds_left:.0f} s more, and this host's "
        f"next call to {shown(found.name)} joins it again (a retry is safe); the missing hosts' logs say why "
        "they are late",
    )


def _barrier_arrival(name: str) -> Callable[[int, float], pb.HeartbeatRequest]:
    """A barrier arrival asking for ``timeout`` s (0: the service's default)."""

    def arrival(request_id: int, timeout: float) -> pb.HeartbeatRequest:
        return pb.HeartbeatRequest(barrier=pb.StreamBarrier(request_id=request_id, name=name, timeout_seconds=timeout))

    return arrival


def _gather_arrival(name: str, value: bytes) -> Callable[[int, float], pb.HeartbeatRequest]:
    def arrival(request_id: int, timeout: float) -> pb.HeartbeatRequest:
        return pb.HeartbeatRequest(
            gather=pb.StreamGather(request_id=request_id, name=name, value=value, timeout_seconds=timeout)
        )

    return arrival
