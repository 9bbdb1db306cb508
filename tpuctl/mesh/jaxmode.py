"""JAX's ``mesh_utils.create_device_mesh`` and ``create_hybrid_device_mesh``, bit for bit, without numpy.

The order reproduces jax 0.10.2 (``jax/_src/mesh_utils.py``, tested against the installed jax on libtpu's
own device lists), except one bug fixed as jax HEAD fixed it: ``_get_prime_factors`` drops every factor
but the last when the largest prime exceeds sqrt(n)+1 (10 -> [5], 28 -> [7]; jax-ml/jax#38286), so jax
0.10.2 crashes on e.g. the full v5p pod 16x20x28 as (140, 64) with ``allow_split_physical_axes``.

The algorithm, in JAX's order:

1. a device-kind handler may return a fixed order (``HANDLERS``, keyed on the last device's kind):
   v2/v3 tray rings, the v4i/8i 2x2 ring, v5e/v6e rings for 4, 8 and 16 chips, v5p 2x2x2, small 7x;
2. otherwise the devices are laid out as the physical box ``(x, y, z)`` (``(x, y, core)`` on v2/v3,
   ``(x, y, z, core)`` on 7x), optionally transposed by the "contiguous submeshes" trick;
3. logical axes, most network-intensive (last) first, each take a product of whole physical axes (more
   axes first, then the lexicographically first subset); the mesh is the box transposed so each logical
   axis is the row-major flattening of its physical axes;
4. when no whole-axis assignment exists and ``allow_split_physical_axes`` is set, physical axes are split
   by prime factors (see :func:`split_physical_axes`).

Devices are ``tpuctl.tpu.slice.Device`` records (``id``, ``coords``, ``core``, ``slice``) in the runtime's
list order, which matters to the v2/v3 and 7x handlers. Output: device ids in row-major mesh order.
Cost: O(N) plus O(L * 2^k) for the assignment (k <= 4 physical axes, L logical axes).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence

from tpuctl.errors import InputError
from tpuctl.mesh.model import strides
from tpuctl.tpu.slice import Device

TPU_V2, TPU_V3 = "TPU v2", "TPU v3"
TPU_V4_LITE, TPU_8I = "TPU v4 lite", "TPU8i"
TPU_V5_LITE, TPU_V6_LITE = "TPU v5 lite", "TPU v6 lite"
TPU_V5P = "TPU v5p"  # Pathways' name; TPU VMs report "TPU v5", which jax 0.10.2 has no handler for
TPU_7X, TPU_7 = "TPU7x", "TPU7"

# Fixed orders of JAX's device-kind handlers (positions in the handler's input order).
TRAY_RING_ORDER = (0, 1, 2, 3, 6, 7, 4, 5)  # v2/v3: 2x2 chips x 2 cores of one host
TRAY_2X2_RING_ORDER = (0, 1, 3, 2)
TRAY_4X4_RING_ORDER = (0, 1, 2, 3, 7, 6, 5, 9, 10, 11, 15, 14, 13, 12, 8, 4)
V5E_TRAY_RING_ORDER = (0, 1, 2, 3, 7, 6, 5, 4)  # a ring on 4x2 chips; not on the real 2x4 v5litepod-8
V5E_TRAY_IOTA_ORDER = (0, 4, 2, 6, 1, 5, 3, 7)
V5P_2X2X2_ORDER = (0, 1, 3, 2, 6, 7, 5, 4)
X7_TRAY_2X2X2_RING_ORDER = (0, 1, 2, 3, 6, 7, 4, 5)

# Physical box -> logical shape (1s dropped) -> transpose that keeps each host's 2x2 block contiguous.
TRANSPOSE_TRICKS: dict[tuple[int, ...], dict[tuple[int, ...], tuple[int, ...]]] = {
    (2, 2, 1): {(2, 2): (0, 1, 2)},
    (2, 2, 4): {(4, 4): (0, 1, 2)},
    (4, 4, 4): {(16, 4): (0, 2, 1)},
    (4, 8, 8): {(64, 4): (0, 2, 1), (4, 64): (0, 2, 1)},
    (8, 8, 8): {(64, 8): (0, 2, 1)},
    (8, 16, 16): {(256, 8): (0, 2, 1), (8, 256): (0, 2, 1)},
}

Shape = tuple[int, ...]


def _ids(devices: Sequence[Device], order: Sequence[int]) -> list[int]:
    return [devices[i].id for i in order]


def _v2_v3(shape: Shape, devices: Sequence[Device]) -> list[int] | None:
    if len(devices) == 8:
        return _ids(devices, TRAY_RING_ORDER)
    ids = [d.id for d in devices]
    if shape[-1] == 8:  # each row of 8 (one host's cores, in list order) becomes a tray ring
        return [ids[r + i] for r in range(0, len(ids), 8) for i in TRAY_RING_ORDER]
    return ids


def _v4i_v8i(shape: Shape, devices: Sequence[Device]) -> list[int] | None:
    return _ids(devices, TRAY_2X2_RING_ORDER) if len(devices) == 4 else None


def _sequential(devices: Sequence[Device]) -> tuple[tuple[int, int, int], list[Device]]:
    """JAX's "bounds" (the lexicographically largest coords + 1) and devices sorted z, y, x (stable)."""
    high = max(d.coords for d in devices)
    return (high[0] + 1, high[1] + 1, high[2] + 1), sorted(
        devices, key=lambda d: (d.coords[2], d.coords[1], d.coords[0])
    )


