"""The coordination client: one ``grpc.aio`` channel to the coordinator, async methods for every call.

Every method is bounded: a call that waits in the service (registration, barrier, gather, key get, error
poll) gets an RPC deadline of its wait plus ``rpc_timeout``, so the service's own, more telling timeout
message wins; any other call gets ``rpc_timeout``. Calls fail fast when the coordinator is not there
(``wait_for_ready=False``); only ``register`` (hosts start in any order) and the background loops retry.

Failures surface as ``TpuctlError``s: ``CoordinatorUnreachable`` (no answer at the address),
``DeadlineError`` (a wait timed out; the message says how many hosts are missing and names the first
ten), ``ClusterError`` (the cluster is in error, or the call was refused), ``InputError`` (an unknown
task id or a bad argument, such as a name longer than 1,024 characters).

Progress callbacks poll the service at most every ``max(progress_every, hosts / PROGRESS_POLLS_PER_S)``
seconds, so a whole pod's progress lines cost the service a bounded number of small answers per second.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypedDict, TypeVar

import grpc

from tpuctl.coordination import convert
from tpuctl.coordination.calls import (
    PROGRESS_EVERY_S,
    RETRY_DELAYS_S,
    STATUS_BY_VALUE,
    Waiting,
    finished,
    progress_interval,
    report,
)
from tpuctl.coordination.channel import Channel
from tpuctl.coordination.plan import Plan, SliceShape
from tpuctl.coordination.session import Session
from tpuctl.coordination.values import (
    CREDENTIAL_BYTES,
    PROTOCOL_VERSION,
    ClusterFailure,
    ClusterStatus,
    Membership,
    RegistrationProgress,
    RendezvousKind,
    RendezvousProgress,
    TaskRef,
)
from tpuctl.errors import ClusterError, CoordinatorUnreachable, DeadlineError, InputError, TpuctlError
from tpuctl.messages import shown
from tpuctl.proto import coordination_pb2 as pb

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("tpuctl.coordination")
_T = TypeVar("_T")

WATCH_POLL_S = 55.0
"""How long one error poll is held by the service (it caps polls at 60 s). Each host's watch costs the
service one answer per poll, so a long poll keeps a pod's polls few a second. A dropped connection fails the poll at
once; a silent one after the poll plus ``rpc_timeout`` (the heartbeat loop notices sooner)."""
RESTART_PROBE_S = 2.0
"""How long a refused call waits for the coordinator's status, to tell a restarted coordinator's refusal."""


def new_incarnation() -> int:
    """A random non-zero 64-bit incarnation for this process."""
    return secrets.randbelow(2**64 - 1) + 1


class Registering(TypedDict, total=False):
    """What a registration says beyond its cluster and task id (``register``, ``open_session``)."""

    incarnation: int | None
    """This process's (default: a new random one)."""
    hostname: str | None
    """This host's name, shown in status and refusals (default: ``socket.gethostname()``)."""
    connect_timeout: float
    """Seconds to retry while nobody answers (default: 0, one attempt)."""
    with_tasks: bool
    """Also fetch every task's address into ``Membership.tasks``."""
    generation: int
    """The last generation this host was in (default: 0, none)."""
    previous_credential: bytes
    """The credential of this host's previous registration."""
    slice_shape: SliceShape | None
    """This host's slice as its backend found it (the service refuses one unlike the cluster's)."""
    spare: bool
    """This host is one of the spec's spares (``tpuctl init --spare``)."""
    previous_plan: Plan | None
    """The plan of ``generation`` as this host learnt it (a fresh service applies the majority rule to it)."""
    answered_before: bool
    """The coordinator answered this process before (an earlier generation): one that does not answer now
    stopped, and the error says so (``Channel.lost_hint``), not the start-up advice."""


