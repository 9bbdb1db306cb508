"""The one place where protobuf messages meet core values, and gRPC status codes meet errors.

Server side: requests to core values, core values to responses, a ``Refused`` reason to its status code.
Client side: responses to core values, a failed call's status to the ``TpuctlError`` a user sees.
"""

from __future__ import annotations

import lzma
import math
from collections.abc import Iterable, Sequence

import grpc

from tpuctl.coordination.plan import Plan, SliceShape
from tpuctl.coordination.values import (
    MAX_GATHER_WIRE,
    RECENT_FAILURES_KEPT,
    SAMPLE,
    ClusterFailed,
    ClusterFailure,
    ClusterStatus,
    FailedBarrier,
    Gathered,
    Membership,
    Moved,
    OpenBarrier,
    Pending,
    Reason,
    Refused,
    Registration,
    RegistrationProgress,
    RendezvousKind,
    RendezvousProgress,
    StandbySlice,
    TaskFailure,
    TaskInfo,
    TaskRef,
    TaskState,
    TaskStatus,
    clip,
)
from tpuctl.errors import (
    ClusterError,
    CoordinatorUnreachable,
    DeadlineError,
    GenerationOver,
    InputError,
    TpuctlError,
)
from tpuctl.goodput.ledger import GoodputSummary
from tpuctl.messages import count
from tpuctl.preemption.notice import (
    MAX_REASON,
    AgreementHeard,
    Notice,
    NoticeHeard,
    NoticeView,
    PreemptionView,
)
from tpuctl.proto import coordination_pb2 as pb
from tpuctl.watchdog.judge import SlowHost, Verdict, WatchdogView
from tpuctl.watchdog.pace import MAX_STEP, PaceReport

MAX_AGE_S = 10.0 * 365 * 86400  # a step age or step time beyond ten years is a mistake, not a measurement
MAX_VERDICT_TASKS = 16
MAX_PLAN_RUNS = 1 << 16
"""Runs a registrant's previous plan may have (a plan has at most one per slice; more is no cluster's)."""

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
    Reason.NOT_PERMITTED: grpc.StatusCode.PERMISSION_DENIED,
    Reason.QUOTA: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reason.CLUSTER_FAILED: grpc.StatusCode.ABORTED,
    Reason.TIMED_OUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    Reason.OLD_GENERATION: grpc.StatusCode.OUT_OF_RANGE,
    Reason.SHAPE_MISMATCH: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.STANDBY: grpc.StatusCode.FAILED_PRECONDITION,
}

_STATES = {
    TaskState.WAITING: pb.TASK_STATE_WAITING,
    TaskState.CONNECTED: pb.TASK_STATE_CONNECTED,
    TaskState.FAILED: pb.TASK_STATE_FAILED,
    TaskState.DISCONNECTED: pb.TASK_STATE_DISCONNECTED,
}
_STATES_BACK = {wire: state for state, wire in _STATES.items()}

# grpc core's own text for a deadline the *client* set; the service's DEADLINE_EXCEEDED carries a message.
_CORE_INTERNAL_DETAILS = "Internal error from Core"
_CLIENT_DEADLINE_DETAILS = "Deadline Exceeded"


# --- small messages ----------------------------------------------------------------------------------


def task_ref(message: pb.TaskRef) -> TaskRef:
    return TaskRef(message.task_id, message.incarnation, message.credential, message.generation or 1)


def task_ref_pb(task: TaskRef) -> pb.TaskRef:
    return pb.TaskRef(
        task_id=task.task_id, incarnation=task.incarnation, credential=task.credential, generation=task.generation
    )


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
        shutdown=failure.shutdown,
        generation=failure.generation,
        rejoin=failure.rejoin,
        earlier=failure.earlier,
        next=failure.next,
        moved=None if failure.moved is None else pb.CoordinatorMoved(task=failure.moved.task, generation=failure.moved.generation),
    )


def cluster_failure(message: pb.ClusterFailure) -> ClusterFailure:
    return ClusterFailure(
        tuple(TaskFailure(_task_info(f.task), f.cause) for f in message.failures),
        message.total,
        message.shutdown,
        generation=message.generation or 1,
        rejoin=message.rejoin,
        earlier=message.earlier,
        next=clip(message.next),
        moved=Moved(message.moved.task, message.moved.generation) if message.HasField("moved") else None,
    )


