"""What each host costs the coordination service in memory: RSS per connection and per standing call.

One tpuctl service process (``start_server`` on 127.0.0.1, port 0) and one client process with N hosts,
each on its own connection (``grpc.use_local_subchannel_pool``: no shared subchannel). The service's
RSS is read from /proc after each step: the hosts register (a connection each), open their heartbeat
streams, park their error polls, park at a barrier. ``--tracemalloc`` also reports the Python share
(tracemalloc's traced bytes, from the service's stderr). Only loopback; both processes are started and
stopped here, by PID.

    .venv/bin/python bench/memory.py --hosts 2000
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


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def serve(hosts: int, traced: bool) -> None:
    import tracemalloc

    if traced:
        tracemalloc.start()
    sys.path.insert(0, str(REPO))
    from tpuctl.coordination.server import start_server
    from tpuctl.coordination.state import ServiceConfig, TaskSpec

    tasks = tuple(TaskSpec(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}") for i in range(hosts))
    config = ServiceConfig(
        cluster="memory", tasks=tasks, heartbeat_timeout=600, register_timeout=600, barrier_timeout=600
    )
    server = await start_server(config, host="127.0.0.1", port=0)
    print(json.dumps({"port": server.port}), flush=True)
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        traced_mb = tracemalloc.get_traced_memory()[0] / 2**20 if traced else 0.0
        print(json.dumps({"step": line.strip(), "traced_mb": traced_mb}), flush=True)
    await server.stop(grace=0)


async def drive(hosts: int, service: subprocess.Popen[str], port: int) -> list[dict[str, Any]]:
    sys.path.insert(0, str(REPO))
    from tpuctl.coordination import client as client_module
    from tpuctl.coordination.client import CoordinationClient

    client_module._CHANNEL_OPTIONS += (("grpc.use_local_subchannel_pool", 1),)  # a connection per host
    assert service.stdin is not None and service.stdout is not None
    rows: list[dict[str, Any]] = []

    async def step(name: str) -> None:
        await asyncio.sleep(SETTLE_S)
        service.stdin.write(name + "\n")  # type: ignore[union-attr]
        service.stdin.flush()  # type: ignore[union-attr]
        answer = json.loads(await asyncio.get_running_loop().run_in_executor(None, service.stdout.readline))  # type: ignore[union-attr]
        rows.append({"step": name, "rss_mb": rss_mb(service.pid), "traced_mb": answer["traced_mb"]})

    clients = [CoordinationClient(f"127.0.0.1:{port}", rpc_timeout=300.0) for _ in range(hosts)]
    background: list[asyncio.Task[Any]] = []
    try:
        await step("idle")
        members = await asyncio.gather(
            *(c.register("memory", t, hostname=f"m-{t}", connect_timeout=60.0) for t, c in enumerate(clients))
        )
        await step("registered: a connection per host")
        pairs = list(zip(clients, members, strict=True))
        background += [asyncio.create_task(c.heartbeat_loop(m, interval=3600.0)) for c, m in pairs]
        await step("+ a heartbeat stream per host")
        background += [asyncio.create_task(c.watch_errors(m.task)) for c, m in pairs]
        await step("+ a parked error poll per host")
        background += [asyncio.create_task(c.barrier(m.task, "parked", timeout=300.0)) for c, m in pairs[1:]]
        await step("+ a parked barrier per host")
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
    args = parser.parse_args()
    argv = [sys.executable, __file__, "_serve", str(args.hosts), "1" if args.tracemalloc else "0"]
    service = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert service.stdout is not None
        port = json.loads(service.stdout.readline())["port"]
        rows = asyncio.run(asyncio.wait_for(drive(args.hosts, service, port), 300))
    finally:
        if service.poll() is None:
            os.kill(service.pid, 9)
        service.wait(10)
    previous = None
    print(f"service RSS, {args.hosts:,} hosts, a connection each")
    for row in rows:
        per_host = "" if previous is None else f"  +{(row['rss_mb'] - previous) * 1024 / args.hosts:5.1f} kB per host"
        python = f"  (Python {row['traced_mb']:.0f} MB)" if args.tracemalloc else ""
        print(f"  {row['step']:36} {row['rss_mb']:7.0f} MB{per_host}{python}")
        previous = row["rss_mb"]
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "_serve":
        asyncio.run(serve(int(sys.argv[2]), sys.argv[3] == "1"))
    else:
        sys.exit(main())
