"""What each host costs the coordination service in memory: RSS per host after each step of ``tpuctl init``.

One tpuctl service process (``start_server`` on 127.0.0.1, port 0) and one client process with N hosts,
each on its own connection (``grpc.use_local_subchannel_pool``: no shared subchannel). The hosts go
through what ``tpuctl init`` does with protocol v7 (``Agent._form_once`` / ``_form_steps``), and the
service's RSS is read from /proc after each step:

1. open a session (the registration is the first message of the heartbeat stream: a connection and
   one standing call per host) and wait for every host on it;
2. watch for the cluster's error on the session (a message, no call);
3. the merge: a parked ``Gather`` per host (task 0 stays away, so everyone else waits);
4. task 0 arrives: every host gets the table;
5. the final barrier, waiting on the session (task 0 stays away again).

Each line gives the RSS, what the step added per host and the total per host above idle; the last
line the peak (VmHWM). ``--tracemalloc`` also reports the Python share (tracemalloc's traced bytes).

``--server-option NAME=VALUE`` / ``--client-option NAME=VALUE`` (repeatable) add a gRPC channel
argument to the service's ``_SERVER_OPTIONS`` / the clients' ``_CHANNEL_OPTIONS`` for this run, to
measure one knob at a time. Only loopback; both processes are started and stopped here, by PID.

    .venv/bin/python bench/memory.py --hosts 2000
    .venv/bin/python bench/memory.py --hosts 2000 --server-option grpc.enable_channelz=0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SETTLE_S = 4.0
RUN_TIMEOUT_S = 600.0
GATHER_VALUE = b'{"cores":[0,1,2,3],"dtensor_port":40123}'  # a host's record, as the merge publishes


def status(pid: int, field: str) -> int:
    """``field`` of /proc/PID/status (VmRSS, VmHWM: kB; Threads)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def channel_args(pairs: list[str]) -> tuple[tuple[str, int | str], ...]:
    """``NAME=VALUE`` strings as gRPC channel arguments (an integer value when it is one)."""
    args: list[tuple[str, int | str]] = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"bench/memory.py: {pair!r} is not NAME=VALUE (e.g. grpc.enable_channelz=0)")
        args.append((name, int(value) if value.lstrip("-").isdigit() else value))
    return tuple(args)


