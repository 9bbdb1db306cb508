"""The goodput ledger (a ``tpuctl.goodput/v1`` document) as text and as an SVG timeline.

Both read the document only (what ``tpuctl goodput --json`` prints), so a saved document renders the same
later. Pure string building, deterministic, stdlib only.

The SVG, read at a glance (the slice picture's style: :mod:`tpuctl.render.svg`)::

    cluster test-pod: goodput 41.2 % of 25.3 s
    | gen 1                         | gen 2                               |   generations as bands
    [bring-up][st][ productive ][lost][rst][ waiting ][r][st][ productive ]   the buckets, coloured
    task 2                         x                 ^                        a host's failure, its return
    0 s        5 s        10 s        15 s        20 s        25 s
    legend: each bucket's colour and total

Sizes are bounded: at most ``KEEP_GENERATIONS`` generations (their segments bounded each), at most
``MAX_HOST_ROWS`` host rows (the rest counted in a caption).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any
from xml.sax.saxutils import escape

from tpuctl.goodput.ledger import BUCKETS, LABELS

COLOURS = {
    "bring_up": "#80b1d3",  # blue: the cluster coming up
    "waiting": "#fdb462",  # orange: waiting for a host
    "startup": "#bebada",  # lavender: the job starting, compiling
    "productive": "#4daf4a",  # green: steps advancing
    "hung": "#e41a1c",  # red: stuck
    "restart": "#ffed6f",  # yellow: detecting a failure, re-forming
    "lost": "#984ea3",  # purple: work thrown away
}
MAX_HOST_ROWS = 16
"""Hosts drawn with a row of their own (failures, returns, notices); the rest are counted."""
TEXT_GENERATIONS = 4
"""Generations with a column of their own in the text table (the earlier ones share one)."""

WIDTH = 960
MARGIN = 16
LABEL_W = 70  # left of the time axis: row labels
HEADER_LINE = 18
BAND_CAPTION = 16
STRIP_H = 30
ROW_H = 18
AXIS_H = 22
LEGEND_ROW = 18
LEGEND_GAP = 20
CHAR_W = 0.62

_STYLE = """\
text{font-family:DejaVu Sans,Arial,sans-serif;fill:#222}
.title{font-size:16px;font-weight:bold}
.info{font-size:12px}
.cap{font-size:11px;font-weight:bold}
.tick{font-size:9px;fill:#666;text-anchor:middle}
.row{font-size:10px;fill:#444}
.seg{font-size:10px;text-anchor:middle}
.band{stroke:#bbb;stroke-width:1}
.segment,.swatch{stroke:#555;stroke-width:.5}
.failure{stroke:#d7191c;stroke-width:2.5}
.return{fill:#1a9641;stroke:#fff;stroke-width:.5}
.notice{fill:#ff7f00;stroke:#fff;stroke-width:.5}
.axis{stroke:#666;stroke-width:1}
"""


# --- text ----------------------------------------------------------------------------------------------


def ledger_text(document: Mapping[str, Any]) -> str:
    """The ledger as a table: a bucket a row, the total and the last ``TEXT_GENERATIONS`` generations a column,
    then a line per generation (how it ended, who came back) and the notes."""
    generations = list(document.get("generations") or [])
    wall = float(document.get("wall_seconds") or 0.0)
    totals = document.get("totals") or {}
    shown = generations[-TEXT_GENERATIONS:]
    earlier = _earlier_column(document, generations[: len(generations) - len(shown)])
    header = ["BUCKET", "TOTAL", "%"] + (["EARLIER"] if earlier is not None else []) + [f"GEN {g['generation']}" for g in shown]
    rows = [header]
    for bucket in BUCKETS:
        total = float(totals.get(bucket, 0.0))
        row = [LABELS[bucket], _cell(total), f"{100 * total / wall:.1f}" if wall > 0 and total else "-"]
        if earlier is not None:
            row.append(_cell(earlier.get(bucket, 0.0)))
        row += [_cell(float((g.get("buckets") or {}).get(bucket, 0.0))) for g in shown]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [_headline(document), ""]
    lines += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip() for r in rows]
    lines.append("")
    for gen in generations:
        lines.append(_generation_line(gen))
    if document.get("earlier"):
        e = document["earlier"]
        first, last = e.get("generations", [0, 0])
        lines.append(f"generations {first}-{last}: summed ({e.get('failed_hosts', 0):,} hosts failed in them)")
    for note in document.get("notes") or []:
        lines.append(f"note: {note}")
    if document.get("error"):
        lines.append(f"cluster error: {document['error']}")
    return "\n".join(lines)


def _headline(document: Mapping[str, Any]) -> str:
    wall = float(document.get("wall_seconds") or 0.0)
    bucket = document.get("bucket")
    now = f"now: {LABELS.get(bucket, bucket)}" if bucket else "the cluster is down"
    return (
        f"cluster {document.get('cluster')}: goodput {100 * float(document.get('goodput') or 0.0):.1f} % of "
        f"{duration(wall)} since {_clock(document.get('since'), date=True)} (generation {document.get('generation')}, {now})"
    )


def _earlier_column(document: Mapping[str, Any], hidden: list[Mapping[str, Any]]) -> dict[str, float] | None:
    folded = document.get("earlier")
    if not hidden and not folded:
        return None
    column = {b: float(((folded or {}).get("totals") or {}).get(b, 0.0)) for b in BUCKETS}
    for gen in hidden:
        for bucket in BUCKETS:
            column[bucket] += float((gen.get("buckets") or {}).get(bucket, 0.0))
    return column


def _generation_line(gen: Mapping[str, Any]) -> str:
    end = gen.get("end")
    span = f"{_clock(gen.get('start'))}-{_clock(end) if end is not None else 'now'} ({duration(float(gen.get('wall_seconds') or 0))})"
    text = f"generation {gen.get('generation')}  {span}"
    if gen.get("ended"):
        failed = int(gen.get("failed_hosts") or 0)
        named = len(gen.get("failures") or [])
        more = f" ({named} of {failed:,} failed hosts named)" if failed > named else ""
        text += f": {'final: ' if gen.get('final') else ''}{gen['ended']}{more}"
    returns = gen.get("returns") or []
    if returns:
        text += "; back: " + ", ".join(f"task {r.get('task')} at {_clock(r.get('at'))}" for r in returns)
    notices = gen.get("notices") or []
    if notices:
        total = int(gen.get("notices_total") or len(notices))
        text += f"; {total:,} preemption notice{'s' if total != 1 else ''} (first: task {notices[0].get('task')}, {notices[0].get('source')})"
    steps = gen.get("steps") or {}
    if steps.get("lost_steps") is not None:
        text += f"; {steps['lost_steps']:,} steps lost (a notice's deadline came first)"
    return text


def _cell(seconds: float) -> str:
    return duration(seconds) if seconds > 0 else "-"


def duration(seconds: float) -> str:
    """``0.4 s``, ``45.2 s``, ``12 min 5 s``, ``2 h 5 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def _clock(at: object, *, date: bool = False) -> str:
    if not isinstance(at, (int, float)) or isinstance(at, bool):
        return "?"
    if date:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    tenths = round(at * 10)
    return time.strftime("%H:%M:%S", time.localtime(tenths // 10)) + f".{tenths % 10}"


# --- SVG -----------------------------------------------------------------------------------------------


def ledger_svg(document: Mapping[str, Any]) -> str:
    """A standalone SVG timeline of the ledger: generations as bands, the buckets coloured along one strip,
    a row per named host with its failures (x), returns (triangle) and preemption notices (diamond)."""
    since = float(document.get("since") or 0.0)
    wall = max(float(document.get("wall_seconds") or 0.0), 1e-3)
    generations = list(document.get("generations") or [])
    x0, x1 = MARGIN + LABEL_W, WIDTH - MARGIN
    scale = (x1 - x0) / wall

    def x(at: float) -> float:
        return round(x0 + min(max(at, 0.0), wall) * scale, 2)

    hosts, more = _host_rows(generations)
    header = [
        f"cluster {document.get('cluster')}: goodput {100 * float(document.get('goodput') or 0.0):.1f} % of {duration(wall)}",
        f"from {_clock(since, date=True)} · generation {document.get('generation')} · "
        + (f"now: {LABELS.get(document.get('bucket') or '', '')}" if document.get("bucket") else "the cluster is down"),
    ]
    top = MARGIN + len(header) * HEADER_LINE + 8
    strip_y = top + BAND_CAPTION
    rows_y = strip_y + STRIP_H + 8
    axis_y = rows_y + len(hosts) * ROW_H + (ROW_H if more else 0) + 4
    legend_y = axis_y + AXIS_H + 8
    entries = _legend_entries(document.get("totals") or {}, wall)
    col_w = max(_text_w(text, 12) for _, text in entries) + 30 + LEGEND_GAP
    legend_cols = max(1, min(len(entries), (WIDTH - 2 * MARGIN) // col_w))
    height = legend_y + (math.ceil(len(entries) / legend_cols) + 1) * LEGEND_ROW + MARGIN

    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}">',
        f"<title>{escape(header[0])}</title>",
        f"<style>{_STYLE}</style>",
        f'<rect width="{WIDTH}" height="{height}" fill="#fff"/>',
    ]
    out += [
        f'<text class="{"title" if i == 0 else "info"}" x="{MARGIN}" y="{MARGIN + 12 + i * HEADER_LINE}">{escape(line)}</text>'
        for i, line in enumerate(header)
    ]
    band_h = axis_y - top
    earlier = document.get("earlier")
    if earlier:
        end = float(earlier.get("end", since)) - since
        first, last = earlier.get("generations", [0, 0])
        out.append(
            f'<g class="generation" data-generation="{first}-{last}"><rect class="band" x="{x(0)}" y="{top}" '
            f'width="{round(x(end) - x(0), 2)}" height="{band_h}" fill="#eee"/>'
            f'<text class="cap" x="{x(0) + 3}" y="{top + 12}">gen {first}-{last}</text></g>'
        )
    for i, gen in enumerate(generations):
        start = float(gen.get("start", since)) - since
        end = (float(gen["end"]) if gen.get("end") is not None else since + wall) - since
        fill = "#f4f4f4" if i % 2 == 0 else "#fff"
        label = f"gen {gen.get('generation')}"
        out.append(
            f'<g class="generation" data-generation="{gen.get("generation")}"><rect class="band" x="{x(start)}" '
            f'y="{top}" width="{round(x(end) - x(start), 2)}" height="{band_h}" fill="{fill}"/>'
            + (f'<text class="cap" x="{x(start) + 3}" y="{top + 12}">{escape(label)}</text>' if x(end) - x(start) > _text_w(label, 11) else "")
            + "</g>"
        )
    out.append(f'<text class="row" x="{MARGIN}" y="{strip_y + STRIP_H // 2 + 4}">buckets</text>')
    for gen in generations:
        for a, b, bucket in gen.get("segments") or []:
            label, width = LABELS.get(bucket, str(bucket)), max(0.0, round(x(b) - x(a), 2))
            out.append(
                f'<rect class="segment" data-bucket="{escape(str(bucket))}" x="{x(a)}" y="{strip_y}" '
                f'width="{width}" height="{STRIP_H}" fill="{COLOURS.get(bucket, "#ccc")}">'
                f"<title>{escape(label)}: {duration(b - a)}</title></rect>"
            )
            for text in (f"{label} {duration(b - a)}", label, duration(b - a)):  # the longest that fits
                if _text_w(text, 10) + 6 <= width:
                    out.append(f'<text class="seg" x="{round(x(a) + width / 2, 2)}" y="{strip_y + STRIP_H // 2 + 4}">{escape(text)}</text>')
                    break
    for row, (task, marks) in enumerate(hosts):
        y = rows_y + row * ROW_H
        out.append(f'<text class="row" x="{MARGIN}" y="{y + 12}">task {task}</text>')
        for kind, at, what in marks:
            out.append(_mark(kind, x(at - since), y + 8, what))
    if more:
        out.append(f'<text class="row" x="{MARGIN}" y="{rows_y + len(hosts) * ROW_H + 12}">... and {more:,} more hosts not drawn</text>')
    out += _axis(wall, x, axis_y)
    out += _legend(entries, legend_y, legend_cols, col_w)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _host_rows(generations: list[Mapping[str, Any]]) -> tuple[list[tuple[int, list[tuple[str, float, str]]]], int]:
    """Each named host's marks (kind, time, what), in the order hosts first appear; the count not drawn."""
    rows: dict[int, list[tuple[str, float, str]]] = {}
    for gen in generations:
        entries = [("failure", f, f"failed: {f.get('cause')}") for f in gen.get("failures") or []]
        entries += [("return", r, "registered again") for r in gen.get("returns") or []]
        entries += [("notice", n, f"preemption notice: {n.get('source')}") for n in gen.get("notices") or []]
        for kind, entry, what in entries:
            at, task = entry.get("at"), entry.get("task")
            if isinstance(at, (int, float)) and isinstance(task, int) and not isinstance(task, bool):
                rows.setdefault(task, []).append((kind, float(at), what))
    drawn = list(rows.items())[:MAX_HOST_ROWS]
    return drawn, max(0, len(rows) - MAX_HOST_ROWS)


def _mark(kind: str, cx: float, cy: float, what: str) -> str:
    tip = f"<title>{escape(what[:200])}</title>"
    if kind == "failure":
        return (
            f'<g class="failure"><path class="failure" d="M{cx - 5},{cy - 5}L{cx + 5},{cy + 5}M{cx - 5},{cy + 5}L{cx + 5},{cy - 5}"/>'
            f"{tip}</g>"
        )
    if kind == "return":
        return f'<path class="return" d="M{cx},{cy - 6}L{cx + 6},{cy + 5}L{cx - 6},{cy + 5}z">{tip}</path>'
    return f'<path class="notice" d="M{cx},{cy - 6}L{cx + 6},{cy}L{cx},{cy + 6}L{cx - 6},{cy}z">{tip}</path>'


def _axis(wall: float, x: Any, y: float) -> list[str]:
    step = _tick_step(wall)
    out = [f'<line class="axis" x1="{x(0)}" y1="{y}" x2="{x(wall)}" y2="{y}"/>']
    for i in range(int(wall // step) + 1):
        at = i * step
        out.append(f'<line class="axis" x1="{x(at)}" y1="{y}" x2="{x(at)}" y2="{y + 4}"/>')
        out.append(f'<text class="tick" x="{x(at)}" y="{y + 14}">{_tick_label(at, step)}</text>')
    return out


def _tick_step(wall: float) -> float:
    """A round step (1, 2, 5 x 10^k seconds; minutes and hours for long walls) giving about 8 ticks."""
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 21600, 43200, 86400):
        if wall / step <= 10:
            return float(step)
    return 86400.0 * math.ceil(wall / 86400 / 10)


def _tick_label(at: float, step: float) -> str:
    if step < 60:
        return f"{at:g} s"
    if step < 3600:
        return f"{at / 60:g} min"
    return f"{at / 3600:g} h"


def _legend_entries(totals: Mapping[str, Any], wall: float) -> list[tuple[str, str]]:
    """Each bucket's colour and ``label: total (share)``."""
    entries = []
    for bucket in BUCKETS:
        total = float(totals.get(bucket, 0.0))
        share = f" ({100 * total / wall:.1f} %)" if wall > 0 else ""
        entries.append((COLOURS[bucket], f"{LABELS[bucket]}: {duration(total)}{share}"))
    return entries


def _legend(entries: list[tuple[str, str]], y: float, cols: int, col_w: int) -> list[str]:
    out = [f'<g class="legend"><text class="cap" x="{MARGIN}" y="{y + 12}">buckets</text>']
    for i, (colour, text) in enumerate(entries):
        cx = MARGIN + (i % cols) * col_w
        cy = y + (i // cols + 1) * LEGEND_ROW
        out.append(f'<rect class="swatch" x="{cx}" y="{cy}" width="24" height="13" fill="{colour}"/>')
        out.append(f'<text class="info" x="{cx + 30}" y="{cy + 11}">{escape(text)}</text>')
    out.append("</g>")
    return out


def _text_w(text: str, font_px: int) -> int:
    return math.ceil(len(text) * font_px * CHAR_W)