def plan_pb(plan: Plan) -> list[pb.PlanRun]:
    return [pb.PlanRun(first=first, count=n) for first, n in plan.runs]


def plan(runs: Sequence[pb.PlanRun]) -> Plan | None:
    """A plan from its runs (None: none sent). A malformed one is the coordinator's bug: InputError."""
    return Plan(tuple((r.first, r.count) for r in runs)) if runs else None


def slice_shape_pb(shape: SliceShape) -> pb.SliceShape:
    return pb.SliceShape(accelerator=shape.accelerator, topology=shape.topology, hosts_per_slice=shape.hosts_per_slice)


def slice_shape(message: pb.SliceShape) -> SliceShape:
    return SliceShape(clip(message.accelerator, 64), clip(message.topology, 64), message.hosts_per_slice)


# --- registration ------------------------------------------------------------------------------------


def registration(request: pb.RegisterTaskRequest, *, peer: str, credential: bytes) -> Registration:
    """The core value of a registration; the hostname is clipped by the state. ``credential``: the secret
    the registration gets if it is new (generated by the caller, at the edge)."""
    return Registration(
        protocol_version=request.protocol_version,
        cluster=request.cluster_name,
        task_id=request.task_id,
        incarnation=request.incarnation,
        hostname=request.hostname,
        peer=peer,
        retry_secret=request.retry_secret,
        credential=credential,
        generation=request.generation,
        previous_credential=request.previous_credential,
        slice_shape=slice_shape(request.slice_shape) if request.HasField("slice_shape") else None,
        spare=request.spare,
        previous_plan=_previous_plan(request),
    )


def _previous_plan(request: pb.RegisterTaskRequest) -> Plan | None:
    """The plan a registrant learnt for the generation it was in, refused ``INVALID`` when malformed."""
    runs = request.previous_plan
    if not runs:
        return None
    if len(runs) > MAX_PLAN_RUNS:
        raise Refused(Reason.INVALID, f"task {request.task_id}: its previous plan has {len(runs)} runs, more than "
                      f"{MAX_PLAN_RUNS} (a plan has at most one per slice)")  # fmt: skip
    try:
        return Plan(tuple((r.first, r.count) for r in runs))
    except InputError as exc:
        raise Refused(Reason.INVALID, f"task {request.task_id}: its previous plan is malformed: {exc.message}") from exc


def register_response(membership: Membership, *, with_tasks: bool) -> pb.RegisterTaskResponse:
    """The same for every task of the cluster (the caller's own ``TaskRef`` is not in it: the answer is
    these shared bytes followed by ``credential_answer``, which protobuf parses as one message)."""
    return pb.RegisterTaskResponse(
        service_incarnation=membership.service_incarnation,
        tasks=_task_infos_pb(membership.tasks) if with_tasks else (),
        heartbeat_timeout_seconds=membership.heartbeat_timeout,
        default_barrier_timeout_seconds=membership.barrier_timeout,
        num_tasks=membership.num_tasks,
        generation=membership.generation,
        plan=plan_pb(membership.plan) if membership.plan is not None else (),
        standby=membership.standby,
    )


def credential_answer(credential: bytes) -> bytes:
    """The caller's own part of a registration answer, appended to the shared bytes: field 6
    (``credential``), length-delimited."""
    if len(credential) < 128:
        return bytes((6 << 3 | 2, len(credential))) + credential
    return pb.RegisterTaskResponse(credential=credential).SerializeToString()


