"""Protocol v8: an open session is a host's proof of life, kept by HTTP/2 keepalive pings in gRPC's
transport both ways, so no heartbeat messages flow while nothing happens.

The state machine: a task with an open session never expires; when its last session ends its silence
counts from one keepalive window before (``keepalive_window``), so it is declared failed within the
heartbeat timeout of its last sign of life; expiry visits only late tasks, however many sessions are open.
Over real gRPC, through a TCP proxy that stops moving bytes (a SIGSTOPped host or a dead link): the
service names a frozen host within the heartbeat timeout, a frozen coordinator ends the host's session
within the timeout + ``CONFIRM_GRACE_S``, a freeze shorter than the timeout is ridden out, and a quiet
cluster sends the service no messages at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from coordination_harness import make_config, run, serving
from test_coordination_frozen import FreezingProxy
from test_coordination_generations import formed
from test_coordination_state import new_state, register, registration

from tpuctl.coordination.calls import CONFIRM_GRACE_S
from tpuctl.coordination.client import CoordinationClient
from tpuctl.coordination.values import Refused, TaskState, keepalive_interval, keepalive_window
from tpuctl.errors import CoordinatorUnreachable

# --- the state machine ------------------------------------------------------------------------------------


def test_an_open_session_keeps_its_task_alive_and_its_end_counts_from_the_keepalive_window() -> None:
    state = new_state(4, heartbeat_timeout=3.0)  # pings every 0.5 s: window 1.0 s
    window = state.keepalive_window
    assert window == keepalive_window(keepalive_interval(3.0)) == 1.0
    refs = register(state, range(4))
    for i, ref in enumerate(refs):
        state.session_opened(ref, 100 + i, now=0.0)
    assert state.expire(now=1000.0) == ()  # no heartbeat for 1,000 s: the sessions vouch for all
    # Status says what it knows: no heartbeat message for 1,000 s, but the session is open, so the last
    # answered keepalive ping is at most one window old (issue 24 item 4: it read "0.0s ago", always).
    row = state.status(now=1000.0).tasks[2]
    assert (row.session_open, row.seconds_since_heartbeat) == (True, window)

    state.session_closed(refs[2], 102, now=1000.0)
    assert state.expire(now=1000.0 + 3.0 - window - 0.01) == ()  # silent since 999.0: 2.99 s
    (failure,) = state.expire(now=1000.0 + 3.0 - window + 0.01)
    assert failure.task.task_id == 2
    assert failure.cause == (
        "no heartbeat for 3.0 s: its session ended 2.0 s ago (connection closed or keepalive pings "
        "unanswered) and it did not reconnect (timeout 3 s)"
    )


def test_a_task_lives_while_any_of_its_sessions_is_open_and_a_new_one_in_time_saves_it() -> None:
    state = new_state(2, heartbeat_timeout=3.0)
    refs = register(state, range(2))
    state.session_opened(refs[0], 1, now=0.0)
    state.session_opened(refs[0], 2, now=0.5)  # a reopened stream before the old one was closed
    state.session_opened(refs[1], 3, now=0.0)
    state.session_closed(refs[0], 1, now=1.0)
    assert state.expire(now=100.0) == ()  # session 2 still open
    state.session_closed(refs[0], 2, now=100.0)
    state.session_closed(refs[0], 2, now=100.0)  # a second close of the same session changes nothing
    state.session_opened(refs[0], 4, now=101.5)  # reconnected within the timeout
    assert state.expire(now=200.0) == ()
    assert state.status(now=200.0).failure is None


def test_a_new_process_does_not_inherit_the_sessions_of_the_one_it_replaced() -> None:
    state, refs = formed(heartbeat_timeout=3.0, tasks=2)
    state.session_opened(refs[1], 7, now=0.0)
    # Task 1's new process, with its predecessor's credential: the old registration fails (generation 2
    # forms) and the new one registers into generation 2.
    new = state.register(registration(1, 5555, previous_credential=refs[1].credential), now=1.0).task
    assert new.incarnation == 5555 and state.generation == 2
    state.session_closed(refs[1], 7, now=2.0)  # the old process's session ends: nothing to do with 5555
    # The old session does not vouch for the new process: silent since its registration, it is missing
    # again once the timeout has passed (generation 2 is still forming), as any silent registrant.
    assert state.expire(now=1.0 + 3.0 - 0.01) == ()
    (failure,) = state.expire(now=1.0 + 3.0 + 0.01)
    assert failure.task.task_id == 1 and failure.cause.startswith("no heartbeat for 3.0 s")
    assert state.status(now=5.0).tasks[1].state is TaskState.WAITING


def test_a_survivor_whose_session_ends_while_its_generation_re_forms_frees_its_place_in_time() -> None:
    state, refs = formed(heartbeat_timeout=3.0)
    for ref in refs:
        state.session_opened(ref, ref.task_id + 10, now=0.0)
    state.report_error(refs[3], "disk on fire", now=1.0)  # generation 2 forms; 0..2 are reserved survivors
    assert state.generation == 2
    assert state.expire(now=5.0) == ()  # their sessions still vouch for them
    state.session_closed(refs[1], 11, now=5.0)
    with pytest.raises(Refused, match="is held for the process that registered it"):
        state.register(registration(1, 9999), now=5.5)
    state.expire(now=5.0 + 3.0 - state.keepalive_window + 0.01)  # presumed dead: its place is free
    assert state.register(registration(1, 9999), now=7.5).task.incarnation == 9999
    with pytest.raises(Refused, match="is held for the process that registered it"):
        state.register(registration(2, 9999), now=7.5)  # task 2's session is still open


def test_expiry_visits_only_the_late_tasks_however_many_sessions_are_open() -> None:
    state = new_state(1_000, heartbeat_timeout=3.0)
    refs = register(state, range(1_000))
    for ref in refs:
        state.session_opened(ref, ref.task_id, now=0.0)
    before = state.counters.touched
    for tick in range(100):
        assert state.expire(now=10.0 + tick) == ()
    assert state.counters.touched - before <= 100  # not 100 x 1,000
    assert all(t.state is TaskState.CONNECTED for t in state.status(now=200.0).tasks)


# --- over gRPC, through a proxy that freezes ------------------------------------------------------------------

TIMEOUT_S = 1.5
"""Heartbeat timeout of these clusters: the service pings every 0.25 s (window 0.5 s)."""
KEEPALIVE_S = 0.2
"""The hosts' pings: window 0.4 s, under half the timeout, so their sessions send no heartbeat messages."""


