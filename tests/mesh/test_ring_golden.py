"""Ring mode on DTensor's own expected orders (tensorflow ``dtensor/python/tests/tpu_device_assignment_test.py``
and reference dtensor.md §6), then on the cases tpuctl fixes. Pure: no TensorFlow.

Pictures show chips as (x, y) with x across and y down; a number is a device's place in the ring.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tpuctl.errors import InputError
from tpuctl.mesh.build import build_mesh
from tpuctl.mesh.model import Mesh, MeshSpec
from tpuctl.mesh.quality import Location, Torus
from tpuctl.mesh.ring import (
    RingOptions,
    build_all_reduce_ring,
    build_orthogonal_rings,
    decode,
    enumerate_cores,
    locate_all,
    ring_order,
)
from tpuctl.mesh.strings import local_device_ids
from tpuctl.tpu.slice import resolve_slice


def ring(locs: Sequence[Location], rotate: bool = False) -> list[Location]:
    return [locs[i] for i in build_all_reduce_ring(locs, rotate)]


def xy(*pairs: tuple[int, int], cores: int = 1, z: int = 0) -> list[Location]:
    return [(x, y, z, c) for x, y in pairs for c in range(cores)]


# --- _build_all_reduce_ring ----------------------------------------------------------------------


def test_ring_of_4() -> None:
    # 0 -- 1
    # |    |
    # 3 -- 2
    assert ring(xy((0, 0), (0, 1), (1, 0), (1, 1))) == xy((0, 0), (1, 0), (1, 1), (0, 1))


def test_ring_of_8_on_two_cores() -> None:
    # 0/1 -- 2/3
    #  |      |
    # 6/7 -- 4/5
    got = ring(xy((0, 0), (0, 1), (1, 0), (1, 1), cores=2))
    assert got == xy((0, 0), (1, 0), (1, 1), (0, 1), cores=2)


def test_ring_of_32() -> None:
    # 0 -- 1 -- 2 -- 3
    # |              |
    # 15   6 -- 5 -- 4
    # |    |
    # 14   7 -- 8 -- 9
    # |              |
    # 13-- 12-- 11-- 10          (each number: both cores of the chip)
    chips = [(x, y) for x in range(4) for y in range(4)]
    expected = [(0, 0), (1, 0), (2, 0), (3, 0), (3, 1), (2, 1), (1, 1), (1, 2), (2, 2), (3, 2), (3, 3), (2, 3), (1, 3), (0, 3), (0, 2), (0, 1)]  # fmt: skip
    assert ring(xy(*chips, cores=2)) == xy(*expected, cores=2)


def test_ring_3d() -> None:
    # z=0: 7 -- 0     z=1: 6 -- 5
    #           |               |
    #      2 -- 1          3 -- 4      (cores in order on z=0, reversed on z=1)
    locs = [(x, y, z, c) for z in range(2) for x in range(2) for y in range(2) for c in range(2)]
    expected = [
        (1, 0, 0, 0), (1, 0, 0, 1), (1, 1, 0, 0), (1, 1, 0, 1), (0, 1, 0, 0), (0, 1, 0, 1),
        (0, 1, 1, 1), (0, 1, 1, 0), (1, 1, 1, 1), (1, 1, 1, 0), (1, 0, 1, 1), (1, 0, 1, 0),
        (0, 0, 1, 0), (0, 0, 1, 1), (0, 0, 0, 0), (0, 0, 0, 1),
    ]  # fmt: skip
    assert ring(locs) == expected


def test_ring_3d_large() -> None:
    # z=0: 31-- 0 -- 1 -- 2       z=1: 30--29--28--27
    #                     |                        |
    #      14   5 -- 4 -- 3            15  24--25--26
    #      |    |                      |   |
    #      13   6 -- 7 -- 8            16  23--22--21
    #      |              |            |           |
    #      12-- 11-- 10-- 9            17--18--19--20
    locs = [(x, y, z, c) for z in range(2) for y in range(4) for x in range(4) for c in range(2)]
    plane0 = [(1, 0), (2, 0), (3, 0), (3, 1), (2, 1), (1, 1), (1, 2), (2, 2), (3, 2), (3, 3), (2, 3), (1, 3), (0, 3), (0, 2), (0, 1)]  # fmt: skip
    plane1 = [(0, 1), (0, 2), (0, 3), (1, 3), (2, 3), (3, 3), (3, 2), (2, 2), (1, 2), (1, 1), (2, 1), (3, 1), (3, 0), (2, 0), (1, 0)]  # fmt: skip
    expected = [(x, y, 0, c) for x, y in plane0 for c in (0, 1)]
    expected += [(x, y, 1, c) for x, y in plane1 for c in (1, 0)]
    expected += [(0, 0, 1, 0), (0, 0, 1, 1), (0, 0, 0, 0), (0, 0, 0, 1)]
    assert ring(locs) == expected


# --- _build_orthogonal_rings ---------------------------------------------------------------------

BOUNDS_4X4X1X2 = (4, 4, 1, 2)
ORTHOGONAL_INPUT = [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 0), (2, 1), (3, 0), (3, 1), (2, 2), (2, 3), (3, 2), (3, 3)]  # fmt: skip


def _orthogonal(rotate: bool) -> list[Location]:
    ids = [x * 2 + c + 8 * y for x, y in ORTHOGONAL_INPUT for c in range(2)]  # id = core + 2 * (x + 4 * y)
    out = build_orthogonal_rings(
        ids,
        8,
        BOUNDS_4X4X1X2,
        lambda locs, _: build_all_reduce_ring(locs),
        lambda locs, _: build_all_reduce_ring(locs, rotate),
        False,
    )
    return locate_all(out, BOUNDS_4X4X1X2)


def test_orthogonal_rings() -> None:
    # 0 -- 1    4 -- 5
    # |    |    |    |
    # 3 -- 2    7 -- 6
    #
    # 12-- 13   8 -- 9
    # |    |    |    |
    # 15-- 14   11-- 10      (rings of 2x2 chips; the 2x2 blocks themselves in ring order)
    order = [(0, 0), (1, 0), (1, 1), (0, 1), (2, 0), (3, 0), (3, 1), (2, 1), (2, 2), (3, 2), (3, 3), (2, 3), (0, 2), (1, 2), (1, 3), (0, 3)]  # fmt: skip
    assert _orthogonal(False) == xy(*order, cores=2)


def test_orthogonal_rings_rotated() -> None:
    # 0 -- 1    12-- 13
    # |    |    |    |
    # 3 -- 2    15-- 14
    #
    # 4 -- 5    8 -- 9
    # |    |    |    |
    # 7 -- 6    11-- 10
    order = [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2), (1, 3), (0, 3), (2, 2), (3, 2), (3, 3), (2, 3), (2, 0), (3, 0), (3, 1), (2, 1)]  # fmt: skip
    assert _orthogonal(True) == xy(*order, cores=2)


# --- _enumerate_core_locations -------------------------------------------------------------------


def enumerate_locs(bounds: Location, ring_bounds: Location, axes: Sequence[str], hosts: Location) -> list[Location]:
    return locate_all(enumerate_cores(bounds, ring_bounds, axes, hosts), bounds)


def test_enumeration_docstring_example() -> None:
    got = enumerate_locs((2, 2, 1, 2), (2, 2, 1, 2), ["core", "z", "y", "x"], (1, 1, 1, 1))
    assert got == [(0, 0, 0, 0), (0, 0, 0, 1), (0, 1, 0, 0), (0, 1, 0, 1), (1, 0, 0, 0), (1, 0, 0, 1), (1, 1, 0, 0), (1, 1, 0, 1)]  # fmt: skip


def test_enumeration_keeping_2x2_hosts_whole() -> None:
    # 4x4 chips, 2 cores, axes core, y, z, x: whole 2x2 hosts, y within them first
    got = enumerate_locs((4, 4, 1, 2), (4, 4, 1, 2), ["core", "y", "z", "x"], (2, 2, 1, 2))
    hosts = [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 0), (2, 1), (3, 0), (3, 1), (2, 2), (2, 3), (3, 2), (3, 3)]  # fmt: skip
    assert got == xy(*hosts, cores=2)


def test_enumeration_with_ring_bounds_keeping_hosts_whole() -> None:
    got = enumerate_locs((4, 4, 1, 2), (2, 2, 1, 2), ["core", "x", "y", "z"], (2, 2, 1, 2))
    tiles = [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1), (0, 2), (1, 2), (0, 3), (1, 3), (2, 2), (3, 2), (2, 3), (3, 3)]  # fmt: skip
    assert got == xy(*tiles, cores=2)


def test_enumeration_splitting_hosts() -> None:
    got = enumerate_locs((4, 4, 1, 2), (4, 4, 1, 2), ["core", "y", "z", "x"], (1, 1, 1, 1))
    assert got == xy(*[(x, y) for x in range(4) for y in range(4)], cores=2)
    cube = enumerate_locs((4, 4, 4, 2), (4, 4, 4, 2), ["core", "x", "y", "z"], (1, 1, 1, 1))
    assert cube == [(x, y, z, c) for z in range(4) for y in range(4) for x in range(4) for c in range(2)]


# --- create_tpu_mesh on synthetic pods (dtensor.md §6.6) -----------------------------------------

DTENSOR = (("compat", "dtensor"),)


def mesh_of(accelerator: str, shape: dict[str, int], options: tuple[tuple[str, object], ...] = DTENSOR) -> Mesh:
    return build_mesh(MeshSpec("m", tuple(shape.items()), "ring", options), resolve_slice(accelerator=accelerator))


def coords(mesh: Mesh, accelerator: str) -> list[tuple[int, ...]]:
    torus = Torus.of(resolve_slice(accelerator=accelerator))
    return [torus.locate(d)[1][: 3 if torus.cores == 1 else 4] for d in mesh.device_ids]


def local(mesh: Mesh, accelerator: str, task: int) -> list[int]:
    tpu = resolve_slice(accelerator=accelerator)
    return local_device_ids(mesh, [d.id for d in tpu.devices_of_task(task)])


def test_v4_32_rings_per_plane() -> None:
    # [4, 4] (ring_dims -1, rings of 4): each ring is one z-plane, walked (0,0) (1,0) (1,1) (0,1)
    mesh = mesh_of("v4-32", {"data": 4, "model": 4})
    assert coords(mesh, "v4-32")[:4] == [(0, 0, 0), (1, 0, 0), (1, 1, 0), (0, 1, 0)]
    assert local(mesh, "v4-32", 0) == [0, 1, 3, 2] and local(mesh, "v4-32", 1) == [4, 5, 7, 6]
    assert mesh.axis_quality("model").ring and not mesh.axis_quality("data").ring


def test_v4_32_one_full_ring() -> None:
    # [1, 16]: a 3D snake (1,0,0) (1,1,0) (0,1,0) (0,1,1) ... (0,0,1) (0,0,0), closed
    mesh = mesh_of("v4-32", {"one": 1, "all": 16})
    got = coords(mesh, "v4-32")
    assert got[:4] == [(1, 0, 0), (1, 1, 0), (0, 1, 0), (0, 1, 1)] and got[-2:] == [(0, 0, 1), (0, 0, 0)]
    assert local(mesh, "v4-32", 0) == [15, 0, 2, 1]
    assert mesh.axis_quality("all").ring


def test_v4_32_one_axis_keeps_the_enumeration() -> None:
    mesh = mesh_of("v4-32", {"x": 16})  # ring_dims 0: single-device rings
    assert coords(mesh, "v4-32")[:4] == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)]
    full = mesh_of("v4-32", {"x": 16}, (*DTENSOR, ("ring_dims", 1)))
    assert full.axis_quality("x").ring


def test_v4_32_orthogonal_rings_reverse_the_planes() -> None:
    for rotate in (False, True):
        options = (*DTENSOR, ("build_ring_across_rings", True), ("rotate_ring_across_rings", rotate))
        got = coords(mesh_of("v4-32", {"data": 4, "model": 4}, options), "v4-32")
        assert [c[2] for c in got[::4]] == [3, 2, 1, 0]


def test_v4_32_whole_hosts() -> None:
    options = (*DTENSOR, ("can_split_host_across_rings", False))
    mesh = mesh_of("v4-32", {"data": 2, "model": 8}, options)
    tpu = resolve_slice(accelerator="v4-32")
    task = {d.id: d.task for d in tpu.devices}
    assert [sorted({task[i] for i in mesh.device_ids[r : r + 8]}) for r in (0, 8)] == [[0, 1], [2, 3]]
    with pytest.raises(InputError, match="rings of 2 devices are too small to keep hosts of 4 devices whole"):
        mesh_of("v4-32", {"data": 8, "model": 2}, options)


def test_v3_32() -> None:
    # [8, 4]: rings of 2 chips x 2 cores along x
    mesh = mesh_of("v3-32", {"data": 8, "model": 4})
    assert coords(mesh, "v3-32")[:4] == [(0, 0, 0, 0), (0, 0, 0, 1), (1, 0, 0, 0), (1, 0, 0, 1)]
    assert local(mesh, "v3-32", 0) == [0, 1, 2, 3, 8, 9, 10, 11]
    # [1, 32]: the 2D snake with the first column as the return path
    assert local(mesh_of("v3-32", {"one": 1, "all": 32}), "v3-32", 0) == [0, 1, 2, 3, 30, 31, 12, 13]


# --- what tpuctl fixes ---------------------------------------------------------------------------


def test_a_4x3_plane_snakes_along_y() -> None:
    # DTensor (x first)          tpuctl (y first: every step one hop)
    #  0  1  2  3                 0 11 10  9
    # 11  6  5  4                 1  4  5  8
    # 10  7  8  9                 2  3  6  7
    # (9 -> 10 is 3 hops)
    torus = Torus((4, 3, 1), (False, False, False), 1)
    dtensor = ring_order((12,), torus, (1, 1, 1), RingOptions(ring_dims=1, compat="dtensor"))
    fixed = ring_order((12,), torus, (1, 1, 1), RingOptions(ring_dims=1))
    assert [decode(i, torus.bounds)[:2] for i in dtensor] == [(0, 0), (1, 0), (2, 0), (3, 0), (3, 1), (2, 1), (1, 1), (1, 2), (2, 2), (3, 2), (0, 2), (0, 1)]  # fmt: skip
    assert [decode(i, torus.bounds)[:2] for i in fixed] == [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (2, 1), (2, 2), (3, 2), (3, 1), (3, 0), (2, 0), (1, 0)]  # fmt: skip
    # 3x4 is already a ring along x: both agree
    torus = Torus((3, 4, 1), (False, False, False), 1)
    assert ring_order((12,), torus, (1, 1, 1), RingOptions(ring_dims=1)) == ring_order(
        (12,), torus, (1, 1, 1), RingOptions(ring_dims=1, compat="dtensor")
    )


def test_a_column_is_walked_in_order() -> None:
    # v3-32, ring_axes z, y, x, core: rings are y columns. DTensor: (0,0) (0,3) (0,2) (0,1), a 3-hop step;
    # tpuctl: (0,0) (0,1) (0,2) (0,3): every step one hop, the column is open (y has no wraparound).
    options: tuple[tuple[str, object], ...] = (("ring_axes", ("z", "y", "x", "core")),)
    dtensor = mesh_of("v3-32", {"data": 8, "model": 4}, options + DTENSOR)
    fixed = mesh_of("v3-32", {"data": 8, "model": 4}, options)
    assert [c[1] for c in coords(dtensor, "v3-32")[:4]] == [0, 3, 2, 1]
    assert [c[1] for c in coords(fixed, "v3-32")[:4]] == [0, 1, 2, 3]
    assert dtensor.axis_quality("model").max_hop == 3 and not dtensor.axis_quality("model").neighbours
    quality = fixed.axis_quality("model")
    assert quality.neighbours and not quality.ring and quality.closing_hop == 3
    assert quality.reason.endswith("y has no wraparound links on this slice")


def test_rings_keep_8_chip_hosts_whole() -> None:
    # v5litepod-32 with 2x4-chip hosts, rings of 8, hosts kept whole. DTensor assumes 2x2 hosts, so each
    # of its rings takes half of two hosts; tpuctl's ring is one host, and a ring.
    options = (("can_split_host_across_rings", False),)
    tpu = resolve_slice(accelerator="v5litepod-32", chips_per_host=8)
    task = {d.id: d.task for d in tpu.devices}
    dtensor = build_mesh(MeshSpec("m", (("data", 4), ("model", 8)), "ring", options + DTENSOR), tpu)
    fixed = build_mesh(MeshSpec("m", (("data", 4), ("model", 8)), "ring", options), tpu)
    assert [task[i] for i in dtensor.device_ids[:8]] == [0, 0, 1, 1, 1, 1, 0, 0]
    assert [[task[i] for i in fixed.device_ids[r : r + 8]] for r in range(0, 32, 8)] == [[t] * 8 for t in range(4)]
    assert fixed.axis_quality("model").ring


def test_ring_bounds_are_checked_element_wise() -> None:
    # DTensor compares lists: [1, 16, 1, 1] <= [2, 2, 4, 1] passes and later fails as "Invalid mesh size"
    for options in ((("ring_bounds", (1, 16, 1, 1)),), (("ring_bounds", (1, 16, 1, 1)), *DTENSOR)):
        with pytest.raises(
            InputError,
            match=r"ring_bounds \[1, 16, 1, 1\] do not divide the slice's bounds \[2, 2, 4, 1\] \(x, y, z, core\): y=16",
        ):
            mesh_of("v4-32", {"data": 4, "model": 4}, options)
    with pytest.raises(InputError, match="y=3"):
        mesh_of("v5litepod-16", {"data": 4, "model": 4}, (("ring_bounds", (4, 3, 1, 1)),))


def test_lines_close_through_wraparound() -> None:
    # v4-128 (4x4x4, wraparound on every axis): a ring of 4 along x closes from x=3 back to x=0 in one hop
    mesh = mesh_of("v4-128", {"data": 16, "model": 4}, ())
    q = mesh.axis_quality("model")
    assert q.ring and q.wraparound and q.reason == "ring (closes through wraparound links)"
    # v4-64 (2x4x4, none): the same shape's data axis cannot close
    assert not mesh_of("v4-64", {"data": 8, "model": 4}, ()).axis_quality("data").ring


def test_names_are_the_spec_names() -> None:
    a, b = mesh_of("v4-32", {"data": 4, "model": 4}), mesh_of("v4-32", {"data": 4, "model": 4})
    assert a == b and a.name == "m"


def test_ring_options_errors() -> None:
    with pytest.raises(InputError, match=r"ring_dims 3 is out of range for a 2-axis mesh; expected -2..2"):
        mesh_of("v4-32", {"data": 4, "model": 4}, (("ring_dims", 3),))
    with pytest.raises(InputError, match=r"ring_axes \['x', 'y', 'z'\] is not an ordering of core, x, y, z"):
        mesh_of("v4-32", {"data": 4, "model": 4}, (("ring_axes", ("x", "y", "z")),))
    with pytest.raises(InputError, match=r"option compat is 'dtensr'; did you mean 'dtensor'\?"):
        mesh_of("v4-32", {"data": 4, "model": 4}, (("compat", "dtensr"),))
    with pytest.raises(
        InputError, match=r"option ring_bounds \[1, 2, 4\] has 3 entries; expected 4: ring extent along x, y, z, core"
    ):
        mesh_of("v4-32", {"data": 4, "model": 4}, (("ring_bounds", (1, 2, 4)),))


def test_multislice_ring_puts_slices_along_the_first_axis() -> None:
    tpu = resolve_slice(accelerator="v4-32", num_slices=2)
    mesh = build_mesh(MeshSpec("m", (("data", 8), ("model", 4))), tpu)
    assert mesh.dcn_shape == (2, 1)
    single = mesh_of("v4-32", {"data": 4, "model": 4}, ())
    assert mesh.device_ids[:16] == tuple(100000 + i for i in single.device_ids)
    assert mesh.device_ids[16:] == tuple(200000 + i for i in single.device_ids)
    q = mesh.axis_quality("data")
    assert q.dcn_steps == 8 and not q.ring and "over DCN" in q.reason
    assert mesh.axis_quality("model").ring
    across = build_mesh(MeshSpec("m", (("data", 4), ("model", 8)), "ring", (("dcn_shape", (1, 2)),)), tpu)
    assert across.device_ids[4:8] == tuple(200000 + i for i in single.device_ids[:4])
