"""JAX mode on JAX's own test expectations (jax-ml/jax ``tests/mesh_utils_test.py``, reference
tpu-topology.md §3.9-3.10), on mock device lists built the way JAX's test (and libtpu) lists them:
hosts of ``min(x, 2) x min(y, 2) x 1`` chips, ids x-minor with the core fastest, list order slice, host
z, y, x, then z, y, x, core within the host. No jax needed.
"""

from __future__ import annotations

import itertools
import math

import pytest

from tpuctl.errors import InputError
from tpuctl.mesh import jaxmode
from tpuctl.mesh.model import nest, strides
from tpuctl.tpu.slice import Device

V2, V3, V4, V5E, V5P, X7, X7B = "TPU v2", "TPU v3", "TPU v4", "TPU v5 lite", "TPU v5p", "TPU7x", "TPU7"


def mock(x: int, y: int, z: int, one_per_chip: bool = True, slices: int = 1, reverse: bool = False) -> list[Device]:
    cpc = 1 if one_per_chip else 2
    nxd, nyd, nzd = min(x, 2), min(y, 2), 1
    nxp, nyp, nzp = x // nxd, y // nyd, z // nzd
    out = []
    for s, zp, yp, xp in itertools.product(range(slices), range(nzp), range(nyp), range(nxp)):
        process = xp + nxp * (yp + nyp * (zp + nzp * s))
        local = itertools.product(range(nzd), range(nyd), range(nxd), range(cpc))
        for ordinal, (zd, yd, xd, core) in enumerate(local):
            coords = (xd + nxd * xp, yd + nyd * yp, zd + nzd * zp)
            device = core + cpc * (xd + nxd * (xp + nxp * (yd + nyd * (yp + nyp * (zd + nzd * (zp + nzp * s))))))
            out.append(Device(device, process, s, coords, core, ordinal))
    return out[::-1] if reverse else out


def mesh_ids(shape: tuple[int, ...], devices: list[Device], kind: str, **kw: bool) -> object:
    return nest(jaxmode.create_device_mesh(shape, devices, kind, **kw), shape)


# --- the physical box ----------------------------------------------------------------------------


@pytest.mark.parametrize("xyz", [(1, 2, 1), (4, 4, 4), (8, 8, 16)])
@pytest.mark.parametrize("reverse", [False, True])
def test_physical_mesh_is_indexed_by_coords(xyz: tuple[int, int, int], reverse: bool) -> None:
    devices = mock(*xyz, reverse=reverse)
    flat, shape = jaxmode.physical_mesh(devices, V4)
    assert shape == xyz
    coords = {d.id: d.coords for d in devices}
    for i, j, k in itertools.product(*(range(n) for n in xyz)):
        assert coords[flat[(i * xyz[1] + j) * xyz[2] + k]] == (i, j, k)


def test_physical_mesh_of_sub_slices() -> None:
    assert jaxmode.physical_mesh(mock(1, 1, 1, one_per_chip=False)[:2], V2)[1] == (1, 1, 2)
    for d in mock(1, 2, 1):
        assert jaxmode.physical_mesh([d], V4) == ([d.id], (1, 1, 1))
    v5e = mock(4, 4, 1)
    for y0 in (0, 2):  # the halves of a v5e 4x4 at y = 0 and y = 2
        half = [d for d in v5e if y0 <= d.coords[1] < y0 + 2]
        assert jaxmode.physical_mesh(half, V5E)[1] == (4, 2, 1)


def test_physical_mesh_refuses_holes() -> None:
    devices = mock(2, 2, 2)
    with pytest.raises(InputError, match="do not fill"):
        jaxmode.physical_mesh(devices[:7], V4)
    with pytest.raises(InputError, match="not a contiguous box"):
        jaxmode.physical_mesh([*devices[:7], devices[0]], V4)
    with pytest.raises(InputError, match="one device per chip"):
        jaxmode.physical_mesh(mock(2, 2, 1, one_per_chip=False), V4)


# --- whole-axis assignment and splitting ---------------------------------------------------------

