"""The one place where protobuf messages meet core values, and gRPC status codes meet errors.

Server side: requests to core values, core values to responses, a ``Refused`` reason to its status code.
Client side: responses to core values, a failed call's status to the ``TpuctlError`` a user sees.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import grpc

from tpuctl.coordination.values import (
    ClusterFailure,
    ClusterStatus,
    Membership,
    OpenBarrier,
    Reason,
    Registration,
    RegistrationProgress,
    RendezvousKind,
    RendezvousProgress,
    TaskFailure,
    TaskInfo,
    TaskRef,
    TaskState,
    TaskStatus,
    count,
)
from tpuctl.errors import ClusterError, CoordinatorUnreachable, DeadlineError, InputError, TpuctlError
from tpuctl.proto import coordination_pb2 as pb

HINT_KEY = "x-tpuctl-hint-bin"
"""Trailing metadata carrying a refusal's hint (``-bin``: UTF-8 bytes, as any text may end up there)."""
MAX_DETAILS_WIRE = 4096
"""Most bytes a status message may take in the trailers once gRPC percent-encodes it."""
MAX_HINT_BYTES = 1024
"""Most UTF-8 bytes of a hint (gRPC base64-encodes ``-bin`` metadata: about 1.4 KB on the wire).

Both keep a refusal's trailers far below gRPC's metadata limits (8 KiB soft, 16 KiB hard) whatever the
cluster size or the names involved: every message a client may see stays within them."""

STATUS_CODES: dict[Reason, grpc.StatusCode] = {
    Reason.VERSION_MISMATCH: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.WRONG_CLUSTER: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.NOT_CONNECTED: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.UNKNOWN_TASK: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.TASK_TAKEN: grpc.StatusCode.ALREADY_EXISTS,
    Reason.KEY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Reason.STALE_INCARNATION: grpc.StatusCode.ABORTED,
    Reason.CLUSTER_FAILED: grpc.StatusCode.ABORTED,
    Reason.TIMED_OUT: grpc.StatusCode.DEADLINE_EXCEEDED,
}

_STATES = {
    TaskState.WAITING: pb.TASK_STATE_WAITING,
    TaskState.CONNECTED: pb.TASK_STATE_CONNECTED,
    TaskState.FAILED: pb.TASK_STATE_FAILED,
    TaskState.DISCONNECTED: pb.TASK_STATE_DISCONNECTED,
}
_STATES_BACK = {wire: state for state, wire in _STATES.items()}

# grpc core's own text for a deadline the *client* set; the service's DEADLINE_EXCEEDED carries a message.
_CLIENT_DEADLINE_DETAILS = "Deadline Exceeded"


# --- small messages ----------------------------------------------------------------------------------


def task_ref(message: pb.TaskRef) -> TaskRef:
    return TaskRef(message.task_id, message.incarnation)


def task_ref_pb(task: TaskRef) -> pb.TaskRef:
    return pb.TaskRef(task_id=task.task_id, incarnation=task.incarnation)


def _task_info(message: pb.TaskInfo) -> TaskInfo:
    return TaskInfo(message.task_id, message.address)


def _task_infos_pb(tasks: Sequence[TaskInfo]) -> list[pb.TaskInfo]:
    return [pb.TaskInfo(task_id=t.task_id, address=t.address) for t in tasks]


def cluster_failure_pb(failure: ClusterFailure) -> pb.ClusterFailure:
    return pb.ClusterFailure(
        failures=[
            pb.TaskFailure(task=pb.TaskInfo(task_id=f.task.task_id, address=f.task.address), cause=f.cause)
            for f in failure.failures
        ],
        total=failure.total,
    )


def cluster_failure(message: pb.ClusterFailure) -> ClusterFailure:
    return ClusterFailure(tuple(TaskFailure(_task_info(f.task), f.cause) for f in message.failures), message.total)


# --- registration ------------------------------------------------------------------------------------


def registration(request: pb.RegisterTaskRequest, *, peer: str) -> Registration:
    """The core value of a registration; the hostname is clipped by the state."""
    return Registration(
        protocol_version=request.protocol_version,
        cluster=request.cluster_name,
        task_id=request.task_id,
        incarnation=request.incarnation,
        hostname=request.hostname,
        peer=peer,
    )


