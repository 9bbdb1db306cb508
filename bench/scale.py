"""``make bench-scale``: one coordination service, thousands of simulated hosts, beside XLA's C++ service.

What runs, per implementation (tpuctl's service, then XLA's C++ coordination service from jaxlib, the one
``jax.distributed`` runs) and per size N:

* one service process: tpuctl's ``start_server`` in a child Python (logging INFO to a file, as task 0 of
  ``tpuctl init`` does), or jaxlib's ``get_distributed_runtime_service`` in a child Python;
* W client processes ("drivers", ``--workers``) sharing the N hosts; every host has its own client
  (tpuctl: a ``CoordinationClient``, one ``grpc.aio`` channel; XLA: a ``DistributedRuntimeClient``) and,
  in the default network namespace mode, its own TCP connection: the bench re-runs itself under
  ``unshare -n`` (a fresh network namespace holding only a loopback interface), the service binds
  0.0.0.0 there (that is, loopback only), and host i dials 127.10.x.y, so gRPC cannot fold the hosts of
  one driver into one connection. ``--no-netns`` (or no ``unshare``): everything on 127.0.0.1, and each
  driver's hosts share one connection (gRPC's global subchannel pool); the table says which.

Phases (the orchestrator starts each phase on every driver at once and measures between phases):

1. ``register``: tpuctl, as ``tpuctl init`` does (tpuctl/agent/bringup.py): register, open the
   session stream (``client.session``; heartbeats every 5 s, the spec default), wait for all (with a
   progress callback, re-polled as the client paces it), start the error watch (on the session since
   protocol v6; a parked long poll before). Every barrier goes on the session too (unary before v6). XLA: ``connect()`` (RegisterTask +
   the PjRT_Client_Connect barrier; it starts its own heartbeat thread and error poll).
2. ``merge``: tpuctl: ``client.gather`` of the record ``tpuctl init`` publishes (4 core IDs and a
   DTensor port; task 0 also a time and JAX's port; tpuctl/agent/merge.py), with its progress polls,
   check that all N are there, barrier. XLA: publish 4 core IDs under ``cores/<task>``, barrier,
   ``key_value_dir_get``, check, barrier.
3. ``last barrier``: one more barrier, timed alone (per-host call latency p50/p99).
4. ``steady``: heartbeats only, for ``--steady`` seconds; service CPU per second is the fraction of one
   core that N heartbeating hosts cost.
5. ``dead_host`` (``--dead-host kill|vanish``, tpuctl only): the last host dies. ``kill``: its session
   ends, as when its process is killed. ``vanish``: its address is blackholed (``ip rule``, in the
   bench's own network namespace), as a preempted VM or a cut cable: nothing tells the service but
   unanswered keepalive pings. Every other host's error watch must name it within the heartbeat
   timeout + 2 s (``--heartbeat-timeout``, default the spec's 30 s); the row is the time from the death
   to the last host told.

Measured per phase: wall time from the phase start to the slowest host's end; service CPU seconds
(utime + stime of the service process, all threads, from /proc/PID/stat); service peak RSS (VmHWM from
/proc/PID/status: the peak so far, not per phase); bytes the service sent (the sum of ``bytes_acked``
of every established TCP socket whose local port is the service's, from ``ss -tin`` at each phase end:
payload bytes the service wrote and the hosts' kernels acknowledged, identical for both services);
barrier call latency p50/p99 (every barrier call of the phase, per host); the drivers' CPU (client
side, for context: it competes with the service for this machine's cores); errors, counted, the first
few verbatim. Every phase has a deadline (``--phase-timeout``); a phase that misses it is an error and
stops that run; an implementation that failed at one size is skipped at larger ones. Only loopback is
used; every process is started here and killed here by PID, in ``finally``.

Two more, by option. ``--floor``: the same steps on a bare ``grpc.aio`` service (a stream per host, one
raw message each way per step, tpuctl's gRPC options, no tpuctl code; its merge is two barriers, no
table): what any Python gRPC service pays on this machine, reported as tpuctl's last barrier against it.
``--xla-merge-pace N`` / ``--xla-retry-paced N``: at most N of each XLA driver's hosts list the table at
once (always, or only in a second run after one with every host at once failed); pacing makes XLA's
merge faster on this machine, so a ratio against it is the conservative one. ``make bench-scale`` uses
``--xla-retry-paced 64 --floor``.

Noisy machines: compare the tpuctl/XLA ratios of one run, not absolute figures across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import queue
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

PY = sys.executable
HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
SIZES = (256, 1024, 2304, 4608, 10000)
PHASES = ("register", "merge", "last_barrier", "steady")
IMPLS = ("tpuctl", "xla")
CLUSTER = "bench"
PREFIX = "bench"
CORES_PER_HOST = 4
HEARTBEAT_INTERVAL_S = 5.0  # tpuctl's spec default (coordinator.heartbeat_interval)
HEARTBEAT_TIMEOUT_S = 30  # tpuctl's spec default; XLA's service gets the same
XLA_HEARTBEAT_TIMEOUT_S = 100  # jax.distributed.initialize's default heartbeat_timeout_seconds
REGISTER_PROGRESS_EVERY_S = 2.0  # as `tpuctl init` asks (tpuctl/agent/bringup.py); the client stretches it
GATHER_PROGRESS_EVERY_S = 2.0  # tpuctl/agent/merge.py PROGRESS_EVERY_S
NETNS_ENV = "TPUCTL_BENCH_NETNS"
MAX_ERRORS_KEPT = 5


# --- small helpers -----------------------------------------------------------------------------------


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def heartbeat_interval(args: argparse.Namespace) -> float:
    """tpuctl's hosts' heartbeat (keepalive) interval: a sixth of the timeout, as the spec's defaults (5 s, 30 s)."""
    return float(args.heartbeat_timeout) / 6


