"""What Python's garbage collector costs the coordination service per host and barrier, at pod scale.

One service process (``start_server`` as the scale bench starts it) and N hosts' sessions in one driver
process on 127.0.0.1 (a connection each); the hosts meet at R barriers; the service's CPU (utime + stime,
``/proc``) over the barriers, divided by N x R. Each service mode runs in the same sitting, in turn,
``--repeats`` times, so the modes are compared on the same machine state:

* ``as-is``: the collector as Python sets it up;
* ``frozen``: ``start_server(freeze_heap=True)``, as ``tpuctl init``'s task 0 runs it (the heap frozen
  once every host registered, the young generation collected every 10,000 allocations);
* ``off``: ``gc.disable()`` in the service (the floor: what the collector costs in all).

The driver's own collector is off in every mode (it simulates N hosts in one process, which no host
does). Only loopback is used; the service is started and stopped here, by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # the service's stop would log a GOAWAY per host
MODES = ("as-is", "frozen", "off")


def serve(hosts: int, mode: str) -> None:
    import gc

    sys.path.insert(0, str(REPO))
    from tpuctl.coordination.server import start_server
    from tpuctl.coordination.values import ServiceConfig, TaskSpec

    if mode == "off":
        gc.disable()

    async def main() -> None:
        tasks = tuple(TaskSpec(f"10.0.{i // 256}.{i % 256}") for i in range(hosts))
        config = ServiceConfig(
            cluster="collector", tasks=tasks, heartbeat_timeout=600, register_timeout=600, barrier_timeout=600
        )
        server = await start_server(config, host="127.0.0.1", port=0, freeze_heap=mode == "frozen")
        print(server.port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await server.stop(grace=0)

    asyncio.run(main())


def service_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_run(hosts: int, rounds: int, mode: str) -> tuple[float, float]:
    """(service CPU us per host and barrier, driver CPU us per host and barrier) for one mode."""
    sys.path.insert(0, str(REPO))
    from tpuctl.coordination import channel as channel_module
    from tpuctl.coordination.client import CoordinationClient

    service = subprocess.Popen(
        [sys.executable, __file__, "_serve", str(hosts), mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert service.stdout is not None and service.stdin is not None
        port = int(service.stdout.readline())
        channel_module._CHANNEL_OPTIONS += (("grpc.use_local_subchannel_pool", 1),)  # a connection per host
        clients = [CoordinationClient(f"127.0.0.1:{port}", rpc_timeout=300.0) for _ in range(hosts)]
        sessions = await asyncio.gather(
            *(c.open_session("collector", t, connect_timeout=60.0, interval=3600.0) for t, c in enumerate(clients))
        )
        runs = [asyncio.create_task(s.run()) for s in sessions]
        await asyncio.gather(*(s.wait_for_all(timeout=300.0) for s in sessions))
        await asyncio.sleep(0.5)
        service0, driver0 = service_cpu(service.pid), _own_cpu()
        for _ in range(rounds):
            await asyncio.gather(*(s.barrier("step", timeout=120.0) for s in sessions))
        per = 1e6 / (hosts * rounds)
        result = ((service_cpu(service.pid) - service0) * per, (_own_cpu() - driver0) * per)
        for task in runs:
            task.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        for c in clients:
            await c.close()
        service.stdin.write("\n")
        service.stdin.flush()
        service.wait(30)
        return result
    finally:
        if service.poll() is None:
            service.kill()
            service.wait(10)


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--hosts", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=20, help="barriers per run")
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode, interleaved")
    args = parser.parse_args()
    import gc

    gc.disable()  # the driver: see the module docstring
    results: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.repeats):
        for mode in MODES:
            service_us, driver_us = asyncio.run(one_run(args.hosts, args.rounds, mode))
            results[mode].append(service_us)
            print(f"  {mode:7} service {service_us:5.0f} us per host and barrier (driver {driver_us:4.0f} us)", flush=True)
    print(f"service CPU per host and barrier, {args.hosts:,} hosts, {args.rounds} barriers, median of {args.repeats}:")
    floor = statistics.median(results["off"])
    for mode in MODES:
        median = statistics.median(results[mode])
        print(f"  {mode:7} {median:5.0f} us  ({median / floor:.2f}x the collector off)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "_serve":
        serve(int(sys.argv[2]), sys.argv[3])
    else:
        sys.exit(main())
