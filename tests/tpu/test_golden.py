"""Golden device lists written out by hand from published listings, independent of libtpu.

Sources (see the topology reference, §1.1 and §1.2): the JAX multi_process doc's v5litepod-16 output,
libtpu listings recorded in the reference, and the real v5litepod-8 output in the jetstream-pytorch
README. Each expected list is in the runtime's order: task by task, then z, y, x, then core.
Rows are (id, task, (x, y, z), core); multislice rows add the slice.
"""

from __future__ import annotations

from tpuctl.tpu.slice import TpuSlice, resolve_slice


def rows(s: TpuSlice) -> list[tuple[int, int, tuple[int, int, int], int]]:
    return [(d.id, d.task, d.coords, d.core) for d in s.devices]


def test_v5litepod_16_as_in_the_jax_multi_process_doc() -> None:
    # v5litepod-16: 4x4 chips, four 2x2 hosts. Cell = device id.
    #
    #   y\x   0   1 |  2   3
    #    0    0   1 |  2   3      task 0 | task 1
    #    1    4   5 |  6   7
    #   ------------+--------
    #    2    8   9 | 10  11      task 2 | task 3
    #    3   12  13 | 14  15
    s = resolve_slice(accelerator="v5litepod-16")
    assert rows(s) == [
        (0, 0, (0, 0, 0), 0), (1, 0, (1, 0, 0), 0), (4, 0, (0, 1, 0), 0), (5, 0, (1, 1, 0), 0),
        (2, 1, (2, 0, 0), 0), (3, 1, (3, 0, 0), 0), (6, 1, (2, 1, 0), 0), (7, 1, (3, 1, 0), 0),
        (8, 2, (0, 2, 0), 0), (9, 2, (1, 2, 0), 0), (12, 2, (0, 3, 0), 0), (13, 2, (1, 3, 0), 0),
        (10, 3, (2, 2, 0), 0), (11, 3, (3, 2, 0), 0), (14, 3, (2, 3, 0), 0), (15, 3, (3, 3, 0), 0),
    ]  # fmt: skip
    assert [d.id for d in s.devices_of_task(0)] == [0, 1, 4, 5]
    assert [d.ordinal for d in s.devices_of_task(3)] == [0, 1, 2, 3]


def test_v4_2x2x2_megacore() -> None:
    # v4-16: 2x2x2 chips, one device per chip (megacore), one 2x2x1 host per z-plane.
    #
    #   z = 0: task 0      z = 1: task 1
    #   y\x  0  1          y\x  0  1
    #    0   0  1           0   4  5
    #    1   2  3           1   6  7
    s = resolve_slice(accelerator="v4-16")
    assert s.megacore
    assert rows(s) == [
        (0, 0, (0, 0, 0), 0), (1, 0, (1, 0, 0), 0), (2, 0, (0, 1, 0), 0), (3, 0, (1, 1, 0), 0),
        (4, 1, (0, 0, 1), 0), (5, 1, (1, 0, 1), 0), (6, 1, (0, 1, 1), 0), (7, 1, (1, 1, 1), 0),
    ]  # fmt: skip


def test_7x_2x2x1_cores_adjacent() -> None:
    # tpu7x-8: 2x2x1 chips, one host, two devices per chip with consecutive ids (core fastest).
    #
    #   y\x    0       1
    #    0   [0 1]   [2 3]
    #    1   [4 5]   [6 7]
    s = resolve_slice(accelerator="tpu7x-8")
    assert rows(s) == [
        (0, 0, (0, 0, 0), 0), (1, 0, (0, 0, 0), 1), (2, 0, (1, 0, 0), 0), (3, 0, (1, 0, 0), 1),
        (4, 0, (0, 1, 0), 0), (5, 0, (0, 1, 0), 1), (6, 0, (1, 1, 0), 0), (7, 0, (1, 1, 0), 1),
    ]  # fmt: skip


