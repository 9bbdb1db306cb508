"""The slice model against libtpu itself: every device's id, task, coords, core, slice and device_kind.

``jax.experimental.topologies.get_topology_desc`` builds libtpu's compile-only device objects for any
slice on a CPU-only machine (the dev extra installs libtpu), so these run in CI and never skip. Each
libtpu call takes 1-350 ms (the full 7x pod, 18432 devices, is the slowest); results are cached per
topology so a case is built once however many tests read it. libtpu prints warnings on stderr.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import pytest
from jax.experimental import topologies

from tpuctl.tpu.slice import TpuSlice, resolve_slice

pytestmark = pytest.mark.oracle

Row = tuple[int, int, tuple[int, int, int], int, int]
"""(id, task, coords, core, slice) of one device, in list order."""
Listing = tuple[tuple[Row, ...], frozenset[str], tuple[int, ...]]
"""libtpu's rows, its device_kind strings, and each row's local ordinal (position within its task)."""


@functools.cache
def _libtpu(
    name: str, chips_per_host_bounds: tuple[int, int, int], num_slices: int, chip_config: str | None
) -> Listing:
    """libtpu's device list for one topology, as a Listing."""
    kwargs: dict[str, Any] = {"chip_config_name": chip_config} if chip_config else {}
    desc: Any = topologies.get_topology_desc(
        name, "tpu", chips_per_host_bounds=chips_per_host_bounds, num_slices=num_slices, **kwargs
    )
    # ``slice_index`` raises AttributeError on a single-slice topology.
    rows: list[Row] = [
        (d.id, d.process_index, tuple(d.coords), d.core_on_chip, getattr(d, "slice_index", 0)) for d in desc.devices
    ]
    seen: Counter[int] = Counter()
    ordinals: list[int] = []
    for row in rows:
        ordinals.append(seen[row[1]])
        seen[row[1]] += 1
    return tuple(rows), frozenset(d.device_kind for d in desc.devices), tuple(ordinals)


def libtpu_devices(s: TpuSlice) -> Listing:
    # chip_config_name only means something to the megacore generations (v4, v5p).
    config = ("megacore" if s.megacore else "default") if s.generation.name in ("v4", "v5p") else None
    return _libtpu(s.libtpu_topology_name, s.chips_per_host_bounds, s.num_slices, config)


def case(accelerator: str | None = None, **kwargs: Any) -> Any:
    """One matrix entry: resolve_slice arguments, with a readable test id."""
    if accelerator:
        kwargs["accelerator"] = accelerator
    label = "-".join(
        [kwargs.get("accelerator") or f"{kwargs['generation']}:{kwargs['topology']}"]
        + [f"{k}={v}" for k, v in sorted(kwargs.items()) if k not in ("accelerator", "generation", "topology")]
    )
    return pytest.param(kwargs, id=label)


SINGLE = [
    # v2 / v3: 2 devices per chip, 2x2 hosts.
    *(case(f"v2-{n}") for n in (8, 32, 128, 256, 512)),
    *(case(f"v3-{n}") for n in (8, 32, 64, 128, 256, 512, 1024, 2048)),
    # v4 megacore (1 device per chip) up to the largest listed type and the full 16x16x16 pod.
    *(case(f"v4-{n}") for n in (8, 16, 32, 64, 128, 256, 384, 512, 1024, 1536, 2048, 4096)),
    case(generation="v4", topology="16x16x16"),
    # v4 with megacore off: 2 devices per chip.
    *(case(f"v4-{n}", megacore=False) for n in (8, 16, 32, 64, 128, 512)),
    case(generation="v4", topology="4x8x8", megacore=False),
    # v5e / v6e: 1x1 hosts for one chip, one 8-chip host for 2x4, 2x2 hosts above; 8-chip hosts on request.
    *(case(f"v5litepod-{n}") for n in (1, 4, 8, 16, 32, 64, 128, 256)),
    *(case(f"v6e-{n}") for n in (1, 4, 8, 16, 32, 64, 128, 256)),
    *(case(f"v5litepod-{n}", chips_per_host=8) for n in (16, 32, 64, 256)),
    *(case(f"v6e-{n}", chips_per_host=8) for n in (16, 128, 256)),
    case("v5litepod-8", chips_per_host=4),
    case("v6e-8", chips_per_host=4),
    # v5p (always megacore) up to the full 8960-chip pod.
    *(case(f"v5p-{n}") for n in (8, 16, 32, 64, 128, 256, 640, 1152, 2304, 6144, 9856, 12288, 17920)),
    case(generation="v5p", topology="8x16x16"),
    # 7x: 2 devices per chip, from the single-chip VM to the full 9216-chip pod and the thin 4x4x244.
    *(case(f"tpu7x-{n}") for n in (2, 8, 16, 32, 64, 128, 1152, 7808, 18432)),
    case(generation="7x", topology="4x8x188"),
]

