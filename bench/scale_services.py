"""The service processes of ``bench/scale.py`` (``scale.py _serve IMPL CFG``): tpuctl's ``start_server``
logging as task 0 of ``tpuctl init`` does, XLA's C++ coordination service from jaxlib, and ``--floor``'s
bare grpc.aio service. Each prints ``{"port": N}`` once it listens and serves until the bench closes its
stdin or kills it."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from scale_common import CLUSTER, FLOOR_METHOD, REPO, emit


def serve_tpuctl(
    hosts: int, bind: str, timeout: float, log_path: str, heartbeat_timeout: float, watchdog: dict[str, Any] | None
) -> None:
    """``watchdog``: ``WatchdogSettings``' fields (``--progress``), else the spec's defaults. A
    ``{"stats": true}`` line on stdin answers ``{"reports": N}``: the pace reports the service took so far."""
    import inspect
    import logging

    sys.path.insert(0, str(REPO))
    from tpuctl.coordination.server import start_server
    from tpuctl.coordination.values import ServiceConfig, TaskSpec

    handler = logging.FileHandler(log_path)  # as task 0 of `tpuctl init` logs: INFO, to a file
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("tpuctl").addHandler(handler)
    logging.getLogger("tpuctl").setLevel(logging.INFO)

    async def main() -> None:
        tasks = tuple(TaskSpec(address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}") for i in range(hosts))
        extra: dict[str, Any] = {}
        if watchdog is not None:
            from tpuctl.watchdog.settings import WatchdogSettings

            extra["watchdog"] = WatchdogSettings(**watchdog)
        config = ServiceConfig(
            cluster=CLUSTER,
            tasks=tasks,
            heartbeat_timeout=heartbeat_timeout,
            register_timeout=timeout,
            barrier_timeout=timeout,
            **extra,
        )
        kwargs = {"freeze_heap": True} if "freeze_heap" in inspect.signature(start_server).parameters else {}
        server = await start_server(config, host=bind, port=0, **kwargs)  # as task 0's agent starts it
        emit({"port": server.port})
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):  # until the bench closes it
            if '"stats"' in line:  # {"stats": true}
                watch = getattr(server.service, "watch", None)
                emit({"reports": getattr(watch, "reports", None)})
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
    from tpuctl.coordination.values import ServiceConfig, TaskSpec

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