def membership(response: pb.RegisterTaskResponse, task: TaskRef) -> Membership:
    """``task`` with the credential the service answered (what every later task-scoped call carries)."""
    return Membership(
        task=TaskRef(task.task_id, task.incarnation, bytes(response.credential), response.generation or 1),
        service_incarnation=response.service_incarnation,
        tasks=tuple(_task_info(t) for t in response.tasks),
        heartbeat_timeout=response.heartbeat_timeout_seconds,
        barrier_timeout=response.default_barrier_timeout_seconds,
        num_tasks=response.num_tasks,
        plan=plan(response.plan),
        standby=response.standby,
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


def call_outcome_response(outcome: int | Gathered | Pending | None) -> pb.RendezvousProgressResponse:
    """What became of an arrival (``CoordinationState.call_outcome``): not counted, open, or passed."""
    if outcome is None:
        return pb.RendezvousProgressResponse()
    if isinstance(outcome, Pending):
        return pb.RendezvousProgressResponse(found=True, counted=True)
    instance = outcome.instance if isinstance(outcome, Gathered) else outcome
    return pb.RendezvousProgressResponse(found=True, counted=True, done=True, passed=True, instance=instance)


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
        generation=status.generation,
        forming=status.forming,
        ended=status.ended,
    )
    for task in status.tasks:
        entry = response.tasks.add(
            task=pb.TaskInfo(task_id=task.task.task_id, address=task.task.address),
            state=_STATES[task.state],
            hostname=task.hostname,
            peer=task.peer,
            cause=task.cause,
            fingerprint=task.fingerprint,
            session_open=task.session_open,
            role=task.role,
        )  # no incarnation: it makes a registration's retry idempotent, so it stays the task's own
        if task.seconds_since_heartbeat is not None:
            entry.seconds_since_heartbeat = task.seconds_since_heartbeat
        if task.rank is not None:
            entry.rank = task.rank
    if status.plan is not None:
        response.plan.extend(plan_pb(status.plan))
    for spare in status.spares:
        response.spares.add(
            roster_slice=spare.roster_slice, first_task=spare.first_task, hosts=spare.hosts,
            registered=spare.registered, spare=spare.spare,
        )  # fmt: skip
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
    for failed in status.failed_barriers:
        response.failed_barriers.add(
            name=failed.name,
            instance=failed.instance,
            kind=_KINDS_PB[failed.kind],
            reason=failed.reason,
            message=failed.message,
            seconds_ago=failed.seconds_ago,
            arrived=failed.arrived,
            missing=_task_infos_pb(failed.missing),
            missing_count=failed.missing_count,
        )
    return response


def _failed_barriers(response: pb.GetStatusResponse) -> tuple[FailedBarrier, ...]:
    """The failed instances a status answer lists, as many as the service keeps (each a sample of hosts)."""
    return tuple(
        FailedBarrier(
            name=f.name,
            instance=f.instance,
            kind=kind(f.kind),
            reason=f.reason,
            message=clip(f.message),
            seconds_ago=f.seconds_ago,
            arrived=f.arrived,
            missing=tuple(_task_info(t) for t in f.missing[:SAMPLE]),
            missing_count=f.missing_count,
        )
        for f in response.failed_barriers[-RECENT_FAILURES_KEPT:]
    )


def cluster_status(response: pb.GetStatusResponse) -> ClusterStatus:
    tasks = tuple(
        TaskStatus(
            task=_task_info(t.task),
            state=_STATES_BACK[t.state],
            incarnation=0,  # never sent: a task's incarnation stays its own
            hostname=t.hostname,
            peer=t.peer,
            seconds_since_heartbeat=t.seconds_since_heartbeat if t.HasField("seconds_since_heartbeat") else None,
            cause=t.cause,
            fingerprint=t.fingerprint,
            session_open=t.session_open,
            role=t.role or "member",
            rank=t.rank if t.HasField("rank") else None,
        )
        for t in response.tasks
    )
    failure = cluster_failure(response.failure) if response.HasField("failure") else None
    barriers = tuple(
        OpenBarrier(b.name, b.instance, tuple(b.arrived), b.seconds_left, kind(b.kind)) for b in response.barriers
    )
    return ClusterStatus(
        response.cluster_name,
        response.service_incarnation,
        tasks,
        failure,
        response.protocol_version,
        barriers,
        generation=response.generation or 1,
        forming=response.forming,
        ended=tuple(response.ended),
        watchdog=watchdog(response.watchdog) if response.HasField("watchdog") else None,
        failed_barriers=_failed_barriers(response),
        goodput=goodput(response.goodput) if response.HasField("goodput") else None,
        preemption=preemption_view(response.preemption) if response.HasField("preemption") else None,
        plan=plan(response.plan),
        spares=tuple(
            StandbySlice(s.roster_slice, s.first_task, s.hosts, s.registered, s.spare) for s in response.spares
        ),
    )


