"""The agent's answers to local commands (``tpuctl barrier``, ``status``, ``down``, ``env``, ``run``).

Requests arrive on the state dir's control socket (:mod:`tpuctl.agent.controlserver`) as an operation
(:class:`~tpuctl.agent.control.Op`) and its arguments; every answer is a plain JSON document of
:mod:`tpuctl.agent.protocol`. An operation this agent does not know is a version mismatch between the
command and the agent, reported as such.

What the answers need of the agent is :class:`ServedAgent` (the bring-up's ``Agent`` is one): its
description, its generation, its health report, the job's environment, a barrier, the coordinator's
answers, and leaving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import TYPE_CHECKING, Protocol

from tpuctl.agent.control import Op
from tpuctl.agent.controlserver import Progress
from tpuctl.agent.protocol import BarrierPassed, ProtocolError
from tpuctl.coordination.values import MAX_NAME_CHARS
from tpuctl.errors import (
    ClusterError,
    CoordinatorUnreachable,
    DeadlineError,
    GenerationOver,
    InputError,
    StandbyError,
    StateError,
    TpuctlError,
)
from tpuctl.preemption.notice import MAX_REASON, source_problem

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tpuctl.agent.protocol import AgentInfo, ErrorReport, Failure
    from tpuctl.coordination.values import ClusterStatus, RendezvousProgress
    from tpuctl.job.env import JobEnv

PROGRESS_EVERY_S = 5.0  # how often a long barrier wait says so
STATUS_RPC_S = 3.0  # the coordinator's status, for `tpuctl status` (whose own call waits 10 s)
PROGRESS_RPC_S = 3.0  # where a barrier stands, for its progress line
GOODPUT_RPC_S = 5.0  # the coordinator's goodput ledger, for `tpuctl goodput` (whose own call waits 10 s)
DUMP_TIMEOUT_S = 10.0  # how long the hosts have to answer `tpuctl dump` (the service's default too)
DUMP_MARGIN_S = 5.0  # ... and the report's way back
MAX_ASKED_AGO_S = 8 * 86400.0  # a barrier caller's `asked_at` further back is not this host's clock (timeouts: 7 days at most)


class ServedAgent(Protocol):
    """What local commands need of the agent they answer for."""

    @property
    def description(self) -> AgentInfo:
        """The agent's ``agent.json`` (written before local commands are served)."""
        ...

    @property
    def generation(self) -> int:
        """The agent's generation (while re-forming: the one that ended)."""
        ...

    @property
    def changed(self) -> asyncio.Event:
        """Set (and replaced) whenever the agent's health report may have changed."""
        ...

    @property
    def job_env(self) -> JobEnv | None:
        """The job's environment on this host, once the generation's mapping exists."""
        ...

    def error_report(self) -> ErrorReport: ...

    def standing_by(self, what: str = "", *, lacks: str = "no job environment") -> StandbyError:
        """The error to answer with while this host stands by (not a member of its generation)."""
        ...

    async def barrier(self, name: str, timeout: float, generation: int = 0) -> int: ...

    async def barrier_progress(self, name: str) -> RendezvousProgress | None: ...

    async def coordinator_status(self) -> ClusterStatus: ...

    async def leave(self, *, everyone: bool) -> None: ...

    async def dump(self, timeout: float) -> str: ...

    async def goodput(self) -> str: ...

    async def preempt(self, source: str, reason: str, seconds: float) -> dict[str, object]: ...

    @property
    def taking_part(self) -> int:
        """Processes of this host's job that ask whether to checkpoint."""
        ...