def register_response(membership: Membership, *, with_tasks: bool) -> pb.RegisterTaskResponse:
    """The same for every task of the cluster (the caller's own ``TaskRef`` is not in it)."""
    return pb.RegisterTaskResponse(
        service_incarnation=membership.service_incarnation,
        tasks=_task_infos_pb(membership.tasks) if with_tasks else (),
        heartbeat_timeout_seconds=membership.heartbeat_timeout,
        default_barrier_timeout_seconds=membership.barrier_timeout,
        num_tasks=membership.num_tasks,
    )


def membership(response: pb.RegisterTaskResponse, task: TaskRef) -> Membership:
    return Membership(
        task=task,
        service_incarnation=response.service_incarnation,
        tasks=tuple(_task_info(t) for t in response.tasks),
        heartbeat_timeout=response.heartbeat_timeout_seconds,
        barrier_timeout=response.default_barrier_timeout_seconds,
        num_tasks=response.num_tasks,
    )


def progress_response(progress: RegistrationProgress) -> pb.WaitForAllTasksResponse:
    return pb.WaitForAllTasksResponse(
        complete=progress.complete,
        registered=progress.registered,
        missing=_task_infos_pb(progress.missing),
        seconds_left=progress.seconds_left,
        total=progress.total,
        missing_count=progress.missing_count,
    )


def progress(response: pb.WaitForAllTasksResponse) -> RegistrationProgress:
    return RegistrationProgress(
        registered=response.registered,
        total=response.total,
        missing=tuple(_task_info(t) for t in response.missing),
        seconds_left=response.seconds_left,
        missing_count=response.missing_count,
    )


def rendezvous_progress_response(found: RendezvousProgress | None) -> pb.RendezvousProgressResponse:
    if found is None:
        return pb.RendezvousProgressResponse()
    return pb.RendezvousProgressResponse(
        found=True,
        instance=found.instance,
        arrived=found.arrived,
        total=found.total,
        missing=_task_infos_pb(found.missing),
        seconds_left=found.seconds_left,
        done=found.done,
    )


def rendezvous_progress(
    response: pb.RendezvousProgressResponse, *, kind: RendezvousKind, name: str
) -> RendezvousProgress | None:
    if not response.found:
        return None
    return RendezvousProgress(
        kind=kind,
        name=name,
        instance=response.instance,
        arrived=response.arrived,
        total=response.total,
        missing=tuple(_task_info(t) for t in response.missing),
        seconds_left=response.seconds_left,
        done=response.done,
    )


_KINDS_PB = {"barrier": pb.RENDEZVOUS_KIND_BARRIER, "gather": pb.RENDEZVOUS_KIND_GATHER}


def kind_pb(kind: RendezvousKind) -> pb.RendezvousKind.ValueType:
    return _KINDS_PB[kind]


def kind(value: int) -> RendezvousKind:
    """The default (0) is a barrier."""
    return "gather" if value == pb.RENDEZVOUS_KIND_GATHER else "barrier"


# --- status ------------------------------------------------------------------------------------------


def status_response(status: ClusterStatus) -> pb.GetStatusResponse:
    response = pb.GetStatusResponse(
        cluster_name=status.cluster,
        service_incarnation=status.service_incarnation,
        protocol_version=status.protocol_version,
    )
    for task in status.tasks:
        entry = response.tasks.add(
            task=pb.TaskInfo(task_id=task.task.task_id, address=task.task.address),
            state=_STATES[task.state],
            incarnation=task.incarnation,
            hostname=task.hostname,
            peer=task.peer,
            cause=task.cause,
        )
        if task.seconds_since_heartbeat is not None:
            entry.seconds_since_heartbeat = task.seconds_since_heartbeat
    if status.failure is not None:
        response.failure.CopyFrom(cluster_failure_pb(status.failure))
    for barrier in status.barriers:
        response.barriers.add(
            name=barrier.name,
            instance=barrier.instance,
            arrived=barrier.arrived,
            seconds_left=barrier.seconds_left,
            kind=_KINDS_PB[barrier.kind],
        )
    return response


