"""The driver processes of ``bench/scale.py`` (``scale.py _drive IMPL CFG``): each simulates hosts
``first .. first+count-1`` of the cluster, one client per host, and runs every phase the bench writes on its
stdin (a JSON line each; ``exit`` ends it) on all of them at once, then answers with one JSON line: when
each host ended, its barrier calls as (start, end), the driver's CPU, its hosts' errors.

* tpuctl's hosts (:class:`TpuctlDriver`) and the floor's (:class:`FloorDriver`) share one event loop
  (:class:`AsyncDriver`, :func:`drive_async`);
* XLA's hosts (:class:`XlaDriver`): jaxlib's client calls block, so a thread per host."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import resource
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from scale_common import CLUSTER, FLOOR_METHOD, MAX_ERRORS_KEPT, REPO, emit, host_address

PREFIX = "bench"
CORES_PER_HOST = 4
REGISTER_PROGRESS_EVERY_S = 2.0  # as `tpuctl init` asks (tpuctl/agent/bringup.py); the client stretches it
GATHER_PROGRESS_EVERY_S = 2.0  # tpuctl/agent/merge.py PROGRESS_EVERY_S


def core_ids(task: int) -> list[int]:
    return list(range(task * CORES_PER_HOST, (task + 1) * CORES_PER_HOST))


def init_record(task: int) -> bytes:
    """What `tpuctl init` publishes to its gather (tpuctl/agent/merge.py): the host's core IDs and the port
    it holds for DTensor (a free port: random here); task 0 adds the creation time and JAX's port."""
    rng = random.Random(task)
    record: dict[str, Any] = {"cores": core_ids(task), "dtensor_port": rng.randint(32768, 60999)}
    if task == 0:
        record.update(created=time.time(), jax_port=rng.randint(32768, 60999))
    return json.dumps(record, separators=(",", ":")).encode()


def _no_progress(progress: Any) -> None:
    """`tpuctl init` prints a progress line; the bench only polls as it does."""


Spans = list[tuple[float, float]]
"""Barrier calls as (start, end), ``time.monotonic()`` (one clock for every process of the machine)."""


def freeze_driver_heap() -> None:
    """After each phase, a driver's objects leave the garbage collector's generations (``gc.freeze``).

    A driver simulates thousands of hosts in one process, so each of its collections walks thousands of
    hosts' clients and sessions, a cost that grows with the simulated cluster and that no host of a pod
    has (each runs one client); at 2,000 hosts a driver's CPU per barrier and host was 270 us with the
    collector, 164 us without. Both implementations' drivers do it."""
    import gc

    gc.freeze()


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class HostErrors:
    """Errors of one driver: counted; one example per kind (the message with its numbers blanked)."""

    def __init__(self) -> None:
        self.count = 0
        self.kinds: dict[str, list[Any]] = {}

    def add(self, task: int, exc: BaseException, step: str) -> None:
        self.count += 1
        text = f"in {step}: {type(exc).__name__}: {' '.join(str(exc).split())}"[:400]
        kind = re.sub(r"\d+", "N", text)[:160]
        entry = self.kinds.setdefault(kind, [0, f"task {task} {text}"])
        entry[0] += 1

    def report(self) -> dict[str, Any]:
        errors = [f"{n}x {example}" for n, example in list(self.kinds.values())[:MAX_ERRORS_KEPT]]
        out = {"error_count": self.count, "errors": errors}
        self.count, self.kinds = 0, {}
        return out


# --- on one event loop: tpuctl's hosts and the floor's ---------------------------------------------