def _v5e(shape: Shape, devices: Sequence[Device]) -> list[int] | None:
    bounds, seq = _sequential(devices)
    n = len(devices)
    if bounds == (2, 2, 1) and n == 4:
        return _ids(seq, TRAY_2X2_RING_ORDER)
    if n == 8:
        return _ids(seq, V5E_TRAY_IOTA_ORDER if bounds == (2, 2, 2) else V5E_TRAY_RING_ORDER)
    if bounds == (4, 4, 1) and n == 16 and max(shape) == n:
        return _ids(seq, TRAY_4X4_RING_ORDER)
    return None


def _v5p(shape: Shape, devices: Sequence[Device]) -> list[int] | None:
    bounds, seq = _sequential(devices)
    if bounds == (2, 2, 2) and len(devices) == 8:
        return _ids(seq, V5P_2X2X2_ORDER)
    return None


def _7x(shape: Shape, devices: Sequence[Device]) -> list[int] | None:
    n = len(devices)
    if n % 8 or n > 32:
        return None
    _, pshape = physical_mesh(devices, TPU_7X)
    if pshape[0] > 2 or pshape[1] > 2:
        return None
    return [devices[r + i].id for r in range(0, n, 8) for i in X7_TRAY_2X2X2_RING_ORDER]


Handler = Callable[[Shape, Sequence[Device]], "list[int] | None"]
HANDLERS: dict[str, Handler] = {
    TPU_V2: _v2_v3,
    TPU_V3: _v2_v3,
    TPU_V4_LITE: _v4i_v8i,
    TPU_V5_LITE: _v5e,
    TPU_V5P: _v5p,
    TPU_V6_LITE: _v5e,
    TPU_7X: _7x,
    TPU_7: _7x,
    TPU_8I: _v4i_v8i,
}
"""jax 0.10.2's ``device_kind_handler_dict``."""