def cluster_status(response: pb.GetStatusResponse) -> ClusterStatus:
    tasks = tuple(
        TaskStatus(
            task=_task_info(t.task),
            state=_STATES_BACK[t.state],
            incarnation=t.incarnation,
            hostname=t.hostname,
            peer=t.peer,
            seconds_since_heartbeat=t.seconds_since_heartbeat if t.HasField("seconds_since_heartbeat") else None,
            cause=t.cause,
        )
        for t in response.tasks
    )
    failure = cluster_failure(response.failure) if response.HasField("failure") else None
    barriers = tuple(
        OpenBarrier(b.name, b.instance, tuple(b.arrived), b.seconds_left, kind(b.kind)) for b in response.barriers
    )
    return ClusterStatus(
        response.cluster_name, response.service_incarnation, tasks, failure, response.protocol_version, barriers
    )


# --- errors ------------------------------------------------------------------------------------------


def hint_metadata(hint: str | None) -> tuple[tuple[str, bytes], ...]:
    """The trailing metadata carrying ``hint``, cut to ``MAX_HINT_BYTES``."""
    return () if hint is None else ((HINT_KEY, fit_text(hint, MAX_HINT_BYTES, percent=False).encode()),)


def fit_text(text: str, limit: int, *, percent: bool = True) -> str:
    """``text`` cut (with a marker saying how much) so that it takes at most ``limit`` bytes on the wire:
    UTF-8, and with ``percent`` as gRPC percent-encodes a status message (bytes outside printable ASCII,
    and "%", take three)."""
    if len(text) * (3 if percent else 1) * 4 <= limit:
        return text  # the common case: short, whatever its characters

    def cost(char: str) -> int:
        if percent and " " <= char <= "~" and char != "%":
            return 1
        return (3 if percent else 1) * len(char.encode())

    if sum(cost(char) for char in text) <= limit:
        return text
    budget, used = limit - 64, 0  # leave room for the marker
    for position, char in enumerate(text):
        used += cost(char)
        if used > budget:
            return f"{text[:position]}... [{count(len(text) - position)} more characters cut]"
    return text


def status_details(message: str) -> str:
    """A refusal's message as it may travel in a status (see ``MAX_DETAILS_WIRE``)."""
    return fit_text(message, MAX_DETAILS_WIRE)


def error_from_status(
    code: grpc.StatusCode, details: str, hint: str | None, *, target: str, call: str, timeout: float
) -> TpuctlError:
    """The error a user sees for a failed call ``call`` to the coordinator at ``target``."""
    if code is grpc.StatusCode.UNAVAILABLE:
        return CoordinatorUnreachable(
            f"coordinator unreachable at {target}: {details}",
            hint=hint
            or f"check that `tpuctl init` runs on task 0, that {target} is its address, and that the port is "
            "open between the hosts",
        )
    if code is grpc.StatusCode.CANCELLED:
        # Not this process's doing (a cancelled asyncio task raises CancelledError instead): the connection
        # was reset under the call, as by an overloaded or restarting coordinator. Retried like UNAVAILABLE.
        return CoordinatorUnreachable(
            f"the coordinator at {target} dropped {call} (CANCELLED: {details})",
            hint=hint or "it may be overloaded or restarting; `tpuctl status` shows what it sees",
        )
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        if details == _CLIENT_DEADLINE_DETAILS:
            return DeadlineError(
                f"the coordinator at {target} did not answer {call} within {timeout:.1f} s",
                hint="it may be overloaded or stuck; `tpuctl status` shows what it sees",
            )
        return DeadlineError(details, hint=hint)
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        return InputError(details, hint=hint)
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return ClusterError(
            f"the coordinator at {target} refused {call}: {details}",
            hint=hint or "use the same token file on every host",
        )
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return ClusterError(
            f"{target} does not serve tpuctl's coordination protocol ({call}: {details})",
            hint="is that address a tpuctl coordinator of the same version?",
        )
    if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.ABORTED):
        return ClusterError(details, hint=hint)
    return ClusterError(f"{call} to the coordinator at {target} failed: {code.name}: {details}", hint=hint)


def hint_from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The hint a refusal carried, from a call's trailing metadata."""
    for key, value in metadata or ():
        if key == HINT_KEY:
            return value.decode(errors="replace") if isinstance(value, bytes) else value
    return None
