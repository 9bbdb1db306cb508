"""A preemption notice, the sources tpuctl hears them from, and the records kept of them.

A notice says that one host is going away: which host, from which source, and by when (the deadline the
source implies). Every source ends in one message from that host's agent to the coordinator, which
records it (:class:`Notice`) and pushes it to every host at once.

The coordinator also keeps a timeline of what happened, as plain records (:class:`PreemptionEvent`): a
notice, the agreement on a checkpoint step (or why there is none), a host's job saving that step, and the
steps lost when a notice's deadline passed without a saved checkpoint. The goodput ledger reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

# The deadline each source implies, in seconds from the notice.
GCE_PREEMPTED_S = 30.0
"""Spot and preemptible VMs get about 30 s between ``instance/preempted`` turning TRUE (an ACPI soft-off)
and the stop (Compute Engine's documentation on preemption)."""
GCE_MAINTENANCE_S = 60.0
"""``instance/maintenance-event`` changes 60 s before host maintenance starts (Compute Engine's
documentation); a TPU VM cannot live-migrate, so TERMINATE_ON_HOST_MAINTENANCE stops it."""
COMMAND_S = 30.0
"""``tpuctl preempt`` without ``--in``: as long as GCE's preemption notice."""

SOURCES = {
    "gce-preempted": "the GCE metadata server: instance/preempted turned TRUE (a spot or preemptible VM stops)",
    "gce-maintenance": "the GCE metadata server: instance/maintenance-event is TERMINATE_ON_HOST_MAINTENANCE",
    "sigterm": "SIGTERM to `tpuctl run` or to the agent (GKE, systemd or a person stopping it: not always "
    "a preemption)",
    "command": "`tpuctl preempt` (a drill, or a scheduler that knows first)",
}
"""Every source a notice may name, and what it means."""
MAX_REASON = 256
"""Longest reason text kept (bytes of UTF-8 on the wire; characters here)."""

AGREE_MIN_S = 1.0
AGREE_MAX_S = 10.0
"""The agreement's bound: every host reports where its job stands within a third of the notice's time,
at least ``AGREE_MIN_S`` and at most ``AGREE_MAX_S``: the rest of the time is the checkpoint's."""


def agree_seconds(deadline_seconds: float) -> float:
    """How long every host has to report where its job stands, for a notice due in ``deadline_seconds``."""
    return min(AGREE_MAX_S, max(AGREE_MIN_S, deadline_seconds / 3))


def source_problem(source: str) -> str | None:
    """What is wrong with ``source`` as a notice's source, or None."""
    if source in SOURCES:
        return None
    return f"{source[:40]!r} is not a notice source; expected one of {', '.join(SOURCES)}"


@dataclass(frozen=True)
class Notice:
    """One host going away, as the coordinator recorded it."""

    task: int
    source: str
    reason: str
    received: float
    """The service's clock when it arrived."""
    deadline: float
    """The service's clock when the host goes."""
    wall: float
    """The service's wall clock when it arrived (seconds since the epoch)."""
    notice_id: int
    """Its number in its generation, from 1."""
    generation: int

    def seconds_left(self, now: float) -> float:
        return max(0.0, self.deadline - now)

    def describe(self, name: str, now: float) -> str:
        """``task 2 (10.0.0.3): gce-preempted (instance/preempted TRUE), deadline in 28 s``; ``name`` names
        the host."""
        why = f" ({self.reason})" if self.reason else ""
        return f"{name}: {self.source}{why}, deadline in {self.seconds_left(now):.0f} s"


EVENT_KINDS = ("notice", "agreed", "no-agreement", "saved", "lost")


@dataclass(frozen=True)
class PreemptionEvent:
    """One entry of the coordinator's preemption timeline, for the goodput ledger.

    ``kind``: ``notice`` (a host is going away: ``task``, ``source``, ``reason``, ``deadline``),
    ``agreed`` (every host checkpoints at ``step``), ``no-agreement`` (``reason`` says why; jobs get
    SIGTERM and the grace as without tpuctl's help), ``saved`` (host ``task``'s job said it checkpointed
    ``step``, at or past the agreed one: the first such report of the agreement), ``lost`` (a notice's
    deadline passed with no saved checkpoint: ``lost_steps`` steps after the last checkpoint ``step``).
    Times are the service's wall clock, seconds since the epoch."""

    kind: str
    at: float
    generation: int
    task: int = -1
    """The host the event is about (-1: the cluster)."""
    source: str = ""
    reason: str = ""
    deadline: float = 0.0
    """The notice's deadline (wall clock; 0: none)."""
    step: int = -1
    lost_steps: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "at": round(self.at, 3),
            "generation": self.generation,
            "task": None if self.task < 0 else self.task,
            "source": self.source or None,
            "reason": self.reason or None,
            "deadline": round(self.deadline, 3) if self.deadline else None,
            "step": None if self.step < 0 else self.step,
            "lost_steps": self.lost_steps,
        }


