"""Ring-ordered TPU meshes: DTensor's ``create_tpu_mesh`` order, and what tpuctl fixes by default.

DTensor (``tensorflow/dtensor/python/tpu_util.py``) orders a TPU mesh's devices in three steps, all
reproduced here on plain integers (a device is its id within the slice,
``core + C * (x + X * (y + Y * z))``, which is also its ``jax.Device.id``):

1. :func:`enumerate_cores` (``_enumerate_core_locations``): walk the slice's ``[x, y, z, core]`` box in
   ``ring_axes`` order, fastest first, in tiles of ``ring_bounds`` and, unless hosts may be split across
   rings, whole host blocks. O(N).
2. :func:`build_all_reduce_ring` (``_build_all_reduce_ring``): order the first ``ring_size`` devices as
   a "snake with a return column" (first column last, walked back; odd rows reversed; in 3D odd planes
   reversed and the (min x, min y) pillar walked back down). O(r log r) for a ring of r devices.
3. apply that ring's permutation to every consecutive block of ``ring_size`` devices, and with
   ``build_ring_across_rings`` order the k-th devices of all rings as a ring too
   (:func:`build_orthogonal_rings`). O(N).

The mesh is the result reshaped row-major; the ring covers the trailing ``-ring_dims`` mesh axes (the
leading ``ring_dims`` when positive; by default every axis but the first).

``compat="dtensor"`` keeps DTensor's order exactly (tested against the installed TensorFlow). The default
keeps it wherever it already is a closed ring of one-hop steps, and otherwise:

* checks ``ring_bounds`` element-wise, and that they divide the slice and are divided by the host block
  (DTensor compares lists lexicographically, so ``[1, 16, 1, 1]`` passes on a ``[2, 2, 4, 1]`` slice and
  yields locations outside the slice; in compat mode these checks apply too, as DTensor's output would
  be garbage);
* takes the host block from the slice (``chips_per_host_bounds``: 2x4 chips on 8-chip v5e/v6e hosts)
  instead of DTensor's fixed 2x2x1;
* picks the snake orientation that gives the better ring (DTensor always snakes along x, so a 4x3 ring
  gets a 3-hop step; along y it is a perfect ring), and walks a line in order (DTensor's return-column
  rule turns a column into ``0, 3, 2, 1``: a 3-hop step);
* measures hops through wraparound links where the slice has them, and builds each ring on its own
  when the blocks are not translates of the first one (DTensor reuses the first ring's permutation).

Example, a 4x3 chip plane (x across, y down), one ring over all 12 chips::

    DTensor (rotate=False)        tpuctl (picks rotate=True)
     0  1  2  3                    0 11 10  9
    11  6  5  4                    1  4  5  8
    10  7  8  9                    2  3  6  7
    (9 -> 10 is 3 hops)           (every step 1 hop, closes 11 -> 0)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tpuctl.errors import InputError
from tpuctl.mesh.quality import Location, Torus, ring_cost
from tpuctl.tpu.hardware import Triple

PHYSICAL_AXES = ("x", "y", "z", "core")
DEFAULT_RING_AXES = ("core", "x", "y", "z")
"""DTensor's default iteration order, fastest first."""


@dataclass(frozen=True)
class RingOptions:
    """``create_tpu_mesh``'s ring arguments (``None``: DTensor's default)."""

    ring_dims: int | None = None
    ring_axes: tuple[str, ...] | None = None
    ring_bounds: tuple[int, ...] | None = None
    """Ring extent along x, y, z, core."""
    can_split_host_across_rings: bool = True
    build_ring_across_rings: bool = False
    rotate_ring_across_rings: bool = False
    compat: str | None = None
    """``"dtensor"``: DTensor's order exactly; ``None``: tpuctl's fixed order."""


# --- enumeration ---------------------------------------------------------------------------------


def _weights(bounds: Sequence[int]) -> tuple[int, int, int, int]:
    """Id increment per unit of x, y, z, core: ``id = core + C * (x + X * (y + Y * z))``."""
    x, y, _, c = bounds
    return (c, c * x, c * x * y, 1)


def decode(device: int, bounds: Sequence[int]) -> Location:
    """The (x, y, z, core) of a device id within its slice."""
    x_n, y_n, _, c_n = bounds
    chip, core = divmod(device, c_n)
    chip, x = divmod(chip, x_n)
    z, y = divmod(chip, y_n)
    return (x, y, z, core)


