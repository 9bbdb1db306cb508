"""The bootstrap use case: one host's agent, from registration to the mapping file and beyond.

``run_agent`` is what ``tpuctl init`` runs on every host (in the background, or attached with
``--foreground``). It is callable without click:

1. take the state dir's lock (a second agent for the same state dir is refused);
2. task 0 starts the coordination service at ``hosts[0]:port``;
3. register (cluster name, task id, fresh incarnation) and wait for every host, reporting who is missing;
4. heartbeat in the background; watch the service's error long-poll;
5. publish this host's core IDs (from the backend) and gather everyone's: the core-ID merge;
6. build the topology and the device mapping; write the mapping file atomically;
7. a final barrier, then report ready (``init`` prints its summary and exits 0);
8. serve local commands (``barrier``, ``status``, ``down``) on the state dir's socket until told to stop,
   the cluster fails, or a signal arrives.

Progress and the outcome go to a ``Reporter`` (the init process reads them from a pipe).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tpuctl.agent.control import Op
from tpuctl.agent.controlserver import serve
from tpuctl.agent.protocol import AgentInfo, BarrierPassed, ErrorReport, Failure, JobPorts, ProtocolError
from tpuctl.agent.statedir import StateDir
from tpuctl.errors import ClusterError, DeadlineError, InputError, StateError, TpuctlError
from tpuctl.spec.model import ClusterSpec

log = logging.getLogger("tpuctl.agent.bringup")

INIT_GATHER = "tpuctl/init/cores"  # the core-ID merge: core IDs, job ports, creation time
INIT_DONE_BARRIER = "tpuctl/init/done"
SHUTDOWN_KEY = "tpuctl/shutdown"
PROGRESS_EVERY_S = 5.0  # how often a long barrier wait says so
REGISTER_PROGRESS_EVERY_S = 2.0  # how often registration names the hosts still missing
REPORT_TIMEOUT_S = 5.0  # telling the cluster why init failed here, before exiting
STATUS_RPC_S = 3.0  # the coordinator's status, for `tpuctl status` (whose own call waits 10 s)
STATE_DIR_CHECK_S = 2.0  # how often a running agent checks that its state dir is still there


class Reporter:
    """Where the agent says how init is going: ``progress`` lines, then ``ready`` or ``failed``."""

    def progress(self, text: str) -> None:
        raise NotImplementedError

    def ready(self, summary: dict[str, Any]) -> None:
        raise NotImplementedError

    def failed(self, exc: TpuctlError) -> None:
        raise NotImplementedError


class PipeReporter(Reporter):
    """JSON lines on a pipe to the waiting ``tpuctl init`` process; closed after the outcome."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream: IO[str] | None = stream

    def _send(self, message: dict[str, Any]) -> None:
        if self._stream is None:
            return
        try:
            self._stream.write(json.dumps(message) + "\n")
            self._stream.flush()
        except (BrokenPipeError, OSError):
            self._stream = None  # init went away (Ctrl-C): carry on, the log still has everything

    def _close(self) -> None:
        if self._stream is not None:
            with contextlib.suppress(OSError):
                self._stream.close()
            self._stream = None

    def progress(self, text: str) -> None:
        log.info("%s", text)
        self._send({"event": "progress", "text": text})

    def ready(self, summary: dict[str, Any]) -> None:
        self._send({"event": "ready", "summary": summary})
        self._close()

    def failed(self, exc: TpuctlError) -> None:
        from tpuctl.agent.control import error_payload

        self._send({"event": "failed", "error": error_payload(exc)})
        self._close()


