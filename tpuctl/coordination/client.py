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
import contextlib
import itertools
import logging
import random
import secrets
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, NoReturn, TypeVar

import grpc

from tpuctl.coordination import convert
from tpuctl.coordination.auth import TOKEN_KEY
from tpuctl.coordination.tls import ClientTls, channel_credentials
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
    keepalive_window,
    shown,
)
from tpuctl.errors import (
    ClusterError,
    CoordinatorUnreachable,
    DeadlineError,
    GenerationOver,
    InputError,
    TpuctlError,
)
from tpuctl.proto import coordination_pb2 as pb
from tpuctl.proto import coordination_pb2_grpc as pb_grpc

log = logging.getLogger("tpuctl.coordination")
_T = TypeVar("_T")

RPC_TIMEOUT_S = 10.0
MAX_WAIT_S = 3600.0
"""Client-side bound on a wait the caller left to the service's default (a barrier without a timeout)."""
WATCH_POLL_S = 55.0
"""How long one error poll is held by the service (it caps polls at 60 s). Each host's watch costs the
service one answer per poll: 10,000 hosts, about 180 a second. A dropped connection fails the poll at
once; a silent one after the poll plus ``rpc_timeout`` (the heartbeat loop notices sooner)."""
CONFIRM_GRACE_S = 0.5
"""How long past the heartbeat timeout a heartbeat confirmation may still arrive before the coordinator
counts as unreachable or frozen. After a short cut TCP retransmits with backoff (0.2, 0.4, 0.8, 1.6 s), so
a heartbeat sent as a 2 s cut begins is answered about 3.4 s later (measured between network namespaces);
confirmations asked at least every third of the timeout leave a host with a 5 s timeout room for that
(1 s heartbeats, each confirmed: 1 + 3.4 < 5 + 0.5)."""
RESTART_PROBE_S = 2.0
"""How long a refused call waits for the coordinator's status, to tell a restarted coordinator's refusal."""
RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.25)
"""Backoff between retries of an unreachable coordinator (the last repeats)."""
PROGRESS_POLLS_PER_S = 100.0
"""Progress polls per second the whole cluster may send the service (each host polls less often in a
bigger cluster: every 2 s up to 200 hosts, every 23 s at 2,304, every 100 s at 10,000). A poll costs the
service about half a millisecond: 100 a second stay under 5 % of its core."""
MAX_RECEIVE_BYTES = 64 * 1024 * 1024
"""Largest answer accepted: a gather's table is at most 32 MiB (``values.MAX_GATHER_TABLE``)."""

KEEPALIVE_S = 5.0
"""Default seconds between this client's HTTP/2 keepalive pings (and how long it waits for each answer):
the spec's default heartbeat interval. A session whose pings vouch for the coordinator within half its
``give_up_after`` sends no heartbeat messages (protocol v8); see ``Session``."""
MIN_KEEPALIVE_S = 0.2
"""Pings closer than the service's abuse limit (``server.MIN_CLIENT_PING_MS``) would get the connection closed."""

CONNECT_TIMEOUT_MS = 20_000
"""How long one connection attempt may take before the channel gives it up and dials again (gRPC's
default minimum connect timeout): a coordinator busy with thousands of handshakes answers late, not
never."""

_CHANNEL_OPTIONS = (
    # Coordination traffic stays inside the cluster; an http_proxy in the environment would route it
    # through a proxy and hang (jax-ml/jax#22995).
    ("grpc.enable_http_proxy", 0),
    # Hosts start in any order: once the coordinator is up, reconnect within 250 ms, not after
    # gRPC's default backoff of up to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 250),
    # gRPC reads ``grpc.min_reconnect_backoff_ms`` as the *connect timeout* (a connection attempt's
    # deadline is at least this): at 50 ms (floored at 100) every host abandoned and redialled any
    # connection whose handshake a busy coordinator had not finished in 100-250 ms, the abandoned ones
    # filled its accept queue, and a pod's registration burst stalled on the kernel's SYN retries of
    # 1, 3 and 7 s. A refused connection still fails at once and is retried after the backoff above.
    ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
    ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
)


def new_incarnation() -> int:
    """A random non-zero 64-bit incarnation for this process."""
    return secrets.randbelow(2**64 - 1) + 1