# --- gather tables -----------------------------------------------------------------------------------


_XZ_PRESET = 6 | lzma.PRESET_EXTREME
"""A table is compressed once per gather and sent to every host: the strongest preset spends a little of
the service's CPU once to save bytes that task 0 sends once per host (docs/PERFORMANCE.md measures it)."""
_XZ_DICT_BYTES = 256 * 1024
"""The largest dictionary a table is compressed with. Its records repeat what neighbouring hosts
published, so matches are near: a dictionary this large compresses a pod's table about as well as one
the size of the whole table, and the encoder's match finder, sized by it, takes a fraction of the memory
of the preset's own 8 MiB."""
_XZ_MIN_DICT_BYTES = 4096  # liblzma's minimum
_XZ_MEMLIMIT = 32 * 1024 * 1024
"""Decoder memory a client allows a table (preset 6 needs about 9 MiB)."""


def gather_response(instance: int, values: Sequence[bytes]) -> pb.GatherResponse:
    """A passed gather's answer: the table serialized and xz-compressed (once, for every caller)."""
    table = pb.GatherTable(values=values).SerializeToString()
    # A dictionary no larger than the table finds the same matches, and the encoder's match finder is
    # sized by it (``_XZ_DICT_BYTES``).
    dict_size = min(_XZ_DICT_BYTES, max(_XZ_MIN_DICT_BYTES, len(table)))
    filters = [{"id": lzma.FILTER_LZMA2, "preset": _XZ_PRESET, "dict_size": dict_size}]
    packed = lzma.compress(table, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32, filters=filters)
    return pb.GatherResponse(instance=instance, table=packed, table_bytes=len(table))