async def serve(hosts: int, traced: bool, trim: bool, options: tuple[tuple[str, int | str], ...]) -> None:
    import ctypes
    import tracemalloc

    if traced:
        tracemalloc.start()
    sys.path.insert(0, str(REPO))
    from tpuctl.coordination import server as server_module
    from tpuctl.coordination.server import start_server
    from tpuctl.coordination.values import ServiceConfig, TaskSpec

    server_module._SERVER_OPTIONS += options
    tasks = tuple(TaskSpec(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}") for i in range(hosts))
    config = ServiceConfig(
        cluster="memory", tasks=tasks, heartbeat_timeout=600, register_timeout=600, barrier_timeout=600
    )
    server = await start_server(config, host="127.0.0.1", port=0)
    print(json.dumps({"port": server.port}), flush=True)
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        if trim:  # what glibc holds freed but not returned: give it back before the reading
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        traced_mb = tracemalloc.get_traced_memory()[0] / 2**20 if traced else 0.0
        print(json.dumps({"step": line.strip(), "traced_mb": traced_mb}), flush=True)
    await server.stop(grace=0)


async def drive(
    hosts: int, service: subprocess.Popen[str], port: int, options: tuple[tuple[str, int | str], ...]
) -> list[dict[str, Any]]:
    sys.path.insert(0, str(REPO))
    from tpuctl.coordination import channel as channel_module
    from tpuctl.coordination.client import CoordinationClient
    from tpuctl.coordination.session import Session

    channel_module._CHANNEL_OPTIONS += (("grpc.use_local_subchannel_pool", 1), *options)  # a connection per host
    assert service.stdin is not None and service.stdout is not None
    rows: list[dict[str, Any]] = []

    async def step(name: str) -> None:
        await asyncio.sleep(SETTLE_S)
        rss, peak, threads = (status(service.pid, field) for field in ("VmRSS", "VmHWM", "Threads"))
        service.stdin.write(name + "\n")  # type: ignore[union-attr]
        service.stdin.flush()  # type: ignore[union-attr]
        answer = json.loads(await asyncio.get_running_loop().run_in_executor(None, service.stdout.readline))  # type: ignore[union-attr]
        trimmed = status(service.pid, "VmRSS") / 1024  # after the service's malloc_trim, with --trim
        row = {"step": name, "rss_mb": rss / 1024, "peak_mb": peak / 1024, "threads": threads, "trimmed_mb": trimmed}
        rows.append(row | answer)

    def start(coroutines: Any) -> list[asyncio.Task[Any]]:
        tasks = [asyncio.create_task(c) for c in coroutines]
        background.extend(tasks)
        return tasks

    clients = [CoordinationClient(f"127.0.0.1:{port}", rpc_timeout=300.0) for _ in range(hosts)]
    background: list[asyncio.Task[Any]] = []
    try:
        await step("idle")
        sessions: list[Session] = await asyncio.gather(
            *(
                c.open_session("memory", t, hostname=f"m-{t}", connect_timeout=60.0, interval=3600.0)
                for t, c in enumerate(clients)
            )
        )
        start(s.run() for s in sessions)
        await asyncio.gather(*(s.wait_for_all(timeout=300.0) for s in sessions))
        await step("registered: a session per host")
        start(s.watch_errors() for s in sessions)
        await step("+ the error watch on the session")
        tables = start(s.gather("parked", GATHER_VALUE, timeout=300.0) for s in sessions[1:])  # v9: on the session
        await step("+ a waiting gather per host")
        await sessions[0].gather("parked", GATHER_VALUE, timeout=300.0)
        await asyncio.gather(*tables)
        await step("every gather answered")
        start(s.barrier("final", timeout=300.0) for s in sessions[1:])
        await step("+ the final barrier on the session")
        return rows
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        for c in clients:
            await c.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--hosts", type=int, default=2000)
    parser.add_argument("--tracemalloc", action="store_true", help="also the Python share (slows the service)")
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) in the service before each reading")
    parser.add_argument("--server-option", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--client-option", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument(
        "--service-env", action="append", default=[], metavar="NAME=VALUE", help="e.g. MALLOC_ARENA_MAX=2"
    )
    args = parser.parse_args()
    server_options, client_options = channel_args(args.server_option), channel_args(args.client_option)
    env = dict(os.environ, **dict(pair.partition("=")[::2] for pair in args.service_env))
    argv = [sys.executable, __file__, "_serve", str(args.hosts), "1" if args.tracemalloc else "0"]
    argv += ["1" if args.trim else "0", json.dumps(server_options)]
    service = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert service.stdout is not None
        port = json.loads(service.stdout.readline())["port"]
        rows = asyncio.run(asyncio.wait_for(drive(args.hosts, service, port, client_options), RUN_TIMEOUT_S))
    finally:
        if service.poll() is None:
            os.kill(service.pid, 9)
        service.wait(10)
    knobs = [f"server {n}={v}" for n, v in server_options] + [f"client {n}={v}" for n, v in client_options]
    knobs += [f"service env {pair}" for pair in args.service_env] + (["malloc_trim"] if args.trim else [])
    print(f"service RSS, {args.hosts:,} hosts, a connection each; options: {', '.join(knobs) or 'as shipped'}")
    print(f"  {'step':34} {'RSS':>7} {'step/host':>10} {'total/host':>10} {'peak so far':>11} threads")
    idle = previous = rows[0]["rss_mb"]
    for row in rows:
        step_kb = (row["rss_mb"] - previous) * 1024 / args.hosts
        total_kb = (row["rss_mb"] - idle) * 1024 / args.hosts
        columns = f"{'':21}" if row is rows[0] else f" {step_kb:+7.1f} kB {total_kb:7.1f} kB"
        python = f"  (Python {row['traced_mb']:.0f} MB)" if args.tracemalloc else ""
        python += f"  (trimmed: {row['trimmed_mb']:.0f} MB)" if args.trim else ""
        print(
            f"  {row['step']:34} {row['rss_mb']:4.0f} MB{columns} {row['peak_mb']:8.0f} MB {row['threads']:7}{python}"
        )
        previous = row["rss_mb"]
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "_serve":
        options = tuple((name, value) for name, value in json.loads(sys.argv[5]))
        asyncio.run(serve(int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1", options))
    else:
        sys.exit(main())