def test_a_quiet_cluster_sends_the_service_no_messages_and_stays_alive() -> None:
    async def body() -> None:
        async with serving(make_config(3, heartbeat_timeout=TIMEOUT_S)) as cluster:
            clients = [cluster.client(keepalive=KEEPALIVE_S) for _ in range(3)]
            sessions = [await c.open_session("test", i) for i, c in enumerate(clients)]
            assert all(s.keepalive_window == pytest.approx(0.4) for s in sessions)
            runs = [asyncio.create_task(s.run()) for s in sessions]
            try:
                await asyncio.sleep(0.5)
                counters = cluster.server.service.counters
                calls, stream_in = counters.calls, counters.stream_in
                await asyncio.sleep(3 * TIMEOUT_S)  # three heartbeat timeouts without a message
                assert (counters.calls, counters.stream_in) == (calls, stream_in)
                assert not any(r.done() for r in runs)
                status = await clients[0].status()
                assert status.failure is None
                assert all(t.state is TaskState.CONNECTED for t in status.tasks)
                window = cluster.server.service.state.keepalive_window  # over the wire: a bound, said as one
                assert all(t.session_open and t.seconds_since_heartbeat == pytest.approx(window) for t in status.tasks)
            finally:
                for r in runs:
                    r.cancel()
                await asyncio.gather(*runs, return_exceptions=True)

    run(body())