class CoordinationClient(Channel):
    """A client of the coordination service at ``target`` ("host:port"): the channel's arguments
    (``channel.Channel``: token, TLS, call deadlines, keepalive), and async methods for every call.

    Task-scoped calls take the ``TaskRef`` that ``register`` returned (``Membership.task``): only the
    process holding it (or one it handed it to) may act for the task.

    Identity: ``register`` returns a ``Membership`` whose ``task`` carries the registration's credential
    (a secret only this registration got); task-scoped calls send it, so pass that ``TaskRef`` on. A
    ``TaskRef`` without it (another process's task id and incarnation) is refused. The client remembers
    its latest registration for ``kv_set``.
    """

    membership: Membership | None = None
    """The latest registration this client made (``register``'s answer)."""
    _retry_secret: tuple[int, bytes] = (0, b"")
    """The incarnation this client last registered with and the random bytes that prove a retry is
    this client's (another process that learns the incarnation cannot replay the registration)."""

    # --- membership ----------------------------------------------------------------------------------

    async def register(self, cluster: str, task_id: int, **registering: Unpack[Registering]) -> Membership:
        """Register as ``task_id`` of ``cluster``; retry for ``connect_timeout`` s while nobody answers.

        ``incarnation``: this process's (default: a new random one); registering again with the same one
        is idempotent, while another live process claiming the task is refused (``ClusterError``).
        ``with_tasks``: also fetch every task's address into ``Membership.tasks`` (O(hosts) bytes; the
        cluster spec usually has them). Refusals: ``ClusterError`` (wrong cluster, protocol version,
        cluster in error), ``InputError`` (unknown task id), ``DeadlineError`` (registration closed).

        ``generation``: the last generation this host was in (0: none); ``previous_credential``: the
        credential of this host's previous registration (a survivor re-registering after its generation
        ended, or a new process replacing its dead predecessor, whose registration then fails at once).
        The answer's ``Membership.generation`` is the generation registered into.
        """
        task, request = self._registration(cluster, task_id, registering)

        async def attempt() -> Membership:
            response = await self._call(self.stub.RegisterTask, request, "RegisterTask", self.rpc_timeout)
            return convert.membership(response, task)

        self.membership = await self._retrying(attempt, registering.get("connect_timeout", 0.0))
        return self.membership

    async def open_session(
        self,
        cluster: str,
        task_id: int,
        *,
        interval: float | None = None,
        give_up_after: float | None = None,
        **registering: Unpack[Registering],
    ) -> Session:
        """``register`` and ``session`` in one: the registration is the first message of
        the session's stream, so a host costs the service one call instead of two, and the answer is the
        session's first confirmed heartbeat. The same arguments, retries, answers and errors as
        ``register``; ``session.membership`` is the registration. ``await session.run()`` next (in a task
        of its own), then ``session.wait_for_all(...)``."""
        task, request = self._registration(cluster, task_id, registering)
        first = pb.HeartbeatRequest(register=request)
        contact = _Contact()

        async def attempt() -> tuple[Membership, Any]:
            call = self.stub.HeartbeatStream(metadata=self.metadata, wait_for_ready=False)
            try:
                await asyncio.wait_for(call.write(first), self.rpc_timeout)
                # A write completes only on a connected transport (a refused connection fails it): the
                # coordinator was there. If it goes silent now, it died or was cut off, not late to start.
                contact.reached = True
                response = await asyncio.wait_for(call.read(), self.rpc_timeout)
                if not isinstance(response, pb.HeartbeatResponse):  # EOF: refused, the status says why
                    raise self.error_of(await finished(call), "RegisterTask", self.rpc_timeout)
                if response.code:  # refused, with the cluster's final failure (``wire.outcome_refused``)
                    raise convert.error_from_status(
                        STATUS_BY_VALUE.get(response.code, grpc.StatusCode.UNKNOWN), response.details,
                        response.hint or None, target=self.target, call="RegisterTask", timeout=self.rpc_timeout,
                        failure=response.failure if response.HasField("failure") else None,
                    )  # fmt: skip
                if not response.HasField("registered"):
                    raise ClusterError(
                        f"the coordinator at {self.target} answered a registration on the session stream "
                        "with something else",
                        hint="every host and the coordinator must run the same tpuctl version",
                    )
                return convert.membership(response.registered, task), call
            except grpc.aio.AioRpcError as exc:
                call.cancel()
                raise self.error_of(exc, "RegisterTask", self.rpc_timeout) from exc
            except asyncio.InvalidStateError as exc:  # written to a call the service already ended
                raise self.error_of(await finished(call), "RegisterTask", self.rpc_timeout) from exc
            except asyncio.TimeoutError as exc:
                # Silent: frozen, cut off (a registration written into a connection the coordinator already
                # closed, unknown to this host while the network was down) or overloaded. Unreachable, not
                # a verdict: retried like a refused connection (after contact, for ``give_up_after`` at most).
                call.cancel()
                raise CoordinatorUnreachable(
                    f"the coordinator at {self.target} did not answer RegisterTask within {self.rpc_timeout:.1f} s",
                    hint=f"it may be frozen, cut off or overloaded; check task {self.coordinator_task}'s host and its agent log",
                ) from exc
            except BaseException:
                call.cancel()
                raise

        connect_timeout = registering.get("connect_timeout", 0.0)
        contact.before = registering.get("answered_before", False)
        membership, call = await self._retrying(attempt, connect_timeout, contact, give_up_after)
        self.membership = membership
        session = Session(self, membership, interval=interval, give_up_after=give_up_after)
        session._adopted = call
        return session

    def _registration(
        self, cluster: str, task_id: int, registering: Registering
    ) -> tuple[TaskRef, pb.RegisterTaskRequest]:
        task = TaskRef(task_id, registering.get("incarnation") or new_incarnation())
        if task.incarnation != self._retry_secret[0]:  # a new registration: new secret; a retry: the same
            self._retry_secret = (task.incarnation, secrets.token_bytes(CREDENTIAL_BYTES))
        request = pb.RegisterTaskRequest(
            protocol_version=PROTOCOL_VERSION,
            cluster_name=cluster,
            task_id=task_id,
            incarnation=task.incarnation,
            hostname=registering.get("hostname") or socket.gethostname(),
            with_tasks=registering.get("with_tasks", False),
            retry_secret=self._retry_secret[1],
            generation=registering.get("generation", 0),
            previous_credential=registering.get("previous_credential", b""),
            spare=registering.get("spare", False),
        )
        shape = registering.get("slice_shape")
        if shape is not None:
            request.slice_shape.CopyFrom(convert.slice_shape_pb(shape))
        previous = registering.get("previous_plan")
        if previous is not None:
            request.previous_plan.extend(convert.plan_pb(previous))
        return task, request

    async def _retrying(
        self,
        attempt: Callable[[], Awaitable[_T]],
        connect_timeout: float,
        contact: _Contact | None = None,
        lost_after: float | None = None,
    ) -> _T:
        """``attempt()`` until it answers, retrying for ``connect_timeout`` s while nobody answers.

        A coordinator that was reached (``contact.reached``, set by ``attempt``) and then stops answering
        is not late to start: it died, restarted or was cut off. From the first failure after contact the
        retries go on for ``lost_after`` s at most (the heartbeat timeout: as long as a session rides out
        an unreachable coordinator), so a host whose registration was in flight when the coordinator died
        fails as its registered peers do, not after the whole register timeout.

        Over TLS, a failed attempt asks why (``Channel.tls_refusal``, a plain handshake at most once a
        second): a certificate that cannot be accepted, on either side, raises ``TlsRefused`` at once."""
        started = time.monotonic()
        give_up_at = started + connect_timeout
        lost_at: float | None = None
        retries = 0
        while True:
            try:
                return await attempt()
            except CoordinatorUnreachable as exc:
                if lost_at is None and not (contact is not None and contact.reached):
                    refused = await self.tls_refusal(exc)  # a TLS failure waiting cannot heal ends the wait now
                    if refused is not None:
                        raise refused from exc
                now = time.monotonic()
                if contact is not None and contact.reached and lost_after is not None and lost_at is None:
                    lost_at = now
                    give_up_at = min(give_up_at, now + lost_after)
                    log.warning("coordinator at %s answered, then broke off: %s", self.target, exc.message)
                left = give_up_at - now
                if left <= 0:
                    if lost_at is not None:
                        raise CoordinatorUnreachable(
                            f"coordinator at {self.target} unreachable after it was reached: {exc.message} "
                            f"(kept trying for {now - lost_at:.1f} s, the heartbeat timeout)",
                            hint=self.lost_hint(exc),
                        ) from exc
                    if contact is not None and contact.before:
                        raise CoordinatorUnreachable(
                            f"{exc.message} (it answered this host before, in an earlier generation; kept trying "
                            f"for {now - started:.1f} s)",
                            hint=self.lost_hint(exc),
                        ) from exc
                    if connect_timeout <= 0:
                        raise
                    raise CoordinatorUnreachable(
                        f"{exc.message} (kept trying for {now - started:.1f} s)", hint=exc.hint
                    ) from exc
                if lost_at is None:
                    log.info("coordinator at %s not answering yet; retrying", self.target)
                await asyncio.sleep(min(RETRY_DELAYS_S[min(retries, len(RETRY_DELAYS_S) - 1)], left))
                retries += 1

    async def wait_for_all(
        self,
        task: TaskRef,
        *,
        timeout: float,
        progress: Callable[[RegistrationProgress], Awaitable[None] | None] | None = None,
        progress_every: float = 1.0,
    ) -> None:
        """Return once every task has registered; call (or await) ``progress`` with a ``RegistrationProgress``
        (counts and the first ten missing hosts; ``.describe()`` is the line to print) about every
        ``progress_every`` s still waiting (less often in clusters over ``PROGRESS_POLLS_PER_S`` hosts).

        The service's register timeout raises ``DeadlineError`` naming how many hosts are missing and the
        first ten; ``timeout`` bounds the wait on this side too. The service answers every waiter at
        once when the last host registers."""
        started = time.monotonic()
        member = self.membership
        known = member.num_tasks if member is not None and member.task.task_id == task.task_id else 0
        every = progress_interval(progress_every, known)  # the first poll too: a pod registers at once
        while True:
            left = started + timeout - time.monotonic()
            if left <= 0:
                raise DeadlineError(f"registration not complete after waiting {timeout:.1f} s")
            poll = min(every, left)
            request = pb.WaitForAllTasksRequest(task=convert.task_ref_pb(task), max_wait_seconds=poll)
            response = await self._call(
                self.stub.WaitForAllTasks, request, "WaitForAllTasks", poll + self.rpc_timeout
            )
            if response.complete:
                return
            current = convert.progress(response)
            every = progress_interval(progress_every, current.total)
            if progress is not None:
                await report(progress(current))

    async def heartbeat(self, task: TaskRef, *, service_incarnation: int = 0) -> int:
        """One heartbeat (a unary call); returns the service incarnation. With ``service_incarnation``
        (``Membership.service_incarnation``), a restarted coordinator refuses it (``ClusterError``)."""
        request = pb.HeartbeatRequest(task=convert.task_ref_pb(task), service_incarnation=service_incarnation)
        response = await self._call(self.stub.Heartbeat, request, "Heartbeat", self.rpc_timeout)
        return int(response.service_incarnation)

    def session(
        self, membership: Membership, *, interval: float | None = None, give_up_after: float | None = None
    ) -> Session:
        """This host's session: heartbeats, barriers and the error watch on one stream, so
        the host holds one standing call in the service instead of three. ``await session.run()`` in a
        task of its own (it heartbeats like ``heartbeat_loop`` and raises as it does); meanwhile
        ``session.barrier(...)`` and ``session.watch_errors()`` use the stream."""
        return Session(self, membership, interval=interval, give_up_after=give_up_after)

    async def heartbeat_loop(
        self, membership: Membership, *, interval: float | None = None, give_up_after: float | None = None
    ) -> NoReturn:
        """Heartbeat every ``interval`` s (default: a third of the service's heartbeat timeout) until cancelled.

        Heartbeats travel on one stream (``HeartbeatStream``), which costs the service a fifth to a third of
        a call each; the service confirms the first and then every k-th, k = ``give_up_after / (3 * interval)``
        rounded down, at least 1 (a confirmation costs it about half a heartbeat more; the spec's default
        5 s / 30 s: every second heartbeat). Rides out an unreachable coordinator for
        ``give_up_after`` s (default: the heartbeat timeout), reopening the stream, then raises
        ``CoordinatorUnreachable``; raises ``ClusterError`` at once when the service refuses a heartbeat
        (this task was declared failed, or replaced) or has restarted.

        A coordinator that is frozen (SIGSTOP, a stalled machine) or cut off keeps the connection open and
        answers nothing: every write and confirmation has a deadline of the last confirmation plus
        ``give_up_after`` plus ``CONFIRM_GRACE_S`` (a confirmation in flight after a short cut arrives late,
        behind TCP's retransmission backoff), so such a coordinator is noticed within ``give_up_after +
        CONFIRM_GRACE_S`` s of its last confirmation, not after the ``rpc_timeout``.

        A ``Session`` (``session``) that only heartbeats: one implementation of the stream, its
        confirmations, deadlines and retries.
        """
        await self.session(membership, interval=interval, give_up_after=give_up_after).run()

    async def raise_if_restarted(self, service_incarnation: int, refusal: TpuctlError) -> None:
        """Raise the error naming a restarted coordinator when the one answering at ``target`` is not the
        one registered with (``service_incarnation``; its status says which it is); return when it is, or
        cannot say within ``RESTART_PROBE_S``. Asked once, after a refusal: a restarted coordinator refuses
        a call as "task N has not registered", which names the wrong culprit."""
        if not service_incarnation:
            return
        try:
            now = (await asyncio.wait_for(self.status(), RESTART_PROBE_S)).service_incarnation
        except (TpuctlError, asyncio.TimeoutError):
            return
        if now not in (0, service_incarnation):
            raise self.restart_error(now, service_incarnation) from refusal

    async def watch_errors(
        self,
        task: TaskRef,
        *,
        timeout: float | None = None,
        give_up_after: float = 10.0,
        service_incarnation: int = 0,
    ) -> ClusterFailure | None:
        """The cluster's error, as soon as there is one; None if ``timeout`` s pass first (None: no limit).

        Parks one long poll at a time in the service, which answers the moment a task fails. Rides out an
        unreachable coordinator for ``give_up_after`` s, then raises ``CoordinatorUnreachable``. With
        ``service_incarnation`` (``Membership.service_incarnation``), a refusal by a coordinator that has
        restarted since raises "the coordinator at ... restarted", not the refusal ("task N has not
        registered": the new one never saw this host).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        failing_since: float | None = None  # a parked poll is healthy: count from the first failure
        unreachable: CoordinatorUnreachable | None = None
        while True:
            poll = WATCH_POLL_S if deadline is None else min(WATCH_POLL_S, deadline - time.monotonic())
            if poll <= 0:
                return None
            try:
                if failing_since is None:
                    request = pb.PollForErrorRequest(task=convert.task_ref_pb(task), max_wait_seconds=poll)
                    response = await self._call(self.stub.PollForError, request, "PollForError", poll + self.rpc_timeout)
                else:
                    # After a dropped poll, one that answers at once, sent the moment the channel reconnects
                    # (wait_for_ready, until the give-up time): a restarted coordinator is heard as soon as
                    # it listens, not after the channel's backoff plus a retry delay of our own.
                    request = pb.PollForErrorRequest(task=convert.task_ref_pb(task), max_wait_seconds=0.0)
                    until = failing_since + give_up_after if deadline is None else min(deadline, failing_since + give_up_after)
                    left = max(0.01, until - time.monotonic())
                    response = await self._call(self.stub.PollForError, request, "PollForError", left, wait_for_ready=True)
            except CoordinatorUnreachable as exc:
                # One dropped long poll must not take the host down (marin-community/marin#7430).
                failing_since, unreachable = failing_since or time.monotonic(), exc
                if time.monotonic() - failing_since > give_up_after:
                    raise
                await asyncio.sleep(RETRY_DELAYS_S[0])  # the next poll waits for the channel: no busy loop
                continue
            except DeadlineError:
                if unreachable is None:
                    raise
                if deadline is not None and time.monotonic() >= deadline:
                    return None  # the caller's timeout came first
                raise unreachable from None  # no connection within give_up_after: still unreachable
            except ClusterError as exc:
                await self.raise_if_restarted(service_incarnation, exc)
                raise
            failing_since, unreachable = None, None
            if response.HasField("failure"):
                return convert.cluster_failure(response.failure)

    async def report_error(
        self, task: TaskRef, cause: str, *, shutdown: bool = False, within: float | None = None
    ) -> None:
        """Declare this task failed with ``cause``: the whole cluster is in error from then on. With
        ``shutdown``, the error is a deliberate shutdown (``ClusterFailure.shutdown``: hosts leave
        without reporting a failure). ``within``: wait that long (at most) for a connection that is being
        made again, as after a cut healed, instead of failing at once while the channel redials."""
        request = pb.ReportErrorRequest(task=convert.task_ref_pb(task), cause=cause, shutdown=shutdown)
        if within is None:
            await self._call(self.stub.ReportError, request, "ReportError", self.rpc_timeout)
        else:
            await self._call(self.stub.ReportError, request, "ReportError", within, wait_for_ready=True)

    async def disconnect(self, task: TaskRef) -> None:
        """Leave the cluster gracefully (not an error); barriers waiting for this task fail."""
        request = pb.DisconnectRequest(task=convert.task_ref_pb(task))
        await self._call(self.stub.Disconnect, request, "Disconnect", self.rpc_timeout)

    # --- barriers and key-value ----------------------------------------------------------------------

    async def barrier(self, task: TaskRef, name: str, **waiting: Unpack[Waiting]) -> int:
        """Wait until every task made as many calls to barrier ``name`` as this one; returns the instance
        (1 for the first call). ``timeout`` None: the service's default barrier timeout.

        ``progress`` is called (or awaited, if a coroutine function) with a ``RendezvousProgress`` (counts,
        the first ten missing hosts, ``.describe()``) about every ``progress_every`` s still waiting. A timeout raises ``DeadlineError``
        naming how many hosts are missing and the first ten; the cluster in error (or a host that left)
        raises ``ClusterError`` at once; a name over 1,024 characters raises ``InputError``. A call
        cancelled while it waits withdraws its arrival (unless its instance was decided first): the
        instance waits for this task again, and its next call joins it. A session's ``barrier`` withdraws
        too once its own ``timeout`` ran out, and raises ``DeadlineError`` naming who was still missing."""
        timeout = waiting.get("timeout") or 0.0
        request = pb.BarrierRequest(task=convert.task_ref_pb(task), name=name, timeout_seconds=timeout)
        response = await self._waiting_call(
            self.stub.Barrier, request, f"barrier {shown(name)}", task, name, "barrier", waiting
        )
        return int(response.instance)

    async def gather(self, task: TaskRef, name: str, value: bytes, **waiting: Unpack[Waiting]) -> list[bytes]:
        """Publish ``value`` and wait for every task's: returns every task's value, by task id.

        A barrier that carries values (counted per name and task like one, in names of its own): the
        k-th call of every task to ``name`` forms instance k. The service assembles the table once and
        sends every host the same bytes. Failures and ``progress`` as for ``barrier``; a value longer than
        ``min(64 KiB, 32 MiB / hosts)`` raises ``InputError``."""
        timeout = waiting.get("timeout") or 0.0
        request = pb.GatherRequest(task=convert.task_ref_pb(task), name=name, value=value, timeout_seconds=timeout)
        response = await self._waiting_call(
            self.stub.Gather, request, f"gather {shown(name)}", task, name, "gather", waiting, streamed=True
        )
        return convert.gather_values(response)  # inflated to at most the size the service allows

    async def rendezvous_progress(
        self, task: TaskRef, name: str, *, kind: RendezvousKind = "barrier"
    ) -> RendezvousProgress | None:
        """Where this task's latest call to barrier (or gather, ``kind="gather"``) ``name`` stands; None if
        it never called it. Cheap (O(10) in the service), unlike ``status``."""
        request = pb.RendezvousProgressRequest(task=convert.task_ref_pb(task), name=name, kind=convert.kind_pb(kind))
        response = await self._call(
            self.stub.RendezvousProgress, request, f"{kind} {shown(name)} progress", self.rpc_timeout
        )
        return convert.rendezvous_progress(response, kind=kind, name=name)

    async def call_outcome(
        self, task: TaskRef, name: str, request_id: int, *, kind: RendezvousKind = "barrier"
    ) -> pb.RendezvousProgressResponse:
        """What became of this task's barrier (or gather) arrival sent with ``request_id`` on its session,
        whose answer the session lost: ``counted`` (it still counts), and once it passed ``passed``,
        ``instance`` and, for a gather, its table (``gathered``). A failed instance raises its failure, as
        the arrival's answer would have."""
        request = pb.RendezvousProgressRequest(
            task=convert.task_ref_pb(task), name=name, kind=convert.kind_pb(kind), request_id=request_id
        )
        response: pb.RendezvousProgressResponse = await self._call(
            self.stub.RendezvousProgress, request, f"{kind} {shown(name)}", self.rpc_timeout
        )
        return response

    async def kv_set(
        self, key: str, value: bytes, *, allow_overwrite: bool = False, task: TaskRef | None = None
    ) -> None:
        """Set ``key`` (at most 1,024 characters); an existing key raises ``ClusterError`` unless
        ``allow_overwrite``. A write is charged to ``task`` (default: this client's registration), under
        quotas: a value at most 1 MiB, per task 1,024 keys and 16 MiB, in all 65,536 keys and 64 MiB;
        over one raises ``InputError`` naming the limit and the use."""
        if task is None:
            if self.membership is None:
                raise InputError(
                    f"set {shown(key)}: a key-value write is charged to a task, and this client has not registered",
                    hint="register() first, or pass task= (the TaskRef a registration returned)",
                )
            task = self.membership.task
        request = pb.KeyValueSetRequest(
            entry=pb.KeyValue(key=key, value=value), allow_overwrite=allow_overwrite, task=convert.task_ref_pb(task)
        )
        await self._call(self.stub.KeyValueSet, request, f"set {key!r}", self.rpc_timeout)

    async def kv_get(self, key: str, *, timeout: float, generation: int = 0) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` s for it to be set. ``generation`` (0: the
        current one): the store is per generation; a get of an ended one raises ``GenerationOver``."""
        request = pb.KeyValueGetRequest(key=key, timeout_seconds=timeout, generation=generation)
        response = await self._call(self.stub.KeyValueGet, request, f"get {key!r}", timeout + self.rpc_timeout)
        return bytes(response.value)

    async def kv_dir(self, prefix: str, *, generation: int = 0) -> list[tuple[str, bytes]]:
        """Every entry whose key starts with ``prefix``, sorted by key; does not wait. The service answers
        in O(entries listed), and every caller the same bytes until the next write; for a table every
        host publishes to, ``gather`` is the one-call form."""
        request = pb.KeyValueDirRequest(prefix=prefix, generation=generation)
        response = await self._call(self.stub.KeyValueDir, request, f"list {prefix!r}", self.rpc_timeout)
        return [(entry.key, bytes(entry.value)) for entry in response.entries]

    async def status(self, *, brief: bool = False, timeout: float | None = None) -> ClusterStatus:
        """Every task's state, the cluster's error and the open barriers (O(hosts): the one call that
        lists every host). Needs no registration. ``brief``: only the cluster's name, the service
        incarnation and the generation (no task listed, O(1): a probe for a live coordinator)."""
        request = pb.GetStatusRequest(brief=brief)
        response = await self._call(self.stub.GetStatus, request, "GetStatus", timeout or self.rpc_timeout)
        return convert.cluster_status(response)

    async def goodput(self) -> str:
        """The goodput ledger as the coordinator keeps it: a JSON document (schema ``tpuctl.goodput/v1``),
        bounded at any cluster size. Needs no registration."""
        response = await self._call(self.stub.GetGoodput, pb.GetGoodputRequest(), "GetGoodput", self.rpc_timeout)
        return str(response.document)

    # --- plumbing ------------------------------------------------------------------------------------

    async def _waiting_call(
        self,
        rpc: Any,
        request: Any,
        call: str,
        task: TaskRef,
        name: str,
        kind: RendezvousKind,
        waiting: Waiting,
        *,
        streamed: bool = False,
    ) -> Any:
        """A barrier or gather call; with ``progress``, ask where it stands while it waits."""
        calling = self._call_streamed if streamed else self._call
        answer = calling(rpc, request, call, self.wait_bound(waiting.get("timeout")))
        return await self.with_progress(answer, call, task, name, kind, waiting)

    def wait_bound(self, timeout: float | None) -> float:
        """The deadline of a barrier or gather that waits ``timeout`` s in the service (None: the
        service's default, bounded here by ``max_wait``): the wait plus ``rpc_timeout``."""
        return (self.max_wait if timeout is None else timeout) + self.rpc_timeout

    async def with_progress(
        self, answer: Awaitable[_Answer], call: str, task: TaskRef, name: str, kind: RendezvousKind, waiting: Waiting
    ) -> _Answer:
        """Await ``answer``; with ``waiting``'s ``progress``, ask where the rendezvous stands while it waits: paced by
        the cluster's size from the first poll on (a pod's hosts all start their waits together: polling
        every ``progress_every`` s at first was 2,304 calls in the service's busiest second), the first
        poll at a random point of the second half of the interval, so they do not come all at once."""
        progress = waiting.get("progress")
        progress_every = waiting.get("progress_every", PROGRESS_EVERY_S)
        if progress is None:
            return await answer
        running = asyncio.ensure_future(answer)
        hosts = self.membership.num_tasks if self.membership is not None else 0
        every = progress_interval(progress_every, hosts)
        first = every * (0.5 + 0.5 * random.random())
        try:
            wait = first
            while True:
                done, _ = await asyncio.wait({running}, timeout=wait)
                if done:
                    return running.result()
                wait = every
                try:
                    found = await self.rendezvous_progress(task, name, kind=kind)
                except TpuctlError as exc:
                    log.debug("%s progress: %s", call, exc.message)
                    continue
                if found is not None and not found.done and not running.done():
                    every = progress_interval(progress_every, found.total)
                    await report(progress(found))
        finally:
            running.cancel()


_Answer = Any


class _Contact:
    """Whether a registration attempt got through to the coordinator (see ``_retrying``), and whether it
    answered this process before it (``Registering.answered_before``)."""

    reached = False
    before = False