class CoordinationClient:
    """A client of the coordination service at ``target`` ("host:port").

    Create it inside the event loop that uses it; ``close`` it (or use ``async with``). Task-scoped calls
    take the ``TaskRef`` that ``register`` returned (``Membership.task``): only the process holding it (or
    one it handed it to) may act for the task.

    ``token``: the cluster's shared token, if the service requires one. ``tls``: talk TLS (``tls.
    load_client_tls``: the CA that signed the service's certificate, and for mutual TLS this host's
    certificate and key). ``rpc_timeout``: the deadline of a call that does not wait in the service, and
    the slack added to one that does. ``max_wait``: the client-side bound on a barrier or gather left to
    the service's default timeout.

    Identity: ``register`` returns a ``Membership`` whose ``task`` carries the registration's credential
    (a secret only this registration got); task-scoped calls send it, so pass that ``TaskRef`` on. A
    ``TaskRef`` without it (another process's task id and incarnation) is refused. The client remembers
    its latest registration for ``kv_set``.
    """

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        rpc_timeout: float = RPC_TIMEOUT_S,
        max_wait: float = MAX_WAIT_S,
        tls: ClientTls | None = None,
        keepalive: float | None = KEEPALIVE_S,
    ) -> None:
        self.target = target
        self.keepalive = max(MIN_KEEPALIVE_S, keepalive) if keepalive else None
        """Seconds between the channel's keepalive pings (None: none), each answered within as long."""
        self._rpc_timeout = rpc_timeout
        self._max_wait = max_wait
        self._metadata = ((TOKEN_KEY, token),) if token else None
        self._tls = tls
        self.membership: Membership | None = None
        """The latest registration this client made (``register``'s answer)."""
        self._retry_secret: tuple[int, bytes] = (0, b"")
        """The incarnation this client last registered with and the random bytes that prove a retry is
        this client's (another process that learns the incarnation cannot replay the registration)."""
        options: tuple[tuple[str, Any], ...] = _CHANNEL_OPTIONS
        if self.keepalive:
            ping_ms = round(self.keepalive * 1000)
            options += (
                ("grpc.keepalive_time_ms", ping_ms),
                ("grpc.keepalive_timeout_ms", ping_ms),
                ("grpc.http2.ping_timeout_ms", ping_ms),
                ("grpc.http2.max_pings_without_data", 0),
            )
        if tls is None:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        else:
            if tls.server_name:
                options += (("grpc.ssl_target_name_override", tls.server_name),)
            self._channel = grpc.aio.secure_channel(target, channel_credentials(tls), options=options)
        self._stub = pb_grpc.CoordinationServiceStub(self._channel)

    async def __aenter__(self) -> CoordinationClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    # --- membership ----------------------------------------------------------------------------------

    async def register(
        self,
        cluster: str,
        task_id: int,
        *,
        incarnation: int | None = None,
        hostname: str | None = None,
        connect_timeout: float = 0.0,
        with_tasks: bool = False,
        generation: int = 0,
        previous_credential: bytes = b"",
    ) -> Membership:
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
        task, request = self._registration(
            cluster, task_id, incarnation, hostname, with_tasks, generation, previous_credential
        )

        async def attempt() -> Membership:
            response = await self._call(self._stub.RegisterTask, request, "RegisterTask", self._rpc_timeout)
            return convert.membership(response, task)

        self.membership = await self._retrying(attempt, connect_timeout)
        return self.membership

    async def open_session(
        self,
        cluster: str,
        task_id: int,
        *,
        incarnation: int | None = None,
        hostname: str | None = None,
        connect_timeout: float = 0.0,
        with_tasks: bool = False,
        generation: int = 0,
        previous_credential: bytes = b"",
        interval: float | None = None,
        give_up_after: float | None = None,
    ) -> Session:
        """``register`` and ``session`` in one (protocol v7): the registration is the first message of
        the session's stream, so a host costs the service one call instead of two, and the answer is the
        session's first confirmed heartbeat. The same arguments, retries, answers and errors as
        ``register``; ``session.membership`` is the registration. ``await session.run()`` next (in a task
        of its own), then ``session.wait_for_all(...)``."""
        task, request = self._registration(
            cluster, task_id, incarnation, hostname, with_tasks, generation, previous_credential
        )
        first = pb.HeartbeatRequest(register=request)
        contact = _Contact()

        async def attempt() -> tuple[Membership, Any]:
            call = self._stub.HeartbeatStream(metadata=self._metadata, wait_for_ready=False)
            try:
                await asyncio.wait_for(call.write(first), self._rpc_timeout)
                # A write completes only on a connected transport (a refused connection fails it): the
                # coordinator was there. If it goes silent now, it died or was cut off, not late to start.
                contact.reached = True
                response = await asyncio.wait_for(call.read(), self._rpc_timeout)
                if not isinstance(response, pb.HeartbeatResponse):  # EOF: refused, the status says why
                    raise self._error(await _finished(call), "RegisterTask", self._rpc_timeout)
                if not response.HasField("registered"):
                    raise ClusterError(
                        f"the coordinator at {self.target} answered a registration on the session stream "
                        "with something else",
                        hint="every host and the coordinator must run the same tpuctl version",
                    )
                return convert.membership(response.registered, task), call
            except grpc.aio.AioRpcError as exc:
                call.cancel()
                raise self._error(exc, "RegisterTask", self._rpc_timeout) from exc
            except asyncio.InvalidStateError as exc:  # written to a call the service already ended
                raise self._error(await _finished(call), "RegisterTask", self._rpc_timeout) from exc
            except asyncio.TimeoutError as exc:
                call.cancel()
                raise DeadlineError(
                    f"the coordinator at {self.target} did not answer RegisterTask within {self._rpc_timeout:.1f} s",
                    hint="it may be frozen or overloaded; check task 0's host and its agent log",
                ) from exc
            except BaseException:
                call.cancel()
                raise

        membership, call = await self._retrying(attempt, connect_timeout, contact, give_up_after)
        self.membership = membership
        session = Session(self, membership, interval=interval, give_up_after=give_up_after)
        session._adopted = call
        return session

    def _registration(
        self,
        cluster: str,
        task_id: int,
        incarnation: int | None,
        hostname: str | None,
        with_tasks: bool,
        generation: int,
        previous_credential: bytes,
    ) -> tuple[TaskRef, pb.RegisterTaskRequest]:
        task = TaskRef(task_id, incarnation or new_incarnation())
        if task.incarnation != self._retry_secret[0]:  # a new registration: new secret; a retry: the same
            self._retry_secret = (task.incarnation, secrets.token_bytes(CREDENTIAL_BYTES))
        request = pb.RegisterTaskRequest(
            protocol_version=PROTOCOL_VERSION,
            cluster_name=cluster,
            task_id=task_id,
            incarnation=task.incarnation,
            hostname=hostname or socket.gethostname(),
            with_tasks=with_tasks,
            retry_secret=self._retry_secret[1],
            generation=generation,
            previous_credential=previous_credential,
        )
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
        fails as its registered peers do, not after the whole register timeout."""
        started = time.monotonic()
        give_up_at = started + connect_timeout
        lost_at: float | None = None
        retries = 0
        while True:
            try:
                return await attempt()
            except CoordinatorUnreachable as exc:
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
                            hint="task 0's agent (the coordinator) died, restarted or was cut off: check task "
                            "0's host and its agent log",
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
        every = _progress_interval(progress_every, known)  # the first poll too: a pod registers at once
        while True:
            left = started + timeout - time.monotonic()
            if left <= 0:
                raise DeadlineError(f"registration not complete after waiting {timeout:.1f} s")
            poll = min(every, left)
            request = pb.WaitForAllTasksRequest(task=convert.task_ref_pb(task), max_wait_seconds=poll)
            response = await self._call(
                self._stub.WaitForAllTasks, request, "WaitForAllTasks", poll + self._rpc_timeout
            )
            if response.complete:
                return
            current = convert.progress(response)
            every = _progress_interval(progress_every, current.total)
            if progress is not None:
                await _report(progress(current))

    async def heartbeat(self, task: TaskRef, *, service_incarnation: int = 0) -> int:
        """One heartbeat (a unary call); returns the service incarnation. With ``service_incarnation``
        (``Membership.service_incarnation``), a restarted coordinator refuses it (``ClusterError``)."""
        request = pb.HeartbeatRequest(task=convert.task_ref_pb(task), service_incarnation=service_incarnation)
        response = await self._call(self._stub.Heartbeat, request, "Heartbeat", self._rpc_timeout)
        return int(response.service_incarnation)

    def session(
        self, membership: Membership, *, interval: float | None = None, give_up_after: float | None = None
    ) -> Session:
        """This host's session (protocol v6): heartbeats, barriers and the error watch on one stream, so
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

    def _unconfirmed(self, silent: float, give_up_after: float, exc: TpuctlError) -> CoordinatorUnreachable:
        return CoordinatorUnreachable(
            f"coordinator at {self.target} unreachable/frozen: no heartbeat confirmed for {silent:.1f} s "
            f"(heartbeat timeout {give_up_after:g} s): {exc.message}",
            hint=exc.hint,
        )

    def _restart_error(self, now: int, was: int) -> ClusterError:
        return GenerationOver(  # this host's generation is gone: under restart policy rejoin it re-registers
            f"the coordinator at {self.target} restarted (service incarnation {now}, was {was}); this host's "
            "registration is gone",
            hint="restart `tpuctl init` on every host",
        )

    async def _raise_if_restarted(self, service_incarnation: int, refusal: TpuctlError) -> None:
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
            raise self._restart_error(now, service_incarnation) from refusal

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
                    response = await self._call(self._stub.PollForError, request, "PollForError", poll + self._rpc_timeout)
                else:
                    # After a dropped poll, one that answers at once, sent the moment the channel reconnects
                    # (wait_for_ready, until the give-up time): a restarted coordinator is heard as soon as
                    # it listens, not after the channel's backoff plus a retry delay of our own.
                    request = pb.PollForErrorRequest(task=convert.task_ref_pb(task), max_wait_seconds=0.0)
                    until = failing_since + give_up_after if deadline is None else min(deadline, failing_since + give_up_after)
                    left = max(0.01, until - time.monotonic())
                    response = await self._call(self._stub.PollForError, request, "PollForError", left, wait_for_ready=True)
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
                await self._raise_if_restarted(service_incarnation, exc)
                raise
            failing_since, unreachable = None, None
            if response.HasField("failure"):
                return convert.cluster_failure(response.failure)

    async def report_error(self, task: TaskRef, cause: str, *, shutdown: bool = False) -> None:
        """Declare this task failed with ``cause``: the whole cluster is in error from then on. With
        ``shutdown``, the error is a deliberate shutdown (``ClusterFailure.shutdown``: hosts leave
        without reporting a failure)."""
        request = pb.ReportErrorRequest(task=convert.task_ref_pb(task), cause=cause, shutdown=shutdown)
        await self._call(self._stub.ReportError, request, "ReportError", self._rpc_timeout)

    async def disconnect(self, task: TaskRef) -> None:
        """Leave the cluster gracefully (not an error); barriers waiting for this task fail."""
        request = pb.DisconnectRequest(task=convert.task_ref_pb(task))
        await self._call(self._stub.Disconnect, request, "Disconnect", self._rpc_timeout)

    # --- barriers and key-value ----------------------------------------------------------------------

    async def barrier(
        self,
        task: TaskRef,
        name: str,
        *,
        timeout: float | None = None,
        progress: Callable[[RendezvousProgress], Awaitable[None] | None] | None = None,
        progress_every: float = 5.0,
    ) -> int:
        """Wait until every task made as many calls to barrier ``name`` as this one; returns the instance
        (1 for the first call). ``timeout`` None: the service's default barrier timeout.

        ``progress`` is called (or awaited, if a coroutine function) with a ``RendezvousProgress`` (counts,
        the first ten missing hosts, ``.describe()``) about every ``progress_every`` s still waiting. A timeout raises ``DeadlineError``
        naming how many hosts are missing and the first ten; the cluster in error (or a host that left)
        raises ``ClusterError`` at once; a name over 1,024 characters raises ``InputError``."""
        request = pb.BarrierRequest(task=convert.task_ref_pb(task), name=name, timeout_seconds=timeout or 0.0)
        wait = self._max_wait if timeout is None else timeout
        response = await self._waiting_call(
            self._stub.Barrier, request, f"barrier {shown(name)}", wait, task, name, "barrier", progress, progress_every
        )
        return int(response.instance)

    async def gather(
        self,
        task: TaskRef,
        name: str,
        value: bytes,
        *,
        timeout: float | None = None,
        progress: Callable[[RendezvousProgress], Awaitable[None] | None] | None = None,
        progress_every: float = 5.0,
    ) -> list[bytes]:
        """Publish ``value`` and wait for every task's: returns every task's value, by task id.

        A barrier that carries values (counted per name and task like one, in names of its own): the
        k-th call of every task to ``name`` forms instance k. The service assembles the table once and
        sends every host the same bytes. Failures and ``progress`` as for ``barrier``; a value longer than
        ``min(64 KiB, 32 MiB / hosts)`` raises ``InputError``."""
        request = pb.GatherRequest(
            task=convert.task_ref_pb(task), name=name, value=value, timeout_seconds=timeout or 0.0
        )
        wait = self._max_wait if timeout is None else timeout
        response = await self._waiting_call(
            self._stub.Gather,
            request,
            f"gather {shown(name)}",
            wait,
            task,
            name,
            "gather",
            progress,
            progress_every,
            streamed=True,
        )
        return convert.gather_values(response)  # inflated to at most the size the service allows

    async def rendezvous_progress(
        self, task: TaskRef, name: str, *, kind: RendezvousKind = "barrier"
    ) -> RendezvousProgress | None:
        """Where this task's latest call to barrier (or gather, ``kind="gather"``) ``name`` stands; None if
        it never called it. Cheap (O(10) in the service), unlike ``status``."""
        request = pb.RendezvousProgressRequest(task=convert.task_ref_pb(task), name=name, kind=convert.kind_pb(kind))
        response = await self._call(
            self._stub.RendezvousProgress, request, f"{kind} {shown(name)} progress", self._rpc_timeout
        )
        return convert.rendezvous_progress(response, kind=kind, name=name)

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
        await self._call(self._stub.KeyValueSet, request, f"set {key!r}", self._rpc_timeout)

    async def kv_get(self, key: str, *, timeout: float, generation: int = 0) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` s for it to be set. ``generation`` (0: the
        current one): the store is per generation; a get of an ended one raises ``GenerationOver``."""
        request = pb.KeyValueGetRequest(key=key, timeout_seconds=timeout, generation=generation)
        response = await self._call(self._stub.KeyValueGet, request, f"get {key!r}", timeout + self._rpc_timeout)
        return bytes(response.value)

    async def kv_dir(self, prefix: str, *, generation: int = 0) -> list[tuple[str, bytes]]:
        """Every entry whose key starts with ``prefix``, sorted by key; does not wait. The service answers
        in O(entries listed), and every caller the same bytes until the next write; for a table every
        host publishes to, ``gather`` is the one-call form."""
        request = pb.KeyValueDirRequest(prefix=prefix, generation=generation)
        response = await self._call(self._stub.KeyValueDir, request, f"list {prefix!r}", self._rpc_timeout)
        return [(entry.key, bytes(entry.value)) for entry in response.entries]

    async def status(self) -> ClusterStatus:
        """Every task's state, the cluster's error and the open barriers (O(hosts): the one call that
        lists every host). Needs no registration."""
        response = await self._call(self._stub.GetStatus, pb.GetStatusRequest(), "GetStatus", self._rpc_timeout)
        return convert.cluster_status(response)

    # --- plumbing ------------------------------------------------------------------------------------

    async def _call(self, rpc: Any, request: Any, call: str, timeout: float, *, wait_for_ready: bool = False) -> Any:
        try:
            return await rpc(request, timeout=timeout, metadata=self._metadata, wait_for_ready=wait_for_ready)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc, call, timeout) from exc

    async def _call_streamed(self, rpc: Any, request: Any, call: str, timeout: float) -> Any:
        """A call whose one answer comes on a server stream (``Gather``)."""
        stream = rpc(request, timeout=timeout, metadata=self._metadata, wait_for_ready=False)
        try:
            response = await stream.read()
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc, call, timeout) from exc
        except asyncio.CancelledError:
            stream.cancel()
            raise
        if response is grpc.aio.EOF:
            ended = await _finished(stream)
            if ended.code() is not grpc.StatusCode.OK:
                raise self._error(ended, call, timeout)
            raise ClusterError(f"the coordinator at {self.target} ended {call} without an answer")
        return response

    def _error(self, exc: grpc.aio.AioRpcError, call: str, timeout: float) -> TpuctlError:
        hint = convert.hint_from_metadata(exc.trailing_metadata())
        if hint is None and self._tls is not None and exc.code() is grpc.StatusCode.UNAVAILABLE:
            hint = (
                f"this host talks TLS to {self.target}: check that the coordinator serves TLS, that its "
                "certificate is signed by auth.tls.ca and names that address (or auth.tls.server_name), and "
                "for mutual TLS that this host's client certificate is signed by the same CA"
            )
        return convert.error_from_status(
            exc.code(), exc.details() or "", hint, target=self.target, call=call, timeout=timeout
        )

    async def _waiting_call(
        self,
        rpc: Any,
        request: Any,
        call: str,
        wait: float,
        task: TaskRef,
        name: str,
        kind: RendezvousKind,
        progress: Callable[[RendezvousProgress], Awaitable[None] | None] | None,
        progress_every: float,
        *,
        streamed: bool = False,
    ) -> Any:
        """A barrier or gather call; with ``progress``, ask where it stands while it waits."""
        calling = self._call_streamed if streamed else self._call
        waiting = calling(rpc, request, call, wait + self._rpc_timeout)
        return await self._with_progress(waiting, call, task, name, kind, progress, progress_every)

    async def _with_progress(
        self,
        waiting: Awaitable[_Answer],
        call: str,
        task: TaskRef,
        name: str,
        kind: RendezvousKind,
        progress: Callable[[RendezvousProgress], Awaitable[None] | None] | None,
        progress_every: float,
    ) -> _Answer:
        """Await ``waiting``; with ``progress``, ask where the rendezvous stands while it waits: paced by
        the cluster's size from the first poll on (a pod's hosts all start their waits together: polling
        every ``progress_every`` s at first was 2,304 calls in the service's busiest second), the first
        poll at a random point of the second half of the interval, so they do not come all at once."""
        if progress is None:
            return await waiting
        running = asyncio.ensure_future(waiting)
        hosts = self.membership.num_tasks if self.membership is not None else 0
        every = _progress_interval(progress_every, hosts)
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
                    every = _progress_interval(progress_every, found.total)
                    await _report(progress(found))
        finally:
            running.cancel()


class Session:
    """One host's session with the coordinator (protocol v6): one stream (``HeartbeatStream``) carries
    its heartbeats, its barrier arrivals and its error watch, so the service holds one call per host
    instead of a stream, a parked error poll and a parked barrier, and answers a passed barrier with one
    write per host. Made by ``CoordinationClient.session``.

    ``run()`` heartbeats until cancelled, exactly as ``heartbeat_loop`` (the same confirmations, the same
    deadlines: a frozen or cut-off coordinator is noticed within ``give_up_after + CONFIRM_GRACE_S`` s of
    the last confirmation; an unreachable one is ridden out for ``give_up_after`` s by reopening the
    stream) and raises as it does. One reader task per stream sorts what comes back: confirmations,
    barrier outcomes (by request id) and the cluster's error.

    While it runs: ``barrier`` and ``gather`` (v9) (as ``CoordinationClient.barrier`` and ``gather``; an
    arrival in flight when the stream breaks fails as a unary call would, it is never sent twice) and ``watch_errors`` (the cluster's
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
        """v8: once a stream's first heartbeat is confirmed, the channel's pings vouch for the coordinator
        (no more heartbeat messages) when they notice a dead one within half of ``give_up_after``; None:
        heartbeat messages every ``interval`` s, every few confirmed, as before."""
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
        self._reopened = 0  # how many times ``_broken`` failed the requests of a broken stream

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
                        await client._raise_if_restarted(membership.service_incarnation, exc)
                        raise
                    silent = time.monotonic() - confirmed[0]
                    if silent > give_up_after:
                        raise client._unconfirmed(silent, give_up_after, exc) from exc
                    log.warning("heartbeat failed (will retry): %s", exc.message)
                    await asyncio.sleep(min(interval, RETRY_DELAYS_S[min(attempt, len(RETRY_DELAYS_S) - 1)]))
                    attempt += 1
        except TpuctlError as exc:
            self._end(exc)
            raise
        except BaseException:
            self._end(ClusterError(f"task {membership.task.task_id}: the session with {client.target} was closed"))
            raise

    async def barrier(
        self,
        name: str,
        *,
        timeout: float | None = None,
        progress: Callable[[RendezvousProgress], Awaitable[None] | None] | None = None,
        progress_every: float = 5.0,
    ) -> int:
        """``CoordinationClient.barrier`` for this session's task, on the stream: the same outcomes and
        errors. Waits up to ``rpc_timeout`` for the stream to be up."""
        arrival = _barrier_arrival(name, timeout or 0.0)
        response = await self._rendezvous("barrier", name, arrival, timeout, progress, progress_every)
        return int(response.instance)

    async def gather(
        self,
        name: str,
        value: bytes,
        *,
        timeout: float | None = None,
        progress: Callable[[RendezvousProgress], Awaitable[None] | None] | None = None,
        progress_every: float = 5.0,
    ) -> list[bytes]:
        """``CoordinationClient.gather`` for this session's task, on the stream (protocol v9): the same
        values, checks, progress and errors, without a call of its own in the service while it waits."""
        arrival = _gather_arrival(name, value, timeout or 0.0)
        response = await self._rendezvous("gather", name, arrival, timeout, progress, progress_every)
        if not response.HasField("gathered"):
            raise ClusterError(f"the coordinator at {self._client.target} answered gather {shown(name)} without its table")
        return convert.gather_values(response.gathered)  # inflated to at most the size the service allows

    async def _rendezvous(
        self,
        kind: RendezvousKind,
        name: str,
        arrival: Callable[[int], pb.HeartbeatRequest],
        timeout: float | None,
        progress: Callable[[RendezvousProgress], Awaitable[None] | None] | None,
        progress_every: float,
    ) -> pb.HeartbeatResponse:
        """A barrier or gather arrival on the stream, with the unary calls' deadline and progress polls."""
        client = self._client
        call = f"{kind} {shown(name)}"
        wait = (client._max_wait if timeout is None else timeout) + client._rpc_timeout
        response: pb.HeartbeatResponse = await client._with_progress(
            self._arrive(arrival, call, wait), call, self.membership.task, name, kind, progress, progress_every
        )
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

    async def _arrive(
        self, build: Callable[[int], pb.HeartbeatRequest], call: str, wait: float
    ) -> pb.HeartbeatResponse:
        """A barrier or gather arrival on the stream, answered by request id within ``wait`` s."""
        started = time.monotonic()
        if self._ended is not None:
            raise self._ended
        if not self._opened.is_set():
            await self._until_open(self._client._rpc_timeout, call)
        return await self._request(build, call, started, started + wait)

    async def wait_for_all(
        self,
        *,
        timeout: float,
        progress: Callable[[RegistrationProgress], Awaitable[None] | None] | None = None,
        progress_every: float = 1.0,
    ) -> None:
        """``CoordinationClient.wait_for_all`` for this session's task, on the stream (protocol v7): the
        same progress, pacing, answers and errors, without a call per host in the service."""
        started = time.monotonic()
        every = _progress_interval(progress_every, self.membership.num_tasks)
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
                response = await self._request(waiting, "WaitForAllTasks", now, now + poll + self._client._rpc_timeout)
            except CoordinatorUnreachable:
                if self._ended is not None:
                    raise self._ended from None
                await asyncio.sleep(RETRY_DELAYS_S[0])
                continue  # the stream broke under the wait (it is idempotent): ask again on the next one
            if response.registration.complete:
                return
            current = convert.progress(response.registration)
            every = _progress_interval(progress_every, current.total)
            if progress is not None:
                await _report(progress(current))

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
            if not await self._write(request, _left(deadline, client._rpc_timeout), call, answer_if_ended=True):
                # The stream ended under the write, as under an arrival already sent: the answer is the
                # session's verdict (``_broken``, ``_end``), unless that came before the write failed.
                if self._ended is not None:
                    raise self._ended
                if self._reopened != reopened:
                    raise CoordinatorUnreachable(
                        f"the session with the coordinator at {client.target} broke while sending {call}",
                        hint="it may have restarted or been cut off; `tpuctl status` shows what it sees",
                    )
            left = deadline - time.monotonic()
            try:
                return await _within(future, max(0.01, left))  # the future is this call's alone
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
            await self._write(pb.HeartbeatRequest(watch_errors=True), self._client._rpc_timeout, "HeartbeatStream")

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
                await _within(stream.write(request), timeout)
            return True
        except grpc.aio.AioRpcError as exc:
            if answer_if_ended:
                return False
            raise self._client._error(exc, call, self._client._rpc_timeout) from exc
        except asyncio.InvalidStateError as exc:  # written to a call the service already ended
            if answer_if_ended:
                return False
            raise self._client._error(await _finished(stream), call, self._client._rpc_timeout) from exc
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
        call = adopted or client._stub.HeartbeatStream(metadata=client._metadata, wait_for_ready=False)
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
                await self._write(request, _left(deadline, client._rpc_timeout), "HeartbeatStream")
                if sent == 1:
                    self._broken()  # arrivals of the broken stream: their outcomes went with it
                    self._opened.set()
                    if self._watching:
                        await self._send_watch()
                if ask:
                    assert self._confirm is not None
                    either: set[asyncio.Future[Any]] = {self._confirm, reader}
                    done, _ = await asyncio.wait(
                        either, timeout=_left(deadline, client._rpc_timeout),
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
        """v8: the stream is confirmed and the channel's keepalive pings vouch for the coordinator: no
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
                    ended = await _finished(call)
                    if ended.code() is not grpc.StatusCode.OK:
                        raise client._error(ended, "HeartbeatStream", client._rpc_timeout)
                    raise ClusterError(f"the coordinator at {client.target} ended the heartbeat stream")
                if response.request_id:
                    future = pending.pop(response.request_id, None)
                    if future is not None and not future.done():
                        if response.code:
                            future.set_exception(self._refusal(response, self._calls.get(response.request_id, "")))
                        else:
                            future.set_result(response)
                elif response.HasField("failure"):
                    if not self._failure.done():
                        self._failure.set_result(convert.cluster_failure(response.failure))
                elif response.code:  # the error watch was refused
                    if not self._failure.done():
                        error = self._refusal(response, "the error watch")
                        await client._raise_if_restarted(expected, error)
                        self._failure.set_exception(error)
                else:  # a heartbeat confirmation
                    if response.service_incarnation != expected:
                        raise client._restart_error(int(response.service_incarnation), expected)
                    if self._confirm is not None and not self._confirm.done():
                        self._confirm.set_result(None)
        except grpc.aio.AioRpcError as exc:
            raise client._error(exc, "HeartbeatStream", client._rpc_timeout) from exc

    def _refusal(self, response: pb.HeartbeatResponse, call: str) -> TpuctlError:
        code = _STATUS_BY_VALUE.get(response.code, grpc.StatusCode.UNKNOWN)
        client = self._client
        return convert.error_from_status(
            code, response.details, response.hint or None, target=client.target, call=call, timeout=client._rpc_timeout
        )

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


def _barrier_arrival(name: str, timeout: float) -> Callable[[int], pb.HeartbeatRequest]:
    def arrival(request_id: int) -> pb.HeartbeatRequest:
        return pb.HeartbeatRequest(barrier=pb.StreamBarrier(request_id=request_id, name=name, timeout_seconds=timeout))

    return arrival


def _gather_arrival(name: str, value: bytes, timeout: float) -> Callable[[int], pb.HeartbeatRequest]:
    def arrival(request_id: int) -> pb.HeartbeatRequest:
        return pb.HeartbeatRequest(
            gather=pb.StreamGather(request_id=request_id, name=name, value=value, timeout_seconds=timeout)
        )

    return arrival


_Answer = Any
_STATUS_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}


async def _report(outcome: Awaitable[None] | None) -> None:
    """A progress callback may be a plain function or a coroutine function."""
    if outcome is not None:
        await outcome


if sys.version_info >= (3, 11):

    async def _within(awaitable: Awaitable[_T], timeout: float) -> _T:
        """``asyncio.wait_for`` without its task per call (Python 3.11's ``asyncio.timeout``): a host's
        every barrier and gather waits twice (its write, its answer), and a driver of the scale bench
        simulates thousands of hosts on one event loop."""
        async with asyncio.timeout(timeout):
            return await awaitable

else:  # pragma: no cover - Python 3.10
    _within = asyncio.wait_for


class _Contact:
    """Whether a registration attempt got through to the coordinator (see ``_retrying``)."""

    reached = False


def _left(deadline: float, cap: float) -> float:
    """Seconds until ``deadline`` (at least a few milliseconds: an immediate timeout still gets asked), at most ``cap``."""
    return max(0.01, min(cap, deadline - time.monotonic()))


def _progress_interval(requested: float, hosts: int) -> float:
    return max(requested, 0.05, hosts / PROGRESS_POLLS_PER_S)


async def _finished(call: Any) -> grpc.aio.AioRpcError:
    """The status of a call that ended, as the error ``call.read`` would have raised."""
    return grpc.aio.AioRpcError(
        await call.code(), await call.initial_metadata(), await call.trailing_metadata(), await call.details()
    )