def host_address(task: int, netns: bool) -> str:
    """The loopback address host ``task`` dials: its own in a network namespace, else 127.0.0.1."""
    if not netns:
        return "127.0.0.1"
    return f"127.10.{task // 250}.{task % 250 + 1}"


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


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


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


# --- service processes (child) -----------------------------------------------------------------------


def serve_tpuctl(hosts: int, bind: str, timeout: float, log_path: str, heartbeat_timeout: float) -> None:
    import inspect
    import logging

    sys.path.insert(0, str(REPO))
    from tpuctl.coordination.server import start_server
    from tpuctl.coordination.state import ServiceConfig, TaskSpec

    handler = logging.FileHandler(log_path)  # as task 0 of `tpuctl init` logs: INFO, to a file
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("tpuctl").addHandler(handler)
    logging.getLogger("tpuctl").setLevel(logging.INFO)

    async def main() -> None:
        tasks = tuple(TaskSpec(address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}") for i in range(hosts))
        config = ServiceConfig(
            cluster=CLUSTER,
            tasks=tasks,
            heartbeat_timeout=heartbeat_timeout,
            register_timeout=timeout,
            barrier_timeout=timeout,
        )
        kwargs = {"freeze_heap": True} if "freeze_heap" in inspect.signature(start_server).parameters else {}
        server = await start_server(config, host=bind, port=0, **kwargs)  # as task 0's agent starts it
        emit({"port": server.port})
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the bench closes it
        await server.stop(grace=0)

    asyncio.run(main())


def serve_xla(hosts: int, bind: str, timeout: float, port: int, heartbeat_timeout: int) -> None:
    from jax._src.lib import _jax

    service = _jax.get_distributed_runtime_service(
        f"{bind}:{port}",
        hosts,
        heartbeat_timeout=heartbeat_timeout,
        cluster_register_timeout=int(timeout),
        shutdown_timeout=10,
    )
    emit({"port": port})
    sys.stdin.read()
    del service
    os._exit(0)


# --- drivers (child) on one event loop; the floor: a bare grpc.aio service and its hosts ------------


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


FLOOR_METHOD = "/floor.Floor/Session"


def serve_floor(hosts: int, bind: str, heartbeat_timeout: float) -> None:
    """``--floor``: the least a grpc.aio coordination service can do for the same steps, no tpuctl code.

    One bidirectional stream per host, raw bytes (no protobuf), gRPC's options as tpuctl's service sets
    them; a host sends a rendezvous name and waits; the stream's own handler coroutine counts it and,
    once all ``hosts`` arrived, every handler writes its host the same answer. No registration record,
    no heartbeat messages (keepalive pings as tpuctl's), no failure detection, no table: what is left is
    gRPC's Python layer reading one message and writing one per host, the floor under tpuctl's barrier."""
    import grpc

    sys.path.insert(0, str(REPO))
    from tpuctl.coordination.server import _SERVER_OPTIONS, keepalive_options
    from tpuctl.coordination.state import ServiceConfig, TaskSpec

    async def main() -> None:
        config = ServiceConfig(
            cluster=CLUSTER, tasks=(TaskSpec(address="10.0.0.1"),), heartbeat_timeout=heartbeat_timeout
        )
        waiting: dict[bytes, tuple[list[int], asyncio.Future[bytes]]] = {}

        async def session(request_iterator: Any, context: Any) -> None:
            while True:
                name = await context.read()
                if name is grpc.aio.EOF:
                    return
                entry = waiting.get(name)
                if entry is None:
                    entry = waiting[name] = ([0], asyncio.get_running_loop().create_future())
                count, released = entry
                count[0] += 1
                if count[0] == hosts:
                    del waiting[name]
                    released.set_result(b"ok")
                await context.write(await released)

        handler = grpc.method_handlers_generic_handler(
            FLOOR_METHOD.split("/")[1], {"Session": grpc.stream_stream_rpc_method_handler(session)}
        )
        server = grpc.aio.server(options=_SERVER_OPTIONS + keepalive_options(config))
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port(f"{bind}:0")
        await server.start()
        emit({"port": port})
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await server.stop(grace=0)

    asyncio.run(main())


class FloorDriver(AsyncDriver):
    """``--floor``'s hosts: one grpc.aio channel and one stream each, channel options as tpuctl's client;
    every step is one message written and one read. Register: open the stream and wait for all; merge:
    two barriers (no table); last barrier: one."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        import grpc

        sys.path.insert(0, str(REPO))
        from tpuctl.coordination.client import _CHANNEL_OPTIONS

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


# --- drivers (child): tpuctl hosts -------------------------------------------------------------------


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


# --- drivers (child): XLA hosts ----------------------------------------------------------------------


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


# --- the orchestrator: child processes, samples of the service -----------------------------------------


class Child:
    """A child process speaking JSON lines on stdin/stdout; stderr goes to ``log``. Killed by PID only."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        with open(log, "w") as err:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
            )
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self, stream: TextIO) -> None:
        for line in stream:
            with contextlib.suppress(json.JSONDecodeError):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def read(self, deadline: float) -> dict[str, Any]:
        """The next message; raises ``TimeoutError`` at ``deadline``, ``ChildDied`` when the child exits."""
        try:
            message = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError from None
        if message is None:
            self.lines.put(None)
            raise ChildDied(f"pid {self.pid} exited (rc {self.proc.wait(5)}): {self.tail()}")
        return message

    def tail(self, lines: int = 3) -> str:
        """Why the child ended: its first fatal log line (absl's ``F...``: a jaxlib client terminating its
        process, whose stack trace follows) if any, else its last ``lines`` lines."""
        text = self.log.read_text(errors="replace").strip().splitlines()
        fatal = next((i for i, line in enumerate(text) if re.match(r"F\d{4} ", line)), None)
        if fatal is not None:  # with the last error logged before it: the fatal line often hides the cause
            cause = next((line for line in reversed(text[:fatal]) if re.match(r"E\d{4} ", line)), None)
            return " | ".join(line.strip()[:400] for line in (cause, text[fatal]) if line)
        return " | ".join(line.strip()[:300] for line in text[-lines:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


class ChildDied(RuntimeError):
    pass


@dataclass
class Sample:
    cpu_s: float
    rss_peak_mb: float
    sent_bytes: int
    connections: int
    tcp: dict[str, int] = field(default_factory=dict)


TCP_COUNTERS = ("ListenOverflows", "ListenDrops", "TCPReqQFullDrop", "TCPReqQFullDoCookies", "TCPSynRetrans")
"""The kernel's TcpExt counters (/proc/net/netstat, this network namespace's) that show connections the
service's listening socket did not take in time: an accept queue that overflowed drops the handshake's
last ACK or the SYN, and the host's kernel retransmits its SYN after 1, 3, 7, 15 s."""


def tcp_counters() -> dict[str, int]:
    """``TCP_COUNTERS`` now, from /proc/net/netstat (empty where it cannot be read)."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return {}
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            row = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            return {name: int(row.get(name, 0)) for name in TCP_COUNTERS}
    return {}


_BYTES_ACKED = re.compile(r"\bbytes_acked:(\d+)")


def sample_service(pid: int, port: int) -> Sample:
    """CPU and peak RSS of ``pid`` from /proc; bytes sent over its established sockets from ``ss``."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    status = Path(f"/proc/{pid}/status").read_text()
    hwm = re.search(r"VmHWM:\s+(\d+) kB", status)
    out = subprocess.run(
        ["ss", "-tinH", "state", "established", f"( sport = :{port} )"], capture_output=True, text=True, timeout=60
    ).stdout
    sent = sum(int(m) for m in _BYTES_ACKED.findall(out))
    sockets = sum(1 for line in out.splitlines() if line and not line[0].isspace())
    return Sample(cpu, int(hwm.group(1)) / 1024 if hwm else 0.0, sent, sockets, tcp_counters())


@dataclass
class PhaseResult:
    phase: str
    wall_s: float | None
    service_cpu_s: float
    service_rss_peak_mb: float
    service_sent_bytes: int
    connections: int
    barrier_p50_s: float | None
    barrier_p99_s: float | None
    barrier_calls: int
    client_cpu_s: float
    error_count: int
    errors: list[str]
    tcp: dict[str, int] = field(default_factory=dict)
    """How much each of ``TCP_COUNTERS`` grew during the phase (all hosts: the bench's namespace)."""
    release_p50_s: float | None = None
    """Last barrier only: from the last host's arrival to each host's return, p50 and p99."""
    release_p99_s: float | None = None
    arrival_spread_s: float | None = None
    """Last barrier only: from the first host's arrival to the last one's (the drivers start thousands of
    calls on two cores: this is how long that took)."""
    told_p50_s: float | None = None
    """Dead host only: from the host's death to each other host's error watch naming it, p50 and the last."""
    told_max_s: float | None = None
    told_hosts: int = 0
    dead_cause: str = ""
    """Dead host only: the failure as the first host told was told it."""


@dataclass
class RunResult:
    impl: str
    hosts: int
    workers: int
    netns: bool
    merge: str = ""
    idle_rss_mb: float = 0.0
    phases: list[PhaseResult] = field(default_factory=list)
    error: str | None = None
    skipped: str | None = None
    profiles: dict[str, Any] = field(default_factory=dict)
    heartbeat_s: float = HEARTBEAT_INTERVAL_S
    load_average: tuple[float, float] = (0.0, 0.0)
    """The machine's 1-minute load average at the start and the end of the run: other work competes."""
    unpaced_error: str | None = None
    """XLA with ``--xla-retry-paced``: why the run with every host listing at once failed (this one is paced)."""

    @property
    def failed(self) -> bool:
        # The dead-host phase runs last: its verdict is its own row, not a reason to skip larger sizes.
        return self.error is not None or any(p.error_count for p in self.phases if p.phase != "dead_host")


def free_port(bind: str) -> int:
    with socket.socket() as probe:
        probe.bind((bind, 0))
        return int(probe.getsockname()[1])


def start_service(impl: str, hosts: int, args: argparse.Namespace, tmp: Path) -> tuple[Child, int]:
    cfg: dict[str, Any] = {"hosts": hosts, "bind": args.bind, "timeout": args.phase_timeout}
    if impl in ("tpuctl", "floor"):
        cfg["heartbeat_timeout"] = args.heartbeat_timeout
    if impl == "tpuctl":
        cfg["log"] = str(tmp / f"service-{impl}-{hosts}.log")
    elif impl == "xla":  # never shorter than tpuctl's, nor than the clients' (jax.distributed gives both one value)
        cfg["port"] = free_port(args.bind)
        cfg["heartbeat_timeout"] = max(args.heartbeat_timeout, args.xla_heartbeat_timeout)
    child = Child([PY, str(HERE), "_serve", impl, json.dumps(cfg)], tmp / f"service-{impl}-{hosts}.stderr")
    port = int(child.read(time.monotonic() + 120)["port"])
    return child, port


def start_drivers(impl: str, hosts: int, port: int, args: argparse.Namespace, tmp: Path) -> list[Child]:
    workers = min(args.workers, hosts)
    drivers = []
    for w in range(workers):
        first, last = hosts * w // workers, hosts * (w + 1) // workers
        cfg = {
            "hosts": hosts,
            "first": first,
            "count": last - first,
            "port": port,
            "netns": args.netns,
            "timeout": args.phase_timeout,
            "xla_heartbeat_timeout": args.xla_heartbeat_timeout,
            "xla_merge_pace": args.xla_merge_pace,
            "nice": args.driver_nice,
            "heartbeat_interval": heartbeat_interval(args),
        }
        argv = [PY, str(HERE), "_drive", impl, json.dumps(cfg)]
        drivers.append(Child(argv, tmp / f"driver-{impl}-{hosts}-{w}.stderr"))
    return drivers


def run_phase(
    phase: str,
    service: Child,
    port: int,
    drivers: list[Child],
    args: argparse.Namespace,
    dead: dict[str, Any] | None = None,
) -> tuple[PhaseResult, str | None]:
    """Start ``phase`` on every driver at once, wait for all (bounded), measure the service around it."""
    before = sample_service(service.pid, port)
    start = time.monotonic()
    for driver in drivers:
        driver.send({"phase": phase, "steady": args.steady, **({"dead": dead} if dead else {})})
    deadline = start + args.phase_timeout + (args.steady if phase == "steady" else 0) + 30
    if dead is not None:
        deadline = dead["until"] + 30
    reports, problem = [], None
    for driver in drivers:
        try:
            reports.append(driver.read(deadline))
        except TimeoutError:
            problem = (
                f"{phase}: not done after {deadline - start:.0f} s ({len(reports)} of {len(drivers)} drivers answered)"
            )
            break
        except ChildDied as exc:
            problem = f"{phase}: a driver died: {exc}"
            break
    if service.proc.poll() is not None:
        problem = problem or f"{phase}: the service exited: {service.tail()}"
    after = sample_service(service.pid, port) if service.proc.poll() is None else before
    result = summarize(phase, start, before, after, reports, problem)
    if dead is not None and not problem:
        told_about(result, dead, reports, args.heartbeat_timeout)
    return result, problem


def told_about(result: PhaseResult, dead: dict[str, Any], reports: list[dict[str, Any]], timeout: float) -> None:
    """The dead-host phase's figures: how long after the death every other host was told, against the
    requirement (heartbeat timeout + 2 s); a late or missing word is an error."""
    died = dead.get("t0") or min((r["killed_at"] for r in reports if "killed_at" in r), default=None)
    if died is None:
        result.error_count += 1
        result.errors.insert(0, "dead_host: no driver held the host to kill")
        return
    told = sorted(e - died for r in reports for e in r["ends"])
    result.told_hosts = len(told)
    result.told_p50_s = percentile(told, 0.5)
    result.told_max_s = told[-1] if told else None
    result.wall_s = result.told_max_s
    result.dead_cause = next((r["cause"] for r in reports if r.get("cause")), "")
    limit = timeout + 2.0
    if told and told[-1] > limit:
        result.error_count += 1
        result.errors.insert(
            0, f"dead_host: the last host was told {told[-1]:.1f} s after the death (required: {limit:g} s)"
        )


def blackhole(address: str) -> list[list[str]]:
    """Drop every packet from and to ``address`` in this network namespace (``ip rule`` blackholes, no
    netfilter needed); the rules added, for :func:`unblackhole`, even when adding the next one failed.
    The namespace's local routing rule moves behind them once (left so: it routes as before)."""
    rules = subprocess.run(["ip", "rule", "show"], capture_output=True, text=True, timeout=30, check=True).stdout
    if not re.search(r"^100:\s+from all lookup local", rules, re.M):
        subprocess.run(["ip", "rule", "add", "pref", "100", "lookup", "local"], check=True, timeout=30)
        subprocess.run(["ip", "rule", "del", "pref", "0"], check=True, timeout=30)
    added: list[list[str]] = []
    for pref, direction in ((10, "from"), (11, "to")):
        rule = ["pref", str(pref), direction, address, "blackhole"]
        try:
            subprocess.run(["ip", "rule", "add", *rule], check=True, timeout=30)
        except subprocess.SubprocessError:
            unblackhole(added)
            raise
        added.append(rule)
    return added


def unblackhole(added: list[list[str]]) -> None:
    for rule in added:
        subprocess.run(["ip", "rule", "del", *rule], capture_output=True, timeout=30, check=False)


def run_dead_host(
    service: Child, port: int, drivers: list[Child], hosts: int, args: argparse.Namespace
) -> tuple[PhaseResult, str | None]:
    """``--dead-host``: the last host dies; every other host must be told, naming it, in time."""
    victim = hosts - 1
    dead: dict[str, Any] = {"victim": victim, "mode": args.dead_host}
    added: list[list[str]] = []
    try:
        if args.dead_host == "vanish":
            added = blackhole(host_address(victim, args.netns))
            dead["t0"] = time.monotonic()
        dead["until"] = time.monotonic() + args.heartbeat_timeout + 2 + 15
        return run_phase("dead_host", service, port, drivers, args, dead)
    finally:
        unblackhole(added)


def summarize(
    phase: str, start: float, before: Sample, after: Sample, reports: list[dict[str, Any]], problem: str | None
) -> PhaseResult:
    ends = [e for r in reports for e in r["ends"]]
    spans = [tuple(b) for r in reports for b in r["barriers"]]
    barriers = [end - start for start, end in spans]
    # One barrier per host (the last barrier phase): how long after the last host arrived each one was
    # released. The calls' own latency also holds how far apart the drivers could start them.
    last_arrival = max((start for start, _ in spans), default=0.0)
    released = [end - last_arrival for _, end in spans] if phase == "last_barrier" else []
    errors = [e for r in reports for e in r["errors"]]
    count = sum(r["error_count"] for r in reports)
    if problem:
        errors, count = [problem, *errors], count + 1
    return PhaseResult(
        phase=phase,
        wall_s=None if problem or not ends else max(ends) - start,
        service_cpu_s=after.cpu_s - before.cpu_s,
        service_rss_peak_mb=after.rss_peak_mb,
        service_sent_bytes=after.sent_bytes - before.sent_bytes,
        connections=after.connections,
        barrier_p50_s=percentile(barriers, 0.5),
        barrier_p99_s=percentile(barriers, 0.99),
        barrier_calls=len(barriers),
        release_p50_s=percentile(released, 0.5),
        release_p99_s=percentile(released, 0.99),
        arrival_spread_s=(last_arrival - min(start for start, _ in spans)) if released else None,
        client_cpu_s=sum(r["cpu"] for r in reports),
        error_count=count,
        errors=errors[:MAX_ERRORS_KEPT],
        tcp={name: after.tcp.get(name, 0) - before.tcp.get(name, 0) for name in after.tcp},
    )


def run_one(impl: str, hosts: int, args: argparse.Namespace, tmp: Path) -> RunResult:
    result = RunResult(impl, hosts, min(args.workers, hosts), args.netns)
    result.heartbeat_s = args.xla_heartbeat_timeout / 2 if impl == "xla" else heartbeat_interval(args)
    load_start = os.getloadavg()[0]
    children: list[Child] = []
    try:
        service, port = start_service(impl, hosts, args, tmp)
        children.append(service)
        result.idle_rss_mb = sample_service(service.pid, port).rss_peak_mb
        children += start_drivers(impl, hosts, port, args, tmp)
        ready_by = time.monotonic() + 120 + hosts / 100
        result.merge = {child.read(ready_by)["merge"] for child in children[1:]}.pop()
        for phase in PHASES:
            with contextlib.ExitStack() as spies:
                spies.enter_context(profiling(args, impl, hosts, phase, service.pid, result))
                if args.profile_driver:
                    spies.enter_context(profiling(args, impl, hosts, phase, children[1].pid, result, who="driver 0"))
                outcome, problem = run_phase(phase, service, port, children[1:], args)
            result.phases.append(outcome)
            tcp = ", ".join(f"{name} {n:,}" for name, n in outcome.tcp.items() if n)
            print(
                f"  {impl:6} {hosts:6} {phase:12} {fmt_phase(outcome)}" + (f"  tcp: {tcp}" if tcp else ""),
                file=sys.stderr,
                flush=True,
            )
            if problem:
                result.error = problem
                break
            if outcome.error_count:  # the later phases would only time out on the failed hosts
                break
        else:
            if args.dead_host and impl == "tpuctl":
                # A problem is the first of the phase's errors (summarize); it does not end the run, and
                # the larger sizes still run (``RunResult.failed``).
                outcome, _ = run_dead_host(service, port, children[1:], hosts, args)
                result.phases.append(outcome)
                print(f"  {impl:6} {hosts:6} {'dead_host':12} {fmt_phase(outcome)}", file=sys.stderr, flush=True)
    except (TimeoutError, ChildDied, OSError, subprocess.SubprocessError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        for child in reversed(children):  # drivers first: a jaxlib client aborts when its service goes
            child.kill()
        result.load_average = (load_start, os.getloadavg()[0])
    return result


# --- py-spy --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def profiling(
    args: argparse.Namespace, impl: str, hosts: int, phase: str, pid: int, result: RunResult, *, who: str = ""
) -> Iterator[None]:
    """With ``--profile DIR``: py-spy samples tpuctl's service (``who`` empty) or a driver (``who``: its
    label) during the phase; its top functions go into the result."""
    spy = shutil.which("py-spy") or str(Path(PY).parent / "py-spy")
    if not args.profile or impl != "tpuctl" or not Path(spy).exists():
        yield
        return
    out = Path(args.profile) / f"tpuctl-{hosts}-{phase}{'-' + who.replace(' ', '-') if who else ''}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "100", "--nonblocking", "-o", str(out)]
    if args.profile_native:  # also C frames (gRPC's Cython and C core); pauses the service per sample
        cmd = [c for c in cmd if c != "--nonblocking"] + ["--native"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(0.5)  # attached before the phase starts
        yield
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
        if out.exists():
            result.profiles[f"{phase} ({who})" if who else phase] = summarize_profile(out)


_GENERIC_FRAME = re.compile(r"\((asyncio/|threading\.py|selectors\.py|scale\.py)")
"""Frames every stack shares (the event loop, this bench's ``_serve``): left out of the inclusive list."""


def summarize_profile(path: Path, top: int = 12) -> dict[str, Any]:
    """Self and inclusive share of samples per function, from py-spy's collapsed ("raw") stacks."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for frame in set(frames):
            if not _GENERIC_FRAME.search(frame):
                inclusive[frame] = inclusive.get(frame, 0) + count

    def share(table: dict[str, int]) -> list[tuple[str, float]]:
        ranked = sorted(table.items(), key=lambda kv: -kv[1])[:top]
        return [(name, round(100 * n / total, 1)) for name, n in ranked]

    return {"samples": total, "self_pct": share(own), "inclusive_pct": share(inclusive), "file": str(path)}


# --- the table -----------------------------------------------------------------------------------------


def fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_phase(p: PhaseResult | None) -> str:
    if p is None:
        return f"{'-':>8} {'-':>8} {'-':>7} {'-':>8} {'-':>15} {'-':>4}"
    bar = f"{fmt_s(p.barrier_p50_s)}/{fmt_s(p.barrier_p99_s)}" if p.barrier_calls else "-"
    return (
        f"{fmt_s(p.wall_s):>8} {fmt_s(p.service_cpu_s):>8} {p.service_rss_peak_mb:>4.0f} MB "
        f"{fmt_bytes(p.service_sent_bytes):>8} {bar:>15} {p.error_count:>4}"
    )


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b <= 0:
        return "-"
    return f"{a / b:.2f}"


def init_total(run: RunResult) -> PhaseResult | None:
    """register + merge + last barrier as one row: the whole of `tpuctl init`'s coordination."""
    init = [p for p in run.phases if p.phase in PHASES[:3]]
    if len(init) < 3:
        return None
    last = init[-1]
    walls = [p.wall_s for p in init]
    return PhaseResult(
        "init (1-3)",
        None if None in walls else sum(w for w in walls if w is not None),
        sum(p.service_cpu_s for p in init),
        last.service_rss_peak_mb,
        sum(p.service_sent_bytes for p in init),
        last.connections,
        last.barrier_p50_s,
        last.barrier_p99_s,
        last.barrier_calls,
        sum(p.client_cpu_s for p in init),
        sum(p.error_count for p in init),
        [e for p in init for e in p.errors][:MAX_ERRORS_KEPT],
    )


def rows(run: RunResult | None) -> dict[str, PhaseResult]:
    if run is None:
        return {}
    out = {p.phase: p for p in run.phases}
    total = init_total(run)
    if total is not None:
        out[total.phase] = total
    return out


def table(runs: list[RunResult], steady_s: float) -> str:
    lines: list[str] = []
    head = f"{'wall':>8} {'svc CPU':>8} {'peakRSS':>7} {'sent':>8} {'barrier p50/p99':>15} {'err':>4}"
    for hosts in sorted({r.hosts for r in runs}):
        ours = next((r for r in runs if r.hosts == hosts and r.impl == "tpuctl"), None)
        peer = next((r for r in runs if r.hosts == hosts and r.impl == "xla"), None)
        lines += ["", size_header(hosts, ours, peer)]
        lines.append(f"{'phase':12} | tpuctl {head} | XLA    {head} | tpuctl/XLA: wall   CPU  sent")
        a, b = rows(ours), rows(peer)
        for phase in (*PHASES[:3], "init (1-3)", "steady", *(["dead_host"] if "dead_host" in a else [])):
            pa, pb = a.get(phase), b.get(phase)
            ra = ratio(pa.wall_s if pa else None, pb.wall_s if pb else None) if phase != "steady" else "-"
            rc = ratio(pa.service_cpu_s if pa else None, pb.service_cpu_s if pb else None)
            rs = ratio(pa.service_sent_bytes if pa else None, pb.service_sent_bytes if pb else None)
            lines.append(f"{phase:12} |        {fmt_phase(pa)} |        {fmt_phase(pb)} |   {ra:>13} {rc:>5} {rs:>5}")
        for run in (ours, peer):
            lines += run_notes(run, steady_s)
        lines += floor_notes(next((r for r in runs if r.hosts == hosts and r.impl == "floor"), None), ours)
    return "\n".join(lines)


def floor_notes(floor: RunResult | None, ours: RunResult | None) -> list[str]:
    """``--floor``: the bare grpc.aio service's phases, and tpuctl's last barrier against it."""
    if floor is None:
        return []
    notes = ["  floor (bare grpc.aio, no tpuctl code; merge: two barriers, no table):"]
    for p in floor.phases:
        if p.phase == "steady":
            continue
        bar = f", barrier p50/p99 {fmt_s(p.barrier_p50_s)}/{fmt_s(p.barrier_p99_s)}" if p.barrier_calls else ""
        notes.append(
            f"    {p.phase:12} wall {fmt_s(p.wall_s)}, service CPU {fmt_s(p.service_cpu_s)}{bar}, "
            f"errors {p.error_count}" + (f" ({p.errors[0]})" if p.errors else "")
        )
    last = next((p for p in floor.phases if p.phase == "last_barrier"), None)
    mine = next((p for p in ours.phases if p.phase == "last_barrier"), None) if ours else None
    if last is not None and last.release_p50_s is not None:
        notes.append(
            f"    last barrier: arrivals spread over {fmt_s(last.arrival_spread_s)}; released "
            f"{fmt_s(last.release_p50_s)} (p50) / {fmt_s(last.release_p99_s)} (p99) after the last arrival"
        )
    if last is not None and mine is not None:
        notes.append(
            f"    tpuctl/floor, last barrier: p50 {ratio(mine.barrier_p50_s, last.barrier_p50_s)}, "
            f"service CPU {ratio(mine.service_cpu_s, last.service_cpu_s)}, "
            f"release p50 {ratio(mine.release_p50_s, last.release_p50_s)}"
        )
    if floor.error:
        notes.append(f"    floor error: {floor.error}")
    return notes


def size_header(hosts: int, ours: RunResult | None, peer: RunResult | None) -> str:
    any_run = ours or peer
    conns = max((p.connections for r in (ours, peer) if r for p in r.phases), default=0)
    mode = "own network namespace, a connection per host" if any_run and any_run.netns else "127.0.0.1, shared"
    workers = any_run.workers if any_run else 0
    return f"## {hosts:,} hosts, {workers} client processes, {conns:,} service connections ({mode})"


def run_notes(run: RunResult | None, steady_s: float) -> list[str]:
    if run is None:
        return []
    notes = []
    if run.skipped:
        notes.append(f"  {run.impl}: skipped: {run.skipped}")
    if run.unpaced_error:
        notes.append(
            f"  {run.impl}: with every host listing at once it failed ({run.unpaced_error[:300]}); these figures are paced"
        )
    steady = next((p for p in run.phases if p.phase == "steady"), None)
    if steady is not None:
        notes.append(
            f"  {run.impl}: steady {steady_s:g} s: service {steady.service_cpu_s / steady_s:.3f} CPU s/s "
            f"({100 * steady.service_cpu_s / steady_s:.1f}% of a core), {fmt_bytes(steady.service_sent_bytes / steady_s)}/s; "
            f"idle RSS {run.idle_rss_mb:.0f} MB; merge via {run.merge or '-'}; heartbeat every {run.heartbeat_s:g} s; "
            f"load average {run.load_average[0]:.1f} -> {run.load_average[1]:.1f}"
        )
    dead = next((p for p in run.phases if p.phase == "dead_host"), None)
    if dead is not None and dead.told_max_s is not None:
        notes.append(
            f"  {run.impl}: dead host: {dead.told_hosts:,} hosts told, p50 {fmt_s(dead.told_p50_s)}, the last "
            f"{fmt_s(dead.told_max_s)} after it died; {dead.dead_cause[:200]}"
        )
    last = next((p for p in run.phases if p.phase == "last_barrier"), None)
    if last is not None and last.release_p50_s is not None:
        notes.append(
            f"  {run.impl}: last barrier: arrivals spread over {fmt_s(last.arrival_spread_s)} (the drivers' own "
            f"pace); released {fmt_s(last.release_p50_s)} (p50) / {fmt_s(last.release_p99_s)} (p99) after the "
            "last arrival"
        )
    errors = [e for p in run.phases for e in p.errors] + ([run.error] if run.error else [])
    for text in dict.fromkeys(errors[:MAX_ERRORS_KEPT]):
        notes.append(f"  {run.impl} error: {text}")
    return notes


def print_profiles(runs: list[RunResult]) -> None:
    for run in runs:
        for phase, prof in run.profiles.items():
            what = "a driver (simulated hosts)" if "driver" in phase else "service"
            print(f"\n## py-spy: tpuctl {what}, {run.hosts:,} hosts, {phase} ({prof['samples']} samples)")
            for name, pct in prof["self_pct"][:8]:
                print(f"  self {pct:5.1f}%  {name}")
            for name, pct in prof["inclusive_pct"][:8]:
                print(f"  incl {pct:5.1f}%  {name}")


# --- main ----------------------------------------------------------------------------------------------


def reexec_in_netns() -> int | None:
    """Run this bench again inside a new network namespace (root, ``unshare``); None if that is not possible."""
    if os.environ.get(NETNS_ENV) == "1" or not shutil.which("unshare") or not shutil.which("ip"):
        return None
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        print("no network namespace (unshare -n failed): hosts share connections", file=sys.stderr)
        return None
    script = 'ip link set lo up && exec "$0" "$@"'
    env = {**os.environ, NETNS_ENV: "1"}
    return subprocess.call(["unshare", "-n", "--", "sh", "-c", script, PY, str(HERE), *sys.argv[1:]], env=env)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="host counts, comma separated")
    parser.add_argument("--workers", type=int, default=3, help="client processes driving the hosts")
    parser.add_argument("--steady", type=float, default=20.0, help="seconds of the heartbeat-only phase")
    parser.add_argument("--phase-timeout", type=float, default=300.0, help="deadline of each phase, seconds")
    parser.add_argument(
        "--xla-heartbeat-timeout",
        type=int,
        default=XLA_HEARTBEAT_TIMEOUT_S,
        help="XLA clients' heartbeat timeout, s: they heartbeat every half of it, each with that deadline "
        "(default: jax.distributed's 100 s; 10 gives tpuctl's 5 s rate, and XLA's clients abort at 4,608 hosts)",
    )
    parser.add_argument(
        "--xla-merge-pace",
        type=int,
        default=0,
        help="at most this many of each XLA driver's hosts list the core-ID table at once (default 0: all "
        "at once, as a pod does; its service breaks connections at 4,608 hosts on a 2-core machine, and "
        "pacing spares it the contention)",
    )
    parser.add_argument(
        "--xla-retry-paced",
        type=int,
        default=0,
        metavar="N",
        help="when XLA's run fails with every host listing at once, run it again with --xla-merge-pace N "
        "and report that run (marked so)",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=HEARTBEAT_TIMEOUT_S,
        help="tpuctl's heartbeat timeout, s (default: the spec's 30); its hosts' keepalive interval is a sixth of it",
    )
    parser.add_argument(
        "--dead-host",
        choices=("kill", "vanish"),
        help="after the steady phase, the last host dies (kill: its session ends, as when its process is "
        "killed; vanish: its address is blackholed, as a preempted VM, which needs the network namespace) "
        "and every other host must be told, naming it, within the heartbeat timeout + 2 s (tpuctl only)",
    )
    parser.add_argument("--driver-nice", type=int, default=10, help="niceness of the client processes")
    parser.add_argument("--skip-peer", action="store_true", help="do not run XLA's service")
    parser.add_argument("--peer-max", type=int, default=0, help="run XLA's service only up to this size (0: all)")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also run the same steps on a bare grpc.aio service (one message each way per host and step, "
        "no tpuctl code): the floor under tpuctl's figures on this machine",
    )
    parser.add_argument("--no-netns", action="store_true", help="stay on 127.0.0.1 (hosts share connections)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--logs", help="keep the service and driver logs in this folder (default: discarded)")
    parser.add_argument("--profile", help="py-spy tpuctl's service per phase; collapsed stacks go to this folder")
    parser.add_argument("--profile-driver", action="store_true", help="with --profile: the first driver too")
    parser.add_argument("--profile-native", action="store_true", help="with --profile: native frames too")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if not args.no_netns:
        rc = reexec_in_netns()
        if rc is not None:
            return rc
    raise_nofile()
    args.netns = os.environ.get(NETNS_ENV) == "1"
    args.bind = "0.0.0.0" if args.netns else "127.0.0.1"  # in a fresh namespace, 0.0.0.0 is loopback only
    if args.dead_host == "vanish" and not args.netns:
        print("--dead-host vanish needs the network namespace (root and unshare; not --no-netns)", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    impls = (["tpuctl"] if args.skip_peer else list(IMPLS)) + (["floor"] if args.floor else [])
    runs: list[RunResult] = []
    failed_at: dict[str, int] = {}
    xla_args = args  # paced from the size where a run with every host listing at once failed
    with tempfile.TemporaryDirectory(prefix="tpuctl-bench-scale-") as scratch:
        tmp = args.logs or scratch
        Path(tmp).mkdir(parents=True, exist_ok=True)
        for hosts in sizes:
            for impl in impls:
                if impl == "xla" and args.peer_max and hosts > args.peer_max:
                    runs.append(RunResult(impl, hosts, args.workers, args.netns, skipped=f"--peer-max {args.peer_max}"))
                elif impl in failed_at:
                    runs.append(
                        RunResult(impl, hosts, args.workers, args.netns, skipped=f"failed at {failed_at[impl]:,}")
                    )
                else:
                    runs.append(run_one(impl, hosts, xla_args if impl == "xla" else args, Path(tmp)))
                    first = runs[-1]
                    if impl == "xla" and merge_failed(first) and args.xla_retry_paced and not xla_args.xla_merge_pace:
                        # XLA's service breaks connections when every host lists the table at once on
                        # this machine (4,608 hosts and up): run it again with its listing paced, which
                        # makes its merge faster, not slower (docs/PERFORMANCE.md), and say so.
                        print(
                            f"  xla    {hosts:6} failed ({first.error or 'errors'}); again, merge paced",
                            file=sys.stderr,
                        )
                        # ... and at the larger sizes too (it would only fail there first again)
                        xla_args = argparse.Namespace(**{**vars(args), "xla_merge_pace": args.xla_retry_paced})
                        runs[-1] = run_one(impl, hosts, xla_args, Path(tmp))
                        runs[-1].unpaced_error = first.error or next(
                            (e for p in first.phases for e in p.errors), "errors"
                        )
                    if runs[-1].failed:
                        failed_at[impl] = hosts
    print(table(runs, args.steady))
    print_profiles(runs)
    if args.json:
        Path(args.json).write_text(json.dumps(report(runs, args), indent=1) + "\n")
    return 0


def merge_failed(run: RunResult) -> bool:
    """Whether ``run`` got through registration and failed in its merge (what pacing can help)."""
    merge = next((p for p in run.phases if p.phase == "merge"), None)
    return merge is not None and (merge.error_count > 0 or merge.wall_s is None)


def report(runs: list[RunResult], args: argparse.Namespace) -> dict[str, Any]:
    import grpc

    try:
        import jaxlib

        jaxlib_version = jaxlib.__version__
    except ImportError:
        jaxlib_version = None
    machine = {"cpus": os.cpu_count(), "python": platform.python_version(), "grpcio": grpc.__version__}
    config = {k: v for k, v in vars(args).items() if k not in ("json",)}
    return {"machine": {**machine, "jaxlib": jaxlib_version}, "config": config, "runs": [asdict(r) for r in runs]}


def child_main(role: str, impl: str, cfg: dict[str, Any]) -> None:
    raise_nofile()
    if role == "_drive":  # the simulated hosts yield the CPU to the service (task 0 has a machine of its own)
        os.nice(cfg["nice"])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the bench stops its children itself
    if role == "_serve" and impl == "tpuctl":
        serve_tpuctl(cfg["hosts"], cfg["bind"], cfg["timeout"], cfg["log"], cfg["heartbeat_timeout"])
    elif role == "_serve" and impl == "floor":
        serve_floor(cfg["hosts"], cfg["bind"], cfg["heartbeat_timeout"])
    elif impl == "floor":
        asyncio.run(drive_floor(cfg))
    elif role == "_serve":
        serve_xla(cfg["hosts"], cfg["bind"], cfg["timeout"], cfg["port"], cfg["heartbeat_timeout"])
    elif impl == "tpuctl":
        asyncio.run(drive_tpuctl(cfg))
    else:
        drive_xla(cfg)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] in ("_serve", "_drive"):
        child_main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
    else:
        sys.exit(main())
