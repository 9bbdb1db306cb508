"""The SVG picture of a slice: valid XML, one box per chip (or per host when summarised), ids, links."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from tpuctl.errors import InputError
from tpuctl.render.svg import PALETTE, is_summary, render_svg
from tpuctl.tpu.slice import TpuSlice, resolve_slice

NS = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg.encode("utf-8"))
    assert root.tag == f"{NS}svg"
    return root


def planes(root: ET.Element) -> list[ET.Element]:
    return [g for g in root.iter(f"{NS}g") if g.get("class") == "plane"]


def of_class(elements: Any, tag: str, cls: str) -> list[ET.Element]:
    """Descendants ``<tag class="cls">`` of one element or of a list of elements."""
    roots = elements if isinstance(elements, list) else [elements]
    return [e for r in roots for e in r.iter(f"{NS}{tag}") if e.get("class") == cls]


def texts(elements: Any, cls: str) -> list[str]:
    return [e.text or "" for e in of_class(elements, "text", cls)]


def link_segments(plane: ET.Element) -> int:
    return sum((p.get("d") or "").count("M") for p in of_class(plane, "path", "ici"))


def header(root: ET.Element) -> str:
    return "\n".join(texts(root, "title") + texts(root, "info"))


SMALL = [
    {"accelerator": "v5litepod-1"},
    {"accelerator": "v5litepod-16"},
    {"accelerator": "v6e-8"},
    {"accelerator": "v2-8"},
    {"accelerator": "v3-32"},
    {"accelerator": "v4-32"},
    {"accelerator": "v4-16", "megacore": False},
    {"accelerator": "v4-128"},
    {"accelerator": "v5p-16"},
    {"accelerator": "tpu7x-2"},
    {"accelerator": "tpu7x-8"},
    {"accelerator": "v5litepod-256"},
    {"accelerator": "v5litepod-8", "num_slices": 2, "chips_per_host": 4},
    {"accelerator": "tpu7x-16", "num_slices": 2},
]


def slice_id(kwargs: dict[str, Any]) -> str:
    return "-".join(str(v) for v in kwargs.values())


@pytest.mark.parametrize("kwargs", SMALL, ids=slice_id)
def test_small_slices_show_every_chip_and_device_id(kwargs: dict[str, Any]) -> None:
    s = resolve_slice(**kwargs)
    root = parse(render_svg(s))
    assert not is_summary(s)
    assert len(planes(root)) == s.topology[2] * s.num_slices
    chips = of_class(root, "rect", "chip")
    assert len(chips) == s.chips_per_slice * s.num_slices
    assert sorted(map(int, texts(root, "dev"))) == sorted(d.id for d in s.devices)
    assert sorted(texts(root, "task")) == sorted(f"t{t}" for t in range(s.num_hosts))
    assert of_class(root, "rect", "host") == []


@pytest.mark.parametrize("kwargs", SMALL, ids=slice_id)
def test_chips_of_a_host_share_its_colour(kwargs: dict[str, Any]) -> None:
    s = resolve_slice(**kwargs)
    fills = [rect.get("fill") for rect in of_class(parse(render_svg(s)), "rect", "chip")]
    # Boxes are drawn slice by slice, plane by plane, row by row: y, then x.
    order = sorted(
        {(d.slice, d.coords[2], d.coords[1], d.coords[0]): d.task for d in s.devices}.items(), key=lambda kv: kv[0]
    )
    assert fills == [PALETTE[task % len(PALETTE)] for _, task in order]


def test_neighbouring_hosts_differ_in_colour() -> None:
    s = resolve_slice(accelerator="v5litepod-256")
    colour = {d.coords: PALETTE[d.task % len(PALETTE)] for d in s.devices}
    for (x, y, z), c in colour.items():
        for nx, ny in ((x + 1, y), (x, y + 1)):
            other = (nx, ny, z)
            if other in colour and s.task_of(other) != s.task_of((x, y, z)):
                assert colour[other] != c


@pytest.mark.parametrize(
    ("accelerator", "segments"),
    [
        ("v5litepod-1", 0),
        ("v5litepod-16", 2 * 3 * 4),  # 4x4: 3 links per row, 4 rows, and the same per column
        ("v5litepod-8", 1 * 4 + 2 * 3),  # 2x4
        ("v4-32", 2 + 2),  # each 2x2 plane
        ("v5litepod-256", 2 * 15 * 16),
    ],
)
def test_ici_links_join_neighbouring_chips(accelerator: str, segments: int) -> None:
    root = parse(render_svg(resolve_slice(accelerator=accelerator)))
    assert {link_segments(p) for p in planes(root)} == {segments}


def test_consecutive_planes_side_by_side_are_joined_in_z() -> None:
    s = resolve_slice(accelerator="v4-32")  # 2x2x4: four planes
    root = parse(render_svg(s))
    plane_xs = [min(float(r.get("x") or 0) for r in of_class(p, "rect", "chip")) for p in planes(root)]
    side_by_side = sum(1 for a, b in itertools.pairwise(plane_xs) if b > a)
    assert len(of_class(root, "path", "ici-z")) == side_by_side >= 1


def wrap_arrows(root: ET.Element) -> int:
    return len(of_class(planes(root), "path", "wrap"))


@pytest.mark.parametrize(
    ("kwargs", "arrows"),
    [
        ({"accelerator": "v5litepod-16"}, 0),
        ({"accelerator": "v5litepod-64"}, 0),
        ({"accelerator": "v5litepod-128"}, 2 * 8),  # 8x16: y wraps; an arrow out and in per column
        ({"accelerator": "v6e-256"}, 2 * 16 + 2 * 16),  # 16x16: both axes
        ({"accelerator": "v4-64"}, 0),  # 2x4x4: below one cube
        ({"accelerator": "tpu7x-64"}, 0),
        ({"accelerator": "v4-128"}, 4 * (2 * 4 + 2 * 4) + 2),  # 4x4x4: x and y in every plane, z once each way
        ({"accelerator": "v5p-17920"}, 28 * (2 * 10 + 2 * 8) + 2),  # summary: per row / column of hosts
    ],
    ids=lambda v: slice_id(v) if isinstance(v, dict) else str(v),
)
def test_wraparound_arrows_iff_the_slice_wraps(kwargs: dict[str, Any], arrows: int) -> None:
    s = resolve_slice(**kwargs)
    root = parse(render_svg(s))
    assert wrap_arrows(root) == arrows
    assert (arrows > 0) == any(s.wraparound)
    if s.wraparound[2]:
        assert any("wraparound" in t for t in texts(root, "wlabel"))


def test_header_says_what_the_slice_is() -> None:
    root = parse(render_svg(resolve_slice(accelerator="v5litepod-128")))
    text = header(root)
    for fact in ("v5litepod-128", "topology 8x16", "device kind TPU v5 lite", "32 hosts", "wraparound: x no, y yes"):
        assert fact in text
    assert "summary" not in text


def test_title_replaces_the_first_line() -> None:
    svg = render_svg(resolve_slice(accelerator="v4-8"), title="training slice <a&b>")
    root = parse(svg)
    assert texts(root, "title") == ["training slice <a&b>"]
    assert root.find(f"{NS}title") is not None


def test_host_addresses_in_legend_and_tooltips() -> None:
    s = resolve_slice(accelerator="v4-32")
    hosts = [f"10.0.0.{i + 1}" for i in range(4)]
    hosts[3] = "w-3.tpu<&>"  # escaped, still valid XML
    root = parse(render_svg(s, hosts))
    legend = texts(root, "info")
    for task, address in enumerate(hosts):
        assert f"task {task} ({address})" in legend
    tips = [t.text or "" for rect in of_class(root, "rect", "chip") for t in rect.iter(f"{NS}title")]
    assert "chip (0, 0, 3) · task 3 (w-3.tpu<&>) · device ids 12" in tips


def test_one_address_per_host_or_none() -> None:
    s = resolve_slice(accelerator="v4-32")
    with pytest.raises(InputError) as info:
        render_svg(s, ["10.0.0.1"])
    assert info.value.message == "1 host addresses for v4-32 (2x2x4, 4 hosts), which has 4 hosts"
    assert info.value.hint == "give one address per task, in task order, or none"


def test_multislice_panels_and_ids() -> None:
    s = resolve_slice(accelerator="v5litepod-8", num_slices=2, chips_per_host=4)
    root = parse(render_svg(s))
    captions = texts(root, "cap")
    assert "slice 0 · tasks 0–1" in captions
    assert "slice 1 · tasks 2–3" in captions
    assert {"100000", "100007", "200000", "200007"} <= set(texts(root, "dev"))
    assert "slices joined by DCN" in header(root)


# --- large slices --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "summary"),
    [
        ({"accelerator": "v3-2048"}, False),  # 1024 chips: still one box per chip
        ({"accelerator": "v5litepod-256", "num_slices": 4}, False),
        ({"accelerator": "v3-2048", "num_slices": 2}, True),
        ({"accelerator": "v4-4096"}, True),
        ({"accelerator": "v5p-17920"}, True),
        ({"accelerator": "tpu7x-18432"}, True),
        ({"accelerator": "tpu7x-7808"}, True),
    ],
    ids=lambda v: slice_id(v) if isinstance(v, dict) else str(v),
)
def test_summary_above_1024_chips(kwargs: dict[str, Any], summary: bool) -> None:
    s = resolve_slice(**kwargs)
    svg = render_svg(s)
    root = parse(svg)
    assert is_summary(s) == summary
    assert ("summary:" in header(root)) == summary
    if summary:
        assert len(of_class(root, "rect", "host")) == s.num_hosts
        assert of_class(root, "rect", "chip") == []
        assert texts(root, "dev") == []
        assert sorted(texts(root, "htask"), key=int) == [str(t) for t in range(s.num_hosts)]
    else:
        assert len(of_class(root, "rect", "chip")) == s.chips_per_slice * s.num_slices
    assert len(svg.encode()) < 2_000_000


@pytest.mark.parametrize("accelerator", ["v5p-17920", "tpu7x-18432"])
def test_full_pod_summary(accelerator: str) -> None:
    s = resolve_slice(accelerator=accelerator)
    svg = render_svg(s)
    root = parse(svg)
    hx, hy, hz = s.host_bounds
    assert len(planes(root)) == hz
    assert {len(of_class(p, "rect", "host")) for p in planes(root)} == {hx * hy}
    assert f"{s.num_hosts} hosts" in header(root)
    tips = [t.text or "" for rect in of_class(root, "rect", "host") for t in rect.iter(f"{NS}title")]
    assert tips[0] == "task 0: chips x 0-1, y 0-1, z 0"
    assert len(svg.encode()) < 2_000_000


def test_many_hosts_legend_lists_colours() -> None:
    root = parse(render_svg(resolve_slice(accelerator="v3-2048")))
    legend = texts(root, "info")
    assert "tasks 0, 12, 24, 36, … (task mod 12 = 0)" in legend
    assert "256 hosts: a host's first chip shows its task (t<N>)" in legend


@pytest.mark.parametrize(
    "s",
    [
        resolve_slice(accelerator="v4-128"),
        resolve_slice(accelerator="tpu7x-16", num_slices=2),
        resolve_slice(accelerator="v5p-17920"),
    ],
    ids=["v4-128", "tpu7x-16x2", "v5p-17920"],
)
def test_deterministic(s: TpuSlice) -> None:
    again = TpuSlice(s.generation, s.topology, s.chips_per_host_bounds, s.num_slices, s.megacore, s.device_kind)
    assert render_svg(s) == render_svg(again)
    hosts = [f"h{t}" for t in range(s.num_hosts)]
    assert render_svg(s, hosts, title="t") == render_svg(again, list(hosts), title="t")
