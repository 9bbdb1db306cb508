"""``tpuctl topology show``: a slice's hosts, chips, device ids and links, offline or from a cluster."""

from __future__ import annotations

import json
from collections.abc import Sequence

import click

from tpuctl.cli.output import emit
from tpuctl.cli.slice_options import slice_from_options, slice_options
from tpuctl.errors import InputError
from tpuctl.tpuslice import TpuSlice


@click.group("topology")
def topology() -> None:
    """Inspect TPU slice topologies."""


@topology.command("show")
@slice_options
@click.option("--config", "-c", "config", metavar="FILE", help="Show the slice of a cluster spec (with its hosts).")
@click.option("--mapping", "mapping_path", metavar="FILE", help="Show a device mapping file written by tpuctl init.")
@click.option(
    "--format",
    "-f",
    "fmt",
    type=click.Choice(["text", "json", "svg"]),
    default="text",
    show_default=True,
    help="text for people, json for scripts, svg for a picture.",
)
@click.option("--output", "-o", metavar="FILE", help="Write to FILE (atomically) instead of stdout.")
def show(
    accelerator: str | None,
    generation: str | None,
    topology_dims: str | None,
    chips_per_host: int | None,
    num_slices: int,
    megacore: bool | None,
    config: str | None,
    mapping_path: str | None,
    fmt: str,
    output: str | None,
) -> None:
    """Show a slice: header, host table, and the chip grid one z-plane at a time.

    \b
    Name the slice one of three ways:
      tpuctl topology show --accelerator v4-32
      tpuctl topology show --generation v5e --topology 4x4 --chips-per-host 8
      tpuctl topology show --config cluster.yaml      (adds each host's address)
      tpuctl topology show --mapping mapping.json     (what tpuctl init found)

    \b
    Each chip cell reads "IDS tT": the device ids on that chip and the task (host) owning it.
    --format json prints one document (keys: accelerator, topology, wraparound, tasks, devices, ...);
    --format svg -o slice.svg draws chips coloured by host with ICI and wraparound links.
    """
    tpu, hosts = _resolve(
        accelerator, generation, topology_dims, chips_per_host, num_slices, megacore, config, mapping_path
    )
    if fmt == "json":
        from tpuctl.render.document import slice_document

        emit(json.dumps(slice_document(tpu, hosts), indent=2) + "\n", output)
    elif fmt == "svg":
        if output is None:
            raise InputError(
                "--format svg needs --output FILE", hint="e.g. tpuctl topology show -a v4-32 -f svg -o slice.svg"
            )
        from tpuctl.render.svg import render_svg

        emit(render_svg(tpu, hosts), output)
    else:
        from tpuctl.render.text import render_text

        emit(render_text(tpu, hosts), output)


def _resolve(
    accelerator: str | None,
    generation: str | None,
    topology_dims: str | None,
    chips_per_host: int | None,
    num_slices: int,
    megacore: bool | None,
    config: str | None,
    mapping_path: str | None,
) -> tuple[TpuSlice, Sequence[str | None] | None]:
    named = slice_from_options(accelerator, generation, topology_dims, chips_per_host, num_slices, megacore)
    sources = [s for s in (named is not None, config is not None, mapping_path is not None) if s]
    if len(sources) != 1:
        raise InputError(
            "name exactly one slice: --accelerator (or --generation/--topology), --config, or --mapping",
            hint="e.g. tpuctl topology show --accelerator v4-32",
        )
    if named is not None:
        return named, None
    if config is not None:
        from tpuctl.specfile import load_spec

        spec = load_spec(config)
        return spec.slice, list(spec.hosts)
    from tpuctl.mapping import load_mapping

    assert mapping_path is not None
    mapping = load_mapping(mapping_path)
    return mapping.slice, [t.address for t in mapping.tasks]
