"""``tpuctl mesh plan``: build a logical mesh offline and show its device grid and quality."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tpuctl.cli.app import SuggestingGroup
from tpuctl.cli.common import WholeNumber
from tpuctl.cli.output import dumps, emit, format_options, out_option
from tpuctl.cli.slice_options import SliceRequest, slice_options
from tpuctl.errors import InputError
from tpuctl.tpu.slice import TpuSlice

if TYPE_CHECKING:
    from tpuctl.mesh.model import MeshOptions

F = TypeVar("F", bound=Callable[..., Any])
_AXIS_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(\d+)$", re.ASCII)


def parse_shape(text: str) -> tuple[tuple[str, int], ...]:
    """``data=16,model=4`` -> (("data", 16), ("model", 4))."""
    axes = []
    for part in text.split(","):
        match = _AXIS_RE.match(part.strip())
        if match is None or int(match.group(2)) < 1:
            raise InputError(
                f"--shape {text!r}: {part.strip()!r} is not NAME=SIZE",
                hint="name each axis with its size, major first: --shape data=16,model=4",
            )
        axes.append((match.group(1), int(match.group(2))))
    return tuple(axes)


def parse_ints(option: str, text: str, expected: str) -> tuple[int, ...]:
    parts = [v.strip() for v in text.replace("x", ",").split(",")]
    if not all(_ascii_digits(p[1:] if p[:1] in ("-", "+") else p) for p in parts):
        # int() alone would read any script's digits ('\u0661' is 1) and '1_0' as 10
        raise InputError(f"{option} {text!r} is not a list of integers", hint=f"expected {expected}")
    return tuple(int(p) for p in parts)


def _ascii_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def parse_dcn(text: str, axes: tuple[tuple[str, int], ...]) -> tuple[int, ...]:
    """``2,1`` (one per axis) or ``data=2`` (named axes; the others 1)."""
    if "=" not in text:
        return parse_ints("--dcn-shape", text, "slices per axis, e.g. 2,1")
    counts = dict.fromkeys((name for name, _ in axes), 1)
    for name, size in parse_shape(text):
        if name not in counts:
            raise InputError(
                f"--dcn-shape names axis {name!r}, which the mesh does not have", hint="axes: " + ", ".join(counts)
            )
        counts[name] = size
    return tuple(counts.values())


@dataclass(frozen=True, kw_only=True)
class MeshFlags:
    """What ``mesh plan``'s mode-option flags said, as typed; :meth:`options` parses the text ones.

    Parsing waits for :meth:`options` so that a bad slice or ``--shape`` is still reported first.
    """

    dcn_shape: str | None = None
    ring_dims: int | None = None
    ring_axes: str | None = None
    ring_bounds: str | None = None
    split_hosts: bool | None = None
    build_ring_across_rings: bool | None = None
    rotate_ring_across_rings: bool | None = None
    compat: str | None = None
    contiguous_submeshes: bool | None = None
    allow_split_physical_axes: bool | None = None

    def options(self, axes: tuple[tuple[str, int], ...]) -> MeshOptions:
        """The options the user set (unset ones keep the mode's defaults); the builder refuses a mode's
        option on the other mode, naming it."""
        from tpuctl.mesh.model import MeshOptions

        return MeshOptions(
            ring_dims=self.ring_dims,
            ring_axes=tuple(a.strip() for a in self.ring_axes.split(",")) if self.ring_axes else None,
            ring_bounds=parse_ints("--ring-bounds", self.ring_bounds, "x,y,z,core, e.g. 2,2,1,1")
            if self.ring_bounds
            else None,
            can_split_host_across_rings=self.split_hosts,
            build_ring_across_rings=self.build_ring_across_rings or None,
            rotate_ring_across_rings=self.rotate_ring_across_rings or None,
            compat=self.compat,
            contiguous_submeshes=self.contiguous_submeshes or None,
            allow_split_physical_axes=self.allow_split_physical_axes or None,
            dcn_shape=parse_dcn(self.dcn_shape, axes) if self.dcn_shape is not None else None,
        )


def mesh_option_flags(func: F) -> F:
    """Add the mode-option flags (``--dcn-shape``, ``--ring-*``, ``--compat``, ``--contiguous-submeshes``,
    ...); the command gets them as one ``flags: MeshFlags`` argument."""
    names = [f.name for f in dataclasses.fields(MeshFlags)]

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        flags = MeshFlags(**{name: kwargs.pop(name) for name in names})
        return func(*args, flags=flags, **kwargs)

    options = [
        click.option(
            "--dcn-shape", metavar="N,N|AXIS=N", help="Multislice: slices along each axis (default: all on the first)."
        ),
        click.option(
            "--ring-dims",
            type=WholeNumber(),
            metavar="N",
            help="ring: -k rings over the last k axes, +k the first k (default 1-axes).",
        ),
        click.option("--ring-axes", metavar="A,B,C,D", help="ring: core,x,y,z in iteration order, fastest first."),
        click.option("--ring-bounds", metavar="X,Y,Z,CORE", help="ring: ring extent along x, y, z, core."),
        click.option(
            "--split-hosts/--whole-hosts",
            "split_hosts",
            default=None,
            help="ring: may a ring take part of a host (default yes).",
        ),
        click.option(
            "--build-ring-across-rings",
            is_flag=True,
            default=None,
            help="ring: also order the k-th devices of all rings as a ring.",
        ),
        click.option("--rotate-ring-across-rings", is_flag=True, default=None, help="ring: that ring column-major."),
        click.option("--compat", type=click.Choice(["dtensor"]), help="ring: DTensor's create_tpu_mesh order exactly."),
        click.option(
            "--contiguous-submeshes", is_flag=True, default=None, help="jax: each host's devices a contiguous block."
        ),
        click.option(
            "--allow-split-physical-axes", is_flag=True, default=None, help="jax: split physical axes to fit the shape."
        ),
    ]
    wrapped: Any = command
    for option in reversed(options):
        wrapped = option(wrapped)
    return wrapped  # type: ignore[no-any-return]


@click.group("mesh", cls=SuggestingGroup)
def mesh() -> None:
    """Plan logical device meshes (ring order, JAX order, quality)."""


@mesh.command("plan")
@slice_options
@click.option("--device-kind", metavar="KIND", help='device_kind the devices report (v5p: "TPU v5" or "TPU v5p").')
@click.option(
    "--shape", "-s", "shape_text", required=True, metavar="AXIS=N,...", help="Axes, major first: data=16,model=4."
)
@click.option("--name", metavar="NAME", help="Mesh name (default: the axis names joined by _).")
@click.option("--mode", type=click.Choice(["ring", "jax"]), default="ring", show_default=True, help="Device order.")
@mesh_option_flags
@click.option(
    "--cells", type=click.Choice(["id", "coords", "task"]), default="id", show_default=True, help="Grid cells."
)
@format_options(
    "text: the grid and quality tables; json: one document (schema tpuctl.mesh/v1).", out_is_the_document=True
)
@out_option("the plan")
def plan(
    slice_request: SliceRequest,
    device_kind: str | None,
    shape_text: str,
    name: str | None,
    mode: str,
    flags: MeshFlags,
    cells: str,
    fmt: str,
    out: str | None,
) -> None:
    """Build a mesh on a slice without a cluster: its device grid, per-axis quality, DTensor strings.

    \b
      tpuctl mesh plan --accelerator v5p-128 --shape data=16,model=4
      tpuctl mesh plan -a v4-32 --shape data=2,model=8 --mode jax --allow-split-physical-axes
      tpuctl mesh plan -a v5litepod-16 --num-slices 2 --shape data=8,model=4 --dcn-shape 2,1 -o json
      tpuctl mesh plan -a v4-32 --shape data=4,model=4 --json --out plan.json

    \b
    Quality, per axis: NEIGHBOURS (consecutive devices one ICI hop apart), RING (and the last device
    one hop from the first, through wraparound links where the slice has them), MAX HOP, CLOSING HOP,
    and why. --format json: {axes: [{name, size}], device_ids (nested in the mesh's shape), quality,
    dtensor_mesh, dtensor_host_mesh, local_device_ids, ...}.

    Exit codes: 0 planned, 2 bad input (slice, shape, options, or a mesh the slice cannot have).
    """
    from tpuctl.mesh.build import build_mesh
    from tpuctl.mesh.model import MeshSpec
    from tpuctl.mesh.report import mesh_document, mesh_text

    tpu = _slice(slice_request, device_kind)
    axes = parse_shape(shape_text)
    options = flags.options(axes)
    spec = MeshSpec(name or "_".join(a for a, _ in axes), axes, mode, options.pairs())
    built = build_mesh(spec, tpu)
    task_devices = [[d.id for d in tpu.devices_of_task(t)] for t in range(tpu.num_hosts)]
    if fmt == "json":
        emit(dumps(mesh_document(built, tpu, task_devices)), out)
    else:
        emit(mesh_text(built, tpu, task_devices, cells), out)


def _slice(request: SliceRequest, device_kind: str | None) -> TpuSlice:
    tpu = dataclasses.replace(request, device_kind=device_kind).resolve()
    if tpu is None:
        raise InputError(
            "name the slice: --accelerator, or --generation with --topology",
            hint="e.g. tpuctl mesh plan --accelerator v5p-128 --shape data=16,model=4",
        )
    return tpu
