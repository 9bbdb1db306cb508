"""Answers the coordination service encodes once and sends to every caller as the same bytes.

The registration, "all registered", a heartbeat's answer, a passed gather's table and the cluster's
error are the same for every host that asks (a gather's and a session's answers differ only by the
request id ``wire.py`` prepends): ``SharedAnswers`` builds and serializes each once and keeps the bytes,
for the unary calls and the session streams alike.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from google.protobuf.message import Message

from tpuctl.coordination import convert
from tpuctl.coordination.fanout import fanout_width
from tpuctl.coordination.values import ClusterFailure, Counters, Gathered
from tpuctl.proto import coordination_pb2 as pb
from tpuctl.protowire import length_delimited

LOST_TABLE_FIELD = pb.RendezvousProgressResponse.DESCRIPTOR.fields_by_name["gathered"].number
"""``RendezvousProgressResponse.gathered``: appended to the encoded reply as the table's own bytes."""
MAX_POLL_S = 60.0
"""Longest a long poll (registration progress, error poll) is held before answering "nothing yet"."""


def poll_seconds(requested: float) -> float:
    """How long a long poll asking for ``requested`` seconds is held (``MAX_POLL_S`` at most)."""
    return min(max(requested, 0.0), MAX_POLL_S) if math.isfinite(requested) else MAX_POLL_S


class SharedAnswers:
    """The service's answers that are the same for every caller, each serialized once."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self._shared: dict[str, bytes] = {}
        self._error: tuple[ClusterFailure, bytes, bytes] | None = None
        """The cluster's error as an error poll's answer and as a session's push, encoded once."""
        self._gathered: dict[str, tuple[Gathered, bytes, asyncio.Semaphore]] = {}
        self._lost: dict[str, tuple[Gathered, bytes]] = {}
        """Per gather name, its latest passed instance as a lost answer's reply (``lost_gather``)."""

    def share(self, key: str, build: Callable[[], Message]) -> bytes:
        """An answer that is the same for every caller, serialized once."""
        data = self._shared.get(key)
        if data is None:
            self.counters.built += 1
            self.counters.encoded += 1
            data = self._shared[key] = build().SerializeToString()
        return data

    def heartbeat(self, service_incarnation: int) -> bytes:
        return self.share("heartbeat", lambda: pb.HeartbeatResponse(service_incarnation=service_incarnation))

    def gathered(self, name: str, gathered: Gathered) -> tuple[bytes, asyncio.Semaphore]:
        """A passed gather's ``GatherResponse``, encoded once for every caller (unary and stream alike),
        and the gate that bounds how many bytes of its copies are being written at once."""
        cached = self._gathered.get(name)
        if cached is None or cached[0] is not gathered:
            self.counters.built += 1
            self.counters.encoded += 1
            self.counters.touched += len(gathered.values)
            data = convert.gather_response(gathered.instance, gathered.values).SerializeToString()  # once, for all
            gate = asyncio.Semaphore(fanout_width(len(data)))
            cached = self._gathered[name] = (gathered, data, gate)
        return cached[1], cached[2]

    def lost_gather(self, name: str, gathered: Gathered) -> bytes:
        """What became of a gather arrival whose answer its session lost, once it passed: a
        ``RendezvousProgressResponse`` with the table, encoded once per instance (the table's bytes are
        ``gathered``'s, not copied per caller), for every host that asks."""
        data, _ = self.gathered(name, gathered)
        cached = self._lost.get(name)
        if cached is None or cached[0] is not gathered:
            self.counters.encoded += 1
            head = convert.call_outcome_response(gathered).SerializeToString()
            cached = self._lost[name] = (gathered, head + length_delimited(LOST_TABLE_FIELD, data))
        return cached[1]

    def error(self, failure: ClusterFailure) -> tuple[bytes, bytes]:
        """The cluster's error as a ``PollForErrorResponse`` and as a session's ``HeartbeatResponse``."""
        if self._error is None or self._error[0] is not failure:
            self.counters.built += 1
            self.counters.encoded += 2
            message = convert.cluster_failure_pb(failure)
            self._error = (
                failure,
                pb.PollForErrorResponse(failure=message).SerializeToString(),
                pb.HeartbeatResponse(failure=message).SerializeToString(),
            )
        return self._error[1], self._error[2]
