"""The meshes section of a spec: the checks that read ``meshes:`` into :class:`~tpuctl.mesh.model.MeshSpec` values.

Each mesh is checked as written (name, shape, mode, options, against the slice when it is known), then
built on the slice with :func:`tpuctl.mesh.build.build_mesh`, so that ``tpuctl validate`` refuses what
``tpuctl init`` would. :func:`tpuctl.spec.model.check_spec` calls ``check_meshes`` for the ``meshes`` key.
"""

from __future__ import annotations

import math
import re
from typing import cast

from tpuctl.errors import InputError
from tpuctl.mesh.build import COMMON_OPTIONS as COMMON_MESH_OPTIONS
from tpuctl.mesh.build import COMPAT_VALUES
from tpuctl.mesh.build import JAX_ONLY_OPTIONS as JAX_OPTIONS
from tpuctl.mesh.build import MODES as MESH_MODES
from tpuctl.mesh.build import RING_ONLY_OPTIONS as RING_OPTIONS
from tpuctl.mesh.model import RESERVED_AXIS_NAMES, MeshSpec
from tpuctl.messages import did_you_mean, plural
from tpuctl.spec.checker import MAX_NAME, Checker, Node, described, join_path
from tpuctl.tpu.slice import TpuSlice

# Option names, modes and reserved axes come from the mesh builder, so the spec accepts exactly what it builds.
MESH_KEYS = ("name", "shape", "mode", "options")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# --- meshes ----------------------------------------------------------------------------------------


def _devices_text(tpu: TpuSlice) -> str:
    per_chip = "1 device" if tpu.devices_per_chip == 1 else f"{tpu.devices_per_chip} devices"
    if tpu.num_slices > 1:
        return (
            f"{tpu.accelerator_type} x {tpu.num_slices} has {tpu.num_devices} devices "
            f"({tpu.num_slices} slices of {tpu.chips_per_slice} chips, {per_chip} per chip)"
        )
    return f"{tpu.accelerator_type} has {tpu.num_devices} devices ({tpu.chips_per_slice} chips, {per_chip} per chip)"


def _shape(ck: Checker, node: Node, path: str, tpu: TpuSlice | None) -> tuple[tuple[str, int], ...] | None:
    expected = "axis sizes in order, major first, like {data: 4, model: 4}"
    if node.kind != "mapping":
        ck.add(node, path, f"got {described(node)}; expected {expected}")
        return None
    entries = ck.entries(node, path, what="axis name")
    if not entries:
        ck.add(node, path, f"has no axes; expected {expected}")
        return None
    axes: list[tuple[str, int]] = []
    failed = len(entries) != len(node.entries)
    for name, key, value in entries:
        axis = join_path(path, name)
        if not _IDENT_RE.match(name) or len(name) > MAX_NAME:
            ck.add(key, axis, "is not an axis name; expected letters, digits and '_', not starting with a digit")
            failed = True
        elif name in RESERVED_AXIS_NAMES:
            reserved = ", ".join(RESERVED_AXIS_NAMES)
            ck.add(key, axis, f"is reserved ({reserved} are DTensor sharding specs); expected another axis name")
            failed = True
        size = ck.integer(value, axis, 1)
        if size is None:
            failed = True
        else:
            axes.append((name, size))
    if failed:
        return None
    total = math.prod(size for _, size in axes)
    if tpu is not None and total != tpu.num_devices:
        dims = "x".join(str(size) for _, size in axes)
        ck.add(
            node, path,
            f"{dims} = {total} devices, but {_devices_text(tpu)}; expected sizes whose product is {tpu.num_devices}",
        )  # fmt: skip
        return None
    return tuple(axes)


_PHYSICAL_AXES = ("core", "x", "y", "z")


def _int_list(ck: Checker, node: Node, path: str, length: int, expected: str) -> tuple[int, ...] | None:
    items = ck.sequence(node, path, expected)
    if items is None:
        return None
    values = [ck.integer(item, f"{path}[{i}]", 1) for i, item in enumerate(items)]
    if any(v is None for v in values):
        return None
    if len(values) != length:
        ck.add(node, path, f"has {plural(len(values), 'entry')}; expected {expected}")
        return None
    return tuple(cast(list[int], values))


def _option_value(
    ck: Checker, name: str, node: Node, path: str, axes: tuple[tuple[str, int], ...] | None, tpu: TpuSlice | None
) -> object:
    """A mesh option's value (lists as tuples), or None after a problem."""
    if name == "ring_dims":
        n = len(axes) if axes else 2**31
        return ck.integer(node, path, -n, n)
    if name == "ring_axes":
        expected = "an ordering of core, x, y, z, fastest-varying first, like [core, x, y, z]"
        items = ck.sequence(node, path, expected)
        if items is None:
            return None
        names = [ck.string(item, f"{path}[{i}]", "core, x, y or z") for i, item in enumerate(items)]
        if None in names:
            return None
        if sorted(cast(list[str], names)) != sorted(_PHYSICAL_AXES):
            ck.add(node, path, f"{names} is not {expected}")
            return None
        return tuple(names)
    if name == "ring_bounds":
        bounds = _int_list(ck, node, path, 4, "4 positive integers: ring extent along x, y, z, core")
        if bounds is None or tpu is None:
            return bounds
        physical = (*tpu.topology, tpu.devices_per_chip)
        if any(b > p or p % b for b, p in zip(bounds, physical, strict=True)):
            ck.add(
                node, path,
                f"{list(bounds)} does not divide the slice's bounds {list(physical)} (x, y, z, core); "
                "expected each entry to divide the matching bound",
            )  # fmt: skip
            return None
        return bounds
    if name == "dcn_shape":
        return _dcn_shape(ck, node, path, axes, tpu)
    if name == "compat":
        value = ck.string(node, path, "dtensor")
        if value is not None and value not in COMPAT_VALUES:
            ck.add(node, path, f"{value!r} is not a compatibility mode; expected dtensor (reproduce DTensor exactly)")
            return None
        return value
    return ck.boolean(node, path)


