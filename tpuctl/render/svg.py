"""A standalone SVG picture of a TPU slice: chips coloured by host, device ids, ICI and wraparound links.

Pure string building (stdlib only, no I/O) and deterministic: the same slice gives the same bytes.

Layout. Each slice of a multislice is a panel, one below the other (slices talk over DCN, not ICI).
Inside a panel the z-planes of a 3D slice sit in a grid of planes, in z order, row by row. In a
plane x grows to the right and y downwards, so the top row of a single-host slice reads 0, 1, 2, ...
(ids are x-minor). Chips of one host are grouped (a wider gap around each host block) and share a
colour from a 12-colour qualitative palette that cycles with the task number; the legend maps colour
to task (and address). Example, ``v5litepod-16`` (four 2x2 hosts)::

         x 0    1        2    3
    y 0  [ 0]--[ 1] -- [ 2]--[ 3]        task 0 | task 1
      1  [ 4]--[ 5] -- [ 6]--[ 7]
      2  [ 8]--[ 9] -- [10]--[11]        task 2 | task 3
      3  [12]--[13] -- [14]--[15]

Links. Solid lines join ICI neighbours within a plane; a connector labelled ``z`` joins consecutive
planes drawn next to each other (every chip links to the same (x, y) in the next plane). A wrapping
axis is drawn as dashed arrows leaving the last chip of each row (column, plane) and entering the
first one on the opposite side.

Mesh overlay (``topology show --mesh NAME -f svg``). The lines of one mesh axis (the last by default)
are drawn over the chips, one colour per line, from a dot at the line's first device through every
device in mesh order and back to the first (the closing step dashed). A step longer than one ICI hop is
drawn in red, a step between slices (DCN) dotted grey; up to ``MAX_MESH_LINES`` lines are drawn. The
header says whether the axis is a ring and why. Needs chip detail (no overlay in summary mode).

Detail. Up to ``MAX_CHIPS`` chips (and ``MAX_SIDE`` chips per plane side) every chip is a box with its
device ids (both cores for 2-device chips). Beyond that (full 3D pods, large multislices) each host is
one box labelled with its task, and the header says so. Chip mode is O(chips), summary mode O(hosts);
a full 7x pod (2304 hosts) renders to about 0.5 MB, four of them in a multislice to 2.2 MB.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

from tpuctl.errors import InputError
from tpuctl.mesh.model import AxisQuality, Mesh, strides
from tpuctl.mesh.quality import Location, Torus
from tpuctl.tpu.hardware import Triple
from tpuctl.tpu.slice import TpuSlice, format_dims

# ColorBrewer Set3: 12 light qualitative colours, all legible under black text.
PALETTE = (
    "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462",
    "#b3de69", "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f",
)  # fmt: skip
MAX_CHIPS = 1024
"""Most chips drawn one by one (all slices together); more are summarised one box per host."""
MAX_SIDE = 64
"""Most chips along a plane side drawn one by one."""
LEGEND_MAX_HOSTS = 64
"""Most hosts listed one by one in the legend; more are listed per colour."""
LEGEND_MAX_ADDRESSED = 256
"""Most hosts listed one by one when addresses are given (else only tooltips show them)."""
MAX_MESH_LINES = 16
"""Most lines of a mesh axis drawn over the chips."""
# ColorBrewer Dark2: 8 strong colours for mesh lines, legible over the light host colours.
LINE_COLOURS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666")

CHIP = 44  # chip box side (px) in chip mode: room for two 6-digit multislice ids
CHIP_GAP = 10  # between chips of one host
HOST_GAP = 22  # between host blocks (chip mode)
HOST_UNIT = 14  # px per chip side in summary mode: a 2x2 host is a 28 px box
SUMMARY_GAP = 6  # between host boxes (summary mode)
STUB = 14  # length of a wraparound arrow
PAD_L, PAD_T, PAD_R, PAD_B = 36, 46, 22, 22  # around a plane's boxes: ticks, captions, wrap arrows
Z_CAPTION = 16
PLANE_GAP = 30  # between planes (the z connector is drawn in it)
SLICE_CAPTION = 22
MARGIN = 16
HEADER_LINE = 18
LEGEND_ROW = 18
LEGEND_COL_GAP = 24
TARGET_ASPECT = 1.6  # width / height the grid of planes aims for
CHAR_W = 0.62  # average glyph width / font size, to size text boxes

_STYLE = """\
text{font-family:DejaVu Sans,Arial,sans-serif;fill:#222}
.title{font-size:16px;font-weight:bold}
.info{font-size:12px}
.cap{font-size:11px;font-weight:bold}
.tick,.ytick{font-size:9px;fill:#666}
.ytick{text-anchor:end}
.dev{font-size:10px;font-family:DejaVu Sans Mono,monospace;text-anchor:middle}
.task{font-size:8px;fill:#444}
.htask{font-size:9px;font-family:DejaVu Sans Mono,monospace;text-anchor:middle}
.chip,.host,.swatch{stroke:#555;stroke-width:1}
.ici,.ici-z{stroke:#444;stroke-width:1.5;fill:none}
.wrap{stroke:#7b3294;stroke-width:1.5;stroke-dasharray:4 2;fill:none;marker-end:url(#wrap-arrow)}
.wlabel{font-size:8px;fill:#7b3294}
.mesh{stroke-width:2.5;fill:none;stroke-linecap:round;opacity:.85}
.mesh-close{stroke-dasharray:5 3}
.mesh-far{stroke:#d7191c !important;stroke-dasharray:2 2}
.mesh-dcn{stroke:#999 !important;stroke-dasharray:1 3}
.mesh-wrap{stroke-dasharray:6 2 1 2}
"""


@dataclass(frozen=True)
class _Axis:
    """Boxes along one plane axis: ``count`` boxes of ``size`` px; a wider gap after every ``group``."""

    count: int
    size: int
    gap: int
    group: int
    group_gap: int

    def offset(self, i: int) -> int:
        return i * (self.size + self.gap) + (i // self.group) * (self.group_gap - self.gap)

    @property
    def length(self) -> int:
        return self.offset(self.count - 1) + self.size


@dataclass(frozen=True)
class _Plan:
    """Geometry of one picture. A "box" is a chip (chip mode) or a host (summary mode)."""

    summary: bool
    ax: _Axis
    ay: _Axis
    cols: int
    rows: int
    pad_t: int
    """Above a plane's boxes: its z caption (3D only), x ticks, incoming y-wrap arrows."""
    caption: int
    """Above a slice's planes: the slice caption (multislice only)."""

    @property
    def plane_w(self) -> int:
        return PAD_L + self.ax.length + PAD_R

    @property
    def plane_h(self) -> int:
        return self.pad_t + self.ay.length + PAD_B

    @property
    def slice_w(self) -> int:
        return self.cols * self.plane_w + (self.cols - 1) * PLANE_GAP

    @property
    def slice_h(self) -> int:
        return self.caption + self.rows * self.plane_h + (self.rows - 1) * PLANE_GAP // 2


@dataclass(frozen=True)
class MeshOverlay:
    """The lines of one mesh axis to draw over the chips: each a list of (slice, location) in mesh order."""

    mesh: str
    quality: AxisQuality
    lines: tuple[tuple[tuple[int, Location], ...], ...]
    total_lines: int


def mesh_overlay(mesh: Mesh, slice_: TpuSlice, axis: str | None = None) -> MeshOverlay:
    """The first ``MAX_MESH_LINES`` lines of ``axis`` (default: the last axis longer than 1). O(N)."""
    names = mesh.axis_names
    if axis is None:
        longer = [a.name for a in mesh.axes if a.size > 1]
        axis = longer[-1] if longer else names[-1]
    if axis not in names:
        raise InputError(f"mesh {mesh.name!r} has no axis {axis!r}", hint="its axes: " + ", ".join(names))
    k = names.index(axis)
    size, stride = mesh.shape[k], strides(mesh.shape)[k]
    torus = Torus.of(slice_)
    starts = [b for start in range(0, mesh.size, size * stride) for b in range(start, start + stride)]
    lines = tuple(
        tuple(torus.locate(mesh.device_ids[b + j * stride]) for j in range(size)) for b in starts[:MAX_MESH_LINES]
    )
    quality = mesh.axis_quality(axis) if mesh.quality else AxisQuality(axis, size, False, False, 0, 0, False, 0, "")
    return MeshOverlay(mesh.name, quality, lines, len(starts))


def is_summary(slice_: TpuSlice) -> bool:
    """Whether the picture shows one box per host instead of one per chip."""
    x, y, _ = slice_.topology
    return slice_.chips_per_slice * slice_.num_slices > MAX_CHIPS or max(x, y) > MAX_SIDE


def render_svg(
    slice: TpuSlice, hosts: Sequence[str] | None = None, *, title: str | None = None, overlay: MeshOverlay | None = None
) -> str:
    """A standalone SVG document picturing ``slice``; ``hosts[task]`` is a task's address, if given;
    ``overlay``: a mesh axis's lines drawn over the chips (:func:`mesh_overlay`)."""
    if hosts is not None and len(hosts) != slice.num_hosts:
        raise InputError(
            f"{len(hosts)} host addresses for {slice.describe()}, which has {slice.num_hosts} hosts",
            hint="give one address per task, in task order, or none",
        )
    plan = _plan(slice)
    header = _header(slice, plan, title) + (_overlay_header(overlay, plan) if overlay is not None else [])
    entries = _legend_entries(slice, hosts)
    entry_w = max(_text_w(text, 12) for _, text in entries) + 30 + LEGEND_COL_GAP
    three_d = slice.topology[2] > 1
    key_w = sum(_text_w(t, 12) + 50 for t in _legend_key(three_d))
    body_w = max(plan.slice_w, max(_text_w(t, 16 if i == 0 else 12) for i, t in enumerate(header)), entry_w, key_w)
    legend_cols = max(1, min(len(entries), body_w // entry_w))
    legend_rows = math.ceil(len(entries) / legend_cols)
    width = body_w + 2 * MARGIN
    top = MARGIN + len(header) * HEADER_LINE + 8
    slices_h = slice.num_slices * plan.slice_h + (slice.num_slices - 1) * PLANE_GAP
    legend_top = top + slices_h + 12
    height = legend_top + (legend_rows + 2) * LEGEND_ROW + MARGIN

    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
        f"<title>{escape(header[0])}</title>",
        "<defs>",
        '<marker id="wrap-arrow" viewBox="0 0 6 6" refX="5" refY="3" markerWidth="6" markerHeight="6" '
        'orient="auto"><path d="M0,0L6,3L0,6z" fill="#7b3294"/></marker>',
        "</defs>",
        f"<style>{_STYLE}</style>",
        f'<rect width="{width}" height="{height}" fill="#fff"/>',
    ]
    for i, line in enumerate(header):
        cls = "title" if i == 0 else "info"
        out.append(f'<text class="{cls}" x="{MARGIN}" y="{MARGIN + 12 + i * HEADER_LINE}">{escape(line)}</text>')
    for s in range(slice.num_slices):
        oy = top + s * (plan.slice_h + PLANE_GAP)
        out += _slice_panel(slice, plan, s, MARGIN, oy, hosts)
    if overlay is not None and not plan.summary:
        out += _overlay(slice, plan, overlay, top)
    out += _legend(entries, three_d, legend_cols, entry_w, MARGIN, legend_top)
    out.append("</svg>")
    return "\n".join(out) + "\n"


# --- layout --------------------------------------------------------------------------------------


def _plan(slice_: TpuSlice) -> _Plan:
    summary = is_summary(slice_)
    x, y, z = slice_.topology
    cx, cy, _ = slice_.chips_per_host_bounds
    if summary:
        hx, hy, _ = slice_.host_bounds
        ax = _Axis(hx, cx * HOST_UNIT, SUMMARY_GAP, hx, SUMMARY_GAP)
        ay = _Axis(hy, cy * HOST_UNIT, SUMMARY_GAP, hy, SUMMARY_GAP)
    else:
        ax = _Axis(x, CHIP, CHIP_GAP, cx, HOST_GAP)
        ay = _Axis(y, CHIP, CHIP_GAP, cy, HOST_GAP)
    pad_t = PAD_T if z > 1 else PAD_T - Z_CAPTION
    cols = _plane_columns(z, PAD_L + ax.length + PAD_R, pad_t + ay.length + PAD_B)
    caption = SLICE_CAPTION if slice_.num_slices > 1 else 0
    return _Plan(summary, ax, ay, cols, math.ceil(z / cols), pad_t, caption)


def _plane_columns(planes: int, plane_w: int, plane_h: int) -> int:
    """Planes per row that bring the grid of planes closest to ``TARGET_ASPECT``. O(planes)."""

    def badness(cols: int) -> float:
        rows = math.ceil(planes / cols)
        w = cols * plane_w + (cols - 1) * PLANE_GAP
        h = rows * plane_h + (rows - 1) * PLANE_GAP // 2
        empty = rows * cols - planes  # a ragged last row reads worse than a less ideal aspect
        return abs(math.log(w / h / TARGET_ASPECT)) + empty / planes

    return min(range(1, planes + 1), key=lambda c: (badness(c), c))


def _text_w(text: str, font_px: int) -> int:
    return math.ceil(len(text) * font_px * CHAR_W)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _header(slice_: TpuSlice, plan: _Plan, title: str | None) -> list[str]:
    gen = slice_.generation
    name = slice_.accelerator_type + (f" x {slice_.num_slices} slices" if slice_.num_slices > 1 else "")
    per_chip = f"{slice_.devices_per_chip} per chip" + (", megacore" if slice_.megacore else "")
    axes = "xyz"[: gen.ndims]
    wrap = ", ".join(f"{a} {_yes(w)}" for a, w in zip(axes, slice_.wraparound, strict=False))
    lines = [
        title or f"{name}: {slice_.topology_str} chips",
        f"accelerator {slice_.accelerator_type} · topology {slice_.topology_str} · device kind "
        f"{slice_.device_kind} · {slice_.chips_per_slice} chips per slice · {slice_.num_devices} devices "
        f"({per_chip})",
        f"{_count(slice_.num_hosts, 'host')} of {format_dims(slice_.chips_per_host_bounds)} chips · host bounds "
        f"{format_dims(slice_.host_bounds)} · wraparound: {wrap}"
        + (" · slices joined by DCN" if slice_.num_slices > 1 else ""),
    ]
    if plan.summary:
        lines.append(
            f"summary: {slice_.chips_per_slice * slice_.num_slices} chips are too many to label one by one; "
            "each box is a host, labelled with its task (hover for its chips)"
        )
    return lines


# --- slices and planes ---------------------------------------------------------------------------


def _slice_panel(slice_: TpuSlice, plan: _Plan, s: int, ox: int, oy: int, hosts: Sequence[str] | None) -> list[str]:
    out: list[str] = []
    if slice_.num_slices > 1:
        first = s * slice_.hosts_per_slice
        last = first + slice_.hosts_per_slice - 1
        out.append(f'<text class="cap" x="{ox}" y="{oy + 14}">slice {s} · tasks {first}–{last}</text>')
    z_n = slice_.topology[2]
    wraps_z = slice_.wraparound[2]
    for z in range(z_n):
        col, row = z % plan.cols, z // plan.cols
        px = ox + col * (plan.plane_w + PLANE_GAP)
        py = oy + plan.caption + row * (plan.plane_h + PLANE_GAP // 2)
        out.append(f'<g class="plane" id="s{s}z{z}">')
        if z_n > 1:
            out += _plane_caption(z, z_n, wraps_z, px + PAD_L, py + 12)
        out += _ticks(slice_, plan, px, py)
        out += _boxes(slice_, plan, s, z, px + PAD_L, py + plan.pad_t, hosts)
        out += _links(slice_, plan, px + PAD_L, py + plan.pad_t)
        out.append("</g>")
        if z + 1 < z_n and col + 1 < plan.cols:
            mid = py + plan.pad_t + plan.ay.length // 2
            right = px + PAD_L + plan.ax.length
            out.append(f'<path class="ici-z" d="M{right},{mid}h{PAD_R + PLANE_GAP + 4}"/>')
            out.append(f'<text class="tick" x="{right + PAD_R + PLANE_GAP // 2 - 3}" y="{mid - 4}">z</text>')
    return out


def _plane_caption(z: int, z_n: int, wraps: bool, x: int, y: int) -> list[str]:
    """``z = k``; with a z wraparound, the last plane's arrow goes to z = 0, the first's comes from the last."""
    text = f"z = {z}"
    out = [f'<text class="cap" x="{x}" y="{y}">{text}</text>']
    if wraps and z in (0, z_n - 1):
        start = x + _text_w(text, 11) + 6
        if z == z_n - 1:
            out.append(f'<path class="wrap" d="M{start},{y - 4}h{STUB}"/>')
            label = "to z = 0 (wraparound)"
        else:
            out.append(f'<path class="wrap" d="M{start + STUB},{y - 4}h-{STUB}"/>')
            label = f"from z = {z_n - 1} (wraparound)"
        out.append(f'<text class="wlabel" x="{start + STUB + 6}" y="{y - 1}">{label}</text>')
    return out


def _ticks(slice_: TpuSlice, plan: _Plan, px: int, py: int) -> list[str]:
    """Chip coordinates along x (above) and y (left); in summary mode, the first chip of each host."""
    cx, cy, _ = slice_.chips_per_host_bounds
    sx, sy = (cx, cy) if plan.summary else (1, 1)
    out = [f'<text class="tick" x="{px + 2}" y="{py + plan.pad_t - 20}">x</text>']
    for i in range(plan.ax.count):
        x = px + PAD_L + plan.ax.offset(i) + plan.ax.size // 2 - 3
        out.append(f'<text class="tick" x="{x}" y="{py + plan.pad_t - 20}">{i * sx}</text>')
    out.append(f'<text class="tick" x="{px + 2}" y="{py + plan.pad_t - 6}">y</text>')
    for j in range(plan.ay.count):
        y = py + plan.pad_t + plan.ay.offset(j) + plan.ay.size // 2 + 3
        out.append(f'<text class="ytick" x="{px + PAD_L - STUB - 5}" y="{y}">{j * sy}</text>')
    return out


def _address(hosts: Sequence[str] | None, task: int) -> str:
    return f" ({hosts[task]})" if hosts is not None else ""


def _boxes(slice_: TpuSlice, plan: _Plan, s: int, z: int, bx: int, by: int, hosts: Sequence[str] | None) -> list[str]:
    """One plane's chip boxes (with device ids) or host boxes (with tasks), row by row."""
    out: list[str] = []
    box = _host_box if plan.summary else _chip_box
    for j in range(plan.ay.count):
        for i in range(plan.ax.count):
            out += box(slice_, plan, (i, j, z), s, bx + plan.ax.offset(i), by + plan.ay.offset(j), hosts)
    return out


def _chip_box(
    slice_: TpuSlice, plan: _Plan, chip: Triple, s: int, x: int, y: int, hosts: Sequence[str] | None
) -> list[str]:
    """A chip: its host's colour, its device ids (one line per core), its task on the host's first chip."""
    w, h = plan.ax.size, plan.ay.size
    task = slice_.task_of(chip, s)
    ids = [slice_.device_id(chip, core, s) for core in range(slice_.devices_per_chip)]
    where = f"slice {s} · " if slice_.num_slices > 1 else ""
    tip = f"{where}chip {chip} · task {task}{_address(hosts, task)} · device ids {', '.join(map(str, ids))}"
    out = [
        f'<rect class="chip" x="{x}" y="{y}" width="{w}" height="{h}" rx="3" '
        f'fill="{PALETTE[task % len(PALETTE)]}"><title>{escape(tip)}</title></rect>'
    ]
    if all(c % b == 0 for c, b in zip(chip, slice_.chips_per_host_bounds, strict=True)):
        out.append(f'<text class="task" x="{x + 3}" y="{y + 9}">t{task}</text>')
    for k, dev in enumerate(ids):
        line_y = y + (28 if len(ids) == 1 else 22 + 12 * k)
        out.append(f'<text class="dev" x="{x + w // 2}" y="{line_y}">{dev}</text>')
    return out


def _host_box(
    slice_: TpuSlice, plan: _Plan, unit: Triple, s: int, x: int, y: int, hosts: Sequence[str] | None
) -> list[str]:
    """A host (``unit`` = host-grid x, y and the plane's z): its colour and its task."""
    w, h = plan.ax.size, plan.ay.size
    cx, cy, _ = slice_.chips_per_host_bounds
    x0, y0, z = unit[0] * cx, unit[1] * cy, unit[2]
    task = slice_.task_of((x0, y0, z), s)
    where = f"slice {s}, " if slice_.num_slices > 1 else ""
    tip = f"task {task}{_address(hosts, task)}: {where}chips x {x0}-{x0 + cx - 1}, y {y0}-{y0 + cy - 1}, z {z}"
    return [
        f'<rect class="host" x="{x}" y="{y}" width="{w}" height="{h}" '
        f'fill="{PALETTE[task % len(PALETTE)]}"><title>{escape(tip)}</title></rect>',
        f'<text class="htask" x="{x + w // 2}" y="{y + h // 2 + 3}">{task}</text>',
    ]


def _links(slice_: TpuSlice, plan: _Plan, bx: int, by: int) -> list[str]:
    """ICI links between neighbouring boxes (one path per plane) and wraparound arrows."""
    ax, ay = plan.ax, plan.ay
    seg: list[str] = []
    for j in range(ay.count):
        yc = by + ay.offset(j) + ay.size // 2
        for i in range(ax.count - 1):
            right = bx + ax.offset(i) + ax.size
            seg.append(f"M{right},{yc}h{ax.offset(i + 1) - ax.offset(i) - ax.size}")
    for i in range(ax.count):
        xc = bx + ax.offset(i) + ax.size // 2
        for j in range(ay.count - 1):
            bottom = by + ay.offset(j) + ay.size
            seg.append(f"M{xc},{bottom}v{ay.offset(j + 1) - ay.offset(j) - ay.size}")
    out = [f'<path class="ici" d="{"".join(seg)}"/>'] if seg else []
    wrap_x, wrap_y, _ = slice_.wraparound
    if wrap_x:
        for j in range(ay.count):
            yc = by + ay.offset(j) + ay.size // 2
            out.append(f'<path class="wrap" d="M{bx + ax.length},{yc}h{STUB}"/>')
            out.append(f'<path class="wrap" d="M{bx - STUB - 3},{yc}h{STUB}"/>')
    if wrap_y:
        for i in range(ax.count):
            xc = bx + ax.offset(i) + ax.size // 2
            out.append(f'<path class="wrap" d="M{xc},{by + ay.length}v{STUB}"/>')
            out.append(f'<path class="wrap" d="M{xc},{by - STUB - 3}v{STUB}"/>')
    return out


# --- mesh overlay --------------------------------------------------------------------------------


def _overlay_header(overlay: MeshOverlay, plan: _Plan) -> list[str]:
    q = overlay.quality
    shown = (
        f"{len(overlay.lines)} of {overlay.total_lines} lines"
        if overlay.total_lines > len(overlay.lines)
        else f"all {overlay.total_lines} lines"
    )
    lines = [f"mesh {overlay.mesh}: axis {q.axis} ({q.size} devices a line): {q.reason}"]
    if plan.summary:
        lines.append(f"(the mesh is not drawn: it needs chip detail, at most {MAX_CHIPS} chips)")
    else:
        lines.append(
            f"drawing {shown}: a dot marks each line's first device; red: a step over 1 hop; dashed: the closing "
            "step; dash-dot arc: through a wraparound link; grey dots: over DCN"
        )
    return lines


def _centre(slice_: TpuSlice, plan: _Plan, top: int, s: int, loc: Location) -> tuple[float, float]:
    """Where a device sits in the picture: its chip's centre, cores side by side."""
    x, y, z, core = loc
    col, row = z % plan.cols, z // plan.cols
    px = MARGIN + col * (plan.plane_w + PLANE_GAP)
    py = top + s * (plan.slice_h + PLANE_GAP) + plan.caption + row * (plan.plane_h + PLANE_GAP // 2)
    cx = px + PAD_L + plan.ax.offset(x) + plan.ax.size / 2
    cy = py + plan.pad_t + plan.ay.offset(y) + plan.ay.size / 2
    cores = slice_.devices_per_chip
    return cx + (core - (cores - 1) / 2) * 12, cy + plan.ay.size / 2 - 6  # below the chip's ids


def _overlay(slice_: TpuSlice, plan: _Plan, overlay: MeshOverlay, top: int) -> list[str]:
    torus = Torus.of(slice_)
    out = ['<g class="mesh-overlay">']
    for k, line in enumerate(overlay.lines):
        colour = LINE_COLOURS[k % len(LINE_COLOURS)]
        points = [_centre(slice_, plan, top, s, loc) for s, loc in line]
        closing = [len(line) - 1] if len(line) > 2 else []
        for i in [*range(len(line) - 1), *closing]:
            (sa, la), (sb, lb) = line[i], line[(i + 1) % len(line)]
            cls = "mesh" + (" mesh-close" if i == len(line) - 1 else "")
            wraps = sa == sb and torus.uses_wrap(la, lb)
            if sa != sb:
                cls += " mesh-dcn"
            elif torus.hop(la, lb) > 1:
                cls += " mesh-far"
            elif wraps:
                cls += " mesh-wrap"
            (x0, y0), (x1, y1) = points[i], points[(i + 1) % len(line)]
            if sa == sb and la[2] == lb[2] and not wraps:
                d = f"M{x0:g},{y0:g}L{x1:g},{y1:g}"
            else:  # to another plane or slice, or round a wraparound link: an arc, not along a row of chips
                bend = min(40.0, math.hypot(x1 - x0, y1 - y0) / 4)
                length = math.hypot(x1 - x0, y1 - y0) or 1.0
                mx, my = (x0 + x1) / 2 - (y1 - y0) / length * bend, (y0 + y1) / 2 + (x1 - x0) / length * bend
                d = f"M{x0:g},{y0:g}Q{mx:.1f},{my:.1f} {x1:g},{y1:g}"
            out.append(f'<path class="{cls}" stroke="{colour}" d="{d}"/>')
        x, y = points[0]
        out.append(f'<circle cx="{x:g}" cy="{y:g}" r="4" fill="{colour}"/>')
    out.append("</g>")
    return out


# --- legend --------------------------------------------------------------------------------------


def _legend_entries(slice_: TpuSlice, hosts: Sequence[str] | None) -> list[tuple[str | None, str]]:
    """(colour or None, text) per legend line: one per task, or one per colour for many hosts."""
    n = slice_.num_hosts
    if n <= LEGEND_MAX_HOSTS or (hosts is not None and n <= LEGEND_MAX_ADDRESSED):
        return [(PALETTE[t % len(PALETTE)], f"task {t}{_address(hosts, t)}") for t in range(n)]
    entries: list[tuple[str | None, str]] = []
    for k, colour in enumerate(PALETTE[: min(n, len(PALETTE))]):
        tasks = list(range(k, n, len(PALETTE)))
        shown = ", ".join(map(str, tasks[:4])) + (", …" if len(tasks) > 4 else "")
        entries.append((colour, f"tasks {shown} (task mod {len(PALETTE)} = {k})"))
    where = "each box shows its task" if is_summary(slice_) else "a host's first chip shows its task (t<N>)"
    entries.append((None, f"{n} hosts: {where}" + ("; hover a host for its address" if hosts else "")))
    return entries


def _legend_key(three_d: bool) -> tuple[str, str]:
    ici = "ICI link" + (" (z: to the next plane; planes in z order, row by row)" if three_d else "")
    return ici, "wraparound link: leaves one side, enters the opposite side"


def _legend(entries: list[tuple[str | None, str]], three_d: bool, cols: int, col_w: int, ox: int, oy: int) -> list[str]:
    """The link key, then the colour entries in ``cols`` columns, filled column by column."""
    ici, wrap = _legend_key(three_d)
    wrap_x = ox + 30 + _text_w(ici, 12) + 20
    y = oy + LEGEND_ROW
    out = [
        f'<g class="legend"><text class="cap" x="{ox}" y="{oy + 12}">legend</text>',
        f'<path class="ici" d="M{ox},{y + 8}h24"/>',
        f'<text class="info" x="{ox + 30}" y="{y + 12}">{ici}</text>',
        f'<path class="wrap" d="M{wrap_x},{y + 8}h22"/>',
        f'<text class="info" x="{wrap_x + 30}" y="{y + 12}">{wrap}</text>',
    ]
    rows = math.ceil(len(entries) / cols)
    for k, (colour, text) in enumerate(entries):
        x, y = ox + (k // rows) * col_w, oy + (k % rows + 2) * LEGEND_ROW
        if colour is not None:
            out.append(f'<rect class="swatch" x="{x}" y="{y}" width="24" height="13" fill="{colour}"/>')
        out.append(f'<text class="info" x="{x + 30}" y="{y + 11}">{escape(text)}</text>')
    out.append("</g>")
    return out
