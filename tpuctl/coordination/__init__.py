"""Cluster coordination: task 0 hosts the service, every host registers, heartbeats, meets at barriers.

Layers, bottom to top: ``state`` (the pure state machine and its values; no grpc, asyncio or clock),
``convert`` (protobuf and gRPC status <-> core values and errors), ``service`` (the gRPC servicer that
parks waiting calls), ``server`` (start/stop), ``client``, ``auth`` (token file and server check).
Importing this package imports no grpc: the names below are the pure core's.
"""

from tpuctl.coordination.state import (
    PROTOCOL_VERSION,
    ClusterFailure,
    ClusterStatus,
    Membership,
    RegistrationProgress,
    ServiceConfig,
    TaskFailure,
    TaskInfo,
    TaskRef,
    TaskSpec,
    TaskState,
    TaskStatus,
)

__all__ = [
    "PROTOCOL_VERSION",
    "ClusterFailure",
    "ClusterStatus",
    "Membership",
    "RegistrationProgress",
    "ServiceConfig",
    "TaskFailure",
    "TaskInfo",
    "TaskRef",
    "TaskSpec",
    "TaskState",
    "TaskStatus",
]
