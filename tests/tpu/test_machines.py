"""Several tasks (TPU processes) per machine: the bounds arithmetic of the slice model, pure.

The recorded GKE LeaderWorkerSet pod on tpu7x-16 (two TPU containers per machine) splits each 2x2x1 machine
into two 1x2x1 processes. Seen from above, z = 0 is machine 0, z = 1 machine 1; each cell is a chip, the
number its task, the letter its number on the machine (``TPU_VISIBLE_CHIPS``)::

    z=0 (machine 0)     z=1 (machine 1)
    y\\x  0    1        y\\x  0    1
    0    0:0  1:1       0    2:0  3:1
    1    0:2  1:3       1    2:2  3:3

libtpu agrees on the tasks' devices (``tests/tpu/test_oracle.py``: ``get_topology_desc`` with the process
block as ``chips_per_host_bounds``): task 0 holds ids 0, 1, 4, 5.
"""

from __future__ import annotations

from itertools import product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuctl.errors import TopologyError
from tpuctl.tpu.slice import TpuSlice, group_tasks, machine_problem, resolve_slice, with_blocks

LWS = resolve_slice(accelerator="tpu7x-16", chips_per_process_bounds=(1, 2, 1))


def test_the_recorded_leaderworkerset_split() -> None:
    assert (LWS.num_hosts, LWS.chips_per_host, LWS.tasks_per_machine, LWS.num_machines) == (4, 2, 2, 2)
    assert LWS.host_bounds == (2, 1, 2)  # TPU_PROCESS_BOUNDS
    assert LWS.chips_per_host_bounds == (1, 2, 1)  # TPU_CHIPS_PER_PROCESS_BOUNDS
    assert LWS.machine_bounds == (1, 1, 2)  # TPU_HOST_BOUNDS
    assert LWS.machine_block == (2, 2, 1)  # TPU_CHIPS_PER_HOST_BOUNDS
    table = [
        (t, LWS.machine_of(t), LWS.rank_on_machine(t), LWS.visible_chips(t), [d.id for d in LWS.devices_of_task(t)])
        for t in range(4)
    ]
    assert table == [
        (0, 0, 0, (0, 2), [0, 1, 4, 5]),
        (1, 0, 1, (1, 3), [2, 3, 6, 7]),
        (2, 1, 0, (0, 2), [8, 9, 12, 13]),
        (3, 1, 1, (1, 3), [10, 11, 14, 15]),
    ]
    assert LWS.describe() == "tpu7x-16 (2x2x2, 4 hosts on 2 machines)"


def test_one_task_per_machine_is_one_spelling() -> None:
    plain = resolve_slice(accelerator="v4-32")
    assert resolve_slice(accelerator="v4-32", chips_per_process_bounds=(2, 2, 1)) == plain
    assert plain.chips_per_machine_bounds is None
    assert (plain.tasks_per_machine, plain.machine_bounds, plain.num_machines) == (1, (1, 1, 4), 4)
    assert [plain.visible_chips(t) for t in (0, 3)] == [(0, 1, 2, 3)] * 2
    assert [plain.rank_on_machine(t) for t in range(4)] == [0, 0, 0, 0]


def test_one_chip_per_process_counts_chips_as_torch_xla_does() -> None:
    """torch_xla's configure_topology gives local rank r of worker w chip r and task w * 4 + r."""
    per_chip = resolve_slice(accelerator="v4-16", chips_per_process_bounds=(1, 1, 1))
    for worker, rank in product(range(2), range(4)):
        task = worker * 4 + rank
        assert (per_chip.machine_of(task), per_chip.rank_on_machine(task)) == (worker, rank)
        assert per_chip.visible_chips(task) == (rank,)