class LocalCommands:
    """Dispatches one control request to the agent it serves (whose state dir is ``state_dir``)."""

    def __init__(self, agent: ServedAgent, state_dir: str) -> None:
        self.agent = agent
        self.state_dir = state_dir

    async def handle(self, op_name: str, args: dict[str, object], progress: Progress) -> dict[str, object]:
        if op_name not in Op.ALL:
            raise ProtocolError(
                f"this tpuctl agent does not know the operation {op_name!r}",
                hint="the command and the agent are of different tpuctl versions; restart the agent with this one",
            )
        op = op_name
        agent = self.agent
        if op == Op.BARRIER:
            return (await self._barrier(args, progress)).to_json()
        if op == Op.STATUS:
            return await self._status()
        if op == Op.DOWN:
            await agent.leave(everyone=bool(args.get("all")))
            return {"stopping": True}
        if op == Op.DUMP:
            timeout = _seconds(args.get("timeout") or None, DUMP_TIMEOUT_S)
            await progress(deadline=timeout + DUMP_MARGIN_S)
            document = json.loads(await agent.dump(timeout))
            return document if isinstance(document, dict) else {}
        if op == Op.GOODPUT:
            return await self._goodput()
        if op == Op.PREEMPT:
            return await self._preempt(args)
        if op == Op.INFO:
            return agent.description.to_json()
        if op == Op.ENV:
            report = agent.error_report()
            if report.error:
                raise ClusterError(report.error, hint="`tpuctl status` shows every host; restart the cluster")
            if report.shutdown or report.stopping:
                raise StateError(f"the tpuctl agent for state dir {self.state_dir} is shutting down")
            if report.rejoining:
                raise GenerationOver(
                    f"generation {report.generation} of cluster {agent.description.cluster!r} is over ({report.ended}); "
                    "the cluster is re-forming",
                    hint="`tpuctl run --max-restarts N` waits for the next generation and restarts the job",
                )
            if report.standby:
                raise agent.standing_by()
            env = agent.job_env
            return {} if env is None else env.to_message()
        # Op.WAIT_ERROR: a long-poll for `tpuctl run`: returns when the cluster is down (errs, shuts down, this
        # agent stops or its generation ended) or `timeout` passes; with `since` (``ErrorReport.seen`` as
        # last seen: generation, rejoining, formed, and the preemption notice's state when ``since`` has four
        # entries), when that changes or the cluster is down for good.
        since = args.get("since")
        deadline = time.monotonic() + _seconds(args.get("timeout"), 30.0)
        while True:
            report = agent.error_report()
            if isinstance(since, list):
                if report.final or report.seen[: len(since)] != since:
                    break
            elif report.down:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(agent.changed.wait(), timeout=left)
        return report.to_json()

    async def _preempt(self, args: dict[str, object]) -> dict[str, object]:
        source, reason, seconds = args.get("source"), args.get("reason") or "", args.get("seconds")
        if not isinstance(source, str) or (problem := source_problem(source)) is not None:
            raise InputError(f"a preemption notice's source: {problem or repr(source)}", hint="`tpuctl preempt --help`")
        if not isinstance(reason, str) or len(reason) > MAX_REASON:
            raise InputError(f"a preemption notice's reason is longer than {MAX_REASON} characters or not text",
                             hint="give a shorter --reason")  # fmt: skip
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 < seconds <= 7 * 86400:
            raise InputError(f"a preemption notice's deadline of {seconds!r} s is not between 0 and 7 days",
                             hint="e.g. tpuctl preempt --in 30s")  # fmt: skip
        if args.get("if_taking_part") is True:  # `tpuctl run` on SIGTERM: only when its job asks
            taking = self.agent.taking_part
            if not taking:
                return {"notice": None, "taking_part": 0}
        return await self.agent.preempt(source, reason, float(seconds))

    async def _barrier(self, args: dict[str, object], progress: Progress) -> BarrierPassed:
        agent = self.agent
        name = str(args.get("name", ""))
        if not name or name.startswith("tpuctl/"):
            raise InputError(f"barrier name {name!r} is empty or reserved", hint="names starting tpuctl/ are tpuctl's own")
        if len(name) > MAX_NAME_CHARS:
            raise InputError(
                f"barrier name {name[:40]!r}... is {len(name):,} characters long; at most {MAX_NAME_CHARS:,} are allowed",
                hint="use a shorter barrier name",
            )
        timeout = _seconds(args.get("timeout") or None, agent.description.barrier_timeout)
        generation = args.get("generation")
        generation = generation if isinstance(generation, int) and not isinstance(generation, bool) else 0
        # The caller's timeout counts from when it asked, not from when this agent got to the request: an
        # agent that was stopped or busy meanwhile must not stretch it, or the call would outlive its
        # caller's timeout and be counted in a round the other hosts' next calls make.
        started = _asked_at(args.get("asked_at"))
        left = timeout - (time.monotonic() - started)
        if left <= 0:
            raise DeadlineError(
                f"barrier {name!r}: this host's agent took the call {time.monotonic() - started:.1f} s after it "
                f"was made, past its timeout of {timeout:.1f} s (the agent was busy or stopped); it was not counted",
                hint=f"a retry is safe: this host's next call to {name!r} joins the round the other hosts are in",
            )
        await progress(deadline=left)  # the caller waits for the answer that long (and a margin)
        waiter = asyncio.create_task(agent.barrier(name, left, generation))
        try:
            while True:
                done, _ = await asyncio.wait({waiter}, timeout=PROGRESS_EVERY_S)
                if not done:
                    # Ask where the barrier stands, but never let the question hold up its answer (a
                    # coordinator that stopped answering would, for the RPC timeout).
                    asking = asyncio.create_task(self._barrier_progress(name, time.monotonic() - started))
                    either: set[asyncio.Future[int] | asyncio.Future[str]] = {waiter, asking}
                    first, _ = await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                    if waiter not in first:
                        await progress(asking.result())
                        continue
                    asking.cancel()
                return BarrierPassed(name=name, instance=waiter.result(), hosts=agent.description.num_tasks)
        finally:
            waiter.cancel()

    async def _barrier_progress(self, name: str, waited: float) -> str:
        """ "waiting at barrier 'step' #3 for 10 s: 3 of 4 hosts arrived; missing: task 2 (10.0.0.4) ..."
        (the service's progress: counts and the first ten missing hosts, O(10) whatever the cluster size)."""
        text = f"waiting at barrier {name!r} for {waited:.0f} s"
        try:
            progress = await asyncio.wait_for(self.agent.barrier_progress(name), PROGRESS_RPC_S)
        except (TpuctlError, asyncio.TimeoutError):
            return text
        if progress is None or progress.done:
            return text
        return f"waiting at barrier {name!r} #{progress.instance} for {waited:.0f} s: {progress.describe()}"

    async def _goodput(self) -> dict[str, object]:
        """The coordinator's goodput ledger; it answers whatever the cluster's state, while it runs."""
        coordinator = self.agent.description.coordinator
        try:
            document = json.loads(await asyncio.wait_for(self.agent.goodput(), GOODPUT_RPC_S))
        except asyncio.TimeoutError:
            raise CoordinatorUnreachable(
                f"the coordinator at {coordinator} did not answer within {GOODPUT_RPC_S:g} s",
                hint="the ledger lives in task 0's coordinator; `tpuctl goodput --state-dir DIR` on task 0's state "
                "dir reads its journal when no agent runs there",
            ) from None
        return document if isinstance(document, dict) else {}

    async def _status(self) -> dict[str, object]:
        agent = self.agent
        info = agent.description
        report = agent.error_report()
        base: dict[str, object] = {
            "cluster": info.cluster,
            "task": info.task,
            "coordinator": info.coordinator,
            "mapping": info.mapping,
            "restart_policy": info.restart_policy,
            "generation": agent.generation,  # this agent's (while re-forming: the one that ended)
            "heartbeat_timeout": info.heartbeat_timeout,  # for the health verdict
            "role": info.role,  # this host's: member, or standby (a spare, a host of a slice left out)
        }
        if report.rejoining:
            base["rejoining"] = f"generation {report.generation} ended: {report.ended}"
        if report.error_type == CoordinatorUnreachable.__name__:
            # This agent already gave up on the coordinator (gone, frozen or cut off): asking it again
            # would only make `tpuctl status` (and `tpuctl run`'s report) wait for nothing.
            return {**base, "tasks": known_tasks(info, report.failures, report.error or ""), "error": report.error}
        try:
            status = (await asyncio.wait_for(agent.coordinator_status(), STATUS_RPC_S)).as_dict()
        except (TpuctlError, asyncio.TimeoutError) as exc:
            # The coordinator is gone or cut off: say what this host knows, and why the rest is missing
            # (answering well within the local command's own timeout, so it never blames this agent).
            why = exc.message if isinstance(exc, TpuctlError) else (
                f"the coordinator at {info.coordinator} did not answer within {STATUS_RPC_S:g} s"
            )
            report = agent.error_report()  # as it is now, after the wait
            if report.error is None and report.rejoining:  # not final: it re-forms
                # what ended the last generation is not this one's state: no host is failed in it (yet)
                return {**base, "tasks": known_tasks(info, (), why), "coordinator_unreachable": why}
            error = report.error or why
            return {**base, "tasks": known_tasks(info, report.failures, error), "error": error}
        local = agent.error_report().error
        return {**base, **status, "error": status.get("error") or local}


