"""How good a mesh is: for every axis, are consecutive devices ICI neighbours, and does the axis close.

Distances are ICI hops between chips: the Manhattan distance over x, y, z, taking the short way round an
axis that has wraparound links (``TpuSlice.wraparound``); the two cores of a chip are 0 hops apart.
Devices of different slices talk over DCN, which has no hop count: such steps are counted apart. Twisted
tori (an optional v4/v5p wiring) are not modelled: their extra links only make real distances shorter.

Example, ``v4-32`` (2x2x4 chips, no wraparound), mesh ``[4, 4]`` in DTensor's default ring order: every
row is one z-plane walked round its 2x2 square, every column runs down z::

    row 0: (0,0,0) (1,0,0) (1,1,0) (0,1,0)   model: neighbours, ring (closes (0,1,0) -> (0,0,0))
    col 0: (0,0,0) (0,0,1) (0,0,2) (0,0,3)   data:  neighbours, open (closes over 3 hops: z has no wraparound)

Cost: O(N) per axis.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from tpuctl.mesh.model import AxisQuality, strides
from tpuctl.tpu.hardware import MULTISLICE_ID_STRIDE, Triple
from tpuctl.tpu.slice import TpuSlice

Location = tuple[int, int, int, int]
"""(x, y, z, core) of a device within its slice."""


@dataclass(frozen=True)
class Torus:
    """One slice's chip grid, which axes wrap, and devices per chip: enough to measure hops."""

    dims: Triple
    wrap: tuple[bool, bool, bool]
    cores: int
    """Devices per chip (1 under megacore)."""
    multislice: bool = False

    @classmethod
    def of(cls, tpu: TpuSlice) -> Torus:
        return cls(tpu.topology, tpu.wraparound, tpu.devices_per_chip, tpu.num_slices > 1)

    @property
    def bounds(self) -> Location:
        """[x, y, z, core] sizes, as DTensor's topology ``mesh_shape`` holds them."""
        return (self.dims[0], self.dims[1], self.dims[2], self.cores)

    def locate(self, device_id: int) -> tuple[int, Location]:
        """(slice index, location) of a global device id (the inverse of ``TpuSlice.device_id``)."""
        s, local = (
            (device_id // MULTISLICE_ID_STRIDE - 1, device_id % MULTISLICE_ID_STRIDE)
            if self.multislice
            else (0, device_id)
        )
        chip, core = divmod(local, self.cores)
        chip, x = divmod(chip, self.dims[0])
        z, y = divmod(chip, self.dims[1])
        return s, (x, y, z, core)

    def hop(self, a: Location, b: Location) -> int:
        """ICI hops between the chips of ``a`` and ``b`` (0 for two cores of one chip)."""
        total = 0
        for i in range(3):
            d = abs(a[i] - b[i])
            if self.wrap[i] and 2 * d > self.dims[i]:
                d = self.dims[i] - d
            total += d
        return total

    def uses_wrap(self, a: Location, b: Location) -> bool:
        return any(self.wrap[i] and 2 * abs(a[i] - b[i]) > self.dims[i] for i in range(3))


def show_location(slice_index: int, loc: Location, torus: Torus) -> str:
    text = f"({loc[0]},{loc[1]},{loc[2]})" + (f"c{loc[3]}" if torus.cores > 1 else "")
    return f"s{slice_index}{text}" if torus.multislice else text


def _closing_why(a: Location, b: Location, torus: Torus) -> str:
    """Which axes make the closing step long: those it crosses far without a wraparound link."""
    far = [("xyz"[i], torus.dims[i]) for i in range(3) if abs(a[i] - b[i]) > 1 and not torus.wrap[i]]
    if not far:
        return ""
    names = " and ".join(name for name, _ in far)
    verb = "has" if len(far) == 1 else "have"
    return f"; {names} {verb} no wraparound links on this slice"


@dataclass(frozen=True)
class _Columns:
    """Slice index and x, y, z of the device at each mesh position, and distance tables: fast to scan."""

    slices: list[int]
    locs: list[Location]
    xs: list[int]
    ys: list[int]
    zs: list[int]
    tables: tuple[list[int], list[int], list[int]]
    """Per axis, hops for a coordinate difference d at index d (negative d from the end)."""

    @classmethod
    def of(cls, located: Sequence[tuple[int, Location]], torus: Torus) -> _Columns:
        locs = [loc for _, loc in located]
        tables = []
        for size, wraps in zip(torus.dims, torus.wrap, strict=True):
            dist = [min(d, size - d) if wraps else d for d in range(size + 1)]
            tables.append(dist[:size] + [dist[size - i] for i in range(size)])
        return cls(
            [s for s, _ in located], locs, [loc[0] for loc in locs], [loc[1] for loc in locs], [loc[2] for loc in locs],
            (tables[0], tables[1], tables[2]),
        )  # fmt: skip

    def at(self, p: int) -> tuple[int, Location]:
        return self.slices[p], self.locs[p]

    def steps(self, offset: int, torus: Torus) -> tuple[list[int], list[int]]:
        """Hops from each position p to p + offset (-1 across slices), with and without wraparound links.
        O(N)."""
        xs, ys, zs = self.xs, self.ys, self.zs
        tx, ty, tz = self.tables
        hop = [
            tx[a - b] + ty[c - d] + tz[e - f]
            for a, b, c, d, e, f in zip(xs, xs[offset:], ys, ys[offset:], zs, zs[offset:], strict=False)
        ]
        raw = hop
        if any(torus.wrap):
            raw = [
                abs(a - b) + abs(c - d) + abs(e - f)
                for a, b, c, d, e, f in zip(xs, xs[offset:], ys, ys[offset:], zs, zs[offset:], strict=False)
            ]
        if torus.multislice:
            sl = self.slices
            hop = [h if s == t else -1 for h, s, t in zip(hop, sl, sl[offset:], strict=False)]
        return hop, raw


@dataclass
class _Worst:
    hop: int = 0
    a: tuple[int, Location] | None = None
    b: tuple[int, Location] | None = None


def _scan(runs: list[tuple[int, int]], offset: int, cols: _Columns, torus: Torus) -> tuple[_Worst, int, bool]:
    """(worst ICI step, DCN steps, whether a step uses a wraparound link) over the steps p -> p + offset
    for p in the ``runs`` (half-open position ranges). O(N)."""
    hop, raw = cols.steps(offset, torus)
    worst = _Worst()
    dcn = 0
    wrap = False
    for a, b in runs:
        part = hop[a:b]
        top = max(part)
        if torus.multislice:
            dcn += part.count(-1)
        if top > worst.hop or (worst.a is None and top >= 0):
            p = a + part.index(top)
            worst.hop, worst.a, worst.b = top, cols.at(p), cols.at(p + offset)
        if raw is not hop and not wrap and part != raw[a:b]:
            wrap = any(h != r for h, r in zip(part, raw[a:b], strict=True) if h >= 0)
    return worst, dcn, wrap


def axis_quality(name: str, size: int, stride: int, cols: _Columns, torus: Torus) -> AxisQuality:
    """Quality of one axis of a row-major mesh whose position p holds the device at ``cols``."""
    if size == 1:
        return AxisQuality(name, 1, True, True, 0, 0, False, 0, "size 1: nothing to exchange")
    n = len(cols.locs)
    block = size * stride
    span = (size - 1) * stride
    inner, dcn, wrap = _scan([(s, s + span) for s in range(0, n, block)], stride, cols, torus)
    closing = _Worst()
    if size > 2:
        closing, closing_dcn, closing_wrap = _scan([(s, s + stride) for s in range(0, n, block)], span, cols, torus)
        closing.a, closing.b = closing.b, closing.a  # the step goes from the last device back to the first
        dcn += closing_dcn
        wrap = wrap or closing_wrap
    neighbours = dcn == 0 and inner.hop <= 1
    ring = neighbours and closing.hop <= 1
    reason = _reason(size, n, inner, closing, dcn, wrap, ring, torus)
    return AxisQuality(name, size, neighbours, ring, inner.hop, closing.hop, wrap, dcn, reason)


def _reason(size: int, n: int, inner: _Worst, closing: _Worst, dcn: int, wrap: bool, ring: bool, torus: Torus) -> str:
    if ring:
        return "ring" + (" (closes through wraparound links)" if wrap else "")
    parts: list[str] = []
    if dcn:
        lines = n // size
        steps = size if size > 2 else 1
        if inner.a is None and closing.a is None:
            return f"over DCN: all {steps} steps of every line cross slices"
        parts.append(f"crosses slices: {dcn / lines:g} of {steps} steps per line go over DCN")
    far_closing = closing.a is not None and closing.b is not None and closing.hop > 1
    if inner.a is not None and inner.b is not None and inner.hop > 1:
        parts.append(
            f"not neighbours: {show_location(*inner.a, torus)} -> {show_location(*inner.b, torus)} is {inner.hop} hops"
        )
        lead = "and open: the last device returns to the first"
    elif dcn:
        lead = "the ICI steps are neighbours; the last device returns to the first"
    else:
        lead = "open: consecutive devices are neighbours, but the last returns to the first"
    if far_closing:
        assert closing.a is not None and closing.b is not None
        parts.append(
            f"{lead} over {closing.hop} hops "
            f"({show_location(*closing.a, torus)} -> {show_location(*closing.b, torus)})"
            + _closing_why(closing.a[1], closing.b[1], torus)
        )
    elif dcn and inner.hop <= 1:
        parts.append("the ICI steps are neighbours")
    return "; ".join(parts)


def mesh_quality(
    names: Sequence[str], shape: Sequence[int], device_ids: Sequence[int], tpu: TpuSlice | Torus
) -> tuple[AxisQuality, ...]:
    """One :class:`AxisQuality` per axis of the row-major mesh ``device_ids``. O(N) per axis."""
    torus = tpu if isinstance(tpu, Torus) else Torus.of(tpu)
    cols = _Columns.of([torus.locate(d) for d in device_ids], torus)
    st = strides(tuple(shape))
    return tuple(axis_quality(n, s, t, cols, torus) for n, s, t in zip(names, shape, st, strict=True))


def hops(locs: Sequence[Location], torus: Torus) -> list[int]:
    """ICI hops between consecutive locations of one slice (``len(locs) - 1`` values). O(n)."""
    pairs = itertools.pairwise(locs)
    x_n, y_n, z_n = torus.dims
    wx, wy, wz = torus.wrap
    if not (wx or wy or wz):
        return [abs(a[0] - b[0]) + abs(a[1] - b[1]) + abs(a[2] - b[2]) for a, b in pairs]
    return [
        (x_n - dx if 2 * (dx := abs(a[0] - b[0])) > x_n and wx else dx)
        + (y_n - dy if 2 * (dy := abs(a[1] - b[1])) > y_n and wy else dy)
        + (z_n - dz if 2 * (dz := abs(a[2] - b[2])) > z_n and wz else dz)
        for a, b in pairs
    ]


def ring_cost(locs: Sequence[Location], torus: Torus) -> tuple[int, int, int, int]:
    """How far a cyclic order of one slice's devices is from a ring, smaller is better: (largest hop over 1,
    inner steps over 1 hop, closing step over 1 hop, total hops beyond 1); (0, 0, 0, 0) is a ring. The
    longest step comes first: it shares links with other steps, so it paces a ring collective. O(n)."""
    inner = hops(locs, torus)
    closing = torus.hop(locs[-1], locs[0]) if len(locs) > 2 else 0
    far = max(max(inner, default=0), closing)
    if far <= 1:
        return (0, 0, 0, 0)
    bad = sum(1 for h in inner if h > 1)
    excess = sum(h - 1 for h in inner if h > 1) + max(closing - 1, 0)
    return (far, bad, int(closing > 1), excess)
