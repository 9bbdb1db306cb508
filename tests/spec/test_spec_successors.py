"""The coordinator's standby list: the default, the succession order, and the spec's checks (FILE:LINE:COL)."""

from __future__ import annotations

import pytest

from tpuctl.spec.successors import default_successors, succession_order
from tpuctl.spec.yamlfile import check_spec_text, load_spec_text

BASE = """\
cluster: pod-a
accelerator: {accelerator}
num_slices: {slices}
backend: sim
hosts: [{hosts}]
"""


def spec_text(extra: str, *, accelerator: str = "v4-16", slices: int = 2, hosts: int = 4) -> str:
    names = ", ".join(f"127.0.0.{i + 1}" for i in range(hosts))
    return BASE.format(accelerator=accelerator, slices=slices, hosts=names) + extra


# The first host of each slice, then the second of each, ... (up to 3).
@pytest.mark.parametrize(
    ("num_hosts", "per_slice", "expected"),
    [
        (4, 2, (0, 2, 1)),  # 2 slices of 2 hosts
        (4, 4, (0, 1, 2)),  # one slice
        (4, 1, (0, 1, 2)),  # 4 single-host slices
        (32, 4, (0, 4, 8)),  # 8 slices of 4
        (1, 1, (0,)),
        (2, 2, (0, 1)),
        (6, 2, (0, 2, 4)),
    ],
)
def test_the_default_standby_list_spreads_over_the_slices(
    num_hosts: int, per_slice: int, expected: tuple[int, ...]
) -> None:
    assert default_successors(num_hosts, per_slice) == expected


@pytest.mark.parametrize(
    ("successors", "lost", "expected"),
    [
        ((0, 2, 1), 0, (2, 1, 0)),
        ((0, 2, 1), 2, (1, 0, 2)),
        ((0, 2, 1), 1, (0, 2, 1)),
        ((0,), 0, (0,)),  # only task 0: wait for it to come back, as without successors
        ((2, 4), 0, (2, 4, 0)),  # a lost coordinator not on the list: every successor first
        ((4, 2), 2, (4, 2)),
    ],
)
def test_every_survivor_computes_the_same_order(
    successors: tuple[int, ...], lost: int, expected: tuple[int, ...]
) -> None:
    assert succession_order(successors, lost) == expected


def test_the_spec_resolves_the_default_under_rejoin_and_none_under_fail() -> None:
    assert load_spec_text(spec_text("restart: {policy: rejoin}\n")).successors == (0, 2, 1)
    assert load_spec_text(spec_text("")).successors == ()
    given = load_spec_text(spec_text("restart: {policy: rejoin}\ncoordinator: {successors: [3, 1]}\n"))
    assert given.successors == (3, 1)
    assert given.coordinator_target_at(3) == "127.0.0.4:8490"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("restart: {policy: rejoin}\ncoordinator: {successors: [0, 7]}\n",
         "<spec>:7:31: coordinator.successors[1]: task 7 is not a host of this cluster; expected a task id from 0 to 3"),
        ("restart: {policy: rejoin}\ncoordinator: {successors: [2, 1, 2]}\n",
         "<spec>:7:34: coordinator.successors[2]: task 2 repeats coordinator.successors[0]; expected each task once"),
        ("coordinator: {successors: [0, 2]}\n",
         "<spec>:6:27: coordinator.successors: a successor takes over when the coordinator's host is lost, which needs"),
        ("restart: {policy: rejoin}\ncoordinator: {successors: []}\n",
         "<spec>:7:27: coordinator.successors: is empty; expected a list of task ids"),
        ("restart: {policy: rejoin}\ncoordinator: {successors: [a]}\n",
         "<spec>:7:28: coordinator.successors[0]: got string 'a'; expected an integer >= 0"),
        ("restart: {policy: rejoin}\ncoordinator: {successors: 2}\n",
         "<spec>:7:27: coordinator.successors: got integer 2; expected a list of task ids"),
    ],
)  # fmt: skip
def test_a_bad_standby_list_is_a_spec_problem_at_its_place(extra: str, expected: str) -> None:
    check = check_spec_text(spec_text(extra))
    assert not check.ok
    lines = check.formatted()
    assert any(line.startswith(expected) for line in lines), lines