def physical_mesh(devices: Sequence[Device], device_kind: str) -> tuple[list[int], Shape]:
    """JAX's ``_get_physical_tpu_mesh``: the devices as a row-major box indexed from the lowest corner.

    ``(x, y, core)`` on v2/v3, ``(x, y, z, core)`` on 7x/7/8i, else ``(x, y, z)`` with one device per chip.
    Returns (device ids, box shape). O(N).
    """
    xs = [d.coords[0] for d in devices]
    ys = [d.coords[1] for d in devices]
    zs = [d.coords[2] for d in devices]
    cs = [d.core for d in devices]
    lx, ly, lz, lc = min(xs), min(ys), min(zs), min(cs)
    nx, ny, nz, nc = max(xs) - lx + 1, max(ys) - ly + 1, max(zs) - lz + 1, max(cs) - lc + 1
    n = len(devices)
    if n != nx * ny * nz * nc:
        raise InputError(
            f"{n} devices do not fill their {nx}x{ny}x{nz} chip box with {nc} core(s) per chip",
            hint="JAX meshes need every device of a contiguous slice",
        )
    if lx or ly or lz or lc:  # a box away from the origin: index from its lowest corner
        xs, ys, zs, cs = [x - lx for x in xs], [y - ly for y in ys], [z - lz for z in zs], [c - lc for c in cs]
    rows = zip(xs, ys, zs, cs, strict=True)
    if device_kind in (TPU_V2, TPU_V3):
        if lz or nz > 1:
            raise InputError(f"{device_kind} devices have z coordinates; these chips form 2D slices")
        shape: Shape = (nx, ny, nc)
        index = [(x * ny + y) * nc + c for x, y, _, c in rows]
    elif device_kind in (TPU_7X, TPU_7, TPU_8I) or (device_kind == TPU_V5P and nc == 2):
        shape = (nx, ny, nz, nc)
        index = [((x * ny + y) * nz + z) * nc + c for x, y, z, c in rows]
    else:
        if lc or nc > 1:
            raise InputError(
                'creating meshes for TPU >v3 requires one device per chip ("megacore" mode); '
                f"these {device_kind} devices show a core_on_chip of 1",
                hint="use megacore (one device per chip), or mode: ring",
            )
        shape = (nx, ny, nz)
        index = [(x * ny + y) * nz + z for x, y, z, _ in rows]
    out = [-1] * n
    for i, d in zip(index, devices, strict=True):
        out[i] = d.id
    if -1 in out:
        raise InputError("the devices' coordinates are not a contiguous box (a chip is missing or listed twice)")
    return out, shape


def transpose(flat: Sequence[int], shape: Shape, order: Sequence[int]) -> list[int]:
    """``np.asarray(flat).reshape(shape).transpose(order).ravel()``. O(N)."""
    if list(order) == list(range(len(shape))):
        return list(flat)
    st = strides(shape)
    index = [0]
    for axis in order:
        size, step = shape[axis], st[axis]
        index = [i + k * step for i in index for k in range(size)]
    return [flat[i] for i in index]


def transpose_trick(flat: list[int], pshape: Shape, mesh_shape: Shape) -> tuple[list[int], Shape]:
    tricks = TRANSPOSE_TRICKS.get(pshape)
    if tricks is None:
        raise InputError(
            f"create_device_mesh cannot create contiguous submeshes for physical mesh topology {pshape}",
            hint="contiguous_submeshes works on " + ", ".join(str(t) for t in TRANSPOSE_TRICKS),
        )
    key = tuple(s for s in mesh_shape if s != 1)
    if key not in tricks:
        raise InputError(
            f"create_device_mesh cannot create contiguous submeshes for mesh_shape {mesh_shape} and physical "
            f"mesh topology {pshape}. Available mesh_shapes: {list(tricks)}"
        )
    order = tricks[key]
    return transpose(flat, pshape, order), tuple(pshape[a] for a in order)


def assign_whole_axes(pshape: Shape, mesh_shape: Shape) -> list[tuple[int, ...]] | None:
    """JAX's whole-axis assignment: logical axis -> physical axes, or None when one does not fit."""
    avail = list(pshape)
    assignment: list[tuple[int, ...]] = [() for _ in mesh_shape]
    for j in reversed(range(len(mesh_shape))):
        size = mesh_shape[j]
        for count in range(len(pshape), 0, -1):
            for combo in itertools.combinations(range(len(pshape)), count):
                if math.prod(avail[i] for i in combo) == size:
                    assignment[j] = combo
                    for i in combo:
                        avail[i] = 0
                    break
            if assignment[j]:
                break
        else:
            if size > 1:
                return None
    return assignment