def test_v3_4x4_two_cores_per_chip() -> None:
    # v3-32: 4x4 chips, four 2x2 hosts, two devices per chip: id = core + 2 * (x + 4 * y).
    #
    #   y\x     0        1     |    2        3
    #    0   [ 0  1]  [ 2  3]  | [ 4  5]  [ 6  7]      task 0 | task 1
    #    1   [ 8  9]  [10 11]  | [12 13]  [14 15]
    #   -----------------------+-----------------
    #    2   [16 17]  [18 19]  | [20 21]  [22 23]      task 2 | task 3
    #    3   [24 25]  [26 27]  | [28 29]  [30 31]
    s = resolve_slice(accelerator="v3-32")
    assert rows(s) == [
        (0, 0, (0, 0, 0), 0), (1, 0, (0, 0, 0), 1), (2, 0, (1, 0, 0), 0), (3, 0, (1, 0, 0), 1),
        (8, 0, (0, 1, 0), 0), (9, 0, (0, 1, 0), 1), (10, 0, (1, 1, 0), 0), (11, 0, (1, 1, 0), 1),
        (4, 1, (2, 0, 0), 0), (5, 1, (2, 0, 0), 1), (6, 1, (3, 0, 0), 0), (7, 1, (3, 0, 0), 1),
        (12, 1, (2, 1, 0), 0), (13, 1, (2, 1, 0), 1), (14, 1, (3, 1, 0), 0), (15, 1, (3, 1, 0), 1),
        (16, 2, (0, 2, 0), 0), (17, 2, (0, 2, 0), 1), (18, 2, (1, 2, 0), 0), (19, 2, (1, 2, 0), 1),
        (24, 2, (0, 3, 0), 0), (25, 2, (0, 3, 0), 1), (26, 2, (1, 3, 0), 0), (27, 2, (1, 3, 0), 1),
        (20, 3, (2, 2, 0), 0), (21, 3, (2, 2, 0), 1), (22, 3, (3, 2, 0), 0), (23, 3, (3, 2, 0), 1),
        (28, 3, (2, 3, 0), 0), (29, 3, (2, 3, 0), 1), (30, 3, (3, 3, 0), 0), (31, 3, (3, 3, 0), 1),
    ]  # fmt: skip


def test_v5e_4x4_with_8_chip_hosts() -> None:
    # v5litepod-16 on two 8-chip VMs: 2x4x1 host blocks.
    #
    #   y\x   0   1 |  2   3
    #    0    0   1 |  2   3
    #    1    4   5 |  6   7      task 0 | task 1
    #    2    8   9 | 10  11
    #    3   12  13 | 14  15
    s = resolve_slice(accelerator="v5litepod-16", chips_per_host=8)
    assert s.chips_per_host_bounds == (2, 4, 1)
    assert s.host_bounds == (2, 1, 1)
    assert rows(s) == [
        (0, 0, (0, 0, 0), 0), (1, 0, (1, 0, 0), 0), (4, 0, (0, 1, 0), 0), (5, 0, (1, 1, 0), 0),
        (8, 0, (0, 2, 0), 0), (9, 0, (1, 2, 0), 0), (12, 0, (0, 3, 0), 0), (13, 0, (1, 3, 0), 0),
        (2, 1, (2, 0, 0), 0), (3, 1, (3, 0, 0), 0), (6, 1, (2, 1, 0), 0), (7, 1, (3, 1, 0), 0),
        (10, 1, (2, 2, 0), 0), (11, 1, (3, 2, 0), 0), (14, 1, (2, 3, 0), 0), (15, 1, (3, 3, 0), 0),
    ]  # fmt: skip


def test_v5e_2x4_two_slices() -> None:
    # Two v5litepod-8 slices on 4-chip VMs; multislice ids are 100000 * (slice + 1) + id in the slice.
    #
    #   slice 0                    slice 1
    #   y\x     0       1          y\x     0       1
    #    0   100000  100001         0   200000  200001     task 0 | task 2
    #    1   100002  100003         1   200002  200003
    #   ----------------           ----------------
    #    2   100004  100005         2   200004  200005     task 1 | task 3
    #    3   100006  100007         3   200006  200007
    s = resolve_slice(accelerator="v5litepod-8", chips_per_host=4, num_slices=2)
    assert [(d.id, d.task, d.slice, d.coords) for d in s.devices] == [
        (100000, 0, 0, (0, 0, 0)), (100001, 0, 0, (1, 0, 0)), (100002, 0, 0, (0, 1, 0)), (100003, 0, 0, (1, 1, 0)),
        (100004, 1, 0, (0, 2, 0)), (100005, 1, 0, (1, 2, 0)), (100006, 1, 0, (0, 3, 0)), (100007, 1, 0, (1, 3, 0)),
        (200000, 2, 1, (0, 0, 0)), (200001, 2, 1, (1, 0, 0)), (200002, 2, 1, (0, 1, 0)), (200003, 2, 1, (1, 1, 0)),
        (200004, 3, 1, (0, 2, 0)), (200005, 3, 1, (1, 2, 0)), (200006, 3, 1, (0, 3, 0)), (200007, 3, 1, (1, 3, 0)),
    ]  # fmt: skip


def test_v5litepod_8_as_listed_on_real_hardware() -> None:
    # v5litepod-8 is one 8-chip VM, 2 chips wide and 4 deep (jetstream-pytorch README, real output).
    #
    #   y\x  0  1
    #    0   0  1
    #    1   2  3      task 0
    #    2   4  5
    #    3   6  7
    s = resolve_slice(accelerator="v5litepod-8")
    assert s.topology == (2, 4, 1)
    assert s.num_hosts == 1
    assert [(d.id, d.coords[:2]) for d in s.devices] == [
        (0, (0, 0)), (1, (1, 0)), (2, (0, 1)), (3, (1, 1)), (4, (0, 2)), (5, (1, 2)), (6, (0, 3)), (7, (1, 3)),
    ]  # fmt: skip
    assert [d.ordinal for d in s.devices] == list(range(8))
