"""The bootstrap use case: one host's agent, from registration to the mapping file and beyond.

``Agent.run`` is what ``tpuctl init`` runs on every host (in the background, or attached with
``--foreground``). It is callable without click:

1. take the state dir's lock (a second agent for the same state dir is refused);
2. task 0 starts the coordination service at ``hosts[0]:port``;
3. register (cluster name, task id, fresh incarnation) and wait for every host, reporting who is missing;
4. open this host's session with the service (one stream: heartbeats, then the error watch and every
   barrier of this host; ``CoordinationClient.session``);
5. publish this host's core IDs (from the backend) and gather everyone's: the core-ID merge;
6. build the topology and the device mapping; write the mapping file atomically;
7. a final barrier, then report ready (``init`` prints its summary and exits 0);
8. serve local commands (``barrier``, ``status``, ``down``) on the state dir's socket until told to stop,
   the cluster fails, or a signal arrives.

Generations (the spec's ``restart: {policy: rejoin}``): when the cluster's generation g ends (a host
failed, left, or the coordinator restarted) and the cluster re-forms, steps 3-7 run again for g + 1 in
the same process: generation g's heartbeats and error watch stop, its mapping is removed (nothing of g
may pass for g + 1), this host registers again (with the credential it holds: a survivor keeps its place),
waits for every host, redoes the core-ID merge (a replaced VM may report other core IDs: the mapping
follows), and writes and commits the mapping of g + 1. While it re-forms, local commands say so and
``tpuctl run`` stops its job (to restart it with ``--max-restarts``). A final failure (policy fail,
no restarts left, the restart timeout) is today's cluster error.

Reclaiming a task: the registration's credential is kept in the state dir (``registration.json``, 0600,
never printed) while the agent runs; a new ``tpuctl init`` on the same state dir after its agent died
(it holds the lock the dead one held) brings it, so the service fails the dead registration at once
("restarted") instead of refusing the new one as "another live process". Task 0's new process starts its
service above the generation its predecessor reached.

Interrupted: SIGTERM, SIGINT or SIGHUP make the agent leave the cluster. ``tpuctl init`` interrupted while
it waits (Ctrl-C, a lost ssh session) sends its agent ``INIT_INTERRUPTED`` (SIGUSR1), and an agent whose
init died finds its pipe broken: before the cluster formed on this host (its final barrier passed) the
agent leaves, telling the cluster why; after, it stays (the cluster's; ``tpuctl down`` stops it).

Progress and the outcome go to a ``Reporter`` (:mod:`tpuctl.agent.reporter`). The merge of step 5-6
is :mod:`tpuctl.agent.merge`; the answers of step 8 are :mod:`tpuctl.agent.commands`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

from tpuctl.agent.blackbox import DumpTaker
from tpuctl.agent.commands import LocalCommands
from tpuctl.agent.controlserver import serve
from tpuctl.agent.coordinator import connect, load_token, start_service
from tpuctl.agent.generation import Generation, GenerationEnd, HistoryRow, failure_end
from tpuctl.agent.merge import commit, local_core_ids, merge, probe_limit, remove, write_pending
from tpuctl.agent.notices import Notices
from tpuctl.agent.options import AgentOptions
from tpuctl.agent.progress import JobProgress
from tpuctl.agent.protocol import MEMBER, NO_JOB_PORTS, STANDBY, AgentInfo, ErrorReport, Failure, JobPorts
from tpuctl.agent.reporter import INIT_INTERRUPTED, InitSummary, Reporter
from tpuctl.agent.succession import Found, candidates, discover, wait_for_any
from tpuctl.coordination.values import ClusterFailed, Moved
from tpuctl.errors import (
    ClusterError,
    CoordinatorUnreachable,
    DeadlineError,
    GenerationOver,
    InterruptError,
    StandbyError,
    StateError,
    TlsRefused,
    TpuctlError,
)
from tpuctl.watchdog.judge import Verdict

if TYPE_CHECKING:
    from tpuctl.agent.metadata_watch import KeyWatch
    from tpuctl.coordination.client import CoordinationClient, Registering
    from tpuctl.coordination.server import CoordinationServer
    from tpuctl.coordination.service import CoordinationServicer
    from tpuctl.coordination.values import ClusterFailure, ClusterStatus, RendezvousProgress
    from tpuctl.job.env import JobEnv
    from tpuctl.mapping.model import DeviceMapping
    from tpuctl.metrics.endpoint import MetricsEndpoint

log = logging.getLogger("tpuctl.agent.bringup")

INIT_DONE_BARRIER = "tpuctl/init/done"
INIT_SCHEMA = "tpuctl.init/v1"
REGISTER_PROGRESS_EVERY_S = 2.0  # how often registration names the hosts still missing
REPORT_TIMEOUT_S = 5.0  # telling the cluster why init failed here, before exiting
SHUTDOWN_WITHIN_S = 10.0  # `tpuctl down --all` telling the coordinator (its CLI waits 15 s for the answer)
SHUTDOWN_RETRY_S = 0.25  # ... trying again at least this often while it cannot
SHUTDOWN_SETTLE_S = 2.0  # ... asking the service whether a refusal was for a shutdown already out
INTERRUPTED_REPORT_S = 2.0  # ... when init was interrupted (it waits launch.STOP_WAIT_S for this agent to go)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # leave the cluster
TELL_PEERS_S = 10.0  # the longest task 0 keeps its service up for hosts that have not heard why init failed
TELL_UNREGISTERED_S = 0.5  # ... and for hosts not registered yet (one retrying comes back within 0.25 s)
TELL_TLS_S = 5.0  # ... and when its own certificate was refused: hosts retrying meet it within a second
FAILED_STOP_GRACE_S = 0.25  # the service's stop grace after a failed init
TELL_PEERS_POLL_S = 0.05
STATE_DIR_CHECK_S = 2.0  # how often a running agent checks that its state dir is still there
ALIVE_EVERY_S = 0.5  # how often init hears that this agent's event loop runs (a quarter of the
# shortest heartbeat timeout, 1 s, at most)
ENDED_POLL_S = 2.0  # asking the service what ended this host's generation, when a heartbeat was refused


class Agent:
    """One host's membership in the cluster. Create, then ``await run()``."""

    def __init__(self, options: AgentOptions, reporter: Reporter) -> None:
        self.options = options
        self.spec = options.spec
        self.task = options.task
        self.reporter = reporter
        self.incarnation = secrets.randbits(63) or 1
        self.stop = asyncio.Event()
        self.shutdown_all = False
        self.cluster_error: TpuctlError | None = None
        self.failures: tuple[Failure, ...] = ()
        self.failed_at: float | None = None
        self.changed = asyncio.Event()  # set (and replaced) on every change: ``notify``
        self.failed = asyncio.Event()  # set when the cluster errs (``cluster_error``)
        self.info: AgentInfo | None = None  # this agent's description (``agent.json``), once a mapping exists
        self.job_env: JobEnv | None = None  # the answer to Op.ENV, computed once the mapping exists
        self.client: CoordinationClient | None = None
        self.current: Generation | None = None  # the latest generation (while re-forming: the one that ended)
        self.rejoining: GenerationEnd | None = None  # the generation ended; the next one is forming
        self.formed = 0  # the latest generation whose mapping is committed on this host
        self.history: list[HistoryRow] = []  # every generation: when it formed, when and why it ended
        self._server: CoordinationServer | None = None
        self._metrics: MetricsEndpoint | None = None  # /metrics (the spec's metrics:), while running
        self._tasks: list[asyncio.Task[None]] = []
        self._control: asyncio.Task[None] | None = None  # serving local commands, from the first mapping on
        self._main_task: asyncio.Task[object] | None = None  # the bring-up, cancelled when init cannot finish
        self._ready = False
        self.cluster_formed = False  # the first generation's final barrier passed on this host
        self._interrupted: tuple[str, signal.Signals | None] | None = None  # why the bring-up was stopped
        self._last_generation = 0
        self._previous_credential = b""
        self._credentials: dict[str, bytes] = {}
        """The credential of this process's last registration with each service address: a host that moved
        to a successor's service and back proves itself to the one it left (which holds its task for it)."""
        self.progress = JobProgress(self.spec.watchdog, Path(options.state.progress_socket))
        """The job's step reports (``tpuctl.job.progress``) and this host's pace reports to the watchdog."""
        self.dumps = DumpTaker(Path(options.state.path))  # the black box: this host's stacks, on order
        self.notices = Notices(self, self.progress.checkpoints)
        """Preemption notices: this host's own, every host's as the coordinator pushes them, the agreement."""
        self._sigterm = False  # a first SIGTERM raised a notice; a second one leaves at once
        self._watches: list[KeyWatch] = []  # the GCE metadata watch's threads
        self.standby = False  # registered into the current generation without being one of its members
        self.generation_spec = self.spec  # the current generation's spec (``tpuctl.spec.elastic.for_plan``)
        self.rank = self.task  # this host's process rank in it
        from tpuctl.spec import hostenv
        from tpuctl.spec.elastic import host_shape

        self.shape = host_shape(self.spec, hostenv.environ())  # what this host's backend reports about its slice
        self.coordinator_task = 0  # the task whose host serves the cluster now (a successor, once it moved)
        self.coordinator_target = self.spec.coordinator_target
        self._token: str | None = None
        self._lost_coordinator: GenerationEnd | None = None  # the coordinator's host was lost: find its successor
        self._took_over_from: int | None = None  # this host's service took over from that task (None: task 0's own)
        self._moving_to: Found | None = None  # this host's service yields to that one: join it (``_watch_succession``)
        self._stalled = asyncio.Event()  # this host's service could not run for half the heartbeat timeout or more
        self._look_until = 0.0  # until then (monotonic) a formed generation's service looks for a successor

    def notify(self) -> None:
        """Wake every local long-poll (``tpuctl run``'s watcher): something changed."""
        event, self.changed = self.changed, asyncio.Event()
        event.set()

    # --- life cycle ------------------------------------------------------------------------------

    async def run(self) -> int:
        lock = self.options.state.take_lock()
        try:
            self.options.state.write_pid(os.getpid())
            return await self._run_locked()
        finally:
            # Only a dead agent leaves its registration behind (for its successor to reclaim).
            for path in (self.options.state.socket, self.options.state.pid_file, self.options.state.registration_file):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            lock.close()

    async def _run_locked(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        loop.add_signal_handler(INIT_INTERRUPTED, self.init_gone, "its tpuctl init was interrupted")
        alive = asyncio.create_task(self._say_alive(), name="alive")
        try:
            try:
                await self._bring_up()
            except OSError as exc:
                raise self._own_failure(exc) from exc
        except TpuctlError as exc:
            log.error("init failed: %s", exc)
            await self._tell_the_cluster(exc)
            await self._until_every_host_heard(exc)
            self.reporter.failed(exc)
            await self._tear_down(leaving=False)
            return exc.exit_code
        except asyncio.CancelledError:
            reason = self.cluster_error or self._interruption()
            if self.cluster_error is None:  # the peers hear why at once, not as a heartbeat timeout
                await self._tell_the_cluster(reason, within=INTERRUPTED_REPORT_S)
            await self._until_every_host_heard()
            self.reporter.failed(reason)
            await self._tear_down(leaving=False)
            return reason.exit_code
        finally:
            alive.cancel()
            with contextlib.suppress(StateError):
                remove(self.current.pending if self.current is not None else None)
        await self.stop.wait()
        if self.shutdown_all:
            await self._until_every_host_heard_the_shutdown()
        await self._tear_down(leaving=True)
        return 0

    def _on_signal(self, sig: signal.Signals) -> None:
        """SIGTERM, SIGINT, SIGHUP: leave the cluster. Before the cluster formed the bring-up stops; once it
        formed on this host (the final barrier passed: ``cluster_formed``) it finishes, reports ready, then leaves,
        as with ``tpuctl down``: never gone with a committed mapping and no word to ``init``. A first SIGTERM while
        this host's job asks whether to checkpoint is a preemption notice first (:mod:`tpuctl.agent.notices`)."""
        if sig == signal.SIGTERM and not self._sigterm and self.up() is not None and self.taking_part:
            # GKE, systemd or a person stopping this host: its job asks whether to checkpoint, so every host's
            # job gets to save the same step first (the spec's preemption.grace); a second SIGTERM leaves now.
            self._sigterm = True
            grace = self.spec.preemption.grace
            log.warning("received SIGTERM: raising a notice for this host (deadline %g s; a second SIGTERM leaves at once)",
                        grace)  # fmt: skip
            self._tasks.append(asyncio.create_task(
                self.notices.raise_or_leave("sigterm", f"the agent (pid {os.getpid()}) got SIGTERM", grace),
                name="sigterm-notice",
            ))  # fmt: skip
            return
        log.info("received %s: leaving the cluster", sig.name)
        if not self.cluster_formed and self._interrupted is None:
            self._interrupted = (sig.name, sig)
            self._stop_bringing_up()
        self.stop.set()
        self.notify()

    def init_gone(self, why: str) -> None:
        """The ``tpuctl init`` that started this agent is gone: interrupted (it sends ``INIT_INTERRUPTED``
        and waits for the outcome), or dead (its pipe broke). Before the cluster formed this agent leaves
        with it (it would otherwise keep registering, and the cluster would form around it); once the
        cluster formed on this host (the final barrier passed) it stays, the cluster's: ``tpuctl down``
        stops it. One event loop decides, so the signal and the final barrier never half-overlap."""
        if self.stop.is_set() or self._interrupted is not None:
            return
        if self.cluster_formed:
            log.info("%s after the cluster formed: this agent stays (`tpuctl down` stops it)", why)
            return
        log.warning("task %d: %s before the cluster formed: leaving", self.task, why)
        self._interrupted = (why, None)
        self._stop_bringing_up()
        self.stop.set()
        self.notify()

    def _stop_bringing_up(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._main_task is not None:
            self._main_task.cancel()

    def _interruption(self) -> TpuctlError:
        """Why the bring-up was cancelled without a cluster error: a signal, or init gone."""
        why, sig = self._interrupted or ("a signal", None)
        if sig is not None:
            why = f"this agent received {why}"
        return InterruptError(
            f"task {self.task}: init was interrupted before the cluster formed ({why}); this host's agent left",
            signal_number=int(sig) if sig is not None else signal.SIGINT,
        )

    async def _bring_up(self) -> None:
        self._main_task = asyncio.current_task()
        spec, task = self.spec, self.task
        self.reporter.phase("registering", spec.coordinator.register_timeout)
        token = self._token = load_token(spec)
        previous = self.options.state.read_registration(spec.cluster, task)
        if previous is not None:  # a dead agent's registration: this process replaces it
            self._last_generation, self._previous_credential = previous
        if spec.metrics is not None:
            from tpuctl.metrics.agent import serve_agent_metrics  # prometheus_client: only with metrics on

            self._metrics = await serve_agent_metrics(self)
        found = await discover(spec, token) if spec.successors else None  # the coordinator may have moved
        if found is not None:
            self.coordinator_task, self.coordinator_target = found.task, found.target
            self.reporter.progress(
                f"task {task}: the cluster's coordinator is task {found.task} ({found.target}) at generation "
                f"{found.generation}; joining it"
            )
        elif task == 0:
            first = self._last_generation + 1 if spec.restart.rejoin and self._last_generation else 1
            self._server = await start_service(
                spec, token, first_generation=first, journal=Path(self.options.state.goodput_journal),
                started=self.options.started or None,
            )  # fmt: skip
            self._server.service.on_stalled = self._service_stalled
            again = f" at generation {first} (the previous coordinator died)" if first > 1 else ""
            self.reporter.progress(f"task 0: coordination service listening on {spec.coordinator_target}{again}")
        self.client = connect(spec, token, target=self.coordinator_target)
        self.client.coordinator_task = self.coordinator_task
        await self._form(first=True)
        self._ready = True
        self._tasks.append(asyncio.create_task(self._watch_state_dir(), name="watch-state-dir"))
        self._tasks.append(asyncio.create_task(self._generations(), name="generations"))
        self._watch_metadata()
        self.reporter.ready(self._summary())

    @property
    def generation(self) -> int:
        return self.current.number if self.current is not None else 0

    @property
    def service(self) -> CoordinationServicer | None:
        """Task 0's coordination service, once started (for metrics)."""
        return self._server.service if self._server is not None else None

    async def _form(self, *, first: bool) -> None:
        """Register and bring up a generation; again while generations end before they form. Raises the
        final error (and this host's own failures)."""
        # Every retry is a restart the service counts; a registration dropped while the generation formed
        # (``GenerationEnd.again``) is not, but each one took a heartbeat timeout of silence: at most so
        # many fit in the time the generation has to form.
        spec = self.spec
        wait = spec.coordinator.register_timeout if first else spec.restart.timeout
        again = int(wait / spec.coordinator.heartbeat_timeout) + 1
        for _ in range(spec.restart.max_restarts + 2 + again):
            end = await self._form_once(first=first)
            if end is None:
                return
            if end.shutdown:  # `tpuctl down --all` while this generation formed: a shutdown, not a failure
                self.failures = ()
                raise end.error
            if not end.rejoin or self.stop.is_set():
                self.failures = end.failures
                self.cluster_error = end.error
                if not first:  # after init nobody else says it (``_fail`` finds the error already set)
                    log.error("task %d: %s", self.task, end.error.message)
                raise end.error
            if end.again:
                await self._register_again(end)
                continue
            await self._leave_generation(end)
        raise ClusterError(f"task {self.task}: generations kept ending before they formed")

    async def _form_once(self, *, first: bool) -> GenerationEnd | None:
        """One generation's bring-up: None once it formed, else why it ended first."""
        spec, task = self.spec, self.task
        if self._moving_to is not None:
            found, self._moving_to, self._lost_coordinator = self._moving_to, None, None
            await self._move_to(found)
        elif self._lost_coordinator is not None:
            lost, self._lost_coordinator = self._lost_coordinator, None
            await self._succeed(lost)
        elif not first and self._server is not None and self.coordinator_task == task and spec.successors:
            await self._step_down_if_moved()
        wait = spec.coordinator.register_timeout if first else spec.restart.timeout
        # Registered on the session's stream: it heartbeats from then on, since waiting for late hosts can
        # take longer than the heartbeat timeout.
        assert self.client is not None  # made by the bring-up
        # What this host's backend found about its slice, and whether it is a spare: the service refuses a
        # shape that differs from the cluster's (Reason.SHAPE_MISMATCH, exit 2) and places a spare as standby.
        registering: Registering = {
            "incarnation": self.incarnation,
            "hostname": socket.gethostname(),
            "connect_timeout": self._connect_within(wait),
            "generation": self._last_generation,
            "previous_credential": self._credentials.get(self.coordinator_target, self._previous_credential),
            "answered_before": self.current is not None,  # this process registered before: the coordinator was up
        }
        cast("dict[str, object]", registering).update(slice_shape=self.shape, spare=spec.is_spare(task))
        if self.current is not None and self.current.number == self._last_generation:
            # The plan of the generation this host was in: a successor's fresh service forms the next one only
            # with a majority of its members (a partition leaves at most one side able to).
            registering["previous_plan"] = self.current.membership.plan
        asked = time.monotonic()
        try:
            session = await self.client.open_session(
                spec.cluster,
                task,
                interval=spec.coordinator.heartbeat_interval,
                give_up_after=spec.coordinator.heartbeat_timeout,
                **registering,
            )
        except ClusterFailed as exc:  # the cluster failed for good, or was shut down, before this host was back
            if not spec.restart.rejoin:
                raise
            return self._failure_end(exc.failure)
        except CoordinatorUnreachable as exc:
            if not spec.restart.rejoin or self.current is None or time.monotonic() - asked >= wait:
                raise  # a new host's first registration, or nobody answered for the whole wait: final
            # Registering again (a generation ended), the coordinator went away under it (stopped, killed,
            # cut off): as when it stops answering a formed generation, wait for it (or its successor) to
            # answer, within the restart timeout, instead of failing for good after the heartbeat timeout.
            serving = self.coordinator_task
            cause = f"the coordinator at {self.coordinator_target} (task {serving}) stopped answering: {exc.message}"
            failures = (Failure(serving, spec.hosts[serving], cause),)
            return GenerationEnd(self._last_generation, True, ClusterError(cause), failures, coordinator_lost=True)
        gen = self.current = Generation(session, asyncio.get_running_loop().create_future())
        if gen.number > 1:
            wait = spec.restart.timeout  # the service's deadline for any generation but a new cluster's first
        session.on_verdict = self._on_verdict
        session.on_notice = self.notices.heard
        session.on_agreement = self.notices.decided
        session.on_dump = lambda order: self.dumps.on_order(session, order)
        number = gen.number
        self._last_generation, self._previous_credential = number, gen.membership.task.credential
        self._credentials[self.coordinator_target] = self._previous_credential  # at most one per candidate
        self.options.state.write_registration(spec.cluster, task, number, self._previous_credential)
        remove(self.options.output)  # the last run's mapping must not outlive a failed init (peers hear why)
        gen.tasks.append(asyncio.create_task(self._heartbeats(gen), name=f"heartbeats-{number}"))
        if self._server is not None and self.coordinator_task == task and spec.successors:
            gen.tasks.append(asyncio.create_task(self._watch_succession(gen), name=f"watch-succession-{number}"))
        steps = asyncio.create_task(self._form_steps(gen, wait), name=f"form-{number}")
        waiting: set[asyncio.Future[None] | asyncio.Future[GenerationEnd]] = {steps, gen.ended}
        try:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            steps.cancel()
            raise
        if not steps.done():
            steps.cancel()
            with contextlib.suppress(BaseException):
                await steps
            return gen.ended.result()
        failed = steps.exception()
        if isinstance(failed, ClusterFailed) and self.spec.restart.rejoin:
            return self._failure_end(failed.failure)  # the refusal said what ended the cluster: nothing to ask
        if failed is not None and gen.ended.done():
            return gen.ended.result()  # the step failed because the generation ended: say why
        if isinstance(failed, ClusterError) and self.spec.restart.rejoin:
            end = await self._why_ended(gen, failed)  # the generation ended under the step?
            if end.rejoin or end.failures:
                return end  # re-form, or the cluster's final error with its failures
        steps.result()  # this host's own failure (or the cluster's final one) raises here
        return None

    async def _form_steps(self, gen: Generation, wait: float) -> None:
        task = self.task
        generation = gen.number
        membership = gen.membership
        if membership.standby:
            await self._stand_by(gen)
            return
        self.standby = False
        spec = self.spec
        rank = task
        task_ids: list[int] | None = None
        runs: tuple[tuple[int, int], ...] = ()
        if membership.plan is not None:  # a generation of its own plan: members in rank order, its slice count
            from tpuctl.spec.elastic import for_plan, roster_of

            roster = roster_of(spec)
            spec = for_plan(self.spec, membership.plan)
            placed = membership.plan.rank_of(task, roster)
            if placed is None:
                raise ClusterError(f"task {task}: generation {generation}'s plan ({membership.plan.describe()}) "
                                   "leaves this host out, but the coordinator did not say it stands by")  # fmt: skip
            rank, task_ids, runs = placed, membership.plan.members(roster), membership.plan.runs
        self.generation_spec, self.rank = spec, rank
        g = f" (generation {generation})" if generation > 1 else ""
        self.reporter.phase("waiting for every host", wait)
        self.reporter.progress(f"task {task}: registered with {self.coordinator_target}{g}; waiting for every host")
        waiting_since = time.monotonic()
        await gen.session.wait_for_all(
            timeout=wait,
            progress=lambda progress: self.reporter.progress(
                f"task {task}{g}: {progress.describe_wait(time.monotonic() - waiting_since)}"
            ),
            progress_every=REGISTER_PROGRESS_EVERY_S,
        )
        gen.all_registered = True
        gen.tasks.append(asyncio.create_task(self._watch_errors(gen), name=f"watch-errors-{generation}"))
        self.reporter.phase("merging core IDs", probe_limit(spec) + spec.barrier_timeout)
        mapping, job_ports = await merge(
            gen.session,
            spec,
            rank,
            await local_core_ids(spec, rank, self.reporter.progress),
            incarnation=self.service_incarnation,
            generation=generation,
            progress=self.reporter.progress,
            task_ids=task_ids,
            plan=runs,
        )
        gen.pending = write_pending(self.options.output, mapping)
        self.reporter.progress(f"task {task}: wrote {self.options.output} (pending until every host has)")
        self.info = self._info(job_ports)
        self.options.state.write_info(self.info)
        self.job_env = self._job_env(self.info, mapping)
        await self._serve_local_commands()
        self.reporter.phase("the final barrier", spec.barrier_timeout)
        await gen.session.barrier(INIT_DONE_BARRIER, timeout=spec.barrier_timeout)
        self.cluster_formed = True  # from here on an interrupted init leaves this agent up (``init_gone``)
        # Every host has its mapping: only now does it take the place jobs read it from, so a cluster
        # that never came up leaves no mapping that loads as valid.
        commit(gen.pending, self.options.output)
        gen.pending = None
        self.rejoining = None
        self.failures = ()  # what ended the last generation is history now (``history``), not this one's cause
        self.formed = generation
        self.progress.start(generation, len(spec.hosts), gen.session.report_pace)  # the generation's hosts
        self.progress.checkpoints.start(generation, gen.session.report_checkpoint)
        self.history.append({"generation": generation, "formed": time.time(), "ended": None, "cause": None})
        del self.history[: -(spec.restart.max_restarts + 2)]
        if generation > 1:
            log.info("task %d: generation %d formed", task, generation)
        self.notify()

    async def _stand_by(self, gen: Generation) -> None:
        """This host registered into generation ``gen`` but is not one of its members (a spare, or a host of a
        slice the generation left out): it heartbeats and watches for the generation's end, when it registers
        again and may be chosen (``_generations``). Init reports it stands by and exits 0."""
        self.standby = True
        self.job_env = None
        self.cluster_formed = True  # init reports it stands by and exits: this agent is the cluster's from here
        gen.tasks.append(asyncio.create_task(self._watch_errors(gen), name=f"watch-errors-{gen.number}"))
        plan = gen.membership.plan
        if plan is not None:  # the generation's members (agent.json lists them, as a member's does)
            from tpuctl.spec.elastic import for_plan

            self.generation_spec = for_plan(self.spec, plan)
        self.rank = self.task
        # `tpuctl status`, `down` and `run` find this agent; `env` and `barrier` say it stands by (StandbyError)
        self.info = self._info(NO_JOB_PORTS, role=STANDBY)
        self.options.state.write_info(self.info)
        await self._serve_local_commands()
        where = f" ({plan.describe()})" if plan is not None else ""
        self.reporter.progress(
            f"task {self.task}: standing by in generation {gen.number}{where}: this host takes a lost slice's place "
            "when the cluster needs it"
        )
        log.info("task %d: standing by in generation %d%s", self.task, gen.number, where)
        self.notify()

    async def _serve_local_commands(self) -> None:
        """From this host's first generation on (a member's mapping written, or standing by): the control socket."""
        if self._control is None:
            await self.progress.open()
            control = await serve(Path(self.options.state.socket), LocalCommands(self, self.options.state.path).handle)
            self._control = asyncio.create_task(_serve_forever(control), name="control")
            self._tasks.append(self._control)

    async def _leave_generation(self, end: GenerationEnd) -> None:
        """Generation ``end.generation`` is over: stop its work, remove its mapping, say so."""
        self.rejoining = end
        self.failures = end.failures
        self.job_env = None
        if self.history and self.history[-1]["generation"] == end.generation:
            row = self.history[-1]
            row["ended"], row["cause"] = time.time(), end.error.message
        self.progress.stop()  # the job is being stopped: its reports do not count for the next generation
        self.notify()
        if end.again:
            log.warning("task %d: %s; registering again", self.task, end.error.message)
        else:
            log.warning("task %d: %s; re-forming as the next generation", self.task, end.error.message)
        if end.coordinator_lost and any(t != self.coordinator_task for t in self.spec.successors):
            self._lost_coordinator = end  # the next registration goes to the successor (``_succeed``)
        if not self._ready:  # init still waits: it hears the real cause now, not at its deadline
            wait = self.spec.coordinator.register_timeout if self.formed == 0 else self.spec.restart.timeout
            self.reporter.phase("registering", wait)
            if end.again:
                self.reporter.progress(f"{end.error.message}; registering again")
            else:
                self.reporter.progress(
                    f"task {self.task}: generation {end.generation} ended before init finished: {end.error.message}; "
                    f"waiting up to {wait:g} s for generation {end.generation + 1} to form (restart policy rejoin)"
                )
        gen = self.current
        if gen is not None:
            await gen.stop()
        with contextlib.suppress(StateError):
            remove(gen.pending if gen is not None else None)
            remove(self.options.output)
        if gen is not None:
            gen.pending = None

    async def _register_again(self, end: GenerationEnd) -> None:
        """The service dropped this host's registration while generation ``end.generation`` formed (silent
        for the heartbeat timeout: frozen or cut off while waiting for the others): register into it again.
        Nothing of the generation was done here yet (every host had not registered), so nothing is redone."""
        if self._moving_to is None:
            log.warning(
                "task %d: the coordinator dropped this host's registration into generation %d while it formed (%s); "
                "registering again",
                self.task,
                end.generation,
                end.error.message,
            )
        gen = self.current
        if gen is not None:
            await gen.stop()

    async def _generations(self) -> None:
        """After init: re-form whenever a generation ends and the cluster re-forms; fail when it is final."""
        while not self.stop.is_set():
            assert self.current is not None
            end = await self.current.ended
            if end.shutdown:
                return
            if not end.rejoin or self.stop.is_set():
                self.failures = end.failures
                self._fail(end.error)
                return
            await self._leave_generation(end)
            try:
                try:
                    await self._form(first=False)
                except OSError as exc:
                    raise self._own_failure(exc) from exc
            except TpuctlError as exc:
                if not self.shutdown_all:
                    await self._tell_the_cluster(exc)  # this host's own failure (a full state dir): every peer hears it
                    self._fail(exc)
                return

    # --- a coordinator that moves (``coordinator.successors``; :mod:`tpuctl.agent.succession`) ------------

    async def _succeed(self, end: GenerationEnd) -> None:
        """The coordinator's host was lost in generation ``end.generation``: find who serves the next one.
        Every survivor tries the same order (the successors after the lost one, it last), each candidate for
        the heartbeat timeout; the first candidate that is this host starts the service on its own address
        at the next generation (one that cannot bind hands over to the next). Bounded by the restart timeout."""
        from tpuctl.spec.successors import succession_order

        spec, task, lost = self.spec, self.task, self.coordinator_task
        order = succession_order(spec.successors, lost)
        per = spec.coordinator.heartbeat_timeout
        started = time.monotonic()
        deadline = started + spec.restart.timeout
        self.reporter.progress(
            f"task {task}: the coordinator, task {lost} ({self.coordinator_target}), is lost; looking for its "
            f"successor (tasks {', '.join(map(str, order))}, up to {per:g} s each)"
        )
        while True:
            for candidate in order:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ClusterError(
                        f"task {task}: no coordinator answered within the restart timeout ({spec.restart.timeout:g} s) "
                        f"after the coordinator, task {lost}, was lost (tried tasks {', '.join(map(str, order))})",
                        hint="check the successors' agent logs; `tpuctl init` on any host of the cluster looks "
                        "for the live coordinator first",
                    )
                if candidate == task and self._server is None and not await self._serve(end.generation + 1, lost):
                    continue
                where = spec.coordinator_target_at(candidate)
                asked = (candidate,) if candidate == lost else (candidate, lost)  # the lost one may be back
                found = await wait_for_any(spec, self._token, asked, min(per, left))
                if found is not None:
                    await self._move_to(found)
                    self.reporter.progress(
                        f"task {task}: the coordinator is now task {found.task} ({found.target}, generation "
                        f"{found.generation}), {time.monotonic() - started:.1f} s after the loss was judged"
                    )
                    return
                self.reporter.progress(f"task {task}: task {candidate} ({where}) did not answer within {per:g} s; "
                                       "trying the next successor")  # fmt: skip

    def _connect_within(self, wait: float) -> float:
        """How long a registration retries a coordinator that does not answer at all: ``wait`` (the
        register or restart timeout), but only the heartbeat timeout when registering again (this process
        was answered before) to another host's service that a successor may replace: a coordinator gone
        between two generations (``tpuctl down`` on its host: the survivors re-form, then find nobody) is
        lost as one that stops answering a session is, and ``_succeed`` finds the next."""
        spec = self.spec
        if self.current is None or self.coordinator_task == self.task:
            return wait
        if not any(t != self.coordinator_task for t in spec.successors):
            return wait  # nobody else may serve: wait for this coordinator to come back
        return min(wait, spec.coordinator.heartbeat_timeout)

    async def _serve(self, first: int, lost: int) -> bool:
        """Start the coordination service on this host's address at generation ``first`` (a successor taking
        over from task ``lost``); False, said, when it cannot (the port is taken, TLS files missing)."""
        spec, task = self.spec, self.task
        try:
            previous = self.current.membership.plan if self.current is not None else None
            self._server = await start_service(
                spec, self._token, first_generation=first, journal=Path(self.options.state.goodput_journal), task=task,
                previous_plan=previous, lost=(lost,),
            )  # fmt: skip
            self._server.service.on_stalled = self._service_stalled
        except (TpuctlError, OSError) as exc:
            why = exc.message if isinstance(exc, TpuctlError) else str(exc)
            log.warning("task %d: cannot take the coordination service over: %s", task, why)
            self.reporter.progress(
                f"task {task}: cannot serve as the coordinator: {why}; handing over to the next successor"
            )
            return False
        self._took_over_from = lost
        self.reporter.progress(
            f"task {task}: coordination service listening on {spec.coordinator_target_at(task)} at generation "
            f"{first} (taking over from task {lost})"
        )
        return True

    async def _move_to(self, found: Found) -> None:
        """Talk to the service ``found`` from now on (this host's own service, if it is another, stops)."""
        if found.task != self.task and self._server is not None:
            server, self._server, self._took_over_from = self._server, None, None
            await server.stop(grace=FAILED_STOP_GRACE_S)
        if found.target != self.coordinator_target or self.client is None:
            old, self.client = self.client, connect(self.spec, self._token, target=found.target)
            self.client.coordinator_task = found.task
            if old is not None:
                with contextlib.suppress(BaseException):
                    await old.close()
        self.coordinator_task, self.coordinator_target = found.task, found.target
        self.notify()

    async def _step_down_if_moved(self) -> None:
        """This host serves, and its generation ended: when a successor took over meanwhile (this host was
        frozen or cut off longer than the heartbeat timeout), its service at the same or a later generation
        wins, and this host joins it as a worker. O(successors) probes, refused at once when nobody serves."""
        from tpuctl.agent.succession import superseded

        assert self._server is not None
        own = self._server.service.state.generation
        found = await superseded(self.spec, self._token, self.task, self._took_over_from, own)
        if found is None:
            return
        # The hosts that registered again here meanwhile go there at once, not after a heartbeat timeout of
        # refused connections.
        self._yield_service(found, own)
        await self._move_to(found)

    async def _watch_succession(self, gen: Generation) -> None:
        """This host serves generation ``gen``: look for another candidate serving in this service's place (a
        successor that took over while this host was frozen or cut off, or that started after this host's
        own discovery found nobody). While ``gen`` forms, every ``WATCH_EVERY_S``: two services would each
        wait for the hosts registered with the other until the timeouts. Once it formed, only after this
        service stalled (``_service_stalled``: its host frozen past half the heartbeat timeout), every
        ``PROBE_EVERY_S`` for as long as the survivors take to judge it lost and a successor to serve: the
        hosts that stayed with this service would otherwise learn only when it judged the others failed, a
        heartbeat timeout later (soak seed 70045). The service that yields (``succession.yields_to``,
        decided the same way on both sides) steps down: it tells every host where the cluster went
        (``ClusterFailure.moved``), and its host joins the other as a worker. O(successors) brief probes
        a round; nothing at all while a formed generation's service runs smoothly."""
        from tpuctl.agent.succession import PROBE_EVERY_S, WATCH_EVERY_S, superseded

        while self._server is not None and gen is self.current and not gen.ended.done():
            forming = not gen.all_registered and not gen.membership.standby
            if not forming and time.monotonic() >= self._look_until:
                self._stalled.clear()
                await self._stalled.wait()
                continue
            own = self._server.service.state.generation
            found = await superseded(self.spec, self._token, self.task, self._took_over_from, own)
            if found is not None and self._server is not None and gen is self.current and not gen.ended.done():
                self._step_down(gen, found, own)
                return
            await asyncio.sleep(WATCH_EVERY_S if forming else PROBE_EVERY_S)

    def _service_stalled(self, seconds: float) -> None:
        """This host's service could not run for ``seconds`` (at least half the heartbeat timeout: its host
        was frozen or starved): the survivors may have judged it lost and a successor may serve. Look for
        one (``_watch_succession``) for as long as that takes: the heartbeat timeout for the judgement, then
        as much again for each candidate before the last one to answer or be passed over."""
        if not self.spec.successors:
            return
        per = self.spec.coordinator.heartbeat_timeout
        self._look_until = time.monotonic() + per * (len(candidates(self.spec)) + 1)
        log.info("task %d: this host's coordination service could not run for %.1f s; looking for a successor that "
                 "took over meanwhile", self.task, seconds)  # fmt: skip
        self._stalled.set()

    def _yield_service(self, found: Found, own: int) -> str:
        """This host's service (at generation ``own``) yields to ``found``: say so here and tell every host
        where the cluster went (the service's ``step_down``, pushed now, the answer to every call after).
        Returns why, for the generation's end."""
        assert self._server is not None
        why = (f"task {found.task} ({found.target}) serves the cluster at generation {found.generation} "
               f"(this host's service is at {own})")  # fmt: skip
        log.warning("task %d: %s: stepping down, joining it as a worker", self.task, why)
        self.reporter.progress(f"task {self.task}: task {found.task} ({found.target}) took the coordination "
                               f"service over at generation {found.generation}; joining it")  # fmt: skip
        self._server.service.step_down(Moved(found.task, found.generation), f"stepped down as the coordinator: {why}")
        return why

    def _step_down(self, gen: Generation, found: Found, own: int) -> None:
        """This host's service yields to ``found``: every host hears where the cluster went (the service's
        ``step_down``, pushed now, the answer to every call after), and this host joins it as a worker."""
        why = self._yield_service(found, own)
        self._moving_to = found
        cause = f"stepped down as the coordinator: {why}"
        if gen.all_registered:  # formed: the job here stops, as on any other host
            failure = Failure(self.task, self.spec.hosts[self.task], cause)
            self._end(gen, GenerationEnd(gen.number, True, ClusterError(f"task {self.task}: {why}"), (failure,)))
        else:
            self._end(gen, GenerationEnd(gen.number, True, ClusterError(f"task {self.task}: {why}"), again=True))

    def _watch_metadata(self) -> None:
        """The GCE metadata server's preemption and maintenance notices, where a watch belongs
        (:mod:`tpuctl.agent.metadata_watch`); each raises a notice for this host from the event loop."""
        from tpuctl.agent.metadata_watch import watch_metadata
        from tpuctl.spec import hostenv

        loop = asyncio.get_running_loop()

        def on_notice(source: str, reason: str, seconds: float) -> None:  # in a watch's thread
            with contextlib.suppress(RuntimeError):  # the loop closed: this agent is exiting anyway
                loop.call_soon_threadsafe(self._metadata_notice, source, reason, seconds)

        self._watches = watch_metadata(
            on_notice, hostenv.environ(), backend=self.spec.backend, setting=self.spec.preemption.metadata
        )

    def _metadata_notice(self, source: str, reason: str, seconds: float) -> None:
        if self.stop.is_set():
            return
        log.warning("GCE metadata server: %s: this host goes away in about %g s", reason, seconds)
        self._tasks.append(asyncio.create_task(self.notices.raise_or_leave(source, reason, seconds), name="gce-notice"))

    def up(self) -> Generation | None:
        """The generation this host is in, when it formed here and is neither re-forming, failed nor leaving."""
        gen = self.current
        if gen is None or self.rejoining is not None or self.cluster_error is not None or self.stop.is_set():
            return None
        return gen if self.formed == gen.number else None

    def go_away(self, why: str) -> None:
        """Leave the cluster now, as ``tpuctl down`` does (under policy rejoin the generation ends)."""
        if not self.stop.is_set():
            log.warning("task %d: %s", self.task, why)
        self.stop.set()
        self.notify()

    @property
    def taking_part(self) -> int:
        """Processes of this host's job that ask whether to checkpoint (``tpuctl.job.should_checkpoint``)."""
        return self.progress.checkpoints.taking_part

    async def preempt(self, source: str, reason: str, seconds: float) -> dict[str, object]:
        """``tpuctl preempt`` (and ``tpuctl run`` on SIGTERM): a notice for this host (:mod:`tpuctl.agent.notices`)."""
        return await self.notices.raise_notice(source, reason, seconds)

    def _on_verdict(self, verdict: Verdict) -> None:
        """A watchdog finding, pushed by the coordinator to every host: this host's log says it."""
        level = logging.INFO if verdict.kind == "recovered" else logging.WARNING
        log.log(level, "watchdog: %s", verdict.message)

    def _end(self, gen: Generation, end: GenerationEnd) -> None:
        """Generation ``gen`` ended (the first word on it counts; a generation already left is not told)."""
        if gen is self.current:
            gen.end(end)

    @property
    def service_incarnation(self) -> int:
        return self.current.membership.service_incarnation if self.current is not None else 0

    async def _tear_down(self, *, leaving: bool) -> None:
        for watch in self._watches:
            watch.stop()  # daemon threads: a request they hold never keeps this process from exiting
        self.notices.stop()
        self.progress.close()
        gen = self.current
        tasks = self._tasks + (gen.tasks if gen is not None else [])
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        if self.client is not None:
            if leaving and gen is not None and not self.shutdown_all:
                with contextlib.suppress(TpuctlError, OSError):
                    await self.client.disconnect(gen.membership.task)
            with contextlib.suppress(BaseException):
                await self.client.close()
        if self._server is not None:
            # In-flight answers get a moment to leave; after a failed init every host has heard already
            # (what is still open is a dead host's stream), so not a whole second.
            await self._server.stop(grace=1.0 if leaving else FAILED_STOP_GRACE_S)
        if self._metrics is not None:
            await self._metrics.close()

    async def _tell_the_cluster(self, exc: TpuctlError, *, within: float = REPORT_TIMEOUT_S) -> None:
        """Init failed here for a reason of this host's own (the mapping write, the backend, ...): report
        it, so every peer fails at once naming this host and the real cause, not a heartbeat timeout."""
        if self.client is None or self.current is None or self.cluster_error is not None:
            return  # not registered, or the failure came from the cluster: nothing new to tell it
        if isinstance(exc, (ClusterError, DeadlineError)):
            return  # the cluster's own failure or a cluster-wide wait: every host already knows
        with contextlib.suppress(TpuctlError, OSError, asyncio.TimeoutError):
            await asyncio.wait_for(
                self.client.report_error(self.current.membership.task, f"init failed on this host: {exc.message}"),
                within,
            )

    async def _until_every_host_saw_the_certificate(self) -> None:
        """Task 0 refused its own service's certificate (expired, another name, ...): every host does. No
        host can register to be told, but each one that tries meets the same certificate and says why
        (``Channel.tls_refusal``, within a second): keep serving it for ``TELL_TLS_S``."""
        limit = min(TELL_TLS_S, self.spec.coordinator.register_timeout)
        self.reporter.progress(
            f"task 0: keeping the coordination service up for {limit:g} s, so that the hosts trying to register "
            "meet its certificate and say why"
        )
        await asyncio.sleep(limit)

    async def _until_every_host_heard(self, failure: TpuctlError | None = None) -> None:
        """On task 0, whose init is failing: keep the coordination service up until every host has heard
        the cluster's error (``untold``): a registered one for at most ``TELL_PEERS_S`` (it is between
        two calls, or in one), one not registered yet for ``TELL_UNREGISTERED_S`` (one that is retrying
        comes back within a quarter of a second; one that never started never will). Without it such a
        host finds the port closed and can only say "coordinator unreachable", never the cause. Not after
        a signal: the user wants out."""
        if self._server is None or self.stop.is_set():
            return
        if isinstance(failure, TlsRefused) and failure.coordinator_certificate:
            await self._until_every_host_saw_the_certificate()
            return
        state = self._server.service.state
        registered, unregistered = state.untold()
        if not registered and not unregistered:
            return
        limit = min(TELL_PEERS_S, self.spec.coordinator.register_timeout)
        self.reporter.progress(
            f"task 0: keeping the coordination service up until every host has heard why ({registered + unregistered:,} "
            f"have not yet; at most {limit:g} s)"
        )
        started = time.monotonic()
        while True:
            waited = time.monotonic() - started
            registered, unregistered = state.untold()
            if waited >= limit or not (registered or (unregistered and waited < TELL_UNREGISTERED_S)):
                break
            await asyncio.sleep(TELL_PEERS_POLL_S)
        if registered or unregistered:
            log.warning(
                "task 0: %d registered and %d unregistered hosts had not heard the cluster's error after %.1f s",
                registered,
                unregistered,
                waited,
            )

    async def _until_every_host_heard_the_shutdown(self) -> None:
        """On task 0, after ``tpuctl down --all``: keep the coordination service up until every registered
        host has heard the shutdown (``untold``), for at most the heartbeat timeout. A host whose session was
        reconnecting just then (a lost keepalive ping, a cut shorter than the heartbeat timeout) hears it on
        its new stream, instead of finding the port closed and waiting the restart timeout for a coordinator
        that is not coming back (soak seed 50486); a host silent for longer would have been failed anyway."""
        if self._server is None:
            return
        state = self._server.service.state
        limit = self.spec.coordinator.heartbeat_timeout
        started = time.monotonic()
        while state.untold()[0] and time.monotonic() - started < limit:
            await asyncio.sleep(TELL_PEERS_POLL_S)
        if state.untold()[0]:
            log.warning(
                "task 0: %d registered hosts had not heard the shutdown after %.1f s (the heartbeat timeout); "
                "stopping the coordination service",
                state.untold()[0],
                limit,
            )

    # --- background work -------------------------------------------------------------------------

    async def _say_alive(self) -> None:
        """Tell the waiting ``init`` that this event loop runs: a frozen agent (SIGSTOP) goes silent."""
        every = min(ALIVE_EVERY_S, self.spec.coordinator.heartbeat_timeout / 4)
        while True:
            self.reporter.alive()
            await asyncio.sleep(every)

    async def _watch_state_dir(self) -> None:
        """Leave the cluster cleanly when this agent's state dir is deleted or replaced: without it no
        local command can reach or stop this agent, and it would hold the task for nobody."""
        state = self.options.state
        try:
            first = os.stat(state.path).st_ino
        except OSError:
            first = -1
        while not self.stop.is_set():
            await asyncio.sleep(STATE_DIR_CHECK_S)
            try:
                gone = os.stat(state.path).st_ino != first or not os.path.exists(state.socket)
            except OSError:
                gone = True
            if gone:
                log.error("task %d: state dir %s was deleted or replaced: leaving the cluster", self.task, state.path)
                self.stop.set()
                self.notify()
                return

    async def _heartbeats(self, gen: Generation) -> None:
        try:
            await gen.session.run()
        except TpuctlError as exc:
            self._end(gen, await self._why_ended(gen, exc))

    async def _watch_errors(self, gen: Generation) -> None:
        """The cluster's error, pushed on the session (the session's own end is the heartbeats' to tell)."""
        try:
            failure = await gen.session.watch_errors()
        except TpuctlError as exc:
            if exc is gen.session.ended:
                return  # the session itself ended: the heartbeats say why
            self._end(gen, await self._why_ended(gen, exc))
            return
        if failure is None:
            return
        self._end(gen, self._failure_end(failure))

    def _failure_end(self, failure: ClusterFailure) -> GenerationEnd:
        end = failure_end(failure, self.spec.cluster)
        moved = failure.moved
        if end.rejoin and moved is not None and moved.task != self.task and moved.task in candidates(self.spec):
            # The coordinator stepped down for a successor's service: register there at once, at the address
            # this host's spec gives that task (never one from the wire).
            self._moving_to = Found(moved.task, self.spec.coordinator_target_at(moved.task), moved.generation)
        if end.shutdown:
            log.info("cluster shut down: %s", end.error.message)
            self.shutdown_all = True
            self.stop.set()
            self.notify()
        return end

    async def _why_ended(self, gen: Generation, exc: TpuctlError) -> GenerationEnd:
        """A heartbeat, the error watch or a bring-up step failed with ``exc``. Under policy rejoin, a call
        of an ended generation, a restarted coordinator and an unreachable one end this generation (the
        next one forms when the coordinator answers again; the service says what ended it). Every other
        error, and every error under policy fail, is final."""
        membership = gen.membership
        generation = membership.generation
        coordinator, serving = self.spec.hosts[self.coordinator_task], self.coordinator_task
        if self.spec.restart.rejoin and isinstance(exc, ClusterFailed):
            # The refusal carried the cluster's final failure (a shutdown, or no restarts left): asking again
            # could find the service already stopped, and take that for a coordinator to rejoin.
            return self._failure_end(exc.failure)
        if self.spec.restart.rejoin and isinstance(exc, ClusterError):
            if not isinstance(exc, CoordinatorUnreachable):
                try:
                    failure = await self._error_now(gen, ENDED_POLL_S)
                except GenerationOver as again:  # not a generation this coordinator had: it restarted
                    exc = again
                except CoordinatorUnreachable as gone:
                    exc = gone
                except (TpuctlError, asyncio.TimeoutError):
                    pass
                else:
                    if failure is not None:
                        return self._failure_end(failure)
            if isinstance(exc, GenerationOver):
                cause = f"the coordinator restarted: {exc.message}"
                return GenerationEnd(generation, True, ClusterError(cause), (Failure(serving, coordinator, cause),))
            if isinstance(exc, CoordinatorUnreachable):
                cause = f"the coordinator at {self.coordinator_target} (task {serving}) stopped answering: {exc.message}"
                failures = (Failure(serving, coordinator, cause),)
                return GenerationEnd(generation, True, ClusterError(cause), failures, coordinator_lost=True)
            if not gen.all_registered:
                # Refused while waiting for the others, and the generation did not end: the service dropped
                # this registration (silent for the heartbeat timeout while the generation formed: it is
                # only missing again). Registering again is a retry at worst; the registration's answer
                # (taken, the cluster failed) is final.
                return GenerationEnd(generation, True, exc, again=True)
        return GenerationEnd(generation, False, exc)

    async def _error_now(self, gen: Generation, within: float) -> ClusterFailure | None:
        """The cluster's error as the service has it now (None: none): one error poll as ``gen``'s member,
        answered within ``within`` s (``asyncio.TimeoutError`` after), its refusals raised as they come."""
        assert self.client is not None  # made before the first generation
        return await asyncio.wait_for(self.client.watch_errors(gen.membership.task, timeout=0.1, give_up_after=0.0), within)

    def _own_failure(self, exc: OSError) -> StateError:
        """An OSError of this host's own files the bring-up met (the state dir's socket, a write the state
        dir's methods do not name already), as the ``StateError`` every peer is told."""
        from tpuctl.agent.statedir import write_error

        if exc.filename is None:
            return StateError(f"task {self.task}: {exc.strerror or exc}", hint=f"see {self.options.state.log_file}")
        return write_error(self.options.state, os.fsdecode(exc.filename), exc)

    def _fail(self, exc: TpuctlError) -> None:
        if self.cluster_error is None:
            self.cluster_error = exc
            self.failed_at = time.time()
            self.notify()
            self.failed.set()
            log.error("task %d: %s", self.task, exc.message)
            if not self._ready and self._main_task is not None:
                self._main_task.cancel()  # init cannot finish: report the cluster's error now

    async def barrier(self, name: str, timeout: float, generation: int = 0) -> int:
        """A job's barrier (``tpuctl barrier``); ``generation``: the job's (``TPUCTL_GENERATION``; 0: any).
        This agent's own failure verdict, or its generation's end, ends the wait too (a frozen or cut-off
        coordinator never answers a parked call: the heartbeat loop is what notices)."""
        if self.cluster_error is not None:
            raise self.cluster_error
        if self.rejoining is not None:
            raise GenerationOver(
                f"generation {self.rejoining.generation} is over ({self.rejoining.error.message}); the cluster "
                "is re-forming",
                hint="`tpuctl run --max-restarts N` restarts the job once the next generation formed",
            )
        if self.standby:
            raise self.standing_by(f"barrier {name!r}: ", lacks="no job and takes part in no barrier")
        if generation and generation != self.generation:
            ahead = generation > self.generation  # not a generation of this agent's: another cluster's variables?
            raise GenerationOver(
                f"this job is of generation {generation}; the cluster is at generation {self.generation}",
                hint=f"TPUCTL_GENERATION={generation} is ahead of this host's agent: is the job's environment another "
                "cluster's? (`tpuctl env` prints this host's)" if ahead
                else "the job's generation is over: restart it (`tpuctl run --max-restarts N` does)",
            )
        gen = self.current
        assert gen is not None  # local commands are served once a generation formed
        waiting = asyncio.ensure_future(gen.session.barrier(name, timeout=timeout))
        failed = asyncio.ensure_future(self.failed.wait())
        either: set[asyncio.Future[int] | asyncio.Future[Literal[True]] | asyncio.Future[GenerationEnd]] = {
            waiting,
            failed,
            gen.ended,
        }
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            failed.cancel()
            if not waiting.done():
                waiting.cancel()
        if waiting.done() and not waiting.cancelled():
            return int(waiting.result())
        if self.cluster_error is not None:
            raise self.cluster_error
        if gen.ended.cancelled() or self.stop.is_set():  # tear-down cancels the waiters of the generation's end
            raise StateError(
                f"the tpuctl agent of task {self.task} is leaving the cluster (`tpuctl down`, or a signal): "
                f"barrier {name!r} stops waiting on this host",
                hint="`tpuctl init` starts it again",
            )
        assert gen.ended.done()
        raise GenerationOver(f"generation {gen.ended.result().generation} is over: {gen.ended.result().error.message}")

    def standing_by(self, what: str = "", *, lacks: str = "no job environment") -> StandbyError:
        """This host stands by: ``what`` (a barrier; "": the job environment) has no answer here."""
        kind = "a spare" if self.spec.is_spare(self.task) else "a host the generation left out"
        return StandbyError(
            f"{what}task {self.task} ({self.options.address}) is {kind} standing by in generation {self.generation}; "
            f"it has {lacks} until it takes a place",
            hint="`tpuctl run` waits for this host to take a place, then starts the job; `tpuctl status` shows each "
            "host's role",
        )

    async def dump(self, timeout: float) -> str:
        """``tpuctl dump``: every host's stacks, the coordinator's report (a JSON document)."""
        if self.current is None or self.rejoining is not None or self.cluster_error is not None:
            raise StateError("no generation of the cluster is up on this host: no dump can be ordered")
        return await self.current.session.dump(timeout, f"asked with `tpuctl dump` on task {self.task}")

    async def barrier_progress(self, name: str) -> RendezvousProgress | None:
        """Where this host's latest call to barrier ``name`` stands (the service's answer)."""
        assert self.client is not None and self.current is not None
        return await self.client.rendezvous_progress(self.current.membership.task, name)

    async def goodput(self) -> str:
        """The coordinator's goodput ledger (a ``tpuctl.goodput/v1`` document)."""
        assert self.client is not None
        return await self.client.goodput()

    async def coordinator_status(self) -> ClusterStatus:
        """The cluster as the coordinator sees it (every host listed)."""
        assert self.client is not None
        return await self.client.status()

    async def leave(self, *, everyone: bool) -> None:
        """``tpuctl down``: leave the cluster; ``everyone`` (``--all``): shut every host down first. Raises
        (and this agent stays, unless it was stopping anyway) when the shutdown could not be told within
        ``SHUTDOWN_WITHIN_S``."""
        if everyone:
            await self._shut_the_cluster_down()
            self.shutdown_all = True  # told (the service answered) or heard: every host leaves
        self.stop.set()
        self.notify()

    async def _shut_the_cluster_down(self) -> None:
        """Tell the coordinator that this host shuts the cluster down, within ``SHUTDOWN_WITHIN_S``. A
        connection being made again (a cut just healed), a generation re-forming (this host not registered
        in it yet) or a coordinator moving is waited out: tried again on every change this agent sees, and
        at least every ``SHUTDOWN_RETRY_S``, each try waiting for the channel up to what is left. A
        shutdown heard meanwhile (this report's, its answer lost; or another host's) is done. Raises when
        this agent stops for another reason meanwhile, or the cluster is not running: nothing was shut down."""
        cause = "tpuctl down --all"  # the service's words: "task 1 (10.0.0.3) shut the cluster down: tpuctl down --all"
        deadline = time.monotonic() + SHUTDOWN_WITHIN_S
        while True:
            if self.shutdown_all:
                return  # heard: the shutdown is out
            self._check_can_shut_down()
            client, gen, changed = self.client, self.current, self.changed
            assert client is not None and gen is not None
            left = deadline - time.monotonic()
            try:
                await client.report_error(gen.membership.task, cause, shutdown=True, within=max(0.05, left))
                return
            except asyncio.CancelledError:
                # The client was closed under the call: this agent stopping (the shutdown it heard, or
                # another reason: the loop's checks say which) or moving to another coordinator. Anything
                # else is a cancelled command, which raises.
                if not self.stop.is_set() and self.client is client:
                    raise
                error: TpuctlError = CoordinatorUnreachable(f"the connection to {client.target} closed under the call")
            except (CoordinatorUnreachable, GenerationOver, DeadlineError) as exc:
                error = exc  # not there yet, or this host's generation ended: try again once something changes
            except ClusterError:
                # Refused: the cluster is in error already, perhaps by this very report (sent, its answer
                # lost) or another host's shutdown. The service says which; anything else is the answer.
                if await self._shut_down_already(gen, deadline):
                    return
                raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClusterError(
                    f"task {self.task}: could not tell the coordinator ({self.coordinator_target}, task "
                    f"{self.coordinator_task}) to shut the cluster down within {SHUTDOWN_WITHIN_S:g} s: "
                    f"{error.message}; the cluster was not shut down, and this host's agent still runs",
                    hint="`tpuctl status` shows whether the coordinator answers; run `tpuctl down --all` again, "
                    "here or on another host, or `tpuctl down` on every host",
                )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), min(left, SHUTDOWN_RETRY_S))

    def _check_can_shut_down(self) -> None:
        """Raise when there is no running cluster for ``tpuctl down --all`` to shut down from here."""
        if self.cluster_error is not None:
            raise ClusterError(
                f"task {self.task}: the cluster is not running, so there is nothing to shut down: "
                f"{self.cluster_error.message}",
                hint="`tpuctl down` stops this host's agent",
            )
        if self.stop.is_set():
            raise ClusterError(
                f"task {self.task}: this host's agent is stopping (`tpuctl down`, or a signal) before it could "
                "tell the coordinator; the cluster was not shut down",
                hint="run `tpuctl down --all` on another host whose agent is up",
            )

    async def _shut_down_already(self, gen: Generation, deadline: float) -> bool:
        """Whether the cluster's error is a shutdown, as this agent heard it or the service says (one error
        poll, within ``SHUTDOWN_SETTLE_S`` and ``deadline``)."""
        if self.shutdown_all:
            return True
        try:
            failure = await self._error_now(gen, max(0.05, min(SHUTDOWN_SETTLE_S, deadline - time.monotonic())))
        except (TpuctlError, asyncio.TimeoutError):
            return self.shutdown_all
        return self.shutdown_all or (failure is not None and failure.shutdown)

    @property
    def description(self) -> AgentInfo:
        """This agent's description (``agent.json``): local commands are served once it is written."""
        assert self.info is not None
        return self.info

    # --- local commands --------------------------------------------------------------------------

    def error_report(self) -> ErrorReport:
        rejoining = self.rejoining
        return ErrorReport(
            error=self.cluster_error.message if self.cluster_error else None,
            error_type=type(self.cluster_error).__name__ if self.cluster_error else None,
            failures=self.failures,
            detected_at=self.failed_at,
            shutdown=self.shutdown_all,
            stopping=self.stop.is_set(),
            generation=self.generation if rejoining is None else rejoining.generation,
            rejoining=rejoining is not None,
            formed=rejoining is None and self.formed == self.generation and self.formed > 0,
            standby=rejoining is None and self.standby,
            ended=rejoining.error.message if rejoining is not None else None,
            history=tuple(self.history),
            preemption=self.notices.record,
        )

    # --- descriptions ----------------------------------------------------------------------------

    def _info(self, job_ports: JobPorts, role: str = MEMBER) -> AgentInfo:
        spec = self.generation_spec  # the generation's hosts in rank order (the spec's own without a plan)
        return AgentInfo(
            role=role,
            pid=os.getpid(),
            cluster=spec.cluster,
            task=self.task,
            rank=self.rank if self.rank != self.task else None,
            address=self.options.address,
            num_tasks=len(spec.hosts),
            hosts=tuple(spec.hosts),
            coordinator=self.coordinator_target,
            accelerator=spec.slice.accelerator_type,
            topology=spec.slice.topology_str,
            mapping=str(self.options.output),
            config=self.options.config_path,
            backend=spec.backend,
            incarnation=str(self.incarnation),
            service_incarnation=str(self.service_incarnation),
            barrier_timeout=spec.barrier_timeout,
            heartbeat_timeout=spec.coordinator.heartbeat_timeout,
            job_ports=job_ports,
            started=time.time(),
            generation=self.generation,
            restart_policy=spec.restart.policy,
            restart_timeout=spec.restart.timeout,
            max_restarts=spec.restart.max_restarts,
        )

    def _job_env(self, info: AgentInfo, mapping: DeviceMapping) -> JobEnv:
        """The job environment every local ``tpuctl env`` / ``tpuctl run`` asks for, computed once here."""
        from tpuctl.job.env import job_environment

        return job_environment(info, mapping, state_dir=str(Path(self.options.state.path).absolute()))

    def _summary(self) -> InitSummary:
        """``tpuctl init``'s document (schema ``tpuctl.init/v1``; key names as in status and topology)."""
        spec = self.spec
        return {
            "schema": INIT_SCHEMA,
            "cluster": spec.cluster,
            "task": self.task,
            "address": self.options.address,
            "num_hosts": len(spec.hosts),
            "tasks": [{"task": task, "address": address} for task, address in enumerate(spec.hosts)],
            "accelerator": spec.slice.accelerator_type,
            "topology": list(spec.slice.topology),
            "topology_name": spec.slice.topology_str,
            "num_devices": spec.slice.num_devices,
            "num_local_devices": spec.slice.devices_per_host,
            "coordinator": self.coordinator_target,
            "mapping": str(self.options.output),
            "state_dir": str(self.options.state.path),
            "pid": os.getpid(),
            **({"role": "standby", "generation": self.generation} if self.standby else {}),  # type: ignore[typeddict-item]
        }


async def _serve_forever(server: asyncio.AbstractServer) -> None:
    async with server:
        await server.serve_forever()


__all__ = ["Agent"]
