"""The options that name a slice without a cluster, shared by ``topology show`` and ``mesh plan``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from tpuctl.errors import InputError
from tpuctl.tpuslice import TpuSlice, resolve_slice

F = TypeVar("F", bound=Callable[..., Any])


def slice_options(func: F) -> F:
    """Add ``--accelerator`` / ``--generation --topology`` and the numbering options."""
    options = [
        click.option(
            "--accelerator", "-a", metavar="TYPE", help="Accelerator type, e.g. v4-32, v5litepod-16, tpu7x-16."
        ),
        click.option("--generation", metavar="GEN", help="With --topology: v2 v3 v4 v5e v5p v6e 7x."),
        click.option("--topology", "topology_dims", metavar="AxBxC", help="With --generation: chips per axis."),
        click.option("--chips-per-host", type=int, metavar="N", help="Chips per host (4; 8 for v5e/v6e hosts)."),
        click.option("--num-slices", type=click.IntRange(min=1), default=1, show_default=True, help="Multislice."),
        click.option("--megacore/--no-megacore", default=None, help="v4: one device per chip (default) or two."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def slice_from_options(
    accelerator: str | None,
    generation: str | None,
    topology_dims: str | None,
    chips_per_host: int | None,
    num_slices: int,
    megacore: bool | None,
) -> TpuSlice | None:
    """The slice the options name, or None when none was given."""
    if not (accelerator or generation or topology_dims):
        return None
    if bool(generation) != bool(topology_dims) and not accelerator:
        raise InputError(
            "--generation and --topology go together",
            hint="e.g. --generation v4 --topology 2x2x4, or --accelerator v4-32",
        )
    return resolve_slice(
        accelerator=accelerator,
        generation=generation,
        topology=topology_dims,
        chips_per_host=chips_per_host,
        num_slices=num_slices,
        megacore=megacore,
    )
