"""Build the meshes a cluster spec declares: the entry point the agent, the CLI and jobs use.

``build_mesh(spec, slice, devices)`` checks a :class:`~tpuctl.mesh.model.MeshSpec` against the slice, orders the
devices (mode ``ring``: :mod:`tpuctl.mesh.ring`; mode ``jax``: :mod:`tpuctl.mesh.jaxmode`), and measures
every axis (:mod:`tpuctl.mesh.quality`). A multislice mesh is the per-slice (ICI) mesh of shape
``shape / dcn_shape`` repeated over the slices, slice index major along each axis, as JAX's
``create_hybrid_device_mesh`` lays it out; without a ``dcn_shape`` the slices go along the first axis.

Pure: no I/O, no clock. Errors are InputError (exit 2) naming the mesh, the value and what was expected.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tpuctl.errors import InputError
from tpuctl.mesh import jaxmode
from tpuctl.mesh.model import RESERVED_AXIS_NAMES, Mesh, MeshAxis, MeshOptions, MeshSpec
from tpuctl.mesh.quality import Torus, mesh_quality
from tpuctl.mesh.ring import RingOptions, ring_order
from tpuctl.messages import did_you_mean
from tpuctl.tpu.hardware import MULTISLICE_ID_STRIDE
from tpuctl.tpu.slice import Device, TpuSlice

MODES = ("ring", "jax")
RING_ONLY_OPTIONS = (
    "ring_dims", "ring_axes", "ring_bounds", "can_split_host_across_rings", "build_ring_across_rings",
    "rotate_ring_across_rings", "compat",
)  # fmt: skip
JAX_ONLY_OPTIONS = ("contiguous_submeshes", "allow_split_physical_axes")
COMMON_OPTIONS = ("dcn_shape",)  # multislice: slices per axis, in either mode
RING_OPTIONS = RING_ONLY_OPTIONS + COMMON_OPTIONS
JAX_OPTIONS = JAX_ONLY_OPTIONS + COMMON_OPTIONS
COMPAT_VALUES = ("dtensor",)


def _problem(spec_name: str, message: str, hint: str | None = None) -> InputError:
    return InputError(f"mesh {spec_name!r}: {message}", hint=hint)


def _flag(name: str, value: object, mesh: str) -> bool:
    if not isinstance(value, bool):
        raise _problem(mesh, f"option {name} is {value!r}; expected true or false")
    return value


def _ints(name: str, value: object, mesh: str, length: int, what: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise _problem(mesh, f"option {name} is {value!r}; expected {length} integers: {what}")
    if len(value) != length:
        raise _problem(mesh, f"option {name} {list(value)} has {len(value)} entries; expected {length}: {what}")
    if any(v < 1 for v in value):
        raise _problem(mesh, f"option {name} {list(value)} has an entry below 1")
    return tuple(value)


def check_axes(spec: MeshSpec, tpu: TpuSlice) -> None:
    """Names unique and not reserved, sizes positive, product = the slice's device count."""
    if not spec.axes:
        raise _problem(spec.name, "has no axes", hint="give axis sizes in order, e.g. data=4,model=4")
    seen: set[str] = set()
    for name, size in spec.axes:
        if name in seen:
            raise _problem(spec.name, f"axis {name!r} appears twice; axis names must be unique")
        if name in RESERVED_AXIS_NAMES:
            raise _problem(
                spec.name,
                f"axis name {name!r} is reserved ({', '.join(RESERVED_AXIS_NAMES)} are DTensor sharding specs)",
                hint="rename the axis",
            )
        if not name or any(c in name for c in "|,= "):
            raise _problem(spec.name, f"axis name {name!r} is empty or holds one of '|', ',', '=', ' '")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise _problem(spec.name, f"axis {name} has size {size!r}; expected a positive integer")
        seen.add(name)
    total = math.prod(spec.shape)
    if total != tpu.num_devices:
        dims = " x ".join(f"{n}={s}" for n, s in spec.axes)
        raise _problem(
            spec.name,
            f"{dims} = {total} devices, but {tpu.describe()} has {tpu.num_devices} devices",
            hint=f"make the axis sizes multiply to {tpu.num_devices}",
        )


def _options(spec: MeshSpec) -> dict[str, object]:
    if spec.mode not in MODES:
        raise _problem(spec.name, f"mode {spec.mode!r} is not a mesh mode; {did_you_mean(spec.mode, MODES)}")
    allowed = RING_OPTIONS if spec.mode == "ring" else JAX_OPTIONS
    options = dict(spec.options)
    for name in options:
        if name not in allowed:
            other = [m for m, opts in (("ring", RING_OPTIONS), ("jax", JAX_OPTIONS)) if name in opts]
            hint = f"{name} is an option of mode {other[0]}" if other else did_you_mean(name, allowed)
            raise _problem(spec.name, f"mode {spec.mode} has no option {name!r}", hint=hint)
    return options


