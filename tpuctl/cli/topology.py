"""``tpuctl topology show``: a slice's hosts, chips, device ids and links, offline or from a cluster."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from tpuctl.cli.app import SuggestingGroup
from tpuctl.cli.output import dumps, emit, format_options, out_option
from tpuctl.cli.slice_options import SliceRequest, slice_options
from tpuctl.errors import InputError
from tpuctl.messages import did_you_mean
from tpuctl.tpu.slice import TpuSlice

if TYPE_CHECKING:  # imported lazily at run time
    from tpuctl.mesh.model import Mesh


@click.group("topology", cls=SuggestingGroup)
def topology() -> None:
    """Inspect TPU slice topologies."""


@topology.command("show")
@slice_options
@click.option("--config", "-c", "config", metavar="FILE", help="Show the slice of a cluster spec (with its hosts).")
@click.option("--mapping", "mapping_path", metavar="FILE", help="Show a device mapping file written by tpuctl init.")
@format_options(
    "text for people, json for scripts, svg for a picture (with --out FILE).",
    ("text", "json", "svg"),
    out_is_the_document=True,
)
@out_option("the picture or document")
@click.option(
    "--mesh", "mesh_name", metavar="NAME", help="Also show a mesh of --config or --mapping: grid and quality."
)
@click.option(
    "--mesh-axis", metavar="AXIS", help="--format svg: the mesh axis whose rings are drawn (default: the last)."
)
def show(
    slice_request: SliceRequest,
    config: str | None,
    mapping_path: str | None,
    fmt: str,
    out: str | None,
    mesh_name: str | None,
    mesh_axis: str | None,
) -> None:
    """Show a slice: header, host table, and the chip grid one z-plane at a time.

    \b
    Name the slice one of three ways:
      tpuctl topology show --accelerator v4-32
      tpuctl topology show --generation v5e --topology 4x4 --chips-per-host 8
      tpuctl topology show --config cluster.yaml      (adds each host's address)
      tpuctl topology show --mapping mapping.json     (what tpuctl init found)
      tpuctl topology show -a v4-32 -o json           (one JSON document; --json too)

    \b
    Each chip cell reads "IDS tT": the device ids on that chip and the task (host) owning it.
    --format json prints one document (schema tpuctl.topology/v2: accelerator, topology, wraparound,
    tasks, devices, ...); --format svg --out slice.svg draws chips coloured by host with ICI and wraparound links.
    Without --format, --out's ending chooses it (slice.svg: svg, .json: json); a format it contradicts is refused.

    \b
    --mesh NAME adds one of the meshes the spec declares (--config: built as tpuctl init would) or the
    mapping holds (--mapping): its device grid and, per axis, whether consecutive devices are ICI
    neighbours and whether the axis closes into a ring, and why (json: a "mesh" key; svg: the rings of
    --mesh-axis drawn over the chips).

    Exit codes: 0 shown, 2 bad input (slice, options, spec), 7 bad mapping file.
    """
    tpu, hosts, source = _resolve(slice_request, config, mapping_path)
    mesh, task_devices = _mesh(mesh_name, source) if mesh_name is not None else (None, [])
    if mesh_axis is not None and (mesh is None or fmt != "svg"):
        raise InputError(
            "--mesh-axis goes with --mesh NAME --format svg",
            hint="e.g. --mesh dp_mp --mesh-axis model --format svg --out m.svg",
        )
    if fmt == "json":
        from tpuctl.render.document import slice_document

        document = slice_document(tpu, hosts)
        if mesh is not None:
            from tpuctl.mesh.report import mesh_document

            document["mesh"] = mesh_document(mesh, tpu, task_devices)
        emit(dumps(document), out)
    elif fmt == "svg":
        if out is None:
            raise InputError(
                "--format svg needs --out FILE", hint="e.g. tpuctl topology show -a v4-32 --format svg --out slice.svg"
            )
        from tpuctl.render.svg import mesh_overlay, render_svg

        overlay = mesh_overlay(mesh, tpu, mesh_axis) if mesh is not None else None
        addresses = [h or "" for h in hosts] if hosts is not None else None
        emit(render_svg(tpu, addresses, overlay=overlay), out)
    else:
        from tpuctl.render.text import render_text

        text = render_text(tpu, hosts)
        if mesh is not None:
            from tpuctl.mesh.report import mesh_text

            text += "\n" + mesh_text(mesh, tpu, task_devices)
        emit(text, out)


def _mesh(name: str, source: Any) -> tuple[Mesh, list[list[int]]]:
    """The mesh ``name`` of the spec (built on the slice model) or of the mapping, and each task's ids."""
    from tpuctl.spec.model import ClusterSpec

    if source is None:
        raise InputError(
            "--mesh needs --config (the spec's meshes) or --mapping (the meshes tpuctl init wrote)",
            hint="for a mesh without a spec: tpuctl mesh plan --accelerator TYPE --shape data=N,model=M",
        )
    if not isinstance(source, ClusterSpec):  # a DeviceMapping
        return source.mesh(name), [[d.id for d in t.devices] for t in source.tasks]
    from tpuctl.mesh.build import build_mesh

    declared = {m.name: m for m in source.meshes}
    if name not in declared:
        raise InputError(
            f"{source.source} declares no mesh {name!r} (meshes: {', '.join(declared) or 'none'})",
            hint=did_you_mean(name, declared, otherwise="declare it under meshes: in the spec"),
        )
    tpu = source.slice
    return build_mesh(declared[name], tpu), [[d.id for d in tpu.devices_of_task(t)] for t in range(tpu.num_hosts)]


def _resolve(
    request: SliceRequest, config: str | None, mapping_path: str | None
) -> tuple[TpuSlice, Sequence[str | None] | None, Any]:
    """The slice, its host addresses (if known), and the spec or mapping it came from (None: options)."""
    named = request.resolve()
    sources = [s for s in (named is not None, config is not None, mapping_path is not None) if s]
    if len(sources) != 1:
        raise InputError(
            "name exactly one slice: --accelerator (or --generation/--topology), --config, or --mapping",
            hint="e.g. tpuctl topology show --accelerator v4-32",
        )
    if named is not None:
        return named, None, None
    if config is not None:
        from tpuctl.spec.yamlfile import load_spec

        spec = load_spec(config)
        return spec.slice, list(spec.hosts), spec
    from tpuctl.mapping.file import read_mapping

    assert mapping_path is not None
    mapping = read_mapping(mapping_path)
    return mapping.slice, [t.address for t in mapping.tasks], mapping