def gather_values(response: pb.GatherResponse, *, limit: int = MAX_GATHER_WIRE) -> list[bytes]:
    """Every task's value from a gather answer, inflating its table to at most ``limit`` bytes.

    Raises ``ClusterError`` for a table that says or turns out to be larger than ``limit`` (a
    decompression bomb is stopped at the limit, not after) or that does not inflate."""
    if not response.table:
        return []  # no table: nothing was gathered
    if response.table_bytes > limit:
        raise ClusterError(
            f"the coordinator sent a gather table of {count(response.table_bytes)} bytes; at most "
            f"{count(limit)} are allowed"
        )
    inflater = lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=_XZ_MEMLIMIT)
    try:
        data = inflater.decompress(response.table, max_length=limit + 1)
    except lzma.LZMAError as exc:
        raise ClusterError(f"the coordinator sent a gather table that does not inflate: {exc}") from None
    if len(data) > limit:
        raise ClusterError(f"the coordinator sent a gather table that inflates beyond {count(limit)} bytes")
    if not inflater.eof or inflater.unused_data:
        raise ClusterError("the coordinator sent a gather table that does not inflate: cut short, or bytes after its end")
    if len(data) != response.table_bytes:
        raise ClusterError(
            f"the coordinator's gather table inflated to {count(len(data))} bytes, not the "
            f"{count(response.table_bytes)} it announced"
        )
    return list(pb.GatherTable.FromString(data).values)


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
    code: grpc.StatusCode,
    details: str,
    hint: str | None,
    *,
    target: str,
    call: str,
    timeout: float,
    failure: pb.ClusterFailure | None = None,
) -> TpuctlError:
    """The error a user sees for a failed call ``call`` to the coordinator at ``target``; ``failure``: the
    cluster's final failure a session's refusal carried (``ClusterFailed``)."""
    if failure is not None and code is grpc.StatusCode.ABORTED:
        return ClusterFailed(details, cluster_failure(failure), hint=hint)
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
    if code is grpc.StatusCode.INTERNAL and details == _CORE_INTERNAL_DETAILS:
        # gRPC's own, never the service's (it sends no INTERNAL): a stream broken under the call, as when
        # the coordinator stops mid-stream (seen on a loaded machine instead of UNAVAILABLE). Retried.
        return CoordinatorUnreachable(
            f"the coordinator at {target} broke off {call} (INTERNAL: {details})",
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
    if code is grpc.StatusCode.OUT_OF_RANGE:
        return GenerationOver(details, hint=hint)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        # The service's quotas name the limit and the use; gRPC's own (a message over its size limit) not.
        return InputError(f"the coordinator at {target} refused {call}: {details}", hint=hint)
    if code is grpc.StatusCode.PERMISSION_DENIED:
        return ClusterError(details, hint=hint)
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


def pace_pb(report: PaceReport) -> pb.HeartbeatRequest:
    """A host's job pace as the session stream carries it."""
    return pb.HeartbeatRequest(
        pace=pb.StepReport(
            step=report.step,
            step_age_seconds=report.step_age,
            step_time_seconds=report.step_time,
            window=report.window,
            stalled=report.stalled,
            checkpointed=report.checkpointed,
            ended=report.ended,
            sent_at=report.sent_at,
        )
    )


def pace(message: pb.StepReport) -> PaceReport | None:
    """The report, or None when a value is out of bounds (a negative step or age, a step time that is
    not a finite number of seconds): a host's word is checked, not trusted."""
    step, age, step_time = int(message.step), float(message.step_age_seconds), float(message.step_time_seconds)
    finite = math.isfinite(age) and math.isfinite(step_time)
    if not (finite and 0 <= step <= MAX_STEP and 0 <= age <= MAX_AGE_S and 0 <= step_time <= MAX_AGE_S):
        return None
    checkpointed = max(-1, min(int(message.checkpointed), MAX_STEP))
    sent_at = float(message.sent_at) if math.isfinite(message.sent_at) and message.sent_at > 0 else 0.0
    window = min(int(message.window), 1_000_000)
    return PaceReport(step, age, step_time, window, bool(message.stalled), checkpointed, bool(message.ended), sent_at)


def verdict_pb(verdict: Verdict) -> pb.WatchdogVerdict:
    return pb.WatchdogVerdict(
        kind=verdict.kind, message=clip(verdict.message), tasks=verdict.tasks[:MAX_VERDICT_TASKS], step=verdict.step
    )


def verdict(message: pb.WatchdogVerdict) -> Verdict:
    return Verdict(
        clip(message.kind, 32), clip(message.message), tuple(int(t) for t in message.tasks[:MAX_VERDICT_TASKS]),
        int(message.step),
    )  # fmt: skip


def watchdog_pb(view: WatchdogView) -> pb.WatchdogStatus:
    return pb.WatchdogStatus(
        armed=view.armed, low=view.low, median=view.median, high=view.high, stalled=view.stalled,
        slowest=[pb.SlowHost(task_id=h.task, step=h.step, step_age_seconds=h.step_age) for h in view.slowest],
        verdicts=[verdict_pb(v) for v in view.verdicts],
    )  # fmt: skip


def watchdog(message: pb.WatchdogStatus) -> WatchdogView:
    return WatchdogView(
        int(message.armed), int(message.low), int(message.median), int(message.high), int(message.stalled),
        tuple(SlowHost(int(h.task_id), int(h.step), float(h.step_age_seconds)) for h in message.slowest[:8]),
        tuple(verdict(v) for v in message.verdicts[:8]),
    )  # fmt: skip


def goodput_pb(summary: GoodputSummary) -> pb.GoodputSummary:
    return pb.GoodputSummary(
        fraction=summary.fraction, bucket=summary.bucket, wall_seconds=summary.wall_seconds,
        productive_seconds=summary.productive_seconds, generation=summary.generation,
    )  # fmt: skip


def goodput(message: pb.GoodputSummary) -> GoodputSummary:
    def seconds(value: float) -> float:
        return float(value) if math.isfinite(value) and value >= 0 else 0.0

    fraction = seconds(message.fraction)
    return GoodputSummary(
        min(fraction, 1.0), clip(message.bucket, 32), seconds(message.wall_seconds),
        seconds(message.productive_seconds), int(message.generation),
    )  # fmt: skip


# --- preemption notices and the agreed checkpoint ------------------------------------------------------

MAX_LISTED_NOTICES = 10


def notice_request(source: str, reason: str, deadline_seconds: float, request_id: int) -> pb.HeartbeatRequest:
    """A host's own notice on its session."""
    return pb.HeartbeatRequest(
        notice=pb.PreemptionNotice(
            source=source, reason=clip(reason, MAX_REASON), deadline_seconds=deadline_seconds, request_id=request_id
        )
    )


def notice_pb(notice: Notice, now: float, agree_by: float) -> pb.PreemptionNotice:
    """A recorded notice as the service pushes it (times from ``now``)."""
    return pb.PreemptionNotice(
        task_id=notice.task, source=notice.source, reason=notice.reason, deadline_seconds=notice.seconds_left(now),
        notice_id=notice.notice_id, generation=notice.generation, agree_seconds=max(0.0, agree_by - now),
    )  # fmt: skip


def notice_heard(message: pb.PreemptionNotice) -> NoticeHeard | None:
    """A pushed notice, checked (None when its times are not finite, non-negative numbers of seconds)."""
    deadline, agree = float(message.deadline_seconds), float(message.agree_seconds)
    if not (math.isfinite(deadline) and math.isfinite(agree) and 0 <= deadline <= MAX_AGE_S and 0 <= agree <= MAX_AGE_S):
        return None
    return NoticeHeard(
        int(message.task_id), clip(message.source, 32), clip(message.reason, MAX_REASON), deadline, agree,
        int(message.notice_id), int(message.generation),
    )  # fmt: skip


def agreement_pb(generation: int, step: int, reason: str, deadline_seconds: float) -> pb.HeartbeatResponse:
    return pb.HeartbeatResponse(
        agreement=pb.CheckpointAgreement(
            generation=generation, step=step, reason=clip(reason), deadline_seconds=max(0.0, deadline_seconds)
        )
    )


def agreement_heard(message: pb.CheckpointAgreement) -> AgreementHeard:
    deadline = float(message.deadline_seconds)
    deadline = deadline if math.isfinite(deadline) and 0 <= deadline <= MAX_AGE_S else 0.0
    step = int(message.step)
    return AgreementHeard(int(message.generation), step if 0 <= step <= MAX_STEP else -1, clip(message.reason), deadline)


def checkpoint_report_pb(
    generation: int, next_step: int, *, unknown: bool = False, checkpointed: int = -1, saved: bool = False
) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(
        checkpoint=pb.CheckpointReport(
            generation=generation, next_step=next_step, unknown=unknown, checkpointed=checkpointed, saved=saved
        )
    )


def checkpoint_report(message: pb.CheckpointReport) -> tuple[int, int, bool, int, bool] | None:
    """``(generation, next_step, unknown, checkpointed, saved)``, or None when a step is out of bounds."""
    next_step, checkpointed = int(message.next_step), int(message.checkpointed)
    if not (-1 <= next_step <= MAX_STEP and -1 <= checkpointed <= MAX_STEP):
        return None
    return int(message.generation), next_step, bool(message.unknown), checkpointed, bool(message.saved)


def preemption_pb(view: PreemptionView) -> pb.PreemptionStatus:
    notices = [
        pb.PreemptionNotice(
            task_id=n.task, source=n.source, reason=n.reason, deadline_seconds=n.deadline_in, notice_id=n.notice_id
        )
        for n in view.notices[:MAX_LISTED_NOTICES]
    ]
    return pb.PreemptionStatus(
        generation=view.generation, notices=notices, count=view.count, state=view.state, step=view.step,
        reason=clip(view.reason), reported=view.reported, hosts=view.hosts, checkpointed=view.checkpointed,
        saved=view.saved,
    )  # fmt: skip


def preemption_view(message: pb.PreemptionStatus) -> PreemptionView:
    notices = tuple(
        NoticeView(
            int(n.task_id),
            clip(n.source, 32),
            clip(n.reason, MAX_REASON),
            float(n.deadline_seconds) if math.isfinite(n.deadline_seconds) else 0.0,
            int(n.notice_id),
        )
        for n in message.notices[:MAX_LISTED_NOTICES]
    )
    return PreemptionView(
        int(message.generation), notices, int(message.count), clip(message.state, 16), int(message.step),
        clip(message.reason), int(message.reported), int(message.hosts), int(message.checkpointed), int(message.saved),
    )  # fmt: skip