WHOLE = [
    ((2, 2, 1), (1, 1, 4), [(), (), (0, 1, 2)]),
    ((2, 2, 4), (1, 4, 4), [(), (2,), (0, 1)]),
    ((4, 4, 4), (1, 16, 4), [(), (1, 2), (0,)]),
    ((4, 4, 8), (1, 16, 8), [(), (0, 1), (2,)]),
    ((4, 4, 8), (1, 8, 16), [(), (2,), (0, 1)]),
    ((4, 4, 8), (16, 8, 1), [(0, 1), (2,), ()]),
    ((4, 8, 8), (1, 32, 8), [(), (0, 2), (1,)]),
    ((8, 8, 8), (1, 64, 8), [(), (1, 2), (0,)]),
    ((8, 8, 16), (1, 64, 16), [(), (0, 1), (2,)]),
    ((8, 8, 1), (8, 8), [(1,), (0, 2)]),  # JAX's "8x8" case: v3 8x8 with one device per chip
]


@pytest.mark.parametrize(("physical", "shape", "expected"), WHOLE)
def test_whole_axis_assignment(
    physical: tuple[int, ...], shape: tuple[int, ...], expected: list[tuple[int, ...]]
) -> None:
    assert jaxmode.assign_whole_axes(physical, shape) == expected
    flat = list(range(math.prod(physical)))
    whole = jaxmode.nd_torus(flat, physical, shape, False)
    assert jaxmode.split_physical_axes(flat, physical, shape) == whole  # the split algorithm agrees


SPLIT = [
    ((4, 4, 4), (2, 1, 32), [[1, 1, 4], [1, 1, 4], [2, 1, 2]]),
    ((4, 4, 4), (8, 8, 1), [[1, 4, 1], [2, 2, 1], [4, 1, 1]]),
    ((4, 4, 8), (2, 2, 8, 4), [[1, 1, 1, 4], [2, 2, 1, 1], [1, 1, 8, 1]]),
    ((4, 4, 8), (2, 4, 1, 16), [[1, 1, 1, 4], [1, 1, 1, 4], [2, 4, 1, 1]]),
    ((4, 8, 8), (1, 128, 2), [[1, 2, 2], [1, 8, 1], [1, 8, 1]]),
    ((8, 8, 1), (2, 1, 32, 1), [[1, 1, 8, 1], [2, 1, 4, 1], [1, 1, 1, 1]]),  # v3 8x8, one device per chip
    ((16, 16, 24), (96, 64), [[1, 16], [4, 4], [24, 1]]),  # v5p 16x16x24 (tpu-topology.md §3.10)
]


@pytest.mark.parametrize(("physical", "shape", "expected"), SPLIT)
def test_split_assignment(physical: tuple[int, ...], shape: tuple[int, ...], expected: list[list[int]]) -> None:
    flat = list(range(math.prod(physical)))
    ids, matrix = jaxmode.nd_torus(flat, physical, shape, True)
    assert matrix == expected
    assert sorted(ids) == flat


def test_split_places_the_more_intensive_axis_minor() -> None:
    """v5p 16x16x24 as (96, 64): 64 = x (16) x low y (4), 96 = high y (4) x z (24); within each logical
    axis the physical pieces keep x, y, z order, so mesh[0][1] is the chip at (0, 1, 0)."""
    devices = mock(16, 16, 24)
    grid = mesh_ids((96, 64), devices, V4, allow_split_physical_axes=True)
    coords = {d.id: d.coords for d in devices}
    assert isinstance(grid, list)
    assert [coords[grid[0][1]], coords[grid[0][4]], coords[grid[1][0]], coords[grid[24][0]]] == [
        (0, 1, 0), (1, 0, 0), (0, 0, 1), (0, 4, 0),
    ]  # fmt: skip


def test_feasible_assignments() -> None:
    def feasible(physical: tuple[int, ...], used: list[int], size: int) -> set[tuple[int, ...]]:
        return set(jaxmode.feasible_assignments(physical, [[u] for u in used], size))

    assert feasible((2, 2, 1), [1, 2, 1], 4) == set()
    assert feasible((12, 4, 4), [2, 2, 1], 6) == {(6, 1, 1), (3, 2, 1), (3, 1, 2)}
    assert feasible((4, 4, 8), [2, 2, 2], 4) == {(2, 2, 1), (2, 1, 2), (1, 2, 2), (1, 1, 4)}