@dataclass(frozen=True)
class NoticeView:
    """A notice as ``tpuctl status`` shows it."""

    task: int
    source: str
    reason: str
    deadline_in: float
    """Seconds until the host goes, when the status was taken (0: passed)."""
    notice_id: int


@dataclass(frozen=True)
class PreemptionView:
    """The latest notices and their agreement, for ``tpuctl status`` (fixed size: a sample of notices)."""

    generation: int
    notices: tuple[NoticeView, ...]
    count: int
    """How many notices there were (``notices`` lists the first few)."""
    state: str
    """``pending``, ``agreed`` or ``none``."""
    step: int
    reason: str
    reported: int
    """Hosts that said where their jobs stand."""
    hosts: int
    """Live hosts asked."""
    checkpointed: int = -1
    saved: int = 0
    """Hosts whose jobs saved the agreed step."""

    @property
    def tasks(self) -> frozenset[int]:
        """The hosts the notices listed are for."""
        return frozenset(n.task for n in self.notices)

    def to_dict(self, addresses: dict[int, str] | None = None) -> dict[str, object]:
        """A JSON-ready document; ``addresses`` names each notice's host."""
        return {
            "generation": self.generation,
            "notices": [
                {
                    "task": n.task,
                    "address": (addresses or {}).get(n.task),
                    "source": n.source,
                    "reason": n.reason or None,
                    "deadline_in": round(n.deadline_in, 1),
                    "notice": n.notice_id,
                }
                for n in self.notices
            ],
            "count": self.count,
            "agreement": {
                "state": self.state,
                "step": None if self.step < 0 else self.step,
                "reason": self.reason or None,
                "reported": self.reported,
                "hosts": self.hosts,
            },
            "checkpointed": None if self.checkpointed < 0 else self.checkpointed,
            "saved": self.saved,
        }


@dataclass(frozen=True)
class NoticeHeard:
    """A notice as a host hears it from the coordinator (times in seconds from when it was sent)."""

    task: int
    source: str
    reason: str
    deadline_in: float
    agree_in: float
    """Seconds left for this host to report where its job stands."""
    notice_id: int
    generation: int


@dataclass(frozen=True)
class AgreementHeard:
    """The agreement as a host hears it: the step (-1: none) and why."""

    generation: int
    step: int
    reason: str
    deadline_in: float


PREEMPTED_KEY = "instance/preempted"
MAINTENANCE_KEY = "instance/maintenance-event"


def gce_notice(key: str, value: str) -> tuple[str, str, float] | None:
    """The notice a metadata value means, as (source, reason, deadline in seconds), or None: ``TRUE`` of
    ``instance/preempted``, ``TERMINATE_ON_HOST_MAINTENANCE`` of ``instance/maintenance-event``. A live
    migration (``MIGRATE_ON_HOST_MAINTENANCE``) keeps the VM: not a notice."""
    if key == PREEMPTED_KEY and value == "TRUE":
        return "gce-preempted", f"{key} is TRUE", GCE_PREEMPTED_S
    if key == MAINTENANCE_KEY and value == "TERMINATE_ON_HOST_MAINTENANCE":
        return "gce-maintenance", f"{key} is {value}", GCE_MAINTENANCE_S
    return None