MULTI = [
    *(
        case(a, num_slices=2)
        for a in ("v2-32", "v3-32", "v4-16", "v4-128", "v5litepod-1", "v5litepod-8", "v5litepod-16", "v6e-8")
    ),
    *(case(a, num_slices=2) for a in ("v6e-64", "v5p-128", "tpu7x-2", "tpu7x-8", "tpu7x-128")),
    case("v4-16", num_slices=2, megacore=False),
    case("v5litepod-8", num_slices=2, chips_per_host=4),
    case("v6e-32", num_slices=2, chips_per_host=8),
    *(case(a, num_slices=4) for a in ("v3-8", "v4-32", "v5litepod-16", "v6e-256", "v5p-16", "tpu7x-32")),
    case("v4-8", num_slices=4, megacore=False),
    case("v5litepod-32", num_slices=4, chips_per_host=8),
]

# Several TPU processes per machine: libtpu numbers the processes of a process block (its chips_per_host_bounds
# is the process's block) as tpuctl numbers tasks; the recorded tpu7x-16 LeaderWorkerSet split first.
PROCESSES = [
    case("tpu7x-16", chips_per_process_bounds=(1, 2, 1)),
    case("tpu7x-16", chips_per_process_bounds=(1, 1, 1)),
    case("tpu7x-128", chips_per_process_bounds=(1, 2, 1)),
    case("v4-16", chips_per_process_bounds=(1, 1, 1)),
    case("v4-32", chips_per_process_bounds=(2, 1, 1), megacore=False),
    case("v5litepod-4", chips_per_process_bounds=(1, 1, 1)),
    case("v6e-8", chips_per_process_bounds=(2, 2, 1)),
    case("tpu7x-16", chips_per_process_bounds=(1, 2, 1), num_slices=2),
]

MATRIX = SINGLE + MULTI + PROCESSES


@pytest.mark.parametrize("kwargs", MATRIX)
def test_devices_match_libtpu(kwargs: dict[str, Any]) -> None:
    s = resolve_slice(**kwargs)
    rows, kinds, ordinals = libtpu_devices(s)
    model = [(d.id, d.task, d.coords, d.core, d.slice) for d in s.devices]
    assert len(model) == len(rows) == s.num_devices
    first_diff = next((i for i, (a, b) in enumerate(zip(model, rows, strict=True)) if a != b), None)
    assert first_diff is None, f"device {first_diff}: model {model[first_diff]}, libtpu {rows[first_diff]}"
    assert tuple(d.ordinal for d in s.devices) == ordinals
    assert kinds == {s.device_kind}


@pytest.mark.parametrize("kwargs", MATRIX)
def test_hosts_match_libtpu(kwargs: dict[str, Any]) -> None:
    s = resolve_slice(**kwargs)
    rows, _, _ = libtpu_devices(s)
    per_task = Counter(task for _, task, _, _, _ in rows)
    assert s.num_hosts == len(per_task)
    hx, hy, hz = s.host_bounds
    assert hx * hy * hz * s.num_slices == len(per_task)
    assert set(per_task.values()) == {s.devices_per_host}
    chips: dict[int, set[tuple[int, int, int]]] = {}
    for _, task, coords, _, _ in rows:
        chips.setdefault(task, set()).add(coords)
    for task, coords_of_task in chips.items():
        assert coords_of_task == {d.coords for d in s.devices_of_task(task)}


def maxtext_wrap(s: TpuSlice) -> tuple[bool, bool, bool]:
    """Wraparound as the MaxText accelerator table states it (reference §1, §1.1), written independently."""
    x, y, z = s.topology
    if s.generation.ndims == 3:  # v4, v5p, 7x: every axis iff the slice holds a whole 4x4x4 cube
        full = min(x, y, z) >= 4
        return (full, full, full)
    return (x == 16, y == 16, False)  # v5e, v6e: an axis iff it spans the 16-chip pod side


def _stated_by_maxtext(param: Any) -> bool:
    kwargs = param.values[0]
    name = kwargs.get("accelerator") or kwargs["generation"]
    return not name.startswith(("v2", "v3"))  # MaxText lists no v2/v3 slices


@pytest.mark.parametrize("kwargs", [p for p in MATRIX if _stated_by_maxtext(p)])
def test_wraparound_follows_maxtext_rule(kwargs: dict[str, Any]) -> None:
    s = resolve_slice(**kwargs)
    assert s.wraparound == maxtext_wrap(s)


@pytest.mark.parametrize(
    ("accelerator", "wrap"),
    [
        ("v5litepod-64", (False, False, False)),
        ("v5litepod-128", (False, True, False)),
        ("v5litepod-256", (True, True, False)),
        ("v6e-128", (False, True, False)),
        ("v6e-256", (True, True, False)),
        ("v4-64", (False, False, False)),
        ("v4-128", (True, True, True)),
        ("v4-256", (True, True, True)),  # a real v4-256 tpu-env: WRAP 'true,true,true'
        ("v5p-64", (False, False, False)),
        ("v5p-128", (True, True, True)),
        ("v5p-17920", (True, True, True)),
        ("tpu7x-2", (False, False, False)),
        ("tpu7x-64", (False, False, False)),
        ("tpu7x-128", (True, True, True)),
        ("tpu7x-7808", (True, True, True)),
    ],
)
def test_wraparound_table(accelerator: str, wrap: tuple[bool, bool, bool]) -> None:
    assert resolve_slice(accelerator=accelerator).wraparound == wrap
