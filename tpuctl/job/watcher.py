"""The watcher of a job under ``tpuctl run``: a thread that long-polls this host's agent (``wait_error``)
and tells the runner, once, when the job must stop: the cluster erred or shut down, the job's generation
ended (restart policy rejoin), or the agent is gone, frozen, or was replaced by a new one on the same
state dir. :class:`~tpuctl.job.runner.JobRunner` starts one per start of the job.

The long-poll's pacing (:data:`POLL_S`, :data:`CALL_MARGIN_S`, :data:`AGENT_BACK_POLL_S`) is shared with
the runner's own questions to the agent between generations.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from tpuctl.agent.control import Op, call
from tpuctl.agent.protocol import ErrorReport
from tpuctl.agent.statedir import StateDir
from tpuctl.errors import TpuctlError
from tpuctl.job.rootcause import ClusterDown
from tpuctl.processes import pid_alive

POLL_S = 10.0  # one wait_error long-poll; a new one starts at once
CALL_MARGIN_S = 2.0  # beyond the long-poll, before an unanswered call counts as a failure
AGENT_BACK_POLL_S = 0.05  # how often a call that found no agent answering is made again (a connect to a
# unix socket nobody serves fails in microseconds; a new agent opens its socket once its mapping is written)


class Watcher(threading.Thread):
    """Long-polls the agent until the cluster errs, shuts down, or the agent goes away.

    The agent must answer within ``silence`` seconds (the cluster's heartbeat timeout): a frozen agent
    (SIGSTOP, swapped out) no longer heartbeats, so the rest of the cluster declares this host failed
    after that long, and this host's own job must stop as soon, not a minute later.
    """

    def __init__(
        self,
        state: StateDir,
        agent_pid: int | None,
        on_down: Callable[[ClusterDown], None],
        *,
        silence: float,
        generation: int = 0,
        on_report: Callable[[ErrorReport], None] | None = None,
    ) -> None:
        super().__init__(name="tpuctl-run-watcher", daemon=True)
        self.generation = generation
        """The job's generation: an agent answering another one is a new agent on this state dir."""
        self.state = state
        self.agent_pid = agent_pid
        self.on_down = on_down
        self.silence = silence
        self.on_report = on_report
        """Called with every report the agent answers (a preemption notice and its agreement change it)."""
        self.stopped = threading.Event()

    def run(self) -> None:
        poll = min(POLL_S, max(0.5, self.silence / 3))
        last_answer = time.monotonic()
        # With a generation, the long-poll also answers when what the agent reports changes: a new agent on
        # this state dir (another generation, or none formed yet) is told at once, not after the poll.
        # The fourth entry, the preemption notice's state: a notice and its agreement wake the long-poll too.
        since: list[Any] | None = [self.generation, False, True, None] if self.generation else None
        while not self.stopped.is_set():
            left = last_answer + self.silence - time.monotonic()
            try:
                if left <= 0:
                    raise TpuctlError(f"no answer for {self.silence:.1f} s (the heartbeat timeout)")
                args: dict[str, Any] = (
                    {"timeout": min(poll, left)} if since is None else {"timeout": min(poll, left), "since": since}
                )
                report = ErrorReport.from_json(
                    call(self.state, Op.WAIT_ERROR, args, timeout=max(0.1, min(poll + CALL_MARGIN_S, left)))
                )
            except TpuctlError as exc:
                if self.stopped.is_set():
                    return
                # A killed agent closes its socket while the kernel still tears it down (pid_alive says
                # alive for a moment): ask again soon
                alive = self.agent_pid is not None and pid_alive(self.agent_pid)
                if alive and time.monotonic() < last_answer + self.silence:
                    self.stopped.wait(AGENT_BACK_POLL_S)
                    continue
                pid = f" (pid {self.agent_pid})" if self.agent_pid else ""
                what = "is not answering (frozen or overloaded?)" if alive else "is gone"
                self.on_down(
                    ClusterDown(ErrorReport(), agent_gone=f"this host's tpuctl agent{pid} {what}: {exc.message}")
                )
                return
            last_answer = time.monotonic()
            if self.on_report is not None:
                self.on_report(report)
            if report.down:
                self.on_down(ClusterDown(report))
                return
            if self.generation and report.generation != self.generation and self._same_agent():
                # the job's generation ended and the next formed before this watcher's first question
                self.on_down(ClusterDown(report._replace(rejoining=True, generation=self.generation,
                                                         ended=self._ended(report))))  # fmt: skip
                return
            if self.generation and report.generation != self.generation:  # the agent died, another one took over
                self.on_down(ClusterDown(report, agent_gone=(
                    f"this host's tpuctl agent{f' (pid {self.agent_pid})' if self.agent_pid else ''} was replaced "
                    f"by a new one (now at generation {report.generation or 'none yet'})"
                )))  # fmt: skip
                return
            if since is not None:
                since = report.seen

    def _same_agent(self) -> bool:
        return self.agent_pid is not None and pid_alive(self.agent_pid) and self.state.live_pid() == self.agent_pid

    def _ended(self, report: ErrorReport) -> str:
        """What ended the job's generation, from the agent's history (bounded: one entry)."""
        cause = next((str(h.get("cause") or "") for h in report.history if h.get("generation") == self.generation), "")
        return (
            f"generation {self.generation} ended{': ' + cause[:500] if cause else ''} (generation "
            f"{report.generation} formed as the job started)"
        )
