"""Running a job under ``tpuctl run``: the cluster's environment, a watcher, and a stop when the cluster fails.

The job runs in its own process group with this host's job environment (``tpuctl env``) on top of ours.
A watcher thread (:mod:`tpuctl.job.watcher`) long-polls this host's agent; when a host fails, the cluster is
shut down, or the agent itself disappears, the job's process group gets SIGTERM, then SIGKILL after
``--grace``, and ``tpuctl run`` exits 3 with a root-cause table (:mod:`tpuctl.job.rootcause`) on stderr.
Otherwise it returns the job's exit code (128 + N when the job died of signal N). SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to
``tpuctl run`` are forwarded to the job's process group; after a forwarded SIGTERM the job also gets
SIGKILL when it is still running ``--grace`` later (TensorFlow catches SIGTERM and keeps going).

On a terminal, the job's group becomes the terminal's foreground group, so the job reads the terminal
and Ctrl-C / Ctrl-Z reach it as they would without tpuctl.

Orphans: ``tpuctl run`` is a child subreaper and reaps what the job leaves behind, never the job itself
(:mod:`tpuctl.job.orphans`).

A Python job finds ``tpuctl/job/startup`` first on its ``PYTHONPATH``: its ``sitecustomize`` registers tpuctl's
JAX cluster detector (:mod:`tpuctl.job.jaxcluster`), so ``jax.distributed.initialize()`` needs no arguments.

Restarts (``--max-restarts N``, with the spec's ``restart: {policy: rejoin}``): when the job's generation
ends (a host failed, the coordinator restarted, or this host's own agent died and a new ``tpuctl init``
takes its place), the job is stopped as above, its root-cause table printed, and ``tpuctl run`` waits
(up to the restart timeout) for the agent's next generation to form, then starts the job again with
that generation's environment (new mapping, new job ports, ``TPUCTL_GENERATION``) and
``TPUCTL_RESTART_COUNT`` (0 for the first start, as torchrun's ``TORCHELASTIC_RESTART_COUNT``). It exits
with the job's code once the job ends by itself, or 3 with a table of every generation when restarts run
out or the cluster fails for good. A stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) while no job runs ends
that wait at once (exit 128 + N); after one, the job is never started again.

Preemption (docs/how-to/preemption.md): the first SIGTERM to a running job's ``tpuctl run`` is a notice for
this host (source ``sigterm``, deadline ``--grace`` away), not forwarded while the job asks whether to
checkpoint (``tpuctl.job.should_checkpoint``, ``tpuctl progress``): every host's job then saves the agreed
step and exits; the job is killed (SIGKILL) if it still runs when the grace is over. When the job does not
ask, or there is no agreement, the SIGTERM is forwarded as before; a second SIGTERM is forwarded at once.
A job that exits after an agreement (on any host's notice) is restarted in the next generation with
``--max-restarts``; without restarts left ``tpuctl run`` exits 3 (the cluster loses a host), or with the
job's code when this ``tpuctl run`` got the SIGTERM. When its generation ends while the job saves the
agreed step, the job gets until the notice's deadline before SIGTERM.

Imports neither grpc, tensorflow, jax nor numpy (a test checks it): the agent does the cluster work.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from tpuctl.agent.control import Op, call
from tpuctl.agent.protocol import AgentInfo, ErrorReport
from tpuctl.agent.stacks import forget_dead_hooks
from tpuctl.agent.statedir import StateDir
from tpuctl.errors import EXIT_CLUSTER, EXIT_DEADLINE, GenerationOver, StandbyError, TpuctlError
from tpuctl.health import cluster_health
from tpuctl.job.env import GENERATION_ENV, RESTART_COUNT_ENV, JobEnv
from tpuctl.job.orphans import become_subreaper, reap_orphans
from tpuctl.job.printed import PrintedSteps
from tpuctl.job.rootcause import ClusterDown, generations_table, root_cause_table
from tpuctl.job.watcher import AGENT_BACK_POLL_S, CALL_MARGIN_S, POLL_S, Watcher

INFO_TIMEOUT_S = 10.0
STATUS_TIMEOUT_S = 5.0
STRAGGLER_KILL_WAIT_S = 10.0
RESTART_MARGIN_S = 30.0  # beyond the restart timeout, waiting for the next generation (the agent decides first)
SETTLE_S = 2.0  # beyond the heartbeat timeout: how long a job that failed by itself waits for its agent's word
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)  # tpuctl run must end: no (re)start after one
ENV_TRIES = 3  # generations that may end between the agent's word that one formed and the job's start
OUTPUT_DRAIN_S = 5.0  # --progress-regex: how long the job's last output may take to pass through after it ended
STOP_CHECK_S = 0.1  # how soon a wait with no job running notices a stop signal
NOTICE_TIMEOUT_S = 5.0  # the agent's answer to a notice raised on SIGTERM (it asks the coordinator)
STANDBY_PROGRESS_S = 10.0  # how often `tpuctl run` on a standby host says it still waits to take a place
HOLD_POLL_S = 0.1  # while a SIGTERM is held for the agreement: how often the agent's word is looked at
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
STARTUP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup")  # its sitecustomize: jaxcluster


# --- running the job -------------------------------------------------------------------------------


class JobRunner:
    """One job under ``tpuctl run``: start, watch, forward signals, stop, report."""

    def __init__(
        self,
        command: list[str],
        state: StateDir,
        *,
        grace: float,
        say: Callable[[str], None],
        max_restarts: int = 0,
        force: bool = False,
        progress_regex: re.Pattern[bytes] | None = None,
    ) -> None:
        self.command = command
        self.progress_regex = progress_regex
        self.printed: PrintedSteps | None = None
        self.force = force
        self.max_restarts = max_restarts
        self.restarts = 0
        self.restart_wanted = False
        self.generations: list[dict[str, Any]] = []  # one row per start of the job
        self.say = say
        self.state = state
        self.grace = grace
        self.wake = threading.Event()
        self.exited = threading.Event()
        self.down: ClusterDown | None = None
        self.status: int | None = None  # the job's wait status
        self.proc: subprocess.Popen[bytes] | None = None
        self.tty: int | None = None
        self.pending: list[int] = []
        self.info: AgentInfo | None = None
        self.term_deadline: float | None = None
        self.stopping: int | None = None
        """The stop signal (``STOPPING``) received: the job is not started (again), and a wait ends at once."""
        self.report: ErrorReport | None = None
        """The agent's latest report while the job runs (the watcher's): the preemption notice's agreement."""
        self.sigterm_at: float | None = None
        """A first SIGTERM to a running job, held to be raised as a notice (``time.monotonic()``)."""
        self.notice_raised = False
        self.holding_until: float | None = None
        """The held SIGTERM's end: the job may run until then to save the agreed step (then SIGKILL)."""
        self.going_away = False
        """The job stopped for this host's own notice: its agent leaves, and a new one (``tpuctl init``
        again) forms the next generation."""

    # --- entry ----------------------------------------------------------------------------------

    def run(self) -> int:
        info = AgentInfo.from_json(call(self.state, Op.INFO, timeout=INFO_TIMEOUT_S))
        self.info = info
        previous = {sig: signal.signal(sig, self._on_signal) for sig in FORWARDED}
        try:
            return self._run(info)
        finally:
            self._take_terminal_back()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run(self, info: AgentInfo) -> int:
        report = ErrorReport.from_json(call(self.state, Op.WAIT_ERROR, {"timeout": 0}, timeout=INFO_TIMEOUT_S))
        if report.down and self._restartable(ClusterDown(report)):
            self.say(f"tpuctl: generation {report.generation} is over; waiting for the next one to start the job")
            formed = self._next_generation(report.generation)
            if self.stopping is not None:
                return self._stopped("while waiting for the next generation; the job was not started")
            if formed is None:
                return self._give_up(ClusterDown(report), "the job was not started")
        elif report.down:
            self.say("tpuctl: error: " + self._table(ClusterDown(report)))
            self.say("tpuctl: the job was not started")
            return EXIT_CLUSTER
        elif report.standby:
            formed = self._until_member(report)
            if self.stopping is not None:
                return self._stopped("while this host stood by; the job was not started")
            if formed is None:
                return self._stood_by(report)
        if not self._healthy_enough(info):
            return EXIT_CLUSTER
        if self.max_restarts and not self._rejoin:
            spec = f" ({info.config})" if info.config else ""
            self.say(
                f"tpuctl: warning: --max-restarts {self.max_restarts} restarts nothing: the cluster's spec{spec} has "
                f"restart policy {info.restart_policy!r}, so a failed host ends the cluster for good (add "
                "restart: {policy: rejoin} to it for hosts to come back and the job to restart)"
            )
        become_subreaper()
        while True:
            code = self._attempt()
            if code is None:
                again = "restarted" if self.generations else "started"
                return self._stopped(f"before the job started; it was not {again}")
            if not self.restart_wanted:
                return code
            self.restart_wanted = False
            ended = self.generations[-1]["generation"]
            formed = self._next_generation(ended)
            if self.stopping is not None:
                return self._stopped("while waiting for the next generation; the job was not restarted")
            if formed is None:
                return self._give_up(self.down or ClusterDown(ErrorReport()), "no next generation formed")
            self.restarts += 1
            self.say(
                f"tpuctl: generation {formed.generation} formed; restarting the job "
                f"(restart {self.restarts} of {self.max_restarts})"
            )

    def _attempt(self) -> int | None:
        """Start the job under the agent's current generation and see it to its end; None when a stop
        signal came before it started (it is not started)."""
        from tpuctl.spec import hostenv

        for _ in range(ENV_TRIES):
            info = self.info = AgentInfo.from_json(call(self.state, Op.INFO, timeout=INFO_TIMEOUT_S))
            try:
                env = JobEnv.from_message(call(self.state, Op.ENV, timeout=INFO_TIMEOUT_S))
                break
            except (GenerationOver, StandbyError) as exc:  # it ended since the agent said it formed: wait for the next one
                if not self.max_restarts:
                    raise
                self.say(f"tpuctl: {exc.message}; waiting for the next generation to start the job")
                formed = self._next_generation(info.generation)
                if self.stopping is not None:
                    return None
                if formed is None:
                    return self._give_up(self.down or ClusterDown(ErrorReport()), "no next generation formed")
        else:
            return self._give_up(ClusterDown(ErrorReport()), f"{ENV_TRIES} generations ended before the job could start")
        generation = _int(env.set.get(GENERATION_ENV), info.generation)  # the one env is of (INFO's may be older)
        environ = with_python_startup(env.apply(hostenv.environ()))
        if self.max_restarts:
            environ[RESTART_COUNT_ENV] = str(self.restarts)
        self.down, self.status, self.term_deadline = None, None, None
        self.exited.clear()
        self.wake.clear()
        self.generations.append(
            {"generation": generation, "started": time.time(), "ended": None, "job": "running", "cause": ""}
        )
        agent_pid = info.pid if info.pid is not None else self.state.live_pid()
        if self.stopping is not None:  # a stop signal before the job started: it is not started
            self.generations.pop()
            return None
        if self.progress_regex is not None:
            environ.setdefault("PYTHONUNBUFFERED", "1")  # a Python job's lines reach the pipe as it prints them
            self.printed = PrintedSteps(self.progress_regex, self.state.progress_socket, generation)
        try:
            self.proc = self._spawn(environ)
        except OSError as exc:
            code = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOT_EXECUTABLE
            self.say(f"tpuctl: error: cannot run {self.command[0]!r}: {exc.strerror or exc}")
            return code
        job_file = _mark_job(self.state.path, self.proc.pid)
        if self.stopping is not None:  # it came between the check and the spawn: the job gets it
            self.pending.append(self.stopping)
        for sig in self.pending:
            self._forward(sig)
        self.pending = []
        waiter = threading.Thread(target=self._reap, name="tpuctl-run-reaper", daemon=True)
        waiter.start()
        self.report, self.sigterm_at, self.notice_raised, self.holding_until = None, None, False, None
        watcher = Watcher(
            self.state, agent_pid, self._on_down, silence=info.heartbeat_timeout, generation=generation,
            on_report=self._on_report,
        )  # fmt: skip
        watcher.start()
        try:
            return self._supervise()
        finally:
            if self.printed is not None:
                self.printed.join(OUTPUT_DRAIN_S)  # what the job wrote before it ended, before any verdict
                self.printed = None
            watcher.stopped.set()
            self._reap_orphans()
            self.proc = None  # reaped: no signal goes to its process group any more (its pgid may be reused)
            if job_file is not None:
                with contextlib.suppress(OSError):
                    os.unlink(job_file)
                forget_dead_hooks(Path(job_file).parent)

    # --- restarts -------------------------------------------------------------------------------

    def _restartable(self, down: ClusterDown) -> bool:
        """The job may start again: restart policy rejoin, restarts left, and its generation ended without
        ending the cluster (or this host's agent died: a new `tpuctl init` may take its place; under policy
        fail that init is refused, the cluster is over)."""
        if self.restarts >= self.max_restarts or self.stopping is not None or not self._rejoin:
            return False
        report = down.report
        return bool(down.agent_gone) or (report.rejoining and not report.final)

    @property
    def _rejoin(self) -> bool:
        """The cluster re-forms after a failure (spec ``restart: {policy: rejoin}``)."""
        return self.info is not None and self.info.restart_policy in ("rejoin", "elastic")

    def _next_generation(self, ended: int) -> ErrorReport | None:
        """Wait (up to the restart timeout) for this host's agent, or its successor, to form a generation
        after ``ended``; None when none forms or the cluster fails for good."""
        assert self.info is not None
        standing_by = [0]

        def each(report: ErrorReport) -> float:
            if report.standby and report.generation != standing_by[0]:  # once a generation: it may take a place later
                standing_by[0] = report.generation
                self.say(f"tpuctl: standing by in generation {report.generation}: this host waits to take a place")
            if self.going_away and report.stopping and not (report.error or report.shutdown):
                return AGENT_BACK_POLL_S * 4  # this host's own notice: its agent leaves, a new `tpuctl init` forms the next
            return 0.0

        deadline = time.monotonic() + self.info.restart_timeout + RESTART_MARGIN_S
        # since None: ask at once (the next generation may have formed already)
        return self._watch_agent(deadline, None, lambda r: r.formed and r.generation > ended, each)

    def _until_member(self, report: ErrorReport) -> ErrorReport | None:
        """This host stands by (a spare, or a host of a slice its generation left out): wait until a generation
        takes it in and forms here, saying so on stderr every ``STANDBY_PROGRESS_S``, for the restart timeout
        at most (a stop signal ends the wait at once); None when none did (``self.down`` set when the cluster
        failed for good)."""
        assert self.info is not None
        task, limit = self.info.task, self.info.restart_timeout
        started = time.monotonic()
        deadline, next_line = started + limit, [started + STANDBY_PROGRESS_S]
        self.say(
            f"tpuctl: standing by: task {task} is not a member of generation {report.generation} (a spare, or a host "
            f"of a slice the generation left out); waiting up to {limit:g} s (restart.timeout) to take a place, "
            "then starting the job"
        )

        def each(report: ErrorReport) -> float:
            if time.monotonic() >= next_line[0]:
                next_line[0] = time.monotonic() + STANDBY_PROGRESS_S
                what = "standing by" if report.standby else "taking a place"
                self.say(
                    f"tpuctl: standing by: {time.monotonic() - started:.0f} s, generation {report.generation} "
                    f"({what}), waiting to take a place (at most {max(0.0, deadline - time.monotonic()):.0f} s more)"
                )
            return 0.0

        formed = self._watch_agent(
            deadline, report.seen, lambda r: r.formed and not r.standby, each, lambda: next_line[0] - time.monotonic()
        )
        if formed is not None:
            self.say(f"tpuctl: task {task} took a place in generation {formed.generation}; starting the job")
        return formed

    def _watch_agent(
        self,
        deadline: float,
        since: list[Any] | None,
        wanted: Callable[[ErrorReport], bool],
        each: Callable[[ErrorReport], float],
        wait_at_most: Callable[[], float] = lambda: POLL_S,
    ) -> ErrorReport | None:
        """Long-poll this host's agent (``WAIT_ERROR``, from ``since``; None: ask at once) until a report is
        ``wanted`` (returned). None at ``deadline``, on a stop signal, or when the cluster failed for good
        (``self.down`` set). ``each`` sees every other report first and may ask for a pause (seconds) before
        the agent is asked afresh; an agent that does not answer (gone, or not up yet: a new ``tpuctl
        init`` may start one) is asked again every ``AGENT_BACK_POLL_S``. Each ask waits at most
        ``wait_at_most()`` (and ``POLL_S``)."""
        while (now := time.monotonic()) < deadline:
            wait = max(0.0, min(POLL_S, deadline - now, wait_at_most()))
            args: dict[str, Any] = {"timeout": 0} if since is None else {"timeout": wait, "since": since}
            try:
                answer = self._ask(Op.WAIT_ERROR, args, timeout=wait + CALL_MARGIN_S)
            except TpuctlError:  # the agent is gone (or not up yet): a new `tpuctl init` may start one
                if not self._pause(min(AGENT_BACK_POLL_S, max(0.0, deadline - time.monotonic()))):
                    return None
                since = None
                continue
            if answer is None:  # a stop signal
                return None
            report = ErrorReport.from_json(answer)
            if wanted(report):
                return report
            pause = each(report)
            if pause:
                if not self._pause(min(pause, max(0.0, deadline - time.monotonic()))):
                    return None
                since = None
                continue
            if report.final:
                self.down = ClusterDown(report)
                return None
            since = report.seen
        return None

    def _stood_by(self, report: ErrorReport) -> int:
        """No generation took this standby host in within the restart timeout (or the cluster failed)."""
        if self.down is not None:
            return self._give_up(self.down, "this host stood by and the job was not started")
        assert self.info is not None
        self.say(
            f"tpuctl: error: task {self.info.task} stood by for {self.info.restart_timeout:g} s (restart.timeout) and "
            "no generation took it in; the job was not started"
        )
        self.say("hint: a spare takes a place when a member's slice is lost; `tpuctl status` shows each host's role")
        return EXIT_DEADLINE

    def _ask(self, op: str, args: dict[str, Any], *, timeout: float) -> Any:
        """``call`` while no job runs, ending at once (None) on a stop signal: the call runs in a thread and
        this one checks for the signal every ``STOP_CHECK_S`` (a handler must not take locks an interrupted
        wait may hold, so it only sets ``self.stopping``). Raises what ``call`` raises."""
        box: list[Any] = []
        done = threading.Event()

        def ask() -> None:
            try:
                box.append(call(self.state, op, args, timeout=timeout))
            except BaseException as exc:  # handed to the caller's thread
                box.append(exc)
            finally:
                done.set()

        threading.Thread(target=ask, name="tpuctl-run-call", daemon=True).start()
        while not done.wait(STOP_CHECK_S):
            if self.stopping is not None:
                return None  # the call ends by its own timeout; nobody reads it
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def _pause(self, seconds: float) -> bool:
        """Sleep ``seconds``; False (at once) on a stop signal."""
        until = time.monotonic() + seconds
        while self.stopping is None and time.monotonic() < until:
            time.sleep(min(STOP_CHECK_S, max(0.0, until - time.monotonic())))
        return self.stopping is None

    def _stopped(self, what: str) -> int:
        """A stop signal came while no job ran (before its start, or between generations): 128 + N."""
        assert self.stopping is not None
        name = signal.Signals(self.stopping).name
        runs = ""
        if self.generations:
            runs = (
                f"; the job ran in {len(self.generations)} generation(s), restarted {self.restarts} of at most "
                f"{self.max_restarts} times:\n" + generations_table(self.generations)
            )
        self.say(f"tpuctl: stopped by {name} {what}{runs}")
        return 128 + self.stopping

    def _give_up(self, down: ClusterDown, why: str) -> int:
        self.say("tpuctl: error: " + self._table(down))
        if down.report.error:
            self.say(f"tpuctl: the cluster's error: {down.report.error}")
        if self.generations:
            self.say(
                f"tpuctl: {why}; the job ran in {len(self.generations)} generation(s), restarted "
                f"{self.restarts} of at most {self.max_restarts} times:\n" + generations_table(self.generations)
            )
        else:
            self.say(f"tpuctl: {why}")
        return EXIT_CLUSTER

    def _supervise(self) -> int:
        while True:
            self.wake.wait(timeout=HOLD_POLL_S if self.holding_until is not None else 1.0)
            self.wake.clear()
            self._reap_orphans()
            if self.exited.is_set():
                return self._finished()
            if self.down is not None:
                return self._stop_for(self.down)
            if self.sigterm_at is not None and not self.notice_raised:
                self._raise_notice(self.sigterm_at + self.grace)
            if self.holding_until is not None and self.term_deadline is None:
                self._hold(self.holding_until)
            if self.term_deadline is not None and time.monotonic() >= self.term_deadline:
                self.term_deadline = None
                self._kill_group(signal.SIGKILL)

    # --- preemption ------------------------------------------------------------------------------

    def _on_report(self, report: ErrorReport) -> None:
        """The watcher's thread: the agent's latest word (a notice's agreement changes it)."""
        self.report = report
        if self.holding_until is not None:
            self.wake.set()

    def _raise_notice(self, deadline: float) -> None:
        """A SIGTERM came: this host is going away by ``deadline``. Tell the cluster (through the agent),
        and hold the SIGTERM while the job asks whether to checkpoint; else forward it now."""
        self.notice_raised = True
        task = self.info.task if self.info else "?"
        args = {"source": "sigterm", "reason": f"tpuctl run (pid {os.getpid()}) on task {task} got SIGTERM",
                "seconds": max(0.1, deadline - time.monotonic()), "if_taking_part": True}  # fmt: skip
        try:
            answer = call(self.state, Op.PREEMPT, args, timeout=NOTICE_TIMEOUT_S)
        except TpuctlError as exc:
            self.say(f"tpuctl: SIGTERM: no preemption notice could be raised ({exc.message}); stopping the job now")
            self._forward_term(deadline)
            return
        if self.term_deadline is not None:
            return  # a second SIGTERM came meanwhile: forwarded already
        taking = answer.get("taking_part")
        if not isinstance(taking, int) or isinstance(taking, bool) or taking <= 0:
            self._forward_term(deadline)  # no process asks whether to checkpoint: SIGTERM as without a notice
            return
        self.holding_until = deadline
        self.say(
            f"tpuctl: SIGTERM: every host's job saves an agreed step first ({taking} process(es) of this job ask); "
            f"it has {max(0.0, deadline - time.monotonic()):.0f} s (--grace); a second SIGTERM stops it now"
        )

    def _hold(self, until: float) -> None:
        """While the SIGTERM is held: forward it when there is no agreement; SIGKILL once the grace is over."""
        generation = self.generations[-1]["generation"] if self.generations else 0
        record = self.report.preemption if self.report is not None else None
        if record is not None and record.get("generation") == generation and record.get("state") == "none":
            self.say(f"tpuctl: no agreed checkpoint step ({record.get('why')}): stopping the job now")
            self.holding_until = None
            self._forward_term(until)
            return
        if time.monotonic() >= until:
            self.say(f"tpuctl: the job did not save and exit within --grace ({self.grace:g} s): SIGKILL")
            self.holding_until = None
            self._kill_group(signal.SIGKILL)

    def _forward_term(self, deadline: float) -> None:
        self._kill_group(signal.SIGTERM)
        self.term_deadline = deadline
        self.wake.set()

    def _agreement(self, fresh: bool) -> tuple[int, str, int | None] | None:
        """The step every host agreed on in the job's generation, whose notice it answered and that notice's
        host, if there was an agreement: the agent's word now (``fresh``), else its last one (a host going
        away may be gone already)."""
        generation = self.generations[-1]["generation"] if self.generations else 0
        report = self.report
        heard = report is not None and report.notice_deadline(generation) is not None
        if fresh and heard:  # the watcher heard of a notice (its long-poll wakes on one): the decision now
            with contextlib.suppress(TpuctlError):
                report = ErrorReport.from_json(call(self.state, Op.WAIT_ERROR, {"timeout": 0}, timeout=CALL_MARGIN_S))
        step = report.agreed_step(generation) if report is not None else None
        if step is None or report is None or report.preemption is None:
            return None
        record = report.preemption
        task = record.get("task")
        noticed = task if isinstance(task, int) and not isinstance(task, bool) else None
        return step, f"task {task}'s notice ({record.get('source')})", noticed

    def _stopped_for_notice(self, code: int, agreed: tuple[int, str, int | None] | None = None) -> int | None:
        """The job exited after the hosts agreed on a checkpoint step: restart it in the next generation
        (--max-restarts; on the host going away, once its next agent formed it), or say so; None when
        there was no agreement."""
        agreed = agreed or self._agreement(fresh=True)
        if agreed is None:
            return None
        step, whose, noticed = agreed
        task = self.info.task if self.info else "?"
        what = f"the job exited {code} after the agreed checkpoint (step {step}) for {whose}"
        self._record(f"exited {code}", f"preemption: {whose}, checkpoint at step {step}")
        if self.stopping is not None:
            self.say(f"tpuctl: task {task}: {what}")
            return code
        if self._rejoin and self.restarts < self.max_restarts:
            self.going_away = noticed is not None and self.info is not None and noticed == self.info.task
            self.say(f"tpuctl: task {task}: {what}; waiting for the next generation to restart it")
            self.restart_wanted = True
            return EXIT_CLUSTER
        self.say(
            f"tpuctl: error: task {task}: {what}; the cluster loses that host and the job is not restarted "
            "(tpuctl run --max-restarts N, with the spec's restart: {policy: rejoin}, restarts it)"
        )
        return EXIT_CLUSTER
    def _healthy_enough(self, info: AgentInfo) -> bool:
        """The one health verdict (:mod:`tpuctl.health`, as ``tpuctl status``): False (said why) when the
        cluster has failed and ``force`` was not given; a degraded cluster starts the job, saying so."""
        status = call(self.state, Op.STATUS, timeout=STATUS_TIMEOUT_S)
        health = cluster_health(status, info.heartbeat_timeout)
        if health.ok and health.problems:  # degraded: say which host to watch
            self.say(f"tpuctl: warning: {health.headline(info.cluster)}")
        if health.ok:
            return True
        if self.force:
            self.say(f"tpuctl: warning: {health.headline(info.cluster)}")
            self.say("tpuctl: starting the job anyway (--force)")
            return True
        self.say(f"tpuctl: error: {health.headline(info.cluster)}")
        self.say("tpuctl: the job was not started (`tpuctl run --force` starts it anyway)")
        return False

    # --- the job process ------------------------------------------------------------------------

    def _spawn(self, environ: dict[str, str]) -> subprocess.Popen[bytes]:
        self.tty = _foreground_tty()
        tty = self.tty

        def child_setup() -> None:  # runs in the child between fork and exec
            os.setpgid(0, 0)
            if tty is not None:
                old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
                try:
                    os.tcsetpgrp(tty, os.getpgrp())
                finally:
                    signal.signal(signal.SIGTTOU, old)

        # Without a terminal to hand over, the job's own process group is set by subprocess itself, with no
        # Python code between fork and exec: this process runs threads (the watcher, the reaper; in a test,
        # gRPC's and JAX's), and Python code in the forked child of a threaded process can deadlock or abort
        # (a job once died with SIGABRT there, exit 134, with gRPC's threads in the parent).
        group: dict[str, Any] = (
            {"process_group": 0} if tty is None and sys.version_info >= (3, 11) else {"preexec_fn": child_setup}
        )
        if self.printed is None:
            return subprocess.Popen(self.command, env=environ, **group)
        proc = subprocess.Popen(self.command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **group)
        assert proc.stdout is not None and proc.stderr is not None
        self.printed.follow(proc.stdout, sys.stdout.buffer, proc.pid)
        self.printed.follow(proc.stderr, sys.stderr.buffer, proc.pid)
        return proc

    def _reap(self) -> None:
        """Wait for the job (and follow it through Ctrl-Z on a terminal); runs in its own thread."""
        assert self.proc is not None
        pid = self.proc.pid
        while True:
            try:
                _, status = os.waitpid(pid, os.WUNTRACED)
            except ChildProcessError:
                status = 0
            except InterruptedError:  # pragma: no cover - PEP 475 retries
                continue
            if os.WIFSTOPPED(status):
                self._job_stopped(os.WSTOPSIG(status))
                continue
            self.status = status
            self.proc.returncode = os.waitstatus_to_exitcode(status)
            self.exited.set()
            self.wake.set()
            return

    def _reap_orphans(self) -> None:
        if self.proc is not None:
            reap_orphans(self.proc.pid)

    def _job_stopped(self, stopsig: int) -> None:
        """The job stopped for its terminal (Ctrl-Z, or reading it from the background): stop too, so the
        shell sees this job stopped and gets its terminal back. When continued (``fg`` or ``bg``), give
        the job the terminal if this process is in the foreground again, and continue it."""
        job_control = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
        if self.proc is None or stopsig not in job_control or not _stdin_is_tty():
            return  # stopped by someone else (SIGSTOP): theirs to continue
        self._take_terminal_back()
        # SIGSTOP stops the whole process; sent to this thread, it also stops this thread before it goes on
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        self.tty = _foreground_tty()
        if self.tty is not None:
            with contextlib.suppress(OSError):
                _set_foreground(self.tty, self.proc.pid)
        self._kill_group(signal.SIGCONT)

    def _take_terminal_back(self) -> None:
        if self.tty is not None:
            with contextlib.suppress(OSError):
                _set_foreground(self.tty, os.getpgrp())

    def _kill_group(self, sig: int) -> bool:
        """Signal the job's process group; False when it has no process left."""
        if self.proc is None:
            return False
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:  # pragma: no cover - a member changed its credentials
            return True
        return True

    def _group_alive_reaped(self) -> bool:
        """The job's group still has a live member, after reaping those of its members that are our
        zombies (``kill(-pgid, 0)`` succeeds on a zombie)."""
        self._reap_orphans()
        return self._kill_group(0)

    # --- signals --------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum in STOPPING and self.stopping is None:
            self.stopping = signum  # whatever runs now, nothing starts after it
        if self.proc is None:  # no job (yet, or between generations): a stop signal ends the wait
            if signum not in STOPPING:
                self.pending.append(signum)
            return
        if signum == signal.SIGTERM and self.sigterm_at is None and self.term_deadline is None:
            # A notice for this host first (raised by the supervising loop: a handler makes no calls); a
            # second SIGTERM is forwarded at once.
            self.sigterm_at = time.monotonic()
            self.wake.set()
            return
        self._forward(signum)

    def _forward(self, signum: int) -> None:
        self._kill_group(signum)
        if signum == signal.SIGTERM and self.term_deadline is None:
            self.term_deadline = time.monotonic() + self.grace
            self.wake.set()

    # --- outcomes -------------------------------------------------------------------------------

    def _on_down(self, down: ClusterDown) -> None:
        self.down = down
        self.wake.set()

    def _exit_code(self) -> int:
        assert self.proc is not None and self.proc.returncode is not None
        code = self.proc.returncode
        return 128 - code if code < 0 else code

    def _finished(self) -> int:
        code = self._exit_code()
        stopped = self._stopped_for_notice(code)  # also when the generation's end came with the exit
        if stopped is not None:
            return stopped
        if code == 0 or self.down is not None:
            if self.down is None:
                self._record("exited 0", "")
                return code
            return self._report(self.down, f"the job exited with code {code}")
        # The job failed on its own: was it because the cluster did? Say so if the agent knows (with
        # restarts, give the agent a heartbeat timeout to learn it: the job's runtime may notice first).
        args: dict[str, Any] = {"timeout": 0}
        if self.max_restarts and self._rejoin and self.info is not None:
            generation = self.generations[-1]["generation"] if self.generations else self.info.generation
            args = {"timeout": self.info.heartbeat_timeout + SETTLE_S, "since": [generation, False, True]}
        try:
            answer = self._ask(Op.WAIT_ERROR, args, timeout=float(args["timeout"]) + CALL_MARGIN_S)
        except TpuctlError:
            answer = None
        if answer is None:  # no word from the agent, or a stop signal: the job's own exit
            self._record(f"exited {code}", "")
            return code
        report = ErrorReport.from_json(answer)
        if report.down and (report.error or self.max_restarts):
            return self._report(ClusterDown(report), f"the job exited with code {code}")
        self._record(f"exited {code}", "")
        return code

    def _record(self, job: str, cause: str) -> None:
        if self.generations:
            self.generations[-1].update(ended=time.time(), job=job, cause=cause)

    def _stop_for(self, down: ClusterDown) -> int:
        assert self.proc is not None
        agreed = self._agreement(fresh=False)
        generation = self.generations[-1]["generation"] if self.generations else 0
        deadline = down.report.notice_deadline(generation) or (
            self.report.notice_deadline(generation) if self.report is not None else None
        )
        if agreed is not None and deadline is not None and deadline > time.time():
            # Every host's job is saving the agreed step: the generation's end does not cut it short.
            self.say(f"tpuctl: generation {generation} ended while the job saves the agreed step {agreed[0]}: it "
                     f"has until the notice's deadline ({deadline - time.time():.0f} s) to exit")  # fmt: skip
            if self.exited.wait(deadline - time.time()):
                self.down = None if self.stopping is not None or not self._rejoin else down
                code = self._stopped_for_notice(self._exit_code(), agreed)
                assert code is not None
                return code
        started = time.monotonic()
        self._kill_group(signal.SIGTERM)
        how = "SIGTERM"
        if not self.exited.wait(self.grace):
            self._kill_group(signal.SIGKILL)
            how = f"SIGTERM, then SIGKILL after {self.grace:g} s"
            self.exited.wait(STRAGGLER_KILL_WAIT_S)
        # What is left of the job's process group (children the job started) goes too. Those the SIGTERM
        # ended are this subreaper's zombies, still in the group: reaped first, so only live ones count.
        deadline = started + self.grace
        while self._group_alive_reaped() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._group_alive_reaped() and self._kill_group(signal.SIGKILL) and how == "SIGTERM":
            how = "SIGTERM (leftover processes of its group: SIGKILL)"
        took = time.monotonic() - started
        if self.exited.is_set():
            stopped = (
                f"stopped the job (pid {self.proc.pid}) with {how}: exited in {took:.1f} s, code {self._exit_code()}"
            )
        else:  # pragma: no cover - SIGKILL did not end it (uninterruptible sleep)
            stopped = f"could not stop the job (pid {self.proc.pid}) with {how} within {took:.1f} s"
        return self._report(down, stopped)

    def _report(self, down: ClusterDown, stopped: str) -> int:
        table = self._table(down)
        self._record(stopped.split(":")[0].replace(f" (pid {self.proc.pid if self.proc else 0})", ""), _cause(down))
        task = self.info.task if self.info else "?"
        if self._restartable(down):
            self.say("tpuctl: " + table)
            self.say(f"tpuctl: task {task}: {stopped}; waiting for the next generation to restart the job")
            self.restart_wanted = True
            self.down = down
            return EXIT_CLUSTER
        self.say("tpuctl: error: " + table)
        self.say(f"tpuctl: task {task}: {stopped}")
        if self.max_restarts and self.generations:
            if down.report.error:
                self.say(f"tpuctl: the cluster's error: {down.report.error}")
            last = "no restarts left" if self.restarts >= self.max_restarts else "the cluster failed for good"
            if self.stopping is not None:
                last = f"stopped by {signal.Signals(self.stopping).name}: not restarted"
            self.say(
                f"tpuctl: {last}; the job ran in {len(self.generations)} generation(s), restarted "
                f"{self.restarts} of at most {self.max_restarts} times:\n" + generations_table(self.generations)
            )
        return EXIT_CLUSTER

    def _table(self, down: ClusterDown) -> str:
        status: dict[str, Any] | None = None
        if not down.agent_gone:
            with contextlib.suppress(TpuctlError):
                status = call(self.state, Op.STATUS, timeout=STATUS_TIMEOUT_S)
        assert self.info is not None
        return root_cause_table(down, self.info, status, time.time())


