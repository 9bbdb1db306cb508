"""The options that name a slice without a cluster, shared by ``topology show`` and ``mesh plan``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import click

from tpuctl.cli.common import WholeNumber
from tpuctl.errors import InputError
from tpuctl.tpu.slice import TpuSlice, resolve_slice

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class SliceRequest:
    """What the slice options said; ``resolve()`` turns it into a slice. The fields are
    :func:`~tpuctl.tpu.slice.resolve_slice`'s keyword arguments, one for one."""

    accelerator: str | None = None
    generation: str | None = None
    topology: str | None = None
    chips_per_host: int | None = None
    num_slices: int = 1
    megacore: bool | None = None
    device_kind: str | None = None

    @property
    def given(self) -> bool:
        return bool(self.accelerator or self.generation or self.topology)

    def resolve(self) -> TpuSlice | None:
        """The slice the options name, or None when none was given."""
        if not self.given:
            return None
        if bool(self.generation) != bool(self.topology) and not self.accelerator:
            raise InputError(
                "--generation and --topology go together",
                hint="e.g. --generation v4 --topology 2x2x4, or --accelerator v4-32",
            )
        return resolve_slice(**asdict(self))


def slice_options(func: F) -> F:
    """Add ``--accelerator`` / ``--generation --topology`` and the numbering options; the command gets
    them as one ``slice_request: SliceRequest`` argument."""

    @functools.wraps(func)
    def command(
        *args: Any,
        accelerator: str | None,
        generation: str | None,
        topology_dims: str | None,
        chips_per_host: int | None,
        num_slices: int,
        megacore: bool | None,
        **kwargs: Any,
    ) -> Any:
        request = SliceRequest(accelerator, generation, topology_dims, chips_per_host, num_slices, megacore)
        return func(*args, slice_request=request, **kwargs)

    options = [
        click.option(
            "--accelerator", "-a", metavar="TYPE", help="Accelerator type, e.g. v4-32, v5litepod-16, tpu7x-16."
        ),
        click.option("--generation", metavar="GEN", help="With --topology: v2 v3 v4 v5e v5p v6e 7x."),
        click.option("--topology", "topology_dims", metavar="AxBxC", help="With --generation: chips per axis."),
        click.option("--chips-per-host", type=WholeNumber(), metavar="N", help="Chips per host (4; 8 for v5e/v6e hosts)."),
        click.option("--num-slices", type=WholeNumber(min=1), default=1, show_default=True, help="Multislice."),
        click.option("--megacore/--no-megacore", default=None, help="v4: one device per chip (default) or two."),
    ]
    wrapped: Any = command
    for option in reversed(options):
        wrapped = option(wrapped)
    return wrapped  # type: ignore[no-any-return]