def known_tasks(info: AgentInfo, failures: Sequence[Failure], unreachable: str) -> list[dict[str, object]]:
    """Every host as this agent knows it when the coordinator does not answer (``tpuctl status`` lists
    every host, not a header without rows): its address from the spec; a host the cluster's failure
    named (``failures``), ``failed`` with its cause; the coordinator (task 0, or the successor serving) ``unreachable`` with the
    cause ``unreachable``; every other ``unknown`` (only the coordinator knew). O(hosts), as the
    coordinator's answer is."""
    failed = {f.task: f.cause for f in failures}
    served_at = info.coordinator.rpartition(":")[0].strip("[]")  # a successor's address, once it moved
    coordinator = next((t for t, address in enumerate(info.hosts) if address == served_at), 0)
    rows: list[dict[str, object]] = []
    for task, address in enumerate(info.hosts):
        state, cause = "unknown", None
        if task in failed:
            state, cause = "failed", failed[task]
        elif task == coordinator:
            state, cause = "unreachable", unreachable
        rows.append(
            {
                "task": task,
                "address": address,
                "state": state,
                "fingerprint": None,
                "hostname": None,
                "peer": None,
                "heartbeat_age": None,
                "session_open": False,
                "cause": cause,
            }
        )
    return rows


def _asked_at(value: object) -> float:
    """When the caller asked (its ``asked_at``: ``time.monotonic()`` on this host), else now. A value
    that cannot be this host's clock (ahead of it, or further back than the longest timeout: a caller in
    another time namespace) counts as now, so it never shortens a call it cannot judge."""
    now = time.monotonic()
    if isinstance(value, (int, float)) and not isinstance(value, bool) and now - MAX_ASKED_AGO_S <= value <= now:
        return float(value)
    return now


def _seconds(value: object, default: float) -> float:
    """A timeout from a control request: a finite number of seconds, 0 or more, else ``default``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e9:
        return float(value)
    return default