def dtensor_host_bounds(bounds: Sequence[int]) -> Location:
    """DTensor's host block in x, y, z, core: one chip for 1- or 2-core slices, else a 2x2x1 "donut"."""
    cores = bounds[3]
    return (1, 1, 1, cores) if math.prod(bounds) <= 2 else (2, 2, 1, cores)


def enumerate_cores(
    bounds: Sequence[int], ring_bounds: Sequence[int], ring_axes: Sequence[str], host_bounds: Sequence[int]
) -> list[int]:
    """Every device id of the ``bounds`` box in DTensor's iteration order (``_enumerate_cores``). O(N).

    All per-axis sequences are in x, y, z, core order; ``ring_axes`` lists axes fastest first. Each
    level appends the next-slowest axis: tiles of ``ring_bounds``, inside them host blocks, inside those
    single values, exactly as DTensor's six nested loops do. Inputs must already be checked
    (:func:`check_bounds`): values that do not divide give out-of-range ids, as in DTensor.
    """
    order = [PHYSICAL_AXES.index(a) for a in ring_axes]
    weights = _weights(bounds)
    partials = [0]
    ring_size = host_size = 1
    for axis in order:
        b, rb, hb, w = bounds[axis], ring_bounds[axis], host_bounds[axis], weights[axis]
        n = len(partials)
        if rb == b and hb == 1 and ring_size == n:  # plain mixed-radix counting
            partials = [p + i * w for i in range(b) for p in partials]
        else:
            partials = [
                partials[j] + i * w
                for ring_i in range(0, b, rb)
                for ring_j in range(0, n, ring_size)
                for host_i in range(ring_i, ring_i + rb, hb)
                for host_j in range(ring_j, ring_j + ring_size, host_size)
                for i in range(host_i, host_i + hb)
                for j in range(host_j, host_j + host_size)
            ]
        ring_size *= rb
        host_size *= hb
    return partials


def check_bounds(
    bounds: Sequence[int],
    ring_bounds: Sequence[int],
    host_bounds: Sequence[int],
    ring_size: int,
    *,
    split_hosts: bool,
    whole_hosts: bool,
) -> None:
    """Element-wise checks DTensor makes lexicographically (or not at all). Everything in x, y, z, core."""
    shown = list(bounds)
    if len(ring_bounds) != 4:
        raise InputError(
            f"ring_bounds {list(ring_bounds)} has {len(ring_bounds)} entries; expected 4 (x, y, z, core)",
            hint=f"e.g. the whole slice: {shown}",
        )
    bad = [f"{a}={r}" for a, r, b in zip(PHYSICAL_AXES, ring_bounds, bounds, strict=True) if r < 1 or r > b or b % r]
    if bad:
        raise InputError(
            f"ring_bounds {list(ring_bounds)} do not divide the slice's bounds {shown} (x, y, z, core): "
            + ", ".join(bad),
            hint="each ring bound must divide the slice's size along its axis",
        )
    if split_hosts:
        return
    host_size = math.prod(host_bounds)
    if ring_size < host_size:
        raise InputError(
            f"rings of {ring_size} devices are too small to keep hosts of {host_size} devices whole "
            "(can_split_host_across_rings: false)",
            hint="use a larger ring (ring_dims), or allow can_split_host_across_rings",
        )
    bad = [f"{a}={r}" for a, r, h in zip(PHYSICAL_AXES, ring_bounds, host_bounds, strict=True) if r % h]
    if bad:
        raise InputError(
            f"ring_bounds {list(ring_bounds)} do not hold whole host blocks {list(host_bounds)} (x, y, z, core): "
            + ", ".join(bad),
            hint="each ring bound must be a multiple of the host block, or allow can_split_host_across_rings",
        )
    if whole_hosts and ring_size % host_size:
        raise InputError(
            f"rings of {ring_size} devices cannot hold whole hosts of {host_size} devices",
            hint="use a ring size that is a multiple of the host's devices, or allow can_split_host_across_rings",
        )


# --- one ring ------------------------------------------------------------------------------------


