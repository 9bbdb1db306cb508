"""``tpuctl mesh plan``: build a logical mesh offline and show its device grid and quality."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import click

from tpuctl.cli.output import emit
from tpuctl.cli.slice_options import SliceRequest, slice_options
from tpuctl.errors import InputError
from tpuctl.tpu.slice import TpuSlice

_AXIS_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(\d+)$")


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
    try:
        values = tuple(int(v) for v in text.replace("x", ",").split(","))
    except ValueError:
        raise InputError(f"{option} {text!r} is not a list of integers", hint=f"expected {expected}") from None
    return values


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


def _plan_options(
    axes: tuple[tuple[str, int], ...], dcn: str | None, ring: dict[str, Any], jax: dict[str, Any]
) -> tuple[tuple[str, object], ...]:
    """The options the user set (unset ones keep the mode's defaults); the builder refuses a mode's
    option on the other mode, naming it."""
    chosen = {k: v for k, v in {**ring, **jax}.items() if v is not None and v is not False}
    if ring.get("can_split_host_across_rings") is not None:
        chosen["can_split_host_across_rings"] = ring["can_split_host_across_rings"]
    if dcn is not None:
        chosen["dcn_shape"] = parse_dcn(dcn, axes)
    return tuple(chosen.items())


@click.group("mesh")
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
@click.option(
    "--dcn-shape", metavar="N,N|AXIS=N", help="Multislice: slices along each axis (default: all on the first)."
)
@click.option(
    "--ring-dims", type=int, metavar="N", help="ring: -k rings over the last k axes, +k the first k (default 1-axes)."
)
@click.option("--ring-axes", metavar="A,B,C,D", help="ring: core,x,y,z in iteration order, fastest first.")
@click.option("--ring-bounds", metavar="X,Y,Z,CORE", help="ring: ring extent along x, y, z, core.")
@click.option(
    "--split-hosts/--whole-hosts",
    "split_hosts",
    default=None,
    help="ring: may a ring take part of a host (default yes).",
)
@click.option(
    "--build-ring-across-rings",
    is_flag=True,
    default=None,
    help="ring: also order the k-th devices of all rings as a ring.",
)
@click.option("--rotate-ring-across-rings", is_flag=True, default=None, help="ring: that ring column-major.")
@click.option("--compat", type=click.Choice(["dtensor"]), help="ring: DTensor's create_tpu_mesh order exactly.")
@click.option("--contiguous-submeshes", is_flag=True, default=None, help="jax: each host's devices a contiguous block.")
@click.option(
    "--allow-split-physical-axes", is_flag=True, default=None, help="jax: split physical axes to fit the shape."
)
@click.option(
    "--cells", type=click.Choice(["id", "coords", "task"]), default="id", show_default=True, help="Grid cells."
)
@click.option("--format", "-f", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--output", "-o", metavar="FILE", help="Write to FILE (atomically) instead of stdout.")
def plan(
    slice_request: SliceRequest,
    device_kind: str | None,
    shape_text: str,
    name: str | None,
    mode: str,
    dcn_shape: str | None,
    ring_dims: int | None,
    ring_axes: str | None,
    ring_bounds: str | None,
    split_hosts: bool | None,
    build_ring_across_rings: bool | None,
    rotate_ring_across_rings: bool | None,
    compat: str | None,
    contiguous_submeshes: bool | None,
    allow_split_physical_axes: bool | None,
    cells: str,
    fmt: str,
    output: str | None,
) -> None:
    """Build a mesh on a slice without a cluster: its device grid, per-axis quality, DTensor strings.

    \b
      tpuctl mesh plan --accelerator v5p-128 --shape data=16,model=4
      tpuctl mesh plan -a v4-32 --shape data=2,model=8 --mode jax --allow-split-physical-axes
      tpuctl mesh plan -a v5litepod-16 --num-slices 2 --shape data=8,model=4 --dcn-shape 2,1 -f json

    \b
    Quality, per axis: NEIGHBOURS (consecutive devices one ICI hop apart), RING (and the last device
    one hop from the first, through wraparound links where the slice has them), MAX HOP, CLOSING HOP,
    and why. --format json: {axes: [{name, size}], device_ids (nested in the mesh's shape), quality,
    dtensor_mesh, dtensor_host_mesh, local_device_ids, ...}.
    """
    from tpuctl.mesh.build import build_mesh
    from tpuctl.mesh.model import MeshSpec
    from tpuctl.mesh.report import mesh_document, mesh_text

    tpu = _slice(slice_request, device_kind)
    axes = parse_shape(shape_text)
    ring = {
        "ring_dims": ring_dims,
        "ring_axes": tuple(a.strip() for a in ring_axes.split(",")) if ring_axes else None,
        "ring_bounds": parse_ints("--ring-bounds", ring_bounds, "x,y,z,core, e.g. 2,2,1,1") if ring_bounds else None,
        "can_split_host_across_rings": split_hosts,
        "build_ring_across_rings": build_ring_across_rings,
        "rotate_ring_across_rings": rotate_ring_across_rings,
        "compat": compat,
    }
    jax = {"contiguous_submeshes": contiguous_submeshes, "allow_split_physical_axes": allow_split_physical_axes}
    options = _plan_options(axes, dcn_shape, ring, jax)
    spec = MeshSpec(name or "_".join(a for a, _ in axes), axes, mode, options)
    built = build_mesh(spec, tpu)
    task_devices = [[d.id for d in tpu.devices_of_task(t)] for t in range(tpu.num_hosts)]
    if fmt == "json":
        emit(json.dumps(mesh_document(built, tpu, task_devices), indent=2) + "\n", output)
    else:
        emit(mesh_text(built, tpu, task_devices, cells), output)


def _slice(request: SliceRequest, device_kind: str | None) -> TpuSlice:
    tpu = dataclasses.replace(request, device_kind=device_kind).resolve()
    if tpu is None:
        raise InputError(
            "name the slice: --accelerator, or --generation with --topology",
            hint="e.g. tpuctl mesh plan --accelerator v5p-128 --shape data=16,model=4",
        )
    return tpu