def test_the_service_names_a_frozen_host_to_every_session_within_the_heartbeat_timeout() -> None:
    async def body() -> None:
        async with (
            serving(make_config(3, heartbeat_timeout=TIMEOUT_S)) as cluster,
            FreezingProxy(cluster.server.port) as proxy,
        ):
            window = cluster.server.service.state.keepalive_window
            direct = [cluster.client(keepalive=KEEPALIVE_S) for _ in range(2)]
            frozen_host = CoordinationClient(proxy.target, keepalive=KEEPALIVE_S)
            try:
                sessions = [await c.open_session("test", i) for i, c in enumerate(direct)]
                sessions.append(await frozen_host.open_session("test", 2))
                runs = [asyncio.create_task(s.run()) for s in sessions]
                watches = [asyncio.create_task(s.watch_errors()) for s in sessions[:2]]
                await asyncio.sleep(1.0)
                proxy.freeze()  # task 2 neither sends nor answers anything from now on
                frozen = time.monotonic()
                failures = await asyncio.wait_for(asyncio.gather(*watches), 10.0)
                took = time.monotonic() - frozen
                for failure in failures:
                    (only,) = failure.failures
                    assert only.task.task_id == 2
                    assert "no heartbeat for " in only.cause and ": its session ended " in only.cause
                # Its pings vouched for it until the freeze at the latest, and at most a window before the
                # service's ping went unanswered: named within the timeout of the freeze (+ the watchdog's
                # tick and scheduling), not before the timeout less a window.
                assert TIMEOUT_S - window - 0.3 <= took <= TIMEOUT_S + 0.75, took
                proxy.thaw()
                for r in runs:
                    r.cancel()
                await asyncio.gather(*runs, return_exceptions=True)
            finally:
                await frozen_host.close()

    run(body())


def test_a_frozen_coordinator_ends_a_keepalive_session_within_the_heartbeat_timeout() -> None:
    async def body() -> None:
        async with (
            serving(make_config(2, heartbeat_timeout=TIMEOUT_S)) as cluster,
            FreezingProxy(cluster.server.port) as proxy,
        ):
            client = CoordinationClient(proxy.target, keepalive=KEEPALIVE_S)
            try:
                session = await client.open_session("test", 0)
                running = asyncio.create_task(session.run())
                waiting = asyncio.create_task(session.barrier("never", timeout=30.0))
                await asyncio.sleep(1.0)
                assert not running.done() and not waiting.done()
                proxy.freeze()
                frozen = time.monotonic()
                with pytest.raises(CoordinatorUnreachable) as excinfo:
                    await asyncio.wait_for(running, 8.0)
                took = time.monotonic() - frozen
                with pytest.raises(CoordinatorUnreachable):
                    await asyncio.wait_for(waiting, 0.5)
                proxy.thaw()
            finally:
                await client.close()
        assert "unreachable/frozen: no heartbeat confirmed for " in excinfo.value.message
        # Vouched for until the freeze at the latest and at most a window before the pings failed. gRPC
        # does not always close the connection within the window (two ping intervals, 0.4 s here): in 16
        # of 162 runs (this code and the code of two commits before alike) the ping failure surfaced
        # 1.2 s after the freeze, so the session counted from 0.8 s after it and ended 2.80 s after it,
        # every time. The slack covers that lag of gRPC's (0.8 s) and a loaded machine's scheduling.
        assert TIMEOUT_S + CONFIRM_GRACE_S - 0.4 - 0.2 <= took <= TIMEOUT_S + CONFIRM_GRACE_S + 1.5, took

    run(body())


def test_a_freeze_shorter_than_the_timeout_is_ridden_out_by_reconnecting() -> None:
    async def body() -> None:
        async with (
            serving(make_config(2, heartbeat_timeout=TIMEOUT_S)) as cluster,
            FreezingProxy(cluster.server.port) as proxy,
        ):
            other = cluster.client(keepalive=KEEPALIVE_S)
            client = CoordinationClient(proxy.target, keepalive=KEEPALIVE_S)
            try:
                sessions = [await other.open_session("test", 0), await client.open_session("test", 1)]
                runs = [asyncio.create_task(s.run()) for s in sessions]
                counters = cluster.server.service.counters
                await asyncio.sleep(0.3)
                quiet = counters.stream_in
                for _ in range(2):  # long enough for both sides' pings to fail and the streams to break
                    await asyncio.sleep(0.6)
                    proxy.freeze()
                    await asyncio.sleep(0.5)
                    proxy.thaw()
                await asyncio.sleep(2 * TIMEOUT_S)
                assert counters.stream_in >= quiet + 2  # task 1 reopened its session after each freeze
                assert not any(r.done() for r in runs), [r.exception() for r in runs if r.done()]
                status = await other.status()
                assert status.failure is None, status.failure
                for r in runs:
                    r.cancel()
                for r in runs:
                    with contextlib.suppress(asyncio.CancelledError):
                        await r
            finally:
                await client.close()

    run(body())