def build_all_reduce_ring(locs: Sequence[Location], rotate: bool = False) -> list[int]:
    """DTensor's ``_build_all_reduce_ring``: a permutation of ``locs`` that walks them as a ring.

    DTensor sorts with a comparator; its comparisons are lexicographic on a few derived values, so this
    sorts once on those values (same order, stable on ties). In 2D (one z-plane), rows of increasing y,
    even rows left to right, odd rows right to left, the first column (but its first row) last and
    upwards; ``rotate`` swaps x and y. In 3D, planes of increasing z with odd planes reversed, leaving out
    the (min x, min y) pillar, which is walked last in decreasing z. O(r log r).
    """
    if not locs:
        return []
    if rotate:
        locs = [(y, x, z, c) for x, y, z, c in locs]  # the same walk with x and y swapped
    fc = min(loc[0] for loc in locs)
    fr = min(loc[1] for loc in locs)
    z0 = locs[0][2]
    keys: list[tuple[int, ...]]
    if all(loc[2] == z0 for loc in locs):
        keys = [((f := int(x == fc and y != fr)), -y if f else y, -x if y % 2 else x, c) for x, y, _, c in locs]
    else:
        keys = [
            (1, -z, 0, 0, 0, c)
            if x == fc and y == fr
            else (0, z, (f := int(x == fc and y != fr)), -y if f else y, -x if y % 2 else x, c)
            if z % 2 == 0
            else (0, z, -(f := int(x == fc and y != fr)), y if f else -y, x if y % 2 else -x, -c)
            for x, y, z, c in locs
        ]
    return sorted(range(len(locs)), key=keys.__getitem__)