def _dcn_shape(
    ck: Checker, node: Node, path: str, axes: tuple[tuple[str, int], ...] | None, tpu: TpuSlice | None
) -> tuple[int, ...] | None:
    """Slices along each axis (JAX's ``dcn_mesh_shape``): a list, one per axis, or {axis: slices}."""
    if axes is None:
        return None
    names = [a for a, _ in axes]
    expected = f"slices per axis: a list of {len(axes)} integers, or a mapping like {{{names[0]}: 2}}"
    if node.kind == "mapping":
        counts = dict.fromkeys(names, 1)
        for axis, key, value in ck.entries(node, path, what="axis name"):
            if axis not in counts:
                ck.add(key, join_path(path, axis), "is not an axis of this mesh; " + did_you_mean(axis, names))
                return None
            count = ck.integer(value, join_path(path, axis), 1)
            if count is None:
                return None
            counts[axis] = count
        dcn = tuple(counts.values())
    else:
        found = _int_list(ck, node, path, len(axes), expected)
        if found is None:
            return None
        dcn = found
    slices = tpu.num_slices if tpu is not None else math.prod(dcn)
    expected = f"expected slices per axis, multiplying to num_slices ({slices}), each dividing its axis"
    if math.prod(dcn) != slices:
        ck.add(node, path, f"{list(dcn)} makes {math.prod(dcn)} slices, but num_slices is {slices}; {expected}")
        return None
    for (axis, size), count in zip(axes, dcn, strict=True):
        if size % count:
            ck.add(node, path, f"{list(dcn)}: axis {axis} ({size}) does not split into {count} slices; {expected}")
            return None
    return dcn


def _options(
    ck: Checker, node: Node, path: str, mode: str | None, axes: tuple[tuple[str, int], ...] | None,
    tpu: TpuSlice | None,
) -> tuple[tuple[str, object], ...] | None:  # fmt: skip
    every = RING_OPTIONS + JAX_OPTIONS + COMMON_MESH_OPTIONS
    if node.kind != "mapping":
        ck.add(node, path, f"got {described(node)}; expected a mapping of mesh options")
        return None
    out: list[tuple[str, object]] = []
    failed = False
    for name, key, value in ck.entries(node, path):
        option = join_path(path, name)
        if name not in every:
            ck.add(key, option, "unknown option; " + did_you_mean(name, every))
            failed = True
        elif mode is not None and name not in (RING_OPTIONS if mode == "ring" else JAX_OPTIONS) + COMMON_MESH_OPTIONS:
            other = "jax" if mode == "ring" else "ring"
            ck.add(key, option, f"is an option of mode {other}, but this mesh has mode {mode}; expected mode: {other}")
            failed = True
        else:
            parsed = _option_value(ck, name, value, option, axes, tpu)
            failed |= parsed is None
            out.append((name, parsed))
    return None if failed else tuple(out)


def _mesh_build_problem(mesh: MeshSpec, tpu: TpuSlice) -> str | None:
    """Build the mesh on the slice now, so that `validate` reports what `init` would refuse."""
    from tpuctl.mesh.build import build_mesh

    try:
        build_mesh(mesh, tpu)
    except InputError as exc:
        return exc.message + (f"; {exc.hint}" if exc.hint else "")
    return None


def check_meshes(ck: Checker, node: Node, tpu: TpuSlice | None) -> tuple[MeshSpec, ...] | None:
    items = ck.sequence(node, "meshes", "a list of meshes, each with name and shape")
    if items is None:
        return None
    meshes: list[MeshSpec] = []
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        path = f"meshes[{index}]"
        required = {"name": "a mesh name like dp_mp", "shape": "axis sizes in order, like {data: 4, model: 4}"}
        keys = ck.mapping(item, path, MESH_KEYS, required)
        if keys is None:
            continue
        name = ck.string(keys["name"], f"{path}.name", "a mesh name like dp_mp") if "name" in keys else None
        if name is not None and (not _IDENT_RE.match(name) or len(name) > MAX_NAME):
            ck.add(keys["name"], f"{path}.name", f"{name!r} is not a mesh name; expected letters, digits and '_'")
            name = None
        elif name is not None and name in first:
            ck.add(keys["name"], f"{path}.name", f"{name!r} repeats meshes[{first[name]}]; expected unique names")
            name = None
        elif name is not None:
            first[name] = index
        axes = _shape(ck, keys["shape"], f"{path}.shape", tpu) if "shape" in keys else None
        mode = ck.choice(keys["mode"], f"{path}.mode", MESH_MODES, "a mesh mode") if "mode" in keys else "ring"
        options = _options(ck, keys["options"], f"{path}.options", mode, axes, tpu) if "options" in keys else ()
        if name is not None and axes is not None and mode is not None and options is not None:
            mesh = MeshSpec(name, axes, mode, options)
            if tpu is not None and (problem := _mesh_build_problem(mesh, tpu)):
                ck.add(item, path, problem)
                continue
            meshes.append(mesh)
    return tuple(meshes) if len(meshes) == len(items) else None
