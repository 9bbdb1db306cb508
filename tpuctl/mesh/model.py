"""The mesh value: named axes over an ordered list of device ids, and how good each axis is.

A :class:`Mesh` is what ``build_mesh`` returns and what the device mapping stores: the axes (major to
minor), the global device ids in row-major mesh order, the algorithm that ordered them, the DCN factor
of each axis in a multislice, and one :class:`AxisQuality` per axis. Pure values, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

RESERVED_AXIS_NAMES = ("unsharded", "match", "any", "scalar")
"""DTensor sharding specs: an axis of that name makes a layout ambiguous (``Mesh.from_string`` refuses)."""


@dataclass(frozen=True)
class MeshAxis:
    name: str
    size: int


@dataclass(frozen=True)
class AxisQuality:
    """How the devices along one mesh axis sit on the ICI network (every line of the axis, worst case).

    A "hop" is the number of ICI links between two chips (Manhattan distance, through wraparound links
    where the slice has them); the two cores of one chip are 0 hops apart. Steps between slices go over
    DCN and are counted in ``dcn_steps``, not in the hop figures.
    """

    axis: str
    size: int
    neighbours: bool
    """Every pair of consecutive devices along the axis is at most one ICI hop apart."""
    ring: bool
    """``neighbours`` and the last device of every line is one hop from the first: the axis closes."""
    max_hop: int
    """Largest hop between consecutive devices (the closing step excluded)."""
    closing_hop: int
    """Largest hop from the last device of a line back to its first (0 for size 1 and 2)."""
    wraparound: bool
    """Some step of the axis uses a wraparound link."""
    dcn_steps: int
    """Steps (closing ones included) between devices of different slices, over all lines."""
    reason: str
    """One line saying why the axis is or is not a ring."""


@dataclass(frozen=True)
class Mesh:
    """A named logical mesh over a cluster's devices."""

    name: str
    axes: tuple[MeshAxis, ...]
    device_ids: tuple[int, ...]
    """Global device ids (``jax.Device.id``) in row-major mesh order."""
    algorithm: str = ""
    """``ring`` (tpuctl's ring order), ``ring:dtensor`` (DTensor's exactly) or ``jax``."""
    dcn_shape: tuple[int, ...] = ()
    """Slices along each axis in a multislice (empty for one slice); axis i spans dcn[i] * ici[i]."""
    quality: tuple[AxisQuality, ...] = ()
    """One entry per axis (empty when not computed)."""

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.size for a in self.axes)

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ici_shape(self) -> tuple[int, ...]:
        """Axis sizes within one slice."""
        if not self.dcn_shape:
            return self.shape
        return tuple(s // d for s, d in zip(self.shape, self.dcn_shape, strict=True))

    def grid(self) -> Any:
        """The device ids as nested lists in the mesh's shape (a flat list for one axis)."""
        return nest(list(self.device_ids), self.shape)

    def positions(self) -> dict[int, int]:
        """Device id -> its row-major position in the mesh."""
        return {d: i for i, d in enumerate(self.device_ids)}

    def axis_quality(self, name: str) -> AxisQuality:
        for q in self.quality:
            if q.axis == name:
                return q
        raise KeyError(name)


def nest(flat: list[Any], shape: tuple[int, ...]) -> Any:
    """Row-major nesting of ``flat`` into lists of ``shape``."""
    out: Any = flat
    for size in reversed(shape[1:]):
        out = [out[i : i + size] for i in range(0, len(out), size)]
    return out


def strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides (in elements)."""
    out = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        out[i] = out[i + 1] * shape[i + 1]
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class MeshOptions:
    """A mesh's mode options, typed: what ``mesh plan``'s flags fill and the builder reads.

    ``None`` means not given (the mode's default applies). :class:`MeshSpec` keeps the options as
    written, ``(name, value)`` pairs, because a spec may hold any value there and its checker reports
    each one; :meth:`pairs` is that form, the builder's ``mesh_options`` the way back, type-checked.
    Field order is the order the options are checked and reported in.
    """

    ring_dims: int | None = None
    """ring: -k rings over the last k axes, +k over the first k."""
    ring_axes: tuple[str, ...] | None = None
    """ring: core, x, y, z in iteration order, fastest first."""
    ring_bounds: tuple[int, ...] | None = None
    """ring: ring extent along x, y, z, core."""
    can_split_host_across_rings: bool | None = None
    """ring: may a ring take part of a host (default yes)."""
    build_ring_across_rings: bool | None = None
    rotate_ring_across_rings: bool | None = None
    compat: str | None = None
    """ring: ``"dtensor"`` for DTensor's ``create_tpu_mesh`` order exactly."""
    contiguous_submeshes: bool | None = None
    """jax: each host's devices form a contiguous block."""
    allow_split_physical_axes: bool | None = None
    """jax: split physical axes to fit the shape."""
    dcn_shape: tuple[int, ...] | None = None
    """Multislice, either mode: slices along each axis."""

    def pairs(self) -> tuple[tuple[str, object], ...]:
        """The options given, as :attr:`MeshSpec.options` holds them (field order, unset ones left out)."""
        return tuple((f.name, v) for f in fields(self) if (v := getattr(self, f.name)) is not None)


@dataclass(frozen=True)
class MeshSpec:
    """A named logical mesh to build once the topology is known (built later, validated here)."""

    name: str
    axes: tuple[tuple[str, int], ...]
    """(axis name, size) in order, major first."""
    mode: str = "ring"
    """``ring``: DTensor's ring-ordered TPU mesh; ``jax``: JAX's ``create_device_mesh`` algorithm."""
    options: tuple[tuple[str, object], ...] = ()
    """Mode options; lists are stored as tuples."""

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(size for _, size in self.axes)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def option(self, name: str, default: object = None) -> object:
        return dict(self.options).get(name, default)
