"""Cluster coordination: task 0 hosts the service, every host registers, heartbeats, meets at barriers.

The public client API::

    from tpuctl.coordination import CoordinationClient

    async with CoordinationClient("10.0.0.2:8476", token=token) as client:
        # registers on the session's stream: heartbeats, waits, gathers, barriers, error watch on one stream
        session = await client.open_session("pod-a", task_id, connect_timeout=300, interval=5)
        beating = asyncio.create_task(session.run())
        await session.wait_for_all(timeout=300, progress=lambda p: print(p.describe()))
        values = await session.gather("cores", b"[0, 1, 2, 3]", timeout=60)  # every task's value, by task id
        await session.barrier("ready", timeout=60)

Layers, bottom to top: ``values`` (configuration, values, limits, refusals), ``taskset``, ``kv``,
``rendezvous`` and ``generations`` (parts of the state), ``state`` (the pure state machine; no grpc,
asyncio or clock), ``convert`` (protobuf and gRPC status <-> core values and errors), ``service`` (the gRPC
servicer that parks waiting calls; ``stream_answers`` answers those on session streams, ``watch`` the
watchdog's verdicts, ``preempt`` the preemption notices and the agreed checkpoint step), ``server``
(start/stop), ``channel`` and ``client``, ``auth`` (token file and server check).

Importing this package imports nothing: each public name is imported on first use (``__getattr__``),
so ``CoordinationClient``, ``start_server`` and ``CoordinationServer`` load grpc only then.
"""

TYPE_CHECKING = False  # not typing's: importing this package imports nothing
if TYPE_CHECKING:
    from tpuctl.coordination.auth import load_token
    from tpuctl.coordination.client import CoordinationClient
    from tpuctl.coordination.server import CoordinationServer, start_server
    from tpuctl.coordination.session import Session
    from tpuctl.coordination.values import (
        PROTOCOL_VERSION,
        SAMPLE,
        ClusterFailure,
        ClusterStatus,
        FailedBarrier,
        Membership,
        OpenBarrier,
        RegistrationProgress,
        RendezvousProgress,
        ServiceConfig,
        TaskFailure,
        TaskInfo,
        TaskRef,
        TaskSpec,
        TaskState,
        TaskStatus,
    )
    from tpuctl.errors import ClusterError, CoordinatorUnreachable, DeadlineError, InputError, TpuctlError

_VALUES = "tpuctl.coordination.values"
_ERRORS = "tpuctl.errors"
_LAZY = {
    "CoordinationClient": "tpuctl.coordination.client",
    "Session": "tpuctl.coordination.session",
    "CoordinationServer": "tpuctl.coordination.server",
    "start_server": "tpuctl.coordination.server",
    "load_token": "tpuctl.coordination.auth",
    **dict.fromkeys(
        (
            "PROTOCOL_VERSION", "SAMPLE", "ClusterFailure", "ClusterStatus", "FailedBarrier", "Membership", "OpenBarrier",
            "RegistrationProgress", "RendezvousProgress", "ServiceConfig", "TaskFailure", "TaskInfo", "TaskRef",
            "TaskSpec", "TaskState", "TaskStatus",
        ),
        _VALUES,
    ),
    **dict.fromkeys(("ClusterError", "CoordinatorUnreachable", "DeadlineError", "InputError", "TpuctlError"), _ERRORS),
}
"""Each public name and the module it comes from, imported on first use."""


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tpuctl.coordination' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "PROTOCOL_VERSION",
    "SAMPLE",
    "ClusterError",
    "ClusterFailure",
    "ClusterStatus",
    "CoordinationClient",
    "CoordinationServer",
    "CoordinatorUnreachable",
    "DeadlineError",
    "FailedBarrier",
    "InputError",
    "Membership",
    "OpenBarrier",
    "RegistrationProgress",
    "RendezvousProgress",
    "ServiceConfig",
    "Session",
    "TaskFailure",
    "TaskInfo",
    "TaskRef",
    "TaskSpec",
    "TaskState",
    "TaskStatus",
    "TpuctlError",
    "load_token",
    "start_server",
]