def nd_torus(flat: list[int], pshape: Shape, mesh_shape: Shape, allow_split: bool) -> tuple[list[int], list[list[int]]]:
    """JAX's ``_create_device_mesh_for_nd_torus``: (mesh ids, assignment matrix [physical][logical])."""
    assignment = assign_whole_axes(pshape, mesh_shape)
    if assignment is None:
        if allow_split:
            return split_physical_axes(flat, pshape, mesh_shape)
        raise InputError(
            f"mesh shape {list(mesh_shape)} does not fit the physical box {list(pshape)}: each axis size must "
            "be a product of whole physical axis sizes (e.g. (4, 16) fits 4x4x4 as 4 and 4x4)",
            hint="set allow_split_physical_axes: true (mode jax), or use mode ring",
        )
    order = [axis for axes in assignment for axis in axes]
    if sorted(order) != list(range(len(pshape))):  # numpy's transpose would refuse it too
        raise InputError(f"mesh shape {list(mesh_shape)} leaves physical axes of {list(pshape)} unassigned")
    matrix = [[1] * len(mesh_shape) for _ in pshape]
    for j, axes in enumerate(assignment):
        for p in axes:
            matrix[p][j] = pshape[p]
    return transpose(flat, pshape, order), matrix


def prime_factors(n: int) -> list[int]:
    """The prime factors of ``n`` in increasing order, with multiplicity (1 -> [])."""
    if n < 1:
        raise ValueError(f"prime_factors needs a positive integer, got {n}")
    out: list[int] = []
    p = 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