class AsyncDriver:
    """A driver whose hosts share one event loop: :meth:`run_phase` times a phase and reports it, the
    subclass's ``run_steps`` runs every host's part of it."""

    errors: HostErrors
    command: dict[str, Any]
    """The bench's whole command for the phase running (``dead_host``: which host, how, by when)."""
    extra: dict[str, Any]
    """What a phase reports besides the common fields."""

    async def run_phase(self, phase: str, steady_s: float) -> dict[str, Any]:
        cpu0 = process_cpu()
        self.extra = {}
        ends: list[float] = []
        barriers: Spans = []
        if phase == "steady":
            await asyncio.sleep(steady_s)
            ends.append(time.monotonic())
        else:
            await self.run_steps(phase, ends, barriers)
        self.after_phase()
        freeze_driver_heap()
        return {"ends": ends, "barriers": barriers, "cpu": process_cpu() - cpu0, **self.errors.report(), **self.extra}

    async def run_steps(self, phase: str, ends: list[float], barriers: Spans) -> None:
        raise NotImplementedError

    def after_phase(self) -> None:
        """Anything to check once the phase is over (default: nothing)."""


async def drive_async(driver: AsyncDriver, merge: str) -> None:
    """A driver's life: ready, then one phase per line on stdin until ``exit``."""
    emit({"ready": True, "merge": merge})
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        cmd = json.loads(line)
        if cmd["phase"] == "exit":
            break
        driver.command = cmd
        emit(await driver.run_phase(cmd["phase"], cmd["steady"]))
    os._exit(0)  # no graceful teardown: the bench kills the service next


class FloorDriver(AsyncDriver):
    """``--floor``'s hosts: one grpc.aio channel and one stream each, channel options as tpuctl's client;
    every step is one message written and one read. Register: open the stream and wait for all; merge:
    two barriers (no table); last barrier: one."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        import grpc

        sys.path.insert(0, str(REPO))
        from tpuctl.coordination.channel import _CHANNEL_OPTIONS

        ping_ms = round(cfg["heartbeat_interval"] * 1000)
        options = _CHANNEL_OPTIONS + (
            ("grpc.keepalive_time_ms", ping_ms),
            ("grpc.keepalive_timeout_ms", ping_ms),
            ("grpc.http2.ping_timeout_ms", ping_ms),
            ("grpc.http2.max_pings_without_data", 0),
        )
        self.timeout: float = cfg["timeout"]
        self.tasks = list(range(cfg["first"], cfg["first"] + cfg["count"]))
        self.channels = {
            t: grpc.aio.insecure_channel(f"{host_address(t, cfg['netns'])}:{cfg['port']}", options=options)
            for t in self.tasks
        }
        self.calls: dict[int, Any] = {}
        self.errors = HostErrors()
        self.alive = set(self.tasks)

    async def run_steps(self, phase: str, ends: list[float], barriers: Spans) -> None:
        names = {"register": [b"all"], "merge": [b"cores", b"done"], "last_barrier": [b"last"]}[phase]
        timed = barriers if phase != "register" else None
        await asyncio.gather(*(self.one(t, names, ends, timed) for t in sorted(self.alive)))

    async def one(self, task: int, names: list[bytes], ends: list[float], barriers: Spans | None) -> None:
        try:
            await asyncio.wait_for(self.steps(task, names, barriers), self.timeout + 15)
            ends.append(time.monotonic())
        except Exception as exc:
            self.alive.discard(task)
            self.errors.add(task, exc, "floor")

    async def steps(self, task: int, names: list[bytes], barriers: Spans | None) -> None:
        if task not in self.calls:
            self.calls[task] = self.channels[task].stream_stream(FLOOR_METHOD)(wait_for_ready=True)
        call = self.calls[task]
        for name in names:
            start = time.monotonic()
            await call.write(name)
            if await call.read() != b"ok":
                raise RuntimeError(f"no answer at {name.decode()}")
            if barriers is not None:
                barriers.append((start, time.monotonic()))


async def drive_floor(cfg: dict[str, Any]) -> None:
    await drive_async(FloorDriver(cfg), "two barriers, no table")


@dataclass
class TpuctlHost:
    task: int
    client: Any
    membership: Any = None
    session: Any = None
    background: list[asyncio.Task[Any]] = field(default_factory=list)
    alive: bool = True
    step: str = ""
    watch: asyncio.Task[Any] | None = None
    """Its error watch (``session.watch_errors``), running from registration on."""
    told_at: float | None = None
    """When its error watch ended (``time.monotonic()``)."""
    pace: Any = None
    """``--progress``: its agent's record of its job's steps (``tpuctl.watchdog.pace.StepPace``)."""
    advanced_at: float = 0.0
    """``--progress``: when its job last advanced a step (``time.monotonic()``)."""
    verdicts: list[tuple[str, float]] = field(default_factory=list)
    """``--progress``: the watchdog's verdicts its session was pushed, as (kind, when received)."""


