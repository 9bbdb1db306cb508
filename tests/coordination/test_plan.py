"""The roster and generation plans (tpuctl/coordination/plan.py): ranks, runs, members."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpuctl.coordination.plan import Plan, Roster, SliceShape
from tpuctl.errors import InputError


def test_the_identity_plan_gives_every_active_host_its_own_task_id_as_rank() -> None:
    roster = Roster(active=6, spares=2, hosts_per_slice=2)
    plan = roster.identity()
    assert plan.runs == ((0, 3),) and len(plan) == 3
    assert [plan.rank_of(t, roster) for t in range(8)] == [0, 1, 2, 3, 4, 5, None, None]
    assert plan.members(roster) == [0, 1, 2, 3, 4, 5]


def test_a_spare_slice_takes_the_lost_slices_position_and_the_others_keep_theirs() -> None:
    roster = Roster(active=6, spares=2, hosts_per_slice=2)
    plan = Plan.of([0, 3, 2])
    assert plan.runs == ((0, 1), (3, 1), (2, 1))
    assert plan.members(roster) == [0, 1, 6, 7, 4, 5]
    assert plan.rank_of(6, roster) == 2 and plan.rank_of(2, roster) is None
    assert plan.task_at(3, roster) == 7 and plan.describe() == "roster slices 0, 3, 2"


def test_a_dropped_slice_moves_the_later_ones_down() -> None:
    roster = Roster(active=6, hosts_per_slice=2)
    plan = Plan.of([0, 2])
    assert plan.members(roster) == [0, 1, 4, 5] and plan.rank_of(4, roster) == 2
    with pytest.raises(InputError, match="beyond its 4 ranks"):
        plan.task_at(4, roster)


def test_a_roster_must_be_whole_slices() -> None:
    with pytest.raises(InputError, match="not whole slices of 2 hosts"):
        Roster(active=6, spares=1, hosts_per_slice=2)
    assert Roster(active=4).num_slices == 1 and Roster(active=4).per_slice == 4


def test_a_spare_of_another_shape_is_told_what_differs() -> None:
    cluster = SliceShape("v4-16", "2x2x2", 2)
    assert SliceShape("v4-16", "2x2x2", 2).differences(cluster) == []
    assert SliceShape("v4-8", "2x2x1", 1).differences(cluster) == [
        "accelerator type v4-8 (the cluster's slices: v4-16)",
        "topology 2x2x1 (the cluster's slices: 2x2x2)",
        "hosts per slice 1 (the cluster's slices: 2)",
    ]


@given(st.lists(st.integers(0, 40), min_size=1, max_size=12, unique=True), st.integers(1, 4))
def test_ranks_and_task_ids_are_inverse_and_runs_are_fewest(slices: list[int], per: int) -> None:
    roster = Roster(active=per * 41, hosts_per_slice=per)
    plan = Plan.of(slices)
    assert list(plan.slices()) == slices
    members = plan.members(roster)
    assert [plan.rank_of(t, roster) for t in members] == list(range(len(members)))
    assert [plan.task_at(r, roster) for r in range(len(members))] == members
    breaks = sum(1 for a, b in itertools.pairwise(slices) if b != a + 1)
    assert len(plan.runs) == breaks + 1
