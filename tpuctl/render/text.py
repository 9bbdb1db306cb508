"""The terminal picture of a slice (``tpuctl topology show``): header, host table, chip grid.

The chip grid is drawn one z-plane at a time, x across and y down, each chip showing its device ids
and the task (host) that owns it::

    z=0     x=0       x=1
    y=0   0,1  t0   2,3  t0
    y=1   4,5  t0   6,7  t0

Slices too large to read chip by chip (more than ``MAX_GRID_CHIPS`` chips) are drawn host by host.
"""

from __future__ import annotations

from collections.abc import Sequence

from tpuctl.messages import table
from tpuctl.tpu.slice import Device, TpuSlice

MAX_GRID_CHIPS = 512  # beyond this a chip-level grid stops fitting a terminal; draw hosts instead
MAX_TABLE_HOSTS = 64  # host table rows shown before eliding the middle


def _yes_no(flags: Sequence[bool]) -> str:
    return " ".join(f"{axis}={'yes' if flag else 'no'}" for axis, flag in zip("xyz", flags, strict=False))


def header_lines(tpu: TpuSlice) -> list[str]:
    gen = tpu.generation
    ndims = gen.ndims
    chips = f"{tpu.topology_str} chips ({tpu.chips_per_slice} per slice)"
    if tpu.num_slices > 1:
        chips += f" x {tpu.num_slices} slices"
    per_chip = f"{tpu.devices_per_chip} per chip"
    if tpu.megacore:
        per_chip += ", megacore"
    block = "x".join(str(d) for d in tpu.chips_per_host_bounds[:ndims])
    bounds = "x".join(str(d) for d in tpu.host_bounds[:ndims])
    return [
        f"accelerator   {tpu.accelerator_type}  (generation {gen.name}, device kind {tpu.device_kind!r})",
        f"topology      {chips}",
        f"wraparound    {_yes_no(tpu.wraparound[:ndims])}",
        f"hosts         {tpu.num_hosts}  (host grid {bounds} per slice, {block} = {tpu.chips_per_host} chips per host)",
        f"devices       {tpu.num_devices}  ({per_chip}, {tpu.devices_per_host} per host)",
    ]


def _id_list(ids: Sequence[int]) -> str:
    return " ".join(str(i) for i in ids)


def host_table_lines(tpu: TpuSlice, hosts: Sequence[str | None] | None) -> list[str]:
    addresses = list(hosts) if hosts is not None else [None] * tpu.num_hosts
    rows = [("TASK", "ADDRESS", "SLICE", "DEVICES")]
    per = tpu.devices_per_host
    devices = tpu.devices
    tasks = list(range(tpu.num_hosts))
    if len(tasks) > MAX_TABLE_HOSTS:
        half = MAX_TABLE_HOSTS // 2
        tasks = tasks[:half] + [-1] + tasks[-half:]
    for task in tasks:
        if task < 0:
            rows.append(("...", "", "", f"({tpu.num_hosts - MAX_TABLE_HOSTS} more hosts)"))
            continue
        own = devices[task * per : (task + 1) * per]
        rows.append((str(task), addresses[task] or "-", str(own[0].slice), _id_list([d.id for d in own])))
    return table(rows)


def _grid(title: str, cells: dict[tuple[int, int], str], nx: int, ny: int, col: str) -> list[str]:
    width = max([len(c) for c in cells.values()] + [len(f"{col}={nx - 1}")])
    label = max(len(title), len(f"y={ny - 1}"))
    lines = [(f"{title:<{label}}  " + "  ".join(f"{f'{col}={x}':<{width}}" for x in range(nx))).rstrip()]
    for y in range(ny):
        row = "  ".join(f"{cells.get((x, y), '.'):<{width}}" for x in range(nx))
        lines.append(f"{f'y={y}':<{label}}  {row}".rstrip())
    return lines


def chip_grid_lines(tpu: TpuSlice, slice_index: int = 0) -> list[str]:
    """One grid per z-plane of one slice; each cell is ``ids tTASK``."""
    nx, ny, nz = tpu.topology
    by_chip: dict[tuple[int, int, int], list[Device]] = {}
    for d in tpu.devices:
        if d.slice == slice_index:
            by_chip.setdefault(d.coords, []).append(d)
    lines: list[str] = []
    for z in range(nz):
        cells = {}
        for (x, y, cz), devs in by_chip.items():
            if cz == z:
                cells[(x, y)] = ",".join(str(d.id) for d in devs) + f" t{devs[0].task}"
        title = f"z={z}" if tpu.generation.ndims == 3 else "chips"
        lines += _grid(title, cells, nx, ny, "x")
        lines.append("")
    return lines[:-1]


def host_grid_lines(tpu: TpuSlice, slice_index: int = 0) -> list[str]:
    """The summary picture for large slices: one cell per host block, showing its task."""
    hx, hy, hz = tpu.host_bounds
    cx, cy, cz = tpu.chips_per_host_bounds
    lines: list[str] = []
    for z in range(hz):
        cells = {(x, y): f"t{tpu.task_of((x * cx, y * cy, z * cz), slice_index)}" for x in range(hx) for y in range(hy)}
        zs = f"z={z * cz}" if cz == 1 else f"z={z * cz}..{z * cz + cz - 1}"
        lines += _grid(zs if tpu.generation.ndims == 3 else "hosts", cells, hx, hy, "hx")
        lines.append("")
    return lines[:-1]


def render_text(tpu: TpuSlice, hosts: Sequence[str | None] | None = None) -> str:
    lines = header_lines(tpu) + [""] + host_table_lines(tpu, hosts) + [""]
    summarise = tpu.chips_per_slice > MAX_GRID_CHIPS
    for s in range(tpu.num_slices):
        if tpu.num_slices > 1:
            lines.append(f"slice {s}")
        if summarise:
            lines.append(
                f"(host grid: {tpu.chips_per_slice} chips are too many to draw one by one; "
                "each cell is one host block; --format json lists every device)"
            )
            lines += host_grid_lines(tpu, s)
        else:
            lines += chip_grid_lines(tpu, s)
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