def share_table_decoding() -> None:
    """One driver process simulates thousands of hosts, and every host decodes the same gather table
    (O(hosts) each: 10,000 hosts x 9 ms of xz and protobuf = 90 s of CPU on this machine's 2 cores, which
    starves the simulated hosts' heartbeats, a cost no pod has: there every host decodes on its own
    machine). So a driver decodes each distinct table once and hands every host an equal copy; every
    host still receives the whole answer over its own connection (the service's work is unchanged) and
    checks it."""
    from tpuctl.coordination import convert

    decode = convert.gather_values
    last: list[tuple[tuple[int, bytes], list[bytes]]] = []

    def gather_values(response: Any, **kwargs: Any) -> list[bytes]:
        key = (response.instance, response.table)
        if last and last[0][0] == key:
            return list(last[0][1])
        values = decode(response, **kwargs)
        last[:] = [(key, values)]
        return list(values)

    convert.gather_values = gather_values


class TpuctlDriver(AsyncDriver):
    """Hosts ``first .. first+count-1`` as tpuctl clients on one event loop."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        sys.path.insert(0, str(REPO))
        from tpuctl.coordination.client import CoordinationClient

        self.cfg = cfg
        self.interval: float = cfg["heartbeat_interval"]
        self.total: int = cfg["hosts"]
        self.timeout: float = cfg["timeout"]
        port, netns = cfg["port"], cfg["netns"]
        self.hosts = [
            TpuctlHost(
                t,
                CoordinationClient(
                    f"{host_address(t, netns)}:{port}",
                    rpc_timeout=max(10.0, self.timeout),
                    keepalive=cfg["heartbeat_interval"],
                ),
            )
            for t in range(cfg["first"], cfg["first"] + cfg["count"])
        ]
        self.errors = HostErrors()
        self.merge_method = "gather" if hasattr(self.hosts[0].client, "gather") else "kv_dir"
        share_table_decoding()

    async def run_steps(self, phase: str, ends: list[float], barriers: Spans) -> None:
        if phase == "dead_host":
            await self.dead_host(ends)
            return
        if phase in ("progress", "hang"):
            await self.job_progress(phase, ends)
            return
        if phase == "dump":
            await self.black_box(ends)
            return
        step = {"register": self.register, "merge": self.merge, "last_barrier": self.last_barrier}[phase]
        await asyncio.gather(*(self.one(host, step, ends, barriers) for host in self.hosts if host.alive))

    def after_phase(self) -> None:
        self.check_background()

    async def one(self, host: TpuctlHost, step: Callable[..., Any], ends: list[float], barriers: Spans) -> None:
        try:
            await asyncio.wait_for(step(host, barriers), self.timeout + 15)
            ends.append(time.monotonic())
        except Exception as exc:
            host.alive = False
            self.errors.add(host.task, exc, host.step)

    async def register(self, host: TpuctlHost, barriers: Spans) -> None:
        c = host.client
        host.step = "register"
        if hasattr(c, "open_session"):  # as `tpuctl init` (protocol v7): registered on the session's stream
            host.session = await c.open_session(
                CLUSTER, host.task, hostname=f"bench-{host.task}", connect_timeout=self.timeout,
                interval=self.interval,
            )  # fmt: skip
            host.membership = m = host.session.membership
            host.background.append(asyncio.create_task(host.session.run()))
            if hasattr(host.session, "on_verdict"):  # protocol v10: the watchdog's verdicts, as an agent hears them
                host.session.on_verdict = lambda v, host=host: host.verdicts.append((v.kind, time.monotonic()))
            if hasattr(host.session, "on_dump"):  # protocol v11: a dump order, answered as an agent does
                host.session.on_dump = lambda order, host=host: self.answer_dump(host, order)
        else:
            host.membership = m = await c.register(
                CLUSTER, host.task, hostname=f"bench-{host.task}", connect_timeout=self.timeout
            )
            if hasattr(c, "session"):  # protocol v6: heartbeats, barriers, error watch on one stream
                host.session = c.session(m, interval=self.interval)
                host.background.append(asyncio.create_task(host.session.run()))
            else:
                host.background.append(asyncio.create_task(c.heartbeat_loop(m, interval=self.interval)))
        host.step = "wait_for_all"
        if hasattr(host.session, "wait_for_all"):  # v7: on the session
            await host.session.wait_for_all(
                timeout=self.timeout, progress=_no_progress, progress_every=REGISTER_PROGRESS_EVERY_S
            )
        else:
            await c.wait_for_all(
                m.task, timeout=self.timeout, progress=_no_progress, progress_every=REGISTER_PROGRESS_EVERY_S
            )
        if host.session is not None:
            host.watch = asyncio.create_task(host.session.watch_errors())
        else:
            host.watch = asyncio.create_task(c.watch_errors(m.task))
        host.watch.add_done_callback(lambda _, host=host: setattr(host, "told_at", time.monotonic()))
        host.background.append(host.watch)

    async def merge(self, host: TpuctlHost, barriers: Spans) -> None:
        c = host.client
        value = init_record(host.task) if self.merge_method == "gather" else json.dumps(core_ids(host.task)).encode()
        if self.merge_method == "gather":
            host.step = "gather"
            table = await self.gather(host, value)
        else:
            host.step = "kv_set"
            await c.kv_set(f"{PREFIX}/cores/{host.task}", value)
            await self.barrier(host, "cores", barriers)
            host.step = "kv_dir"
            table = await c.kv_dir(f"{PREFIX}/cores/")
        if len(table) != self.total:
            raise RuntimeError(f"merge: {len(table)} hosts' core IDs, expected {self.total}")
        await self.barrier(host, "done", barriers)

    async def gather(self, host: TpuctlHost, value: bytes) -> Any:
        """The coordination helper's one-RPC merge; its signature is read, not assumed."""
        import inspect

        if host.session is not None and hasattr(host.session, "gather"):  # v9: on the session, as `tpuctl init`
            gather = host.session.gather
            args: tuple[Any, ...] = ("cores", value)
        else:
            gather = host.client.gather
            args = (host.membership.task, "cores", value)
        params = inspect.signature(gather).parameters
        kwargs: dict[str, Any] = {"timeout": self.timeout} if "timeout" in params else {}
        if "progress" in params:  # as `tpuctl init` asks (tpuctl/agent/merge.py)
            kwargs.update(progress=_no_progress, progress_every=GATHER_PROGRESS_EVERY_S)
        return await gather(*args, **kwargs)

    async def last_barrier(self, host: TpuctlHost, barriers: Spans) -> None:
        await self.barrier(host, "last", barriers)

    async def barrier(self, host: TpuctlHost, name: str, barriers: Spans) -> None:
        host.step = f"barrier {name}"
        start = time.monotonic()
        if host.session is not None:
            await host.session.barrier(name, timeout=self.timeout)
        else:
            await host.client.barrier(host.membership.task, name, timeout=self.timeout)
        barriers.append((start, time.monotonic()))

    async def dead_host(self, ends: list[float]) -> None:
        """``--dead-host``: one host dies (``kill``: its process ends, here its channel is closed, which
        ends its session at once; ``vanish``: the bench blackholes its address, as a preempted VM or a
        cut cable, and only the keepalive pings notice). Every other host's error watch must name it
        within the heartbeat timeout + 2 s; ``ends``: when each one was told."""
        dead = self.command["dead"]
        victim: int = dead["victim"]
        for host in self.hosts:
            if host.task != victim:
                continue
            host.alive = False
            for task in host.background:
                task._bench_seen = True  # type: ignore[attr-defined]  # its end is the point
            if dead["mode"] == "kill":
                self.extra["killed_at"] = time.monotonic()
                for task in host.background:
                    task.cancel()
                await host.client.close()
        waiting = {host.watch: host for host in self.hosts if host.alive and host.watch is not None}
        if waiting:
            await asyncio.wait(waiting, timeout=max(0.0, dead["until"] - time.monotonic()))
        causes = []
        for watch, host in waiting.items():
            watch._bench_seen = True  # type: ignore[attr-defined]
            if not watch.done():
                self.errors.add(host.task, RuntimeError(f"not told of task {victim}'s death in time"), "dead_host")
            elif watch.cancelled() or watch.exception() is not None:
                self.errors.add(host.task, watch.exception() or RuntimeError("watch cancelled"), "dead_host")
            elif victim not in [f.task.task_id for f in watch.result().failures]:
                self.errors.add(host.task, RuntimeError(f"told {watch.result()}, not task {victim}"), "dead_host")
            else:  # its done callback may not have run yet if it ended in this very step
                ends.append(host.told_at or time.monotonic())
                causes.append(str(watch.result()))
        self.extra["cause"] = causes[0][:500] if causes else ""

    async def job_progress(self, phase: str, ends: list[float]) -> None:
        """``--progress``: every host's job and agent as ``tpuctl run`` has them, the job's steps fed to a
        ``StepPace`` per host (what the agent's progress socket feeds) and ``due()`` asked every
        ``CHECK_EVERY_S`` (the agent's loop, tpuctl/agent/progress.py); what it returns goes out with
        ``session.report_pace``, and a report that did not leave is ``unsent()`` (sent again later).

        ``progress`` (``length`` s): every job advances one step a second, all hosts at once (a job in
        lockstep; the first advance arms each host's watchdog and sends its first report).
        ``hang``: no job advances any more; each host's agent says stalled once, after ``stall_after``,
        and the phase ends when every host was pushed the ``hang`` verdict, or ``hang_timeout`` + 15 s
        after the last advance. Reports what was sent and the verdicts each host was pushed."""
        from tpuctl.agent.progress import CHECK_EVERY_S
        from tpuctl.watchdog.pace import StepPace
        from tpuctl.watchdog.settings import WatchdogSettings

        settings = WatchdogSettings(**self.cfg["watchdog"])
        hosts = [h for h in self.hosts if h.alive and h.session is not None]
        for host in hosts:
            if host.pace is None:
                host.pace = StepPace(settings, self.total)
            host.verdicts.clear()
        start = time.monotonic()
        if phase == "progress":
            ticks, until = max(1, round(self.command["steady"] / CHECK_EVERY_S)), None
            per_second = max(1, round(1.0 / CHECK_EVERY_S))
        else:
            last = max((h.advanced_at for h in hosts), default=start)
            ticks, until = 10**9, last + settings.hang_timeout + 15.0
            per_second = 0  # no advance
        sent = unsent = stalled = 0
        step = max((h.pace.step for h in hosts), default=-1)
        pid = os.getpid()
        for tick in range(ticks):
            due_at = start + tick * CHECK_EVERY_S
            await asyncio.sleep(max(0.0, due_at - time.monotonic()))
            now = time.monotonic()
            if until is not None and (now > until or all(any(k == "hang" for k, _ in h.verdicts) for h in hosts)):
                break
            if per_second and tick % per_second == 0:
                step += 1
                for host in hosts:
                    host.pace.record("P", step, pid, now)
                    host.advanced_at = now
            wall = time.time()  # the agent stamps its reports with its wall clock (StepReport.sent_at)
            due = [(host, report) for host in hosts if (report := host.pace.due(now, wall)) is not None]
            if not due:
                continue
            results = await asyncio.gather(
                *(asyncio.wait_for(host.session.report_pace(report), self.timeout) for host, report in due),
                return_exceptions=True,
            )
            for (host, report), ok in zip(due, results, strict=True):
                if ok is True:
                    sent += 1
                    stalled += report.stalled
                else:
                    unsent += 1
                    host.pace.unsent()
                    if isinstance(ok, BaseException):
                        self.errors.add(host.task, ok, f"report_pace ({phase})")
        kinds: dict[str, int] = {}
        for host in hosts:
            for kind, _ in host.verdicts:
                kinds[kind] = kinds.get(kind, 0) + 1
        self.extra.update(reports=sent, unsent=unsent, stalled_reports=stalled, verdicts=kinds, step=step)
        if phase == "progress":
            await asyncio.sleep(max(0.0, start + self.command["steady"] - time.monotonic()))  # the whole window
            ends.append(time.monotonic())
            return
        told = []
        for host in hosts:
            at = next((when for kind, when in host.verdicts if kind == "hang"), None)
            if at is None:
                self.errors.add(host.task, RuntimeError("never pushed the hang verdict"), "hang")
            else:
                told.append(at - host.advanced_at)
                ends.append(at)
        last = max((h.advanced_at for h in hosts), default=0.0)
        self.extra.update(hang_delays=told, hosts=len(hosts), last_advance_wall=time.time() - (time.monotonic() - last))

    def answer_dump(self, host: TpuctlHost, order: Any) -> None:
        """A host's answer to a dump order, as an agent's (a fixed-size digest): every host's job waits in
        the all-gather, one (task 17) in its data loader, so the report has two groups."""
        from tpuctl.proto import coordination_pb2 as pb

        if host.task == 17:
            signature = "next_batch (data.py:41) <- train_step (train.py:80) <- <module> (train.py:120)"
        else:
            signature = "all_gather (jax/_src/lax/parallel.py:612) <- train_step (train.py:88) <- <module> (train.py:120)"
        digest = pb.StackDigest(
            dump_id=order.dump_id, signature=signature, state="running", method="py-spy",
            path=f"/run/tpuctl/host-{host.task}/blackbox/dump-{order.dump_id}.txt", processes=1,
        )  # fmt: skip
        assert host.session is not None
        task = asyncio.ensure_future(host.session.answer_dump(digest))
        host.background.append(task)
        task.add_done_callback(host.background.remove)

    async def black_box(self, ends: list[float]) -> None:
        """``dump``: the driver holding task 0 asks for every host's black box (``tpuctl dump``'s path:
        the order pushed to every session, every host's digest, the report assembled) and times it; every
        driver's hosts answer (``answer_dump``)."""
        first = next((h for h in self.hosts if h.task == 0 and h.alive and h.session is not None), None)
        if first is None:
            return
        assert first.session is not None
        start = time.monotonic()
        document = await first.session.dump(10.0, "bench")
        took = time.monotonic() - start
        report = json.loads(document)
        ends.append(time.monotonic())
        groups = report.get("groups", [])
        self.extra.update(
            dump_s=took, dump_bytes=len(document.encode()), dump_hosts=report.get("hosts"),
            dump_answered=report.get("answered"), dump_groups=[g.get("hosts") for g in groups],
            dump_first=(groups[0].get("signature") if groups else None),
        )  # fmt: skip

    def check_background(self) -> None:
        """A heartbeat loop or error watch that ended is an error (they run until cancelled)."""
        for host in self.hosts:
            for bg in host.background:
                if bg.done() and not getattr(bg, "_bench_seen", False):
                    bg._bench_seen = True  # type: ignore[attr-defined]
                    exc = None if bg.cancelled() else bg.exception()
                    self.errors.add(host.task, exc or RuntimeError(f"ended: {bg.result()!r}"), "background")


