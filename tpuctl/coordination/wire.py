"""Session answers written as wire bytes by hand, to share one encoding among many hosts.

A passed barrier, a passed gather, the end of registration and a refusal are the same answer for every
host waiting on them but for ``HeartbeatResponse.request_id``, each host's own. Protobuf messages
concatenate (a field that appears later is added to the message), so the shared part is encoded once
and each host's request id is prepended as raw wire bytes: no message is built or serialized per host.
"""

from __future__ import annotations

import functools

from tpuctl.coordination import convert
from tpuctl.coordination.values import Refused
from tpuctl.proto import coordination_pb2 as pb
from tpuctl.protowire import varint

REGISTERED_FIELD = pb.HeartbeatResponse.DESCRIPTOR.fields_by_name["registered"].number
GATHERED_FIELD = pb.HeartbeatResponse.DESCRIPTOR.fields_by_name["gathered"].number
_REQUEST_ID_KEY = varint(pb.HeartbeatResponse.DESCRIPTOR.fields_by_name["request_id"].number << 3)
"""``HeartbeatResponse.request_id``'s key: its field number, wire type varint (0)."""


def request_id_prefix(request_id: int) -> bytes:
    """``HeartbeatResponse.request_id`` on the wire: prepended to an outcome encoded once for every
    waiter (the outcome itself leaves the field unset)."""
    return _REQUEST_ID_KEY + varint(request_id) if request_id else b""


def outcome_passed(request_id: int, instance: int) -> bytes:
    return request_id_prefix(request_id) + _passed_tail(instance)


@functools.lru_cache(maxsize=256)
def _passed_tail(instance: int) -> bytes:
    return pb.HeartbeatResponse(instance=instance).SerializeToString()


def outcome_refused(request_id: int, refused: Refused) -> bytes:
    """A refusal as a session answer: what the unary call's status and hint would have carried, bounded, and
    the cluster's final failure when that is why (``Refused.failure``: the answer says whether it was a
    shutdown; asking again may find the service gone)."""
    return pb.HeartbeatResponse(
        request_id=request_id,
        code=convert.STATUS_CODES[refused.reason].value[0],
        details=convert.status_details(refused.message),
        hint=convert.fit_text(refused.hint, convert.MAX_HINT_BYTES, percent=False) if refused.hint else "",
        failure=convert.cluster_failure_pb(refused.failure) if refused.failure is not None else None,
    ).SerializeToString()


@functools.lru_cache(maxsize=256)
def barrier_answer(instance: int) -> bytes:
    """A passed unary ``Barrier``'s answer (the same for every caller of that instance)."""
    return pb.BarrierResponse(instance=instance).SerializeToString()