def test_preferences() -> None:
    def prefer(x: tuple[int, ...], y: tuple[int, ...], physical: tuple[int, ...], used: list[int]) -> bool:
        matrix = [[u] for u in used]
        return jaxmode.preference(x, physical, matrix) > jaxmode.preference(y, physical, matrix)

    assert prefer((1, 2, 1), (1, 1, 2), (2, 2, 4), [1, 1, 1])
    assert prefer((4, 4, 1), (1, 1, 16), (4, 4, 16), [1, 1, 1])
    assert prefer((2, 1), (1, 2), (2, 4), [1, 2])
    # JAX's comment says a new axis of size 2 on 4x4x4 after 1x2x4 goes to [2, 1, 1]; its code picks [1, 2, 1]
    assert max([(2, 1, 1), (1, 2, 1), (1, 1, 2)], key=lambda z: jaxmode.preference(z, (4, 4, 4), [[1], [2], [4]])) == (
        1,
        2,
        1,
    )


def test_prime_factors() -> None:
    cases = {1: [], 12: [2, 2, 3], 121: [11, 11], 43: [43], 10: [2, 5], 14: [2, 7], 22: [2, 11], 26: [2, 13]}
    assert {n: jaxmode.prime_factors(n) for n in cases} == cases


@pytest.mark.parametrize(
    ("xyz", "chip"),
    [((2, 2, 1), V4), ((2, 2, 4), V4), ((4, 4, 4), V4), ((4, 4, 8), V4), ((4, 8, 8), V4), ((8, 8, 1), V4)],
)
def test_every_three_axis_shape_is_computable_with_split(xyz: tuple[int, int, int], chip: str) -> None:
    devices = mock(*xyz)
    n = len(devices)
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    for a, b in itertools.product(divisors, divisors):
        if n % (a * b) == 0:
            ids = jaxmode.create_device_mesh((a, b, n // a // b), devices, chip, allow_split_physical_axes=True)
            assert sorted(ids) == sorted(d.id for d in devices)


# --- device-kind handlers ------------------------------------------------------------------------


def test_v3_tray_rings() -> None:
    # Picture of one host's tray (2x2 chips, 2 cores each), ring 0 1 2 3 6 7 4 5:
    #   0/1 -- 2/3
    #    |      |
    #   6/7 -- 4/5   (ids 4/5 are chip (0,1), 6/7 chip (1,1))
    assert mesh_ids((8,), mock(2, 2, 1, False), V3) == [0, 1, 2, 3, 6, 7, 4, 5]
    assert mesh_ids((2, 4), mock(2, 2, 1, False), V3) == [[0, 1, 2, 3], [6, 7, 4, 5]]
    assert mesh_ids((4, 8), mock(4, 4, 1, False), V3) == [
        [0, 1, 2, 3, 10, 11, 8, 9],
        [4, 5, 6, 7, 14, 15, 12, 13],
        [16, 17, 18, 19, 26, 27, 24, 25],
        [20, 21, 22, 23, 30, 31, 28, 29],
    ]
    # (8, 4): no handler rule, the list order (each pair of rows is one host)
    assert mesh_ids((8, 4), mock(4, 4, 1, False), V3) == [
        [0, 1, 2, 3], [8, 9, 10, 11], [4, 5, 6, 7], [12, 13, 14, 15],
        [16, 17, 18, 19], [24, 25, 26, 27], [20, 21, 22, 23], [28, 29, 30, 31],
    ]  # fmt: skip


def test_v5e_handlers() -> None:
    # 4x2 chips: 0 1 2 3 / 7 6 5 4 is a ring; 2x2x2: the "iota" order
    assert mesh_ids((8,), mock(4, 2, 1), V5E) == [0, 1, 2, 3, 7, 6, 5, 4]
    assert mesh_ids((8,), mock(2, 2, 2), V5E) == [0, 4, 2, 6, 1, 5, 3, 7]
    # 4x4: a 16-ring only when one axis holds all 16 devices
    #    0 -- 1 -- 2 -- 3
    #    |              |
    #    4    6 -- 5 -- 7      (ids at (x, y): 5=(1,1) 6=(2,1) 7=(3,1))
    v5e16 = mock(4, 4, 1)
    assert mesh_ids((16,), v5e16, V5E) == [0, 1, 2, 3, 7, 6, 5, 9, 10, 11, 15, 14, 13, 12, 8, 4]
    assert mesh_ids((4, 4), v5e16, V5E) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    with pytest.raises(InputError, match="allow_split_physical_axes"):
        mesh_ids((2, 8), v5e16, V5E)
    assert mesh_ids((2, 8), v5e16, V5E, allow_split_physical_axes=True) == [
        [0, 4, 1, 5, 2, 6, 3, 7],
        [8, 12, 9, 13, 10, 14, 11, 15],
    ]
    # the real v5litepod-8 is 2x4 (x 0..1): the 4x2 table gives 2-hop steps there (not a ring)
    assert mesh_ids((8,), mock(2, 4, 1), V5E) == [0, 1, 2, 3, 7, 6, 5, 4]


def test_v4_v5p_small_cases() -> None:
    # v4 2x2x4 as (4, 4): rows are z-planes, columns (x, y) in x-major order: not a ring
    v4_32 = mock(2, 2, 4)
    assert mesh_ids((4, 4), v4_32, V4) == [[0, 2, 1, 3], [4, 6, 5, 7], [8, 10, 9, 11], [12, 14, 13, 15]]
    assert mesh_ids((16,), v4_32, V4) == [0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15]
    # v4-8 as (4,): 0 2 1 3 = (0,0) (0,1) (1,0) (1,1), not a ring (jax-ml/jax#20305)
    assert mesh_ids((4,), mock(2, 2, 1), V4) == [0, 2, 1, 3]
    # v5p 2x2x2: a ring with Pathways' kind "TPU v5p"; the TPU-VM kind "TPU v5" has no handler in 0.10.2
    assert mesh_ids((8,), mock(2, 2, 2), V5P) == [0, 1, 3, 2, 6, 7, 5, 4]
    assert mesh_ids((8,), mock(2, 2, 2), "TPU v5") == [0, 4, 2, 6, 1, 5, 3, 7]


def _x7_block(k: int) -> list[int]:
    return [8 * k + i for i in (0, 1, 2, 3, 6, 7, 4, 5)]


@pytest.mark.parametrize("kind", [X7, X7B])
def test_7x_handler(kind: str) -> None:
    assert mesh_ids((1, 1, 2), mock(1, 1, 1, False), kind) == [[[0, 1]]]
    assert mesh_ids((2, 1, 4), mock(2, 2, 1, False), kind) == [[[0, 1, 2, 3]], [[6, 7, 4, 5]]]
    assert mesh_ids((4, 1, 2), mock(2, 2, 1, False), kind) == [[[0, 1]], [[2, 3]], [[6, 7]], [[4, 5]]]
    assert mesh_ids((4, 2, 2), mock(2, 2, 2, False), kind) == [
        [[0, 1], [2, 3]], [[6, 7], [4, 5]], [[8, 9], [10, 11]], [[14, 15], [12, 13]],
    ]  # fmt: skip
    assert mesh_ids((2, 8), mock(2, 2, 2, False), kind) == [_x7_block(0), _x7_block(1)]
    flat = [i for k in range(4) for i in _x7_block(k)]
    for shape in ((4, 4, 2), (4, 2, 4), (8, 4), (4, 8)):
        assert mesh_ids(shape, mock(2, 2, 4, False), kind) == nest(flat, shape)
    big = mock(2, 4, 4, False)  # 64 devices: past the handler, the generic path
    assert len(jaxmode.create_device_mesh((1, 32), big[:32], kind)) == 32
    assert len(jaxmode.create_device_mesh((1, 32), big[32:], kind)) == 32


def test_7x_cube_puts_the_core_axis_with_a_physical_axis() -> None:
    """7x 4x4x4 (physical (4, 4, 4, 2)) as (8, 16): 16 = (x, y), 8 = (z, core)."""
    devices = mock(4, 4, 4, False)
    grid = mesh_ids((8, 16), devices, X7)
    assert isinstance(grid, list)
    assert grid[0][:4] == [0, 8, 16, 24] and grid[1][0] == 1


# --- contiguous submeshes ------------------------------------------------------------------------


def _contiguous(ids: list[int], shape: tuple[int, ...], devices: list[Device]) -> bool:
    process = {d.id: d.task for d in devices}
    st = strides(shape)
    boxes: dict[int, list[tuple[int, ...]]] = {}
    for pos, device in enumerate(ids):
        boxes.setdefault(process[device], []).append(tuple(pos // s % n for s, n in zip(st, shape, strict=True)))
    for points in boxes.values():
        extent = [max(p[a] for p in points) - min(p[a] for p in points) + 1 for a in range(len(shape))]
        if math.prod(extent) != len(points):
            return False
    return True


@pytest.mark.parametrize("topology", list(jaxmode.TRANSPOSE_TRICKS))
def test_contiguous_submeshes(topology: tuple[int, ...]) -> None:
    devices = mock(topology[0], topology[1], topology[2])
    for shape in jaxmode.TRANSPOSE_TRICKS[topology]:
        for full in (shape, (1, 1, *shape, 1, 1)):
            ids = jaxmode.create_device_mesh(full, devices, V4, contiguous_submeshes=True)
            assert _contiguous(ids, full, devices), (topology, full)


def test_contiguous_submesh_errors() -> None:
    with pytest.raises(InputError) as info:
        jaxmode.create_device_mesh((1, 16, 8), mock(4, 4, 8), V4, contiguous_submeshes=True)
    assert (
        info.value.message
        == "create_device_mesh cannot create contiguous submeshes for physical mesh topology (4, 4, 8)"
    )
    with pytest.raises(InputError) as info:
        jaxmode.create_device_mesh((1, 128, 2), mock(4, 8, 8), V4, contiguous_submeshes=True)
    assert info.value.message == (
        "create_device_mesh cannot create contiguous submeshes for mesh_shape (1, 128, 2) and physical mesh "
        "topology (4, 8, 8). Available mesh_shapes: [(64, 4), (4, 64)]"
    )


# --- hybrid (multislice) -------------------------------------------------------------------------


@pytest.mark.parametrize(("ici", "dcn"), [((1, 16, 4), (2, 1, 1)), ((1, 4, 16), (1, 2, 1))])
def test_hybrid_puts_slices_major(ici: tuple[int, ...], dcn: tuple[int, ...]) -> None:
    devices = mock(4, 4, 4, slices=2)
    ids = jaxmode.create_hybrid_device_mesh(ici, dcn, devices, V4)
    total = tuple(i * d for i, d in zip(ici, dcn, strict=True))
    by_id = {d.id: d for d in devices}
    st = strides(total)
    axis = dcn.index(2)
    d1, d2 = by_id[ids[0]], by_id[ids[ici[axis] * st[axis]]]
    assert d1.coords == d2.coords and d1.slice != d2.slice
    reversed_list = mock(4, 4, 4, slices=2, reverse=True)  # granules sorted by slice index
    assert jaxmode.create_hybrid_device_mesh(ici, dcn, reversed_list, V4) == jaxmode.create_hybrid_device_mesh(
        ici, dcn, sorted(reversed_list, key=lambda d: d.slice), V4
    )


def test_hybrid_v4_2x2x4_two_slices() -> None:
    devices = mock(2, 2, 4, slices=2)
    first = mesh_ids((4, 4), devices[:16], V4)
    assert isinstance(first, list)
    rows = nest(jaxmode.create_hybrid_device_mesh((4, 4), (2, 1), devices, V4), (8, 4))
    assert rows[:4] == first  # slice 0 in rows 0-3
    cols = nest(jaxmode.create_hybrid_device_mesh((4, 4), (1, 2), devices, V4), (4, 8))
    assert [r[:4] for r in cols] == first and all(i >= 16 for r in cols for i in r[4:])  # slice 1 in columns 4-7
    with pytest.raises(InputError, match="Number of slices 2 must equal the product of dcn_mesh_shape"):
        jaxmode.create_hybrid_device_mesh((4, 4), (2, 2), devices, V4)