async def drive_tpuctl(cfg: dict[str, Any]) -> None:
    driver = TpuctlDriver(cfg)
    await drive_async(driver, driver.merge_method)


# --- XLA's hosts, a thread each ---------------------------------------------------------------------


class XlaDriver:
    """Hosts ``first .. first+count-1`` as jaxlib clients; every call blocks, so one thread per host."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        from jax._src.lib import _jax

        self.total: int = cfg["hosts"]
        self.timeout: float = cfg["timeout"]
        port, netns = cfg["port"], cfg["netns"]
        threading.stack_size(512 * 1024)
        self.tasks = list(range(cfg["first"], cfg["first"] + cfg["count"]))
        self.clients = {
            t: _jax.get_distributed_runtime_client(
                f"{host_address(t, netns)}:{port}",
                t,
                init_timeout=int(self.timeout),
                heartbeat_timeout=cfg["xla_heartbeat_timeout"],  # XLA heartbeats every timeout / 2
                shutdown_on_destruction=False,
            )
            for t in self.tasks
        }
        self.alive = set(self.tasks)
        self.pool = ThreadPoolExecutor(max_workers=len(self.tasks))
        self.errors = HostErrors()
        self.lock = threading.Lock()
        self.steps: dict[int, str] = {}
        # --xla-merge-pace: at most this many of this driver's hosts list the table at once (0: all)
        pace = cfg.get("xla_merge_pace", 0)
        self.listing = threading.BoundedSemaphore(pace) if pace else None
        self.deadline = time.monotonic() + self.timeout

    def run_phase(self, phase: str, steady_s: float) -> dict[str, Any]:
        cpu0 = process_cpu()
        self.deadline = time.monotonic() + self.timeout  # before the bench's own, which adds 30 s
        ends: list[float] = []
        barriers: Spans = []
        if phase == "steady":
            time.sleep(steady_s)
            ends.append(time.monotonic())
        else:
            step = {"register": self.register, "merge": self.merge, "last_barrier": self.last_barrier}[phase]
            futures = {self.pool.submit(self.one, t, step, ends, barriers): t for t in sorted(self.alive)}
            _, stuck = wait(futures, timeout=self.timeout + 30)
            for future in stuck:
                self.errors.add(futures[future], TimeoutError("still blocked"), self.steps.get(futures[future], ""))
        freeze_driver_heap()
        return {"ends": ends, "barriers": barriers, "cpu": process_cpu() - cpu0, **self.errors.report()}

    def one(self, task: int, step: Callable[..., None], ends: list[float], barriers: Spans) -> None:
        try:
            step(task, barriers)
            with self.lock:
                ends.append(time.monotonic())
        except Exception as exc:
            with self.lock:
                self.alive.discard(task)
                self.errors.add(task, exc, self.steps.get(task, ""))

    def register(self, task: int, barriers: Spans) -> None:
        self.steps[task] = "connect"
        self.clients[task].connect()

    def merge(self, task: int, barriers: Spans) -> None:
        c = self.clients[task]
        self.steps[task] = "key_value_set"
        c.key_value_set(f"{PREFIX}/cores/{task}", json.dumps(core_ids(task)))
        self.barrier(task, "cores", barriers)
        self.steps[task] = "key_value_dir_get"
        if self.listing is None:
            table = c.key_value_dir_get(f"{PREFIX}/cores/")
        elif not self.listing.acquire(timeout=max(0.0, self.deadline - time.monotonic())):
            raise TimeoutError(f"no turn to list the table within the phase's {self.timeout:g} s (--xla-merge-pace)")
        else:
            try:
                table = c.key_value_dir_get(f"{PREFIX}/cores/")
            finally:
                self.listing.release()
        if len(table) != self.total:
            raise RuntimeError(f"merge: {len(table)} hosts' core IDs, expected {self.total}")
        self.barrier(task, "done", barriers)

    def last_barrier(self, task: int, barriers: Spans) -> None:
        self.barrier(task, "last", barriers)

    def barrier(self, task: int, name: str, barriers: Spans) -> None:
        self.steps[task] = f"barrier {name}"
        start = time.monotonic()
        self.clients[task].wait_at_barrier(name, int(self.timeout * 1000))
        with self.lock:
            barriers.append((start, time.monotonic()))


def drive_xla(cfg: dict[str, Any]) -> None:
    driver = XlaDriver(cfg)
    pace = cfg.get("xla_merge_pace", 0)
    emit({"ready": True, "merge": f"key_value_dir_get, {pace} at a time per driver" if pace else "key_value_dir_get"})
    while line := sys.stdin.readline():
        cmd = json.loads(line)
        if cmd["phase"] == "exit":
            break
        emit(driver.run_phase(cmd["phase"], cmd["steady"]))
    os._exit(0)
