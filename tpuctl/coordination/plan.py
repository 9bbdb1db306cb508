"""Which hosts make up a generation: the roster, its slices, and a generation's *plan*.

The *roster* is every host the spec names: its ``hosts`` (task ids ``0 .. active - 1``, the cluster at
full size) and then its ``spares`` (task ids from ``active`` on). A host's task id never changes; it is
how status, logs and messages name it. The roster is cut into *roster slices* of ``hosts_per_slice``
consecutive task ids (a TPU slice is replaced whole: its hosts share one ICI domain).

A generation is made of whole roster slices placed at *positions* ``0 .. k - 1`` (``k`` at most the
spec's ``num_slices``): its *plan*. Position ``p`` is the generation's slice ``p`` (``MEGASCALE_SLICE_ID``);
the hosts of the slice at position ``p`` get the generation's process ranks ``p * hosts_per_slice ..``
in task-id order (``JAX_PROCESS_ID``, ``RANK``, the mapping's task). Generation 1's plan is the identity:
roster slice ``p`` at position ``p`` for every active slice. A spare slice that replaces a lost slice
takes the lost slice's position (the others keep their slice ids); a slice dropped by policy elastic
leaves the positions after it one lower.

A plan travels as *runs* (first roster slice, count): consecutive positions holding consecutive roster
slices. The identity is one run; every replacement or drop adds at most two, so a plan's size is
O(1 + changes), never O(hosts). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from tpuctl.errors import InputError

Run = tuple[int, int]
"""(first roster slice, how many consecutive ones)."""


@dataclass(frozen=True)
class Roster:
    """The spec's hosts and spares as the service sees them: counts only."""

    active: int
    """The spec's ``hosts``: the cluster at full size (task ids ``0 .. active - 1``)."""
    spares: int = 0
    """The spec's ``spares`` (task ids ``active .. active + spares - 1``)."""
    hosts_per_slice: int = 0
    """Hosts per TPU slice (0: the whole cluster is one slice)."""

    def __post_init__(self) -> None:
        per = self.hosts_per_slice or self.active
        if self.active < 1 or self.spares < 0 or per < 1:
            raise InputError(f"roster: {self.active} hosts, {self.spares} spares, {per} per slice")
        if self.active % per or self.spares % per:
            raise InputError(
                f"roster: {self.active} hosts and {self.spares} spares are not whole slices of {per} hosts"
            )

    @property
    def per_slice(self) -> int:
        return self.hosts_per_slice or self.active

    @property
    def size(self) -> int:
        """Every task id: hosts and spares."""
        return self.active + self.spares

    @property
    def num_slices(self) -> int:
        """Positions at full size (the spec's ``num_slices``)."""
        return self.active // self.per_slice

    @property
    def roster_slices(self) -> int:
        """Roster slices, spare slices included."""
        return self.size // self.per_slice

    def slice_of(self, task_id: int) -> int:
        """The roster slice of ``task_id``."""
        return task_id // self.per_slice

    def tasks_of(self, roster_slice: int) -> range:
        per = self.per_slice
        return range(roster_slice * per, (roster_slice + 1) * per)

    def is_spare(self, task_id: int) -> bool:
        return task_id >= self.active

    def identity(self) -> Plan:
        return Plan(((0, self.num_slices),))


@dataclass(frozen=True)
class Plan:
    """The roster slices of one generation, by position, as runs."""

    runs: tuple[Run, ...]

    def __post_init__(self) -> None:
        seen = 0
        for first, n in self.runs:
            if first < 0 or n < 1:
                raise InputError(f"plan: a run ({first}, {n}) is not a first slice >= 0 and a count >= 1")
            seen += n
        if not seen:
            raise InputError("plan: no slice")

    @classmethod
    def of(cls, roster_slices: Sequence[int]) -> Plan:
        """The plan placing ``roster_slices[p]`` at position ``p``, as the fewest runs."""
        runs: list[list[int]] = []
        for s in roster_slices:
            if runs and runs[-1][0] + runs[-1][1] == s:
                runs[-1][1] += 1
            else:
                runs.append([s, 1])
        return cls(tuple((a, n) for a, n in runs))

    def __len__(self) -> int:
        """Positions (the generation's slice count)."""
        return sum(n for _, n in self.runs)

    def slices(self) -> Iterator[int]:
        """The roster slice at each position, in position order. O(positions)."""
        for first, n in self.runs:
            yield from range(first, first + n)

    def position_of(self, roster_slice: int) -> int | None:
        """The position of ``roster_slice`` (None: not in this generation). O(runs)."""
        base = 0
        for first, n in self.runs:
            if first <= roster_slice < first + n:
                return base + roster_slice - first
            base += n
        return None

    def rank_of(self, task_id: int, roster: Roster) -> int | None:
        """``task_id``'s process rank in this generation (None: not a member: a spare or a dropped slice)."""
        per = roster.per_slice
        position = self.position_of(task_id // per)
        return None if position is None else position * per + task_id % per

    def task_at(self, rank: int, roster: Roster) -> int:
        """The task id holding process rank ``rank``. O(runs)."""
        per = roster.per_slice
        position, local = divmod(rank, per)
        for first, n in self.runs:
            if position < n:
                return (first + position) * per + local
            position -= n
        raise InputError(f"plan: rank {rank} is beyond its {len(self) * per} ranks")

    def members(self, roster: Roster) -> list[int]:
        """Every member's task id in rank order. O(members)."""
        per = roster.per_slice
        return [s * per + i for s in self.slices() for i in range(per)]

    def describe(self) -> str:
        """E.g. ``roster slices 0, 3, 2`` (bounded: runs, not hosts)."""
        parts = [str(a) if n == 1 else f"{a}-{a + n - 1}" for a, n in self.runs]
        return "roster slices " + ", ".join(parts[:16]) + (f", ... ({len(parts)} runs)" if len(parts) > 16 else "")


@dataclass(frozen=True)
class SliceShape:
    """What a host's backend found about its own TPU slice; a spare must match the cluster's."""

    accelerator: str
    """e.g. ``v4-16``."""
    topology: str
    """e.g. ``2x2x2``."""
    hosts_per_slice: int

    def differences(self, cluster: SliceShape) -> list[str]:
        """What differs from the cluster's shape, one phrase each (empty: it matches)."""
        out = []
        for name, mine, theirs in (
            ("accelerator type", self.accelerator, cluster.accelerator),
            ("topology", self.topology, cluster.topology),
            ("hosts per slice", self.hosts_per_slice, cluster.hosts_per_slice),
        ):
            if mine != theirs:
                out.append(f"{name} {mine} (the cluster's slices: {theirs})")
        return out