def locate_all(ids: Sequence[int], bounds: Sequence[int]) -> list[Location]:
    """:func:`decode` of many ids at once. O(N)."""
    x_n, y_n, _, c_n = bounds
    cx = c_n * x_n
    cxy = cx * y_n
    return [(i // c_n % x_n, i // cx % y_n, i // cxy, i % c_n) for i in ids]


def _line_order(locs: Sequence[Location]) -> list[int]:
    """Devices in (z, y, x, core) order: along a line, each step is one hop (or on-chip)."""
    return sorted(range(len(locs)), key=lambda i: (locs[i][2], locs[i][1], locs[i][0], locs[i][3]))


def best_ring(locs: Sequence[Location], torus: Torus, rotate: bool, also: Sequence[list[int]] = ()) -> list[int]:
    """tpuctl's ring over ``locs``: DTensor's when it is perfect, else the best of its two orientations,
    the plain line order and ``also`` (ties keep DTensor's). Perfect = every step, the closing one
    included, at most one hop (through wraparound where the slice has it); "best" compares
    :func:`~tpuctl.mesh.quality.ring_cost`: the longest step first, then how many steps are long."""
    first = build_all_reduce_ring(locs, rotate)
    cost = ring_cost([locs[i] for i in first], torus)
    if cost == (0, 0, 0, 0):
        return first
    best, best_cost = first, cost
    for perm in (build_all_reduce_ring(locs, not rotate), _line_order(locs), *also):
        c = ring_cost([locs[i] for i in perm], torus)
        if c < best_cost:
            best, best_cost = perm, c
    return best


# --- all rings -----------------------------------------------------------------------------------


def _translates(ids: Sequence[int], size: int, bounds: Sequence[int]) -> bool:
    """Whether every block of ``size`` ids is the first block shifted by one coordinate offset. O(N).

    Ids are linear in coordinates, so equal id offsets mean equal coordinate offsets as long as the
    shifted box stays inside the slice, which is checked per block from its first device.
    """
    base = ids[:size]
    locs = locate_all(base, bounds)
    low = [min(loc[a] for loc in locs) for a in range(4)]
    high = [max(loc[a] for loc in locs) for a in range(4)]
    origin = locs[0]
    for r in range(size, len(ids), size):
        head = decode(ids[r], bounds)
        for a in range(4):
            shift = head[a] - origin[a]
            if low[a] + shift < 0 or high[a] + shift >= bounds[a]:
                return False
        delta = ids[r] - base[0]
        if list(ids[r : r + size]) != [i + delta for i in base]:
            return False
    return True


Chooser = Callable[[Sequence[Location], Sequence[list[int]]], list[int]]
"""Orders one block as a ring: (its locations, other permutations worth considering) -> permutation."""


def _apply_rings(ids: list[int], size: int, bounds: Sequence[int], choose: Chooser, per_block: bool) -> list[int]:
    """Order every block of ``size`` ids as a ring: the first block's permutation for all (DTensor), or,
    with ``per_block``, each block its own when the blocks are not translates of the first (the first
    block's permutation stays a candidate, so no block gets worse than DTensor's)."""
    if size <= 1:
        return ids
    n = len(ids)
    perm = choose(locate_all(ids[:size], bounds), ())
    if not per_block or n == size or _translates(ids, size, bounds):
        return [ids[r + p] for r in range(0, n, size) for p in perm]
    out: list[int] = [ids[p] for p in perm]
    for r in range(size, n, size):
        block = ids[r : r + size]
        out += [block[p] for p in choose(locate_all(block, bounds), (perm,))]
    return out


def build_orthogonal_rings(
    ids: list[int], ring_size: int, bounds: Sequence[int], primary: Chooser, secondary: Chooser, per_block: bool
) -> list[int]:
    """DTensor's ``_build_orthogonal_rings``: rings of ``ring_size`` consecutive devices, then the k-th
    devices of all rings ordered as rings too (done by transposing, ordering, transposing back). O(N)."""
    n = len(ids)
    ids = _apply_rings(ids, ring_size, bounds, primary, per_block)
    num_rings = n // ring_size
    transposed = [ids[g + i] for i in range(ring_size) for g in range(0, n, ring_size)]
    transposed = _apply_rings(transposed, num_rings, bounds, secondary, per_block)
    return [transposed[g + i] for i in range(num_rings) for g in range(0, n, num_rings)]


def ring_size_of(shape: Sequence[int], ring_dims: int) -> int:
    if ring_dims > 0:
        return math.prod(shape[:ring_dims])
    if ring_dims < 0:
        return math.prod(shape[ring_dims:])
    return 1


def resolve_ring_dims(shape: Sequence[int], ring_dims: int | None) -> int:
    n = len(shape)
    if ring_dims is None:
        return 1 - n
    if not -n <= ring_dims <= n:
        raise InputError(
            f"ring_dims {ring_dims} is out of range for a {n}-axis mesh; expected {-n}..{n}",
            hint="negative: that many trailing axes form the ring; positive: leading axes; 0: no rings",
        )
    return ring_dims


def resolve_ring_axes(ring_axes: Sequence[str] | None) -> tuple[str, ...]:
    if ring_axes is None:
        return DEFAULT_RING_AXES
    axes = tuple(ring_axes)
    if len(axes) != 4 or sorted(axes) != sorted(PHYSICAL_AXES):
        raise InputError(
            f"ring_axes {list(axes)} is not an ordering of core, x, y, z",
            hint="list all four, fastest-varying first, e.g. [core, x, y, z]",
        )
    return axes


def ring_order(shape: Sequence[int], torus: Torus, host_block: Triple, options: RingOptions) -> list[int]:
    """The device ids of one slice in mesh order (row-major over ``shape``), DTensor's way.

    ``torus`` gives the slice's bounds and wraparound; ``host_block`` is its chips per host (x, y, z).
    Raises InputError for options DTensor rejects or mishandles. O(N + r log r).
    """
    compat = options.compat == "dtensor"
    ring_dims = resolve_ring_dims(shape, options.ring_dims)
    axes = resolve_ring_axes(options.ring_axes)
    bounds = torus.bounds
    ring_bounds = tuple(options.ring_bounds) if options.ring_bounds is not None else bounds
    ring_size = ring_size_of(shape, ring_dims)
    split = options.can_split_host_across_rings
    if split:
        host_bounds: Sequence[int] = (1, 1, 1, 1)
    elif compat:
        host_bounds = dtensor_host_bounds(bounds)
    else:
        host_bounds = (*host_block, bounds[3])
    check_bounds(bounds, ring_bounds, host_bounds, ring_size, split_hosts=split, whole_hosts=not compat)
    ids = enumerate_cores(bounds, ring_bounds, axes, host_bounds)
    size = math.prod(shape)
    if size != len(ids):
        raise InputError(
            f"mesh shape {list(shape)} holds {size} devices, but the slice has {len(ids)}",
            hint="a TPU mesh uses every device: make the axis sizes multiply to the device count",
        )
    if ring_size > 1 and size % ring_size:  # pragma: no cover - ring_size is a product of mesh axes
        raise InputError(f"ring size {ring_size} does not divide {size} devices")
    rotate2 = options.rotate_ring_across_rings
    if compat:

        def primary(locs: Sequence[Location], also: Sequence[list[int]]) -> list[int]:
            return build_all_reduce_ring(locs)

        def secondary(locs: Sequence[Location], also: Sequence[list[int]]) -> list[int]:
            return build_all_reduce_ring(locs, rotate2)

    else:

        def primary(locs: Sequence[Location], also: Sequence[list[int]]) -> list[int]:
            return best_ring(locs, torus, False, also)

        def secondary(locs: Sequence[Location], also: Sequence[list[int]]) -> list[int]:
            return best_ring(locs, torus, rotate2, also)

    if options.build_ring_across_rings:
        return build_orthogonal_rings(ids, ring_size, bounds, primary, secondary, not compat)
    return _apply_rings(ids, ring_size, bounds, primary, not compat)