# --- the job's Python ------------------------------------------------------------------------------


def _mark_job(state_dir: str, pid: int) -> str | None:
    """``STATE_DIR/blackbox/job-PID``: the agent's black box takes the stacks of this job's process group
    (``tpuctl.agent.stacks``). None when it could not be written (the job runs all the same)."""
    folder = os.path.join(state_dir, "blackbox")
    path = os.path.join(folder, f"job-{pid}")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        with open(path, "w") as handle:
            handle.write(f"{pid}\n")
    except OSError:
        return None
    return path


def with_python_startup(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with ``tpuctl/job/startup`` first on ``PYTHONPATH``: a Python job then has tpuctl's JAX
    cluster detector, so plain ``jax.distributed.initialize()`` works (:mod:`tpuctl.job.jaxcluster`)."""
    here = os.path.realpath(STARTUP_DIR)
    given = environ.get("PYTHONPATH", "")
    # empty entries stay: Python reads them as the working directory
    rest = [p for p in (given.split(os.pathsep) if given else []) if not (p and os.path.realpath(p) == here)]
    return {**environ, "PYTHONPATH": os.pathsep.join([STARTUP_DIR, *rest])}


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def _cause(down: ClusterDown) -> str:
    """What ended a generation, in one line: the first failed host and its cause."""
    report = down.report
    if down.agent_gone:
        return down.agent_gone
    if report.failures:
        first = report.failures[0]
        return f"task {first.task} ({first.address}): {first.cause}"
    return report.ended or report.error or ("shut down" if report.shutdown else "this host's agent stopped")


def _stdin_is_tty() -> bool:
    try:
        return os.isatty(0)
    except OSError:  # pragma: no cover - stdin closed
        return False


def _foreground_tty() -> int | None:
    """stdin's terminal when this process group is its foreground group (an interactive shell), else None."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None


def _set_foreground(fd: int, pgid: int) -> None:
    if threading.current_thread() is threading.main_thread():
        old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            os.tcsetpgrp(fd, pgid)
        finally:
            signal.signal(signal.SIGTTOU, old)
    else:
        # signal.signal works only in the main thread; block SIGTTOU in this thread instead
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
        try:
            os.tcsetpgrp(fd, pgid)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTTOU})