def _given_flag(name: str, options: dict[str, object], mesh: str) -> bool | None:
    return _flag(name, options[name], mesh) if name in options else None


def _given_dcn(spec: MeshSpec) -> tuple[int, ...] | None:
    given = dict(spec.options).get("dcn_shape")
    return None if given is None else _ints("dcn_shape", given, spec.name, len(spec.axes), "slices along each axis")


def mesh_options(spec: MeshSpec) -> MeshOptions:
    """The options of ``spec`` as one typed value, checked for its mode in :class:`MeshOptions` order.

    InputError (naming the mesh) for an unknown mode, an option of the other mode or of neither, and a
    value of the wrong type. The checks that need the slice (``dcn_shape`` against ``num_slices``) are
    :func:`dcn_shape_of`'s.
    """
    o = _options(spec)
    name = spec.name
    if spec.mode == "jax":
        return MeshOptions(
            contiguous_submeshes=_given_flag("contiguous_submeshes", o, name),
            allow_split_physical_axes=_given_flag("allow_split_physical_axes", o, name),
            dcn_shape=_given_dcn(spec),
        )
    ring_dims = o.get("ring_dims")
    if ring_dims is not None and (isinstance(ring_dims, bool) or not isinstance(ring_dims, int)):
        raise _problem(name, f"option ring_dims is {ring_dims!r}; expected an integer")
    axes = o.get("ring_axes")
    if axes is not None and (not isinstance(axes, (list, tuple)) or not all(isinstance(a, str) for a in axes)):
        raise _problem(name, f"option ring_axes is {axes!r}; expected a list like [core, x, y, z]")
    bounds = o.get("ring_bounds")
    compat = o.get("compat")
    if compat is not None and compat not in COMPAT_VALUES:
        raise _problem(name, f"option compat is {compat!r}; {did_you_mean(str(compat), COMPAT_VALUES)}")
    return MeshOptions(  # keyword arguments are evaluated in this order: the checks' order
        ring_dims=ring_dims,
        ring_axes=tuple(axes) if axes is not None else None,
        ring_bounds=_ints("ring_bounds", bounds, name, 4, "ring extent along x, y, z, core")
        if bounds is not None
        else None,
        can_split_host_across_rings=_given_flag("can_split_host_across_rings", o, name),
        build_ring_across_rings=_given_flag("build_ring_across_rings", o, name),
        rotate_ring_across_rings=_given_flag("rotate_ring_across_rings", o, name),
        compat=str(compat) if compat is not None else None,
        dcn_shape=_given_dcn(spec),
    )


def ring_options(spec: MeshSpec) -> RingOptions:
    """The ring options of a mode-``ring`` spec, type-checked, the unset ones at DTensor's defaults."""
    m = mesh_options(spec)
    return RingOptions(
        ring_dims=m.ring_dims,
        ring_axes=m.ring_axes,
        ring_bounds=m.ring_bounds,
        can_split_host_across_rings=m.can_split_host_across_rings is not False,
        build_ring_across_rings=bool(m.build_ring_across_rings),
        rotate_ring_across_rings=bool(m.rotate_ring_across_rings),
        compat=m.compat,
    )


def dcn_shape_of(spec: MeshSpec, tpu: TpuSlice) -> tuple[int, ...]:
    """Slices along each axis: the spec's ``dcn_shape``, or all slices on the first axis. () for one slice."""
    dcn = _given_dcn(spec)
    n = len(spec.axes)
    if dcn is None:
        if tpu.num_slices == 1:
            return ()
        first_name, first = spec.axes[0]
        if first % tpu.num_slices:
            raise _problem(
                spec.name,
                f"the {tpu.num_slices} slices go along the first axis by default, but {first_name}={first} "
                f"does not split into {tpu.num_slices}",
                hint="give dcn_shape: slices per axis, e.g. " + ",".join(["1"] * (n - 1) + [str(tpu.num_slices)]),
            )
        return (tpu.num_slices, *([1] * (n - 1)))
    if math.prod(dcn) != tpu.num_slices:
        raise _problem(
            spec.name,
            f"dcn_shape {list(dcn)} makes {math.prod(dcn)} slices, but the cluster has {tpu.num_slices}",
            hint="the dcn_shape entries multiply to num_slices",
        )
    for (name, size), d in zip(spec.axes, dcn, strict=True):
        if size % d:
            raise _problem(spec.name, f"dcn_shape {list(dcn)}: axis {name}={size} does not split into {d} slices")
    return dcn if tpu.num_slices > 1 else ()