def test_multislice_machines_count_across_slices() -> None:
    tpu = resolve_slice(accelerator="tpu7x-16", num_slices=2, chips_per_process_bounds=(1, 2, 1))
    assert (tpu.num_hosts, tpu.num_machines) == (8, 4)
    assert [tpu.machine_of(t) for t in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [tpu.rank_on_machine(t) for t in range(8)] == [0, 1] * 4


@pytest.mark.parametrize(
    ("topology", "task", "machine", "problem"),
    [
        ((2, 2, 2), (1, 2, 1), (2, 2, 1), None),
        ((2, 2, 2), (1, 1, 1), (2, 2, 1), None),
        ((4, 4, 1), (2, 2, 1), (4, 2, 1), None),
        ((2, 2, 2), (1, 1, 2), (2, 2, 1), "1,1,2 processes do not split a 2,2,1 machine (every axis a multiple)"),
        ((2, 2, 2), (1, 2, 1), (2, 2, 3), "2,2,3 machines do not tile the 2x2x2 chip grid"),
        # v5e-16 on 2x2 machines, one process per chip: a machine's chips are tasks 0, 1, 4, 5
        (
            (4, 4, 1),
            (1, 1, 1),
            (2, 2, 1),
            "a 2,2,1 machine of 1,1,1 processes would run processes that are not consecutive in the runtime's "
            "order (x fastest over the 4,4,1 process grid)",
        ),
        ((2, 2, 2), (0, 2, 1), (2, 2, 1), "blocks 0,2,1 and 2,2,1 must have every axis at least 1"),
    ],
)
def test_machine_problem(
    topology: tuple[int, int, int], task: tuple[int, int, int], machine: tuple[int, int, int], problem: str | None
) -> None:
    assert machine_problem(topology, task, machine) == problem


def test_with_blocks_refuses_what_machine_problem_finds() -> None:
    with pytest.raises(TopologyError, match="do not split a 2,2,1 machine"):
        with_blocks(resolve_slice(accelerator="tpu7x-16"), (2, 1, 2), (2, 2, 1))


@pytest.mark.parametrize(
    ("accelerator", "per_machine", "machine"),
    [
        ("v5litepod-16", 2, (4, 2, 1)),  # 2x2 tasks, two side by side along x
        ("v4-32", 2, (2, 2, 2)),  # 1,1,4 hosts: two along z
        ("v5litepod-16", 4, (4, 4, 1)),
        ("v4-32", 1, (2, 2, 1)),
    ],
)
def test_group_tasks(accelerator: str, per_machine: int, machine: tuple[int, int, int]) -> None:
    grouped = group_tasks(resolve_slice(accelerator=accelerator), per_machine)
    assert grouped.machine_block == machine
    assert grouped.tasks_per_machine == per_machine


def test_group_tasks_refuses_a_count_that_is_not_a_box() -> None:
    with pytest.raises(TopologyError, match="3 consecutive processes of the 2,2,1 process grid do not form a box"):
        group_tasks(resolve_slice(accelerator="v5litepod-16"), 3)


SPLITS = [
    (accelerator, block)
    for accelerator in ("v4-16", "v4-32", "v5litepod-8", "v5litepod-16", "v6e-64", "tpu7x-16", "tpu7x-128", "v5p-128")
    for block in product((1, 2), (1, 2, 4), (1,))
]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(SPLITS), st.integers(1, 2))
def test_a_valid_split_partitions_every_machine(split: tuple[str, tuple[int, int, int]], num_slices: int) -> None:
    """Every machine's tasks are consecutive, hold its chips once each, and number them 0..n-1 once each."""
    accelerator, block = split
    machines: TpuSlice = resolve_slice(accelerator=accelerator, num_slices=num_slices)
    if machine_problem(machines.topology, block, machines.machine_block) is not None:
        return
    tpu = with_blocks(machines, block, machines.machine_block)
    per_machine = tpu.tasks_per_machine
    chips_on_machine = tpu.machine_block[0] * tpu.machine_block[1] * tpu.machine_block[2]
    for machine in range(tpu.num_machines):
        tasks = range(machine * per_machine, (machine + 1) * per_machine)
        assert [tpu.machine_of(t) for t in tasks] == [machine] * per_machine
        assert [tpu.rank_on_machine(t) for t in tasks] == list(range(per_machine))
        numbers = sorted(c for t in tasks for c in tpu.visible_chips(t))
        assert numbers == list(range(chips_on_machine))
        coords = [d.coords for t in tasks for d in tpu.devices_of_task(t) if d.core == 0]
        assert len(set(coords)) == chips_on_machine
