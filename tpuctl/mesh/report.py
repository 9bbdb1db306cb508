"""A mesh for people and scripts: the device grid, per-axis quality, DTensor strings (text and JSON).

Used by ``tpuctl mesh plan`` and ``tpuctl topology show --mesh``. Pure string and dict building.

Text example (``tpuctl mesh plan -a v4-32 --shape data=4,model=4``)::

    mesh dp: data=4 x model=4 = 16 devices, mode ring (algorithm ring)
    slice v4-32 (2x2x4, 4 hosts), wraparound x=no y=no z=no

    device ids      model=0  model=1  model=2  model=3
    data=0          0        1        3        2
    ...

    AXIS   SIZE  NEIGHBOURS  RING  MAX HOP  CLOSING HOP  WHY
    data   4     yes         no    1        3            open: ... z has no wraparound links on this slice
    model  4     yes         yes   1        1            ring

    DTensor mesh (task 0): dp|data=4,model=4|0,1,...|0,1,3,2|/job:worker/replica:0/task:0/device:TPU:0,...
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from tpuctl.mesh.model import Mesh, strides
from tpuctl.mesh.quality import Torus, show_location
from tpuctl.mesh.strings import default_job_name, dtensor_host_mesh_string, dtensor_mesh_string
from tpuctl.messages import table
from tpuctl.tpu.slice import TpuSlice

MESH_SCHEMA = "tpuctl.mesh/v1"
MAX_GRID_CELLS = 4096
"""Largest mesh drawn cell by cell in text; larger ones are summarised (JSON has every id)."""
MAX_STRING = 600
"""Characters of a DTensor mesh string shown in text before eliding (JSON has the whole string)."""
CELLS = ("id", "coords", "task")


def mode_of(mesh: Mesh) -> str:
    return mesh.algorithm.split(":")[0] or "ring"


def local_ids_by_task(mesh: Mesh, task_devices: Sequence[Sequence[int]]) -> list[list[int]]:
    """DTensor's local_device_ids of every task (``task_devices[t]``: task t's ids in ordinal order)."""
    positions = mesh.positions()
    return [[positions[d] for d in ids] for ids in task_devices]


def mesh_document(mesh: Mesh, tpu: TpuSlice, task_devices: Sequence[Sequence[int]]) -> dict[str, Any]:
    """The JSON document of a mesh (stable keys; new keys may be added, none removed)."""
    local = local_ids_by_task(mesh, task_devices)
    job = default_job_name(len(task_devices))
    return {
        "schema": MESH_SCHEMA,
        "name": mesh.name,
        "mode": mode_of(mesh),
        "algorithm": mesh.algorithm,
        "accelerator": tpu.accelerator_type,
        "topology": list(tpu.topology),
        "num_slices": tpu.num_slices,
        "axes": [{"name": a.name, "size": a.size} for a in mesh.axes],
        "dcn_shape": list(mesh.dcn_shape),
        "device_ids": mesh.grid(),
        "quality": [
            {
                "axis": q.axis, "size": q.size, "neighbours": q.neighbours, "ring": q.ring, "max_hop": q.max_hop,
                "closing_hop": q.closing_hop, "wraparound": q.wraparound, "dcn_steps": q.dcn_steps, "reason": q.reason,
            }
            for q in mesh.quality
        ],
        "dtensor_mesh": dtensor_mesh_string(mesh, 0, local[0], job),
        "dtensor_host_mesh": dtensor_host_mesh_string(mesh, 0, local[0], job),
        "local_device_ids": local,
    }  # fmt: skip


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def quality_lines(mesh: Mesh) -> list[str]:
    rows: list[tuple[str, ...]] = [("AXIS", "SIZE", "NEIGHBOURS", "RING", "MAX HOP", "CLOSING HOP", "DCN STEPS", "WHY")]
    multislice = any(q.dcn_steps for q in mesh.quality)
    for q in mesh.quality:
        rows.append(
            (
                q.axis,
                str(q.size),
                _yes(q.neighbours),
                _yes(q.ring),
                str(q.max_hop),
                str(q.closing_hop),
                str(q.dcn_steps),
                q.reason,
            )
        )
    if not multislice:
        rows = [r[:6] + r[7:] for r in rows]
    return table(rows)


def _cell_text(mesh: Mesh, tpu: TpuSlice, cells: str, task_of: dict[int, int]) -> list[str]:
    if cells == "task":
        return [f"t{task_of[d]}" for d in mesh.device_ids]
    if cells == "coords":
        torus = Torus.of(tpu)
        return [show_location(*torus.locate(d), torus) for d in mesh.device_ids]
    return [str(d) for d in mesh.device_ids]


def grid_lines(mesh: Mesh, tpu: TpuSlice, cells: str, task_devices: Sequence[Sequence[int]]) -> list[str]:
    """The mesh drawn as 2-D grids (rows: second-to-last axis, columns: last axis), one per index of the
    leading axes; a 1-axis mesh is one row wrapped 16 cells a line."""
    task_of = {d: t for t, ids in enumerate(task_devices) for d in ids}
    text = _cell_text(mesh, tpu, cells, task_of)
    what = {"id": "device ids", "coords": "chip (x,y,z)", "task": "tasks"}[cells]
    axes = mesh.axes
    if len(axes) == 1:
        width = max(len(t) for t in text)
        head = f"{axes[0].name}="
        label = len(head) + len(str(axes[0].size - 1))
        row_lines = [what]
        for i in range(0, len(text), 16):
            row_lines.append(
                f"{head + str(i):<{label}}  " + "  ".join(f"{t:<{width}}" for t in text[i : i + 16]).rstrip()
            )
        return row_lines
    rows_axis, cols_axis = axes[-2], axes[-1]
    width = max(max(len(t) for t in text), len(f"{cols_axis.name}={cols_axis.size - 1}"))
    label = len(f"{rows_axis.name}={rows_axis.size - 1}")
    lead = axes[:-2]
    st = strides(mesh.shape)
    lines: list[str] = []
    for index in itertools.product(*(range(a.size) for a in lead)):
        base = sum(i * s for i, s in zip(index, st, strict=False))
        title = ", ".join(f"{a.name}={i}" for a, i in zip(lead, index, strict=True))
        head = f"{what} ({title})" if title else what
        lines.append(
            f"{head:<{label}}  "
            + "  ".join(f"{f'{cols_axis.name}={c}':<{width}}" for c in range(cols_axis.size)).rstrip()
        )
        for r in range(rows_axis.size):
            start = base + r * st[-2]
            row = "  ".join(f"{t:<{width}}" for t in text[start : start + cols_axis.size]).rstrip()
            lines.append(f"{f'{rows_axis.name}={r}':<{max(label, len(head))}}  {row}")
        lines.append("")
    return lines[:-1]


def _elide(text: str) -> str:
    if len(text) <= MAX_STRING:
        return text
    return text[:MAX_STRING] + f"... ({len(text)} characters; --format json has the whole string)"


def mesh_text(mesh: Mesh, tpu: TpuSlice, task_devices: Sequence[Sequence[int]], cells: str = "id") -> str:
    """The mesh for a terminal: header, device grid (small meshes), per-axis quality, DTensor strings."""
    dims = " x ".join(f"{a.name}={a.size}" for a in mesh.axes)
    wrap = " ".join(f"{a}={_yes(w)}" for a, w in zip("xyz", tpu.wraparound[: tpu.generation.ndims], strict=False))
    lines = [
        f"mesh {mesh.name}: {dims} = {mesh.size} devices, mode {mode_of(mesh)} (algorithm {mesh.algorithm})",
        f"slice {tpu.describe()}, wraparound {wrap}"
        + (f", dcn_shape {'x'.join(map(str, mesh.dcn_shape))}" if mesh.dcn_shape else ""),
        "",
    ]
    if mesh.size <= MAX_GRID_CELLS:
        lines += grid_lines(mesh, tpu, cells, task_devices)
    else:
        lines.append(f"({mesh.size} devices are too many to draw; --format json lists every id)")
    lines += ["", *quality_lines(mesh), ""]
    local = local_ids_by_task(mesh, task_devices)
    job = default_job_name(len(task_devices))
    lines.append(f"DTensor mesh (task 0): {_elide(dtensor_mesh_string(mesh, 0, local[0], job))}")
    lines.append(f"DTensor host mesh (task 0): {_elide(dtensor_host_mesh_string(mesh, 0, local[0], job))}")
    return "\n".join(lines) + "\n"