def _slice_groups(devices: Sequence[Device], tpu: TpuSlice) -> list[list[Device]]:
    groups = jaxmode.group_by_slice(devices)
    if len(groups) != tpu.num_slices or any(len(g) != tpu.devices_per_slice for g in groups):
        sizes = [len(g) for g in groups]
        raise InputError(
            f"the devices form {len(groups)} slice(s) of {sizes} devices; {tpu.describe()} has "
            f"{tpu.num_slices} of {tpu.devices_per_slice}"
        )
    return groups


def _jax_order(
    spec: MeshSpec, tpu: TpuSlice, devices: Sequence[Device], ici: tuple[int, ...], dcn: tuple[int, ...]
) -> list[int]:
    options = mesh_options(spec)
    contiguous = bool(options.contiguous_submeshes)
    split = bool(options.allow_split_physical_axes)
    if not dcn:
        return jaxmode.create_device_mesh(
            ici, devices, tpu.device_kind, contiguous_submeshes=contiguous, allow_split_physical_axes=split
        )
    if contiguous:
        raise InputError(
            "contiguous_submeshes does not apply to a multislice mesh (JAX's create_hybrid_device_mesh has no "
            "such option)",
            hint="drop contiguous_submeshes",
        )
    _slice_groups(devices, tpu)
    return jaxmode.create_hybrid_device_mesh(ici, dcn, devices, tpu.device_kind, allow_split_physical_axes=split)


def _ring_order(spec: MeshSpec, tpu: TpuSlice, ici: tuple[int, ...], dcn: tuple[int, ...]) -> list[int]:
    torus = Torus(tpu.topology, tpu.wraparound, tpu.devices_per_chip)
    local = ring_order(ici, torus, tpu.chips_per_host_bounds, ring_options(spec))
    if not dcn:
        return local
    per_slice = [[MULTISLICE_ID_STRIDE * (s + 1) + i for i in local] for s in range(tpu.num_slices)]
    return jaxmode.block(per_slice, ici, dcn)


def mesh_order(spec: MeshSpec, tpu: TpuSlice, devices: Sequence[Device] | None = None) -> tuple[list[int], str]:
    """(device ids in row-major mesh order, algorithm name): the work the peers do, no quality figures."""
    check_axes(spec, tpu)
    dcn = dcn_shape_of(spec, tpu)
    ici = tuple(s // d for s, d in zip(spec.shape, dcn, strict=True)) if dcn else spec.shape
    try:
        if spec.mode == "jax":
            return _jax_order(spec, tpu, tpu.devices if devices is None else devices, ici, dcn), "jax"
        ids = _ring_order(spec, tpu, ici, dcn)
    except InputError as exc:
        if exc.message.startswith("mesh "):
            raise
        raise _problem(spec.name, exc.message, exc.hint) from exc
    return ids, "ring:dtensor" if mesh_options(spec).compat == "dtensor" else "ring"


def build_mesh(spec: MeshSpec, tpu: TpuSlice, devices: Sequence[Device] | None = None) -> Mesh:
    """The mesh ``spec`` declares on ``tpu``, with its quality figures.

    ``devices``: the cluster's devices in the runtime's list order (task-major, local ordinal minor), as
    the merge found them; default: the slice model's own list. Ring mode places devices by location;
    JAX mode follows JAX, whose device-kind handlers depend on that order.
    """
    ids, algorithm = mesh_order(spec, tpu, devices)
    if devices is not None:
        known = {d.id for d in devices}
        missing = sorted(set(ids) - known)
        if missing or len(known) != len(ids):
            raise _problem(
                spec.name,
                f"its {len(ids)} devices are not the cluster's {len(known)} devices"
                + (f" (e.g. id {missing[0]} is not in the cluster)" if missing else ""),
            )
    dcn = dcn_shape_of(spec, tpu)
    quality = mesh_quality(spec.axis_names, spec.shape, ids, tpu)
    axes = tuple(MeshAxis(n, s) for n, s in spec.axes)
    return Mesh(spec.name, axes, tuple(ids), algorithm, dcn, quality)


def build_declared_meshes(specs: Sequence[MeshSpec], tpu: TpuSlice, devices: Sequence[Device]) -> tuple[Mesh, ...]:
    """Every mesh of a cluster spec, in spec order, for the device mapping (``build_mapping(meshes=...)``).

    ``devices``: every device of the cluster in task-major, local-ordinal order, as the merge placed them
    (``tpuctl.mapping.model.merged_devices(slice, merged)``). Raises InputError naming the first bad mesh.
    """
    names = [s.name for s in specs]
    for name in names:
        if names.count(name) > 1:
            raise _problem(name, "is declared twice; mesh names must be unique")
    return tuple(build_mesh(s, tpu, devices) for s in specs)
