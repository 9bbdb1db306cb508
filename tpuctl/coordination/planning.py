"""A generation's plan as the service uses it (``Placement``), and the next generation's plan (``plan_next``).

``plan.py`` defines the vocabulary (roster, roster slices, positions, ranks). Here:

* ``Placement`` indexes one generation's plan: the roster slice at each position and the position of each
  roster slice, so a task id's rank and a rank's task are O(1); built in O(roster slices), once a
  generation. ``members`` is the generation's members in rank order as a sequence of ``TaskInfo``
  (what the rendezvous and the registration count run over), without a list of them.
* ``plan_next`` decides the plan of the generation after one that lost members (the rule is in
  ``docs`` and ``state.py``): each lost position takes the lowest-numbered ready standby roster slice;
  the remaining ones are dropped under policy elastic while at least ``min_slices`` stay, else kept (the
  cluster waits for their hosts); and the majority rule: unless the plan's members that were members
  before and did not fail are more than half of the generation's members, every lost position is kept.
  O(positions + ready slices).

Pure: no grpc, no asyncio, no clock.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

from tpuctl.coordination.plan import Plan, Roster
from tpuctl.coordination.values import SAMPLE, RestartPolicy, TaskInfo
from tpuctl.errors import InputError


class Placement:
    """One generation's plan, indexed both ways."""

    __slots__ = ("members", "per", "plan", "position", "roster", "slice_at")

    def __init__(self, plan: Plan, roster: Roster, tasks: Sequence[TaskInfo]) -> None:
        self.plan = plan
        self.roster = roster
        self.per = roster.per_slice
        self.slice_at = array("i", plan.slices())
        """The roster slice at each position."""
        self.position = array("i", [-1]) * roster.roster_slices
        """Each roster slice's position (-1: not in this generation)."""
        for p, s in enumerate(self.slice_at):
            if not 0 <= s < roster.roster_slices or self.position[s] >= 0:
                raise InputError(f"plan {plan.describe()}: roster slice {s} is not one of the roster's once")
            self.position[s] = p
        self.members = Members(self, tasks)

    def __len__(self) -> int:
        """Positions: the generation's slice count."""
        return len(self.slice_at)

    @property
    def member_count(self) -> int:
        return len(self.slice_at) * self.per

    def rank_of(self, task_id: int) -> int | None:
        """``task_id``'s rank (None: not a member). O(1)."""
        position = self.position[task_id // self.per]
        return None if position < 0 else position * self.per + task_id % self.per

    def task_at(self, rank: int) -> int:
        position, local = divmod(rank, self.per)
        return self.slice_at[position] * self.per + local

    def is_member_slice(self, roster_slice: int) -> bool:
        return self.position[roster_slice] >= 0


class Members(Sequence[TaskInfo]):
    """A generation's members in rank order, looked up through its placement (O(1) each, no list)."""

    __slots__ = ("_placement", "_tasks")

    def __init__(self, placement: Placement, tasks: Sequence[TaskInfo]) -> None:
        self._placement = placement
        self._tasks = tasks

    def __len__(self) -> int:
        return self._placement.member_count

    @overload
    def __getitem__(self, rank: int) -> TaskInfo: ...

    @overload
    def __getitem__(self, rank: slice) -> Sequence[TaskInfo]: ...

    def __getitem__(self, rank: int | slice) -> TaskInfo | Sequence[TaskInfo]:
        if isinstance(rank, slice):
            return [self[i] for i in range(*rank.indices(len(self)))]
        if not 0 <= rank < len(self):
            raise IndexError(rank)
        return self._tasks[self._placement.task_at(rank)]


def tasks_text(roster: Roster, roster_slice: int) -> str:
    """``task 4``, ``tasks 6, 7``, ``tasks 8-15``: a roster slice's hosts (bounded)."""
    hosts = roster.tasks_of(roster_slice)
    if len(hosts) == 1:
        return f"task {hosts[0]}"
    if len(hosts) == 2:
        return f"tasks {hosts[0]}, {hosts[1]}"
    return f"tasks {hosts[0]}-{hosts[-1]}"


def slice_text(roster: Roster, roster_slice: int) -> str:
    """``spare slice 3 (tasks 6, 7)`` or ``roster slice 1 (tasks 2, 3)``."""
    kind = "spare slice" if roster.is_spare(roster.tasks_of(roster_slice)[0]) else "roster slice"
    return f"{kind} {roster_slice} ({tasks_text(roster, roster_slice)})"


def _listed(parts: list[str]) -> str:
    shown = parts[:SAMPLE]
    more = len(parts) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


@dataclass(frozen=True)
class NextPlan:
    plan: Plan
    note: str
    """What changes, for the end message (empty: the same slices, as under rejoin)."""
    held: str = ""
    """The majority rule kept the lost positions (empty: it did not have to): why, for the restart
    timeout's verdict."""


def plan_next(
    placement: Placement,
    lost: dict[int, int],
    ready: Sequence[int],
    policy: RestartPolicy,
    *,
    generation: int,
    after: int = 0,
) -> NextPlan:
    """The plan of generation ``generation`` (the next one) after generation ``after`` (default: the one
    before), whose plan ``placement`` is: ``lost`` maps each position that lost members to how many;
    ``ready`` the ready standby roster slices, ascending. O(positions + ready)."""
    after = after or generation - 1
    roster, per = placement.roster, placement.per
    positions = len(placement)
    slices = list(placement.slice_at)
    lost_positions = sorted(lost)
    replaced: list[str] = []
    remaining: list[int] = []
    spare_iter = iter(ready)
    used = 0
    for p in lost_positions:
        spare = next(spare_iter, None)
        if spare is None:
            remaining.append(p)
            continue
        used += 1
        replaced.append(f"{slice_text(roster, spare)} in place of slice {p}")
        slices[p] = spare
    dropped: list[int] = []
    min_slices = policy.min_slices or roster.num_slices
    if remaining and policy.elastic and positions - len(remaining) >= min_slices:
        dropped, remaining = remaining, []
    survivors = (positions - len(lost_positions)) * per + sum(per - lost[p] for p in remaining)
    members = positions * per
    if 2 * survivors <= members:
        held = (
            f"only {survivors} of generation {after}'s {members} hosts survived, not a majority: a cluster "
            "forms only with a majority of the previous generation's hosts (a network partition leaves at most one "
            f"side able to), so generation {generation} waits for the lost hosts"
        )
        changed = bool(replaced or dropped)
        return NextPlan(placement.plan, held if changed else "", held if changed else "")
    dropped_set = set(dropped)
    kept = [s for p, s in enumerate(slices) if p not in dropped_set]
    grown: list[int] = []
    if policy.elastic:
        room = roster.num_slices - len(kept)
        grown = list(ready[used : used + max(0, room)])
        kept.extend(grown)
    plan = Plan.of(kept)
    parts = []
    if replaced:
        parts.append(f"forms with {_listed(replaced)}")
    if dropped:
        gone = [f"slice {p} dropped: {tasks_text(roster, placement.slice_at[p])}" for p in dropped]
        parts.append(f"shrinks to {len(kept)} slices ({_listed(gone)})")
    if grown:
        parts.append(f"grows to {len(kept)} slices ({_listed([slice_text(roster, s) for s in grown])} joining)")
    note = f"generation {generation} " + " and ".join(parts) if parts else ""
    return NextPlan(plan, note)


def plan_grown(placement: Placement, ready: Sequence[int], *, generation: int) -> NextPlan:
    """The plan of an elastic generation that grows: the current slices, then the ready standby roster
    slices in roster order, up to ``num_slices``. O(positions + ready)."""
    roster = placement.roster
    room = roster.num_slices - len(placement)
    grown = list(ready[:room])
    plan = Plan.of([*placement.slice_at, *grown])
    joining = _listed([f"{slice_text(roster, s)} is complete again" for s in grown])
    return NextPlan(plan, f"{joining}: generation {generation} grows to {len(plan)} slices")