@dataclass
class AgentOptions:
    spec: ClusterSpec
    task: int
    state: StateDir
    output: Path
    address: str
    config_path: str | None = None


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
        self.changed = asyncio.Event()  # set when the cluster errs or this agent stops
        self.job_ports: JobPorts | None = None
        self.info: AgentInfo | None = None
        self.job_env: dict[str, Any] = {}  # the answer to Op.ENV, computed once the mapping exists
        self._server: Any = None
        self._client: Any = None
        self._membership: Any = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._main_task: asyncio.Task[Any] | None = None  # the bring-up, cancelled when init cannot finish
        self._ready = False
        self._pending: Path | None = None  # the mapping written but not yet committed (init not done)

    # --- life cycle ------------------------------------------------------------------------------

    async def run(self) -> int:
        lock = _take_lock(self.options.state)
        try:
            self.options.state.pid_file.write_text(f"{os.getpid()}\n")
            return await self._run_locked()
        finally:
            for path in (self.options.state.socket, self.options.state.pid_file):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            lock.close()

    async def _run_locked(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            await self._bring_up()
        except TpuctlError as exc:
            log.error("init failed: %s", exc)
            await self._tell_the_cluster(exc)
            self.reporter.failed(exc)
            await self._tear_down(leaving=False)
            return exc.exit_code
        except asyncio.CancelledError:
            reason = self.cluster_error or StateError(f"task {self.task}: init interrupted by a signal")
            self.reporter.failed(reason)
            await self._tear_down(leaving=False)
            return reason.exit_code
        finally:
            with contextlib.suppress(StateError):
                _remove(self._pending)
        await self.stop.wait()
        await self._tear_down(leaving=True)
        return 0

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("received %s: leaving the cluster", sig.name)
        if not self._ready:
            for task in self._tasks:
                task.cancel()
            if self._main_task is not None:
                self._main_task.cancel()
        self.stop.set()
        self.changed.set()

    async def _bring_up(self) -> None:
        self._main_task = asyncio.current_task()
        from tpuctl.coordination.client import CoordinationClient

        spec, task = self.spec, self.task
        token = _load_token(spec)
        if task == 0:
            self._server = await _start_service(spec, token)
            self.reporter.progress(f"task 0: coordination service listening on {spec.coordinator_target}")
        self._client = CoordinationClient(spec.coordinator_target, token=token)
        client = self._client
        self._membership = await client.register(
            spec.cluster,
            task,
            incarnation=self.incarnation,
            hostname=socket.gethostname(),
            connect_timeout=spec.coordinator.register_timeout,
        )
        _remove(self.options.output)  # the last run's mapping must not outlive a failed init (peers hear why)
        # Heartbeat from registration on: waiting for late hosts can take longer than the heartbeat timeout.
        self._tasks.append(asyncio.create_task(self._heartbeats(), name="heartbeats"))
        self.reporter.progress(f"task {task}: registered with {spec.coordinator_target}; waiting for every host")
        await client.wait_for_all(
            self._membership.task,
            timeout=spec.coordinator.register_timeout,
            progress=lambda progress: self.reporter.progress(f"task {task}: {progress.describe()}"),
            progress_every=REGISTER_PROGRESS_EVERY_S,
        )
        self._tasks.append(asyncio.create_task(self._watch_errors(), name="watch-errors"))
        mapping = await self._merge_and_write()
        self.info = self._info()
        self.options.state.write_info(self.info)
        self.job_env = self._job_env(self.info, mapping)
        control = await serve(self.options.state.socket, self._handle)
        self._tasks.append(asyncio.create_task(_serve_forever(control), name="control"))
        await self._barrier(INIT_DONE_BARRIER, spec.barrier_timeout)
        # Every host has its mapping: only now does it take the place jobs read it from, so a cluster
        # that never came up leaves no mapping that loads as valid.
        _commit(self._pending, self.options.output)
        self._pending = None
        self._ready = True
        self._tasks.append(asyncio.create_task(self._watch_state_dir(), name="watch-state-dir"))
        self.reporter.ready(self._summary(mapping))

    async def _merge_and_write(self) -> Any:
        """Publish this host's core IDs, gather everyone's (the merge), write the mapping.

        Every input of the mapping comes from the service (core IDs, the creation time task 0
        publishes), so every host writes a byte-identical file.
        """
        from tpuctl.mapping.file import write_mapping
        from tpuctl.mapping.model import build_mapping, merged_devices
        from tpuctl.mesh.build import build_declared_meshes
        from tpuctl.tpu.topology import build_topologies, merge_core_ids

        spec, task, client = self.spec, self.task, self._client
        core_ids = await self._local_core_ids()
        # Ports for the jobs' own runtimes (DTensor's gRPC server on every host, JAX's coordinator on
        # task 0). Each is held open until every host has published, so hosts sharing a machine
        # (a simulated cluster) cannot pick the same one.
        port_range = spec.coordinator.job_ports
        held = [_hold_port(port_range)]
        if task == 0:
            held.append(_hold_port(port_range))
        mine: dict[str, Any] = {
            "cores": list(core_ids),
            "dtensor_port": held[0].getsockname()[1],
        }
        if task == 0:  # the mapping's creation time and JAX's port come from task 0, so every host agrees
            mine["created"] = time.time()
            mine["jax_port"] = held[1].getsockname()[1]
        # One gather: every host publishes once; the service assembles the table once and sends every
        # host the same bytes (the core-ID merge, as DTensor's all-reduce of core IDs).
        try:
            values = await client.gather(
                self._membership.task,
                INIT_GATHER,
                json.dumps(mine, separators=(",", ":")).encode(),
                timeout=spec.barrier_timeout,
                progress=lambda p: self.reporter.progress(f"task {task}: core-ID merge: {p.describe()}"),
                progress_every=REGISTER_PROGRESS_EVERY_S,
            )
        finally:
            for sock in held:
                sock.close()
        published = [_published(raw, t) for t, raw in enumerate(values)]
        self.job_ports = JobPorts(
            dtensor=tuple(int(p["dtensor_port"]) for p in published), jax=int(published[0]["jax_port"])
        )
        per_task = {t: p["cores"] for t, p in enumerate(published)}
        created = float(published[0]["created"])
        merged = merge_core_ids(per_task, spec.slice)
        meshes = build_declared_meshes(spec.meshes, spec.slice, merged_devices(spec.slice, merged))
        mapping = build_mapping(
            slice=spec.slice,
            cluster=spec.cluster,
            incarnation=self.service_incarnation,
            hosts=list(spec.hosts),
            merged=merged,
            topology=build_topologies(merged, spec.slice),
            created=created,
            meshes=meshes,
        )
        self._pending = _pending_path(self.options.output)
        write_mapping(self._pending, mapping)
        self.reporter.progress(f"task {task}: wrote {self.options.output} (pending until every host has)")
        return mapping

    async def _local_core_ids(self) -> list[int]:
        """This host's core IDs from the backend. Real backends run in a short-lived child so this
        long-lived agent never holds the TPU the job needs; the sim backend runs in-process, after the
        simulated runtime start-up time ``TPUCTL_SIM_INIT_DELAY`` (seconds; 0 by default; tests use it
        to kill a host in the middle of init)."""
        spec = self.spec
        if spec.backend != "sim":
            from tpuctl.backends.probe import probe_core_ids

            return await probe_core_ids(spec.backend, self.task, spec.slice)
        from tpuctl.backends import get_backend
        from tpuctl.spec import hostenv

        delay = float(hostenv.environ().get("TPUCTL_SIM_INIT_DELAY", "0") or 0)
        if delay > 0:
            self.reporter.progress(f"task {self.task}: simulated TPU runtime starting ({delay:g} s)")
            await asyncio.sleep(delay)
        return get_backend("sim", spec.slice).local_core_ids(self.task)

    @property
    def service_incarnation(self) -> int:
        return int(self._membership.service_incarnation) if self._membership is not None else 0

    async def _tear_down(self, *, leaving: bool) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        if self._client is not None:
            if leaving and self._membership is not None and not self.shutdown_all:
                with contextlib.suppress(TpuctlError, OSError):
                    await self._client.disconnect(self._membership.task)
            with contextlib.suppress(BaseException):
                await self._client.close()
        if self._server is not None:
            await self._server.stop(grace=1.0)

    async def _tell_the_cluster(self, exc: TpuctlError) -> None:
        """Init failed here for a reason of this host's own (the mapping write, the backend, ...): report
        it, so every peer fails at once naming this host and the real cause, not a heartbeat timeout."""
        if self._client is None or self._membership is None or self.cluster_error is not None:
            return  # not registered, or the failure came from the cluster: nothing new to tell it
        if isinstance(exc, (ClusterError, DeadlineError)):
            return  # the cluster's own failure or a cluster-wide wait: every host already knows
        with contextlib.suppress(TpuctlError, OSError, asyncio.TimeoutError):
            await asyncio.wait_for(
                self._client.report_error(self._membership.task, f"init failed on this host: {exc.message}"),
                REPORT_TIMEOUT_S,
            )

    # --- background work -------------------------------------------------------------------------

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
                gone = os.stat(state.path).st_ino != first or not state.socket.exists()
            except OSError:
                gone = True
            if gone:
                log.error("task %d: state dir %s was deleted or replaced: leaving the cluster", self.task, state.path)
                self.stop.set()
                self.changed.set()
                return

    async def _heartbeats(self) -> None:
        try:
            await self._client.heartbeat_loop(self._membership, interval=self.spec.coordinator.heartbeat_interval)
        except TpuctlError as exc:
            self._fail(exc)

    async def _watch_errors(self) -> None:
        try:
            failure = await self._client.watch_errors(self._membership.task)
        except TpuctlError as exc:
            self._fail(exc)
            return
        if failure is None:
            return
        text = str(failure)
        if SHUTDOWN_KEY in text:
            log.info("cluster shut down: %s", text)
            self.shutdown_all = True
            self.stop.set()
            self.changed.set()
            return
        self.failures = tuple(
            Failure(task=f.task.task_id, address=f.task.address, cause=f.cause) for f in failure.failures
        )
        self._fail(ClusterError(f"cluster {self.spec.cluster!r} is in error: {text}"))

    def _fail(self, exc: TpuctlError) -> None:
        if self.cluster_error is None:
            self.cluster_error = exc
            self.failed_at = time.time()
            self.changed.set()
            log.error("task %d: %s", self.task, exc.message)
            if not self._ready and self._main_task is not None:
                self._main_task.cancel()  # init cannot finish: report the cluster's error now

    async def _barrier(self, name: str, timeout: float) -> int:
        if self.cluster_error is not None:
            raise self.cluster_error
        return int(await self._client.barrier(self._membership.task, name, timeout=timeout))

    # --- local commands --------------------------------------------------------------------------

    async def _handle(self, op_name: str, args: dict[str, Any], progress: Callable[[str], Any]) -> dict[str, Any]:
        try:
            op = Op(op_name)
        except ValueError:
            raise ProtocolError(
                f"this tpuctl agent does not know the operation {op_name!r}",
                hint="the command and the agent are of different tpuctl versions; restart the agent with this one",
            ) from None
        if op is Op.BARRIER:
            return (await self._local_barrier(args, progress)).to_json()
        if op is Op.STATUS:
            return await self._status()
        if op is Op.DOWN:
            self.shutdown_all = bool(args.get("all"))
            if self.shutdown_all:
                cause = f"{SHUTDOWN_KEY}: the cluster was shut down from task {self.task} (tpuctl down --all)"
                await self._client.report_error(self._membership.task, cause)
            self.stop.set()
            self.changed.set()
            return {"stopping": True}
        if op is Op.INFO:
            assert self.info is not None  # the control socket opens after the info is written
            return self.info.to_json()
        if op is Op.ENV:
            report = self._error_report()
            if report.error:
                raise ClusterError(report.error, hint="`tpuctl status` shows every host; restart the cluster")
            if report.shutdown or report.stopping:
                raise StateError(f"the tpuctl agent for state dir {self.options.state.path} is shutting down")
            return self.job_env
        # Op.WAIT_ERROR: a long-poll for `tpuctl run`: returns when the cluster errs, shuts down, or `timeout` passes.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout=_seconds(args.get("timeout"), 30.0))
        return self._error_report().to_json()

    async def _local_barrier(self, args: dict[str, Any], progress: Callable[[str], Any]) -> BarrierPassed:
        name = str(args.get("name", ""))
        if not name or name.startswith("tpuctl/"):
            raise InputError(f"barrier name {name!r} is empty or reserved", hint="names starting tpuctl/ are tpuctl's own")
        timeout = _seconds(args.get("timeout") or None, self.spec.barrier_timeout)
        waiter = asyncio.create_task(self._barrier(name, timeout))
        started = time.monotonic()
        while True:
            done, _ = await asyncio.wait({waiter}, timeout=PROGRESS_EVERY_S)
            if done:
                return BarrierPassed(name=name, instance=waiter.result(), hosts=len(self.spec.hosts))
            await progress(await self._barrier_progress(name, time.monotonic() - started))

    async def _barrier_progress(self, name: str, waited: float) -> str:
        """ "waiting at barrier 'step' #3 for 10 s: 3 of 4 hosts arrived; missing: task 2 (10.0.0.4) ..."
        (the service's progress: counts and the first ten missing hosts, O(10) whatever the cluster size)."""
        text = f"waiting at barrier {name!r} for {waited:.0f} s"
        try:
            progress = await self._client.rendezvous_progress(self._membership.task, name)
        except TpuctlError:
            return text
        if progress is None or progress.done:
            return text
        return f"waiting at barrier {name!r} #{progress.instance} for {waited:.0f} s: {progress.describe()}"

    def _error_report(self) -> ErrorReport:
        return ErrorReport(
            error=self.cluster_error.message if self.cluster_error else None,
            error_type=type(self.cluster_error).__name__ if self.cluster_error else None,
            failures=self.failures,
            detected_at=self.failed_at,
            shutdown=self.shutdown_all,
            stopping=self.stop.is_set(),
        )

    async def _status(self) -> dict[str, Any]:
        base = {
            "cluster": self.spec.cluster,
            "task": self.task,
            "coordinator": self.spec.coordinator_target,
            "mapping": str(self.options.output),
        }
        try:
            info = (await asyncio.wait_for(self._client.status(), STATUS_RPC_S)).as_dict()
        except (TpuctlError, asyncio.TimeoutError) as exc:
            # The coordinator is gone or cut off: say what this host knows, and why the rest is missing
            # (answering well within the local command's own timeout, so it never blames this agent).
            why = exc.message if isinstance(exc, TpuctlError) else (
                f"the coordinator at {self.spec.coordinator_target} did not answer within {STATUS_RPC_S:g} s"
            )
            return {**base, "tasks": [], "error": self.cluster_error.message if self.cluster_error else why}
        local = self.cluster_error.message if self.cluster_error else None
        return {**base, **info, "error": info.get("error") or local}

    # --- descriptions ----------------------------------------------------------------------------

    def _info(self) -> AgentInfo:
        spec = self.spec
        assert self.job_ports is not None  # reserved during the merge
        return AgentInfo(
            pid=os.getpid(),
            cluster=spec.cluster,
            task=self.task,
            address=self.options.address,
            num_tasks=len(spec.hosts),
            hosts=tuple(spec.hosts),
            coordinator=spec.coordinator_target,
            accelerator=spec.slice.accelerator_type,
            topology=spec.slice.topology_str,
            mapping=str(self.options.output),
            config=self.options.config_path,
            incarnation=str(self.incarnation),
            service_incarnation=str(self.service_incarnation),
            barrier_timeout=spec.barrier_timeout,
            heartbeat_timeout=spec.coordinator.heartbeat_timeout,
            job_ports=self.job_ports,
            started=time.time(),
        )

    def _job_env(self, info: AgentInfo, mapping: Any) -> dict[str, Any]:
        """The job environment every local ``tpuctl env`` / ``tpuctl run`` asks for, computed once here."""
        from tpuctl.job.env import job_environment

        return job_environment(info, mapping, state_dir=str(self.options.state.path.absolute())).to_message()

    def _summary(self, mapping: Any) -> dict[str, Any]:
        spec = self.spec
        return {
            "cluster": spec.cluster,
            "task": self.task,
            "tasks": len(spec.hosts),
            "accelerator": spec.slice.accelerator_type,
            "topology": spec.slice.topology_str,
            "devices": spec.slice.num_devices,
            "local_devices": spec.slice.devices_per_host,
            "mapping": str(self.options.output),
            "pid": os.getpid(),
        }


def _pending_path(output: Path) -> Path:
    """Where the mapping waits for the final barrier: beside the real one, hidden, not loadable by name."""
    return output.with_name(f".{output.name}.pending")


def _commit(pending: Path | None, output: Path) -> None:
    if pending is None:
        return
    try:
        os.replace(pending, output)
    except OSError as exc:
        raise StateError(f"cannot put the device mapping in place at {output}: {exc.strerror or exc}") from exc


def _remove(path: Path | None) -> None:
    if path is None:
        return
    try:
        path.unlink()
    except (FileNotFoundError, NotADirectoryError):
        pass  # nothing there (writing it will say what is wrong with the folder)
    except OSError as exc:
        raise StateError(
            f"cannot remove the previous device mapping {path}: {exc.strerror or exc}",
            hint="the mapping's folder must be writable by this user (or pass --output PATH)",
        ) from exc


def _published(raw: bytes, task: int) -> dict[str, Any]:
    """One host's part of the init gather; ClusterError naming the host when it is not one."""
    try:
        value = json.loads(raw)
        common = isinstance(value, dict) and isinstance(value.get("cores"), list) and isinstance(value.get("dtensor_port"), int)
        if common and (task != 0 or (isinstance(value.get("created"), float) and isinstance(value.get("jax_port"), int))):
            return dict(value)
    except ValueError:
        pass
    raise ClusterError(
        f"task {task} published {len(raw):,} bytes that are not tpuctl's init record (core ids, job ports)",
        hint="every host must run the same tpuctl version; restart the cluster with one",
    )


def _seconds(value: object, default: float) -> float:
    """A timeout from a control request: a finite number of seconds, 0 or more, else ``default``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e9:
        return float(value)
    return default


def _hold_port(port_range: tuple[int, int] | None) -> socket.socket:
    """A TCP socket bound to a free port on every interface (the first free one of ``port_range`` when the
    spec gives ``coordinator.job_ports``), kept open to reserve the port until every host has published."""
    candidates = [0] if port_range is None else range(port_range[0], port_range[1] + 1)
    for port in candidates:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("", port))
        except OSError:
            sock.close()
            continue
        return sock
    first, last = port_range or (0, 0)
    raise StateError(
        f"no free port in coordinator.job_ports {first}-{last} on this host for the job's runtime",
        hint="widen coordinator.job_ports (each host needs one port, task 0 two), or free some of them",
    )


def _load_token(spec: ClusterSpec) -> str | None:
    if spec.auth is None:
        return None
    from tpuctl.coordination.auth import load_token

    return load_token(spec.auth.token_file)


async def _start_service(spec: ClusterSpec, token: str | None) -> Any:
    from tpuctl.coordination.server import start_server
    from tpuctl.coordination.state import ServiceConfig, TaskSpec

    config = ServiceConfig(
        cluster=spec.cluster,
        tasks=tuple(TaskSpec(address=h) for h in spec.hosts),
        heartbeat_timeout=spec.coordinator.heartbeat_timeout,
        register_timeout=spec.coordinator.register_timeout,
        barrier_timeout=spec.barrier_timeout,
        token=token,
    )
    return await start_server(config, host=spec.coordinator_address, port=spec.coordinator.port)


async def _serve_forever(server: asyncio.AbstractServer) -> None:
    async with server:
        await server.serve_forever()


def _take_lock(state: StateDir) -> IO[str]:
    state.ensure()
    handle = state.lock_file.open("a+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        pid = state.live_pid()
        raise StateError(
            f"a tpuctl agent is already running for state dir {state.path}" + (f" (pid {pid})" if pid else ""),
            hint="`tpuctl status` shows it; `tpuctl down` stops it; use another --state-dir for another host",
        ) from None
    return handle


def configure_logging(path: Path | None, level: int = logging.INFO) -> None:
    """Agent log: to ``path`` (background agent) or stderr (``--foreground``)."""
    handler: logging.Handler = logging.FileHandler(path) if path else logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("tpuctl")
    root.handlers[:] = [handler]
    root.setLevel(level)


__all__ = ["Agent", "AgentOptions", "PipeReporter", "Reporter", "configure_logging"]