def feasible_assignments(pshape: Shape, matrix: Sequence[Sequence[int]], size: int) -> Iterator[tuple[int, ...]]:
    """Every split of ``size`` over the physical axes' remaining sizes (one factor per axis), JAX's way:
    each prime of ``size`` goes to a combination of the axes whose remaining size holds it."""
    multiplicity: dict[int, int] = {}
    for f in prime_factors(size):
        multiplicity[f] = multiplicity.get(f, 0) + 1
    available = [p // math.prod(row) for p, row in zip(pshape, matrix, strict=True)]
    holders: dict[int, list[int]] = {f: [] for f in multiplicity}
    for axis, avail in enumerate(available):
        for f in prime_factors(avail):
            if f in holders:
                holders[f].append(axis)
    choices = [(f, set(itertools.combinations(holders[f], m))) for f, m in multiplicity.items()]
    for pick in itertools.product(*(c for _, c in choices)):
        result = [1] * len(pshape)
        for (f, _), axes in zip(choices, pick, strict=True):
            for axis in axes:
                result[axis] *= f
        yield tuple(result)


def preference(z: tuple[int, ...], pshape: Shape, matrix: Sequence[Sequence[int]]) -> tuple[object, ...]:
    """JAX's ``_prefer_first_logical_axis_assignment`` as a sort key (larger is preferred): whole physical
    axes taken (product, then count), then the product over axes already used by more intensive logical
    axes (the code maximises it, though its comment says the opposite), then the vector itself."""
    used = [math.prod(row) for row in matrix]
    whole = [s for s, p in zip(z, pshape, strict=True) if s == p]
    return (
        math.prod(whole),
        sum(1 for s in whole if s > 1),
        math.prod(s for s, u in zip(z, used, strict=True) if u > 1),
        z,
    )


def split_physical_axes(flat: list[int], pshape: Shape, mesh_shape: Shape) -> tuple[list[int], list[list[int]]]:
    """JAX's ``_create_device_mesh_for_nd_torus_splitting_axes`` with correct prime factors.

    For each logical axis, most intensive first, pick the preferred feasible split; then view physical
    axis p as ``matrix[p][0] x ... x matrix[p][L-1]`` (more intensive logical axes minor) and gather the
    pieces by logical axis. Example, v5p 16x16x24 as (96, 64): matrix [[1, 16], [4, 4], [24, 1]], so 64 =
    x (16) x low y (4) and 96 = high y (4) x z (24).
    """
    if math.prod(pshape) != math.prod(mesh_shape):
        raise InputError(f"physical box {list(pshape)} and mesh shape {list(mesh_shape)} hold different device counts")
    matrix = [[1] * len(mesh_shape) for _ in pshape]
    for j in reversed(range(len(mesh_shape))):
        best = max(feasible_assignments(pshape, matrix, mesh_shape[j]), key=lambda z: preference(z, pshape, matrix))
        for p, s in enumerate(best):
            matrix[p][j] = s
    logical = len(mesh_shape)
    pieces = tuple(s for row in matrix for s in row)  # axis p * L + l
    order = sorted(range(len(pieces)), key=lambda a: (a % logical, a // logical))
    return transpose(flat, pieces, order), matrix


def create_device_mesh(
    mesh_shape: Sequence[int],
    devices: Sequence[Device],
    device_kind: str,
    *,
    contiguous_submeshes: bool = False,
    allow_split_physical_axes: bool = False,
) -> list[int]:
    """``jax.experimental.mesh_utils.create_device_mesh`` on TPU devices: ids in row-major mesh order."""
    shape = tuple(int(s) for s in mesh_shape)
    if math.prod(shape) != len(devices):
        raise InputError(
            f"mesh shape {list(shape)} holds {math.prod(shape)} devices; there are {len(devices)}",
            hint="make the axis sizes multiply to the device count",
        )
    handler = HANDLERS.get(device_kind)
    if handler is not None:
        result = handler(shape, devices)
        if result is not None:
            return result
    flat, pshape = physical_mesh(devices, device_kind)
    if contiguous_submeshes:
        flat, pshape = transpose_trick(flat, pshape, shape)
    return nd_torus(flat, pshape, shape, allow_split_physical_axes)[0]


def block(per_slice: Sequence[Sequence[int]], ici_shape: Shape, dcn_shape: Shape) -> list[int]:
    """``np.block`` of per-slice meshes laid out on the ``dcn_shape`` grid: axis i of the result has size
    ``dcn[i] * ici[i]`` with the slice index major. O(N)."""
    total = tuple(d * i for d, i in zip(dcn_shape, ici_shape, strict=True))
    t_st = strides(total)
    offsets = [0]
    for size, step in zip(ici_shape, t_st, strict=True):
        offsets = [o + k * step for o in offsets for k in range(size)]
    bases = [0]
    for d, i, step in zip(dcn_shape, ici_shape, t_st, strict=True):
        bases = [b + k * i * step for b in bases for k in range(d)]
    out = [0] * math.prod(total)
    for base, ids in zip(bases, per_slice, strict=True):
        for off, device in zip(offsets, ids, strict=True):
            out[base + off] = device
    return out


def group_by_slice(devices: Sequence[Device]) -> list[list[Device]]:
    groups: dict[int, list[Device]] = {}
    for d in devices:
        groups.setdefault(d.slice, []).append(d)
    return [groups[k] for k in sorted(groups)]


def create_hybrid_device_mesh(
    mesh_shape: Sequence[int],
    dcn_mesh_shape: Sequence[int],
    devices: Sequence[Device],
    device_kind: str,
    *,
    allow_split_physical_axes: bool = False,
) -> list[int]:
    """``create_hybrid_device_mesh`` (slices as granules, sorted by slice index): ids of the mesh of shape
    ``mesh_shape[i] * dcn_mesh_shape[i]``."""
    ici, dcn = tuple(mesh_shape), tuple(dcn_mesh_shape)
    groups = group_by_slice(devices)
    if math.prod(dcn) != len(groups):
        raise InputError(f"Number of slices {len(groups)} must equal the product of dcn_mesh_shape {list(dcn)}")
    per_slice = [
        create_device_mesh(ici, g, device_kind, allow_split_physical_axes=allow_split_physical_axes) for g in groups
    ]
    return block(per_slice, ici, dcn)
