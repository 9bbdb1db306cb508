"""Slices the topology tests run over, and the sim backend's reports for them."""

from __future__ import annotations

from typing import Any

from tpuctl.backends.sim import SimBackend
from tpuctl.tpu.slice import TpuSlice, resolve_slice

# (label, resolve_slice keywords): every generation, both v4 modes, both v5e host sizes, a multislice.
SLICES: list[tuple[str, dict[str, Any]]] = [
    ("v4-32", {"accelerator": "v4-32"}),
    ("v4-16-non-megacore", {"accelerator": "v4-16", "megacore": False}),
    ("v3-32", {"accelerator": "v3-32"}),
    ("v2-8", {"accelerator": "v2-8"}),
    ("v5litepod-16", {"accelerator": "v5litepod-16"}),
    ("v5litepod-16-8chip-hosts", {"accelerator": "v5litepod-16", "chips_per_host": 8}),
    ("tpu7x-16", {"accelerator": "tpu7x-16"}),
    ("v6e-64", {"accelerator": "v6e-64"}),
    ("v5p-128", {"accelerator": "v5p-128"}),
    ("v4-8-one-host", {"accelerator": "v4-8"}),
    ("v5litepod-16x2", {"accelerator": "v5litepod-16", "num_slices": 2}),
    ("v4-16x3", {"accelerator": "v4-16", "num_slices": 3}),
]
SLICE_IDS = [label for label, _ in SLICES]


def make_slice(kw: dict[str, Any]) -> TpuSlice:
    return resolve_slice(**kw)


def sim_reports(tpu: TpuSlice) -> dict[int, list[int]]:
    """What every host's sim backend reports: task -> local core ids."""
    backend = SimBackend(tpu)
    return {t: backend.local_core_ids(t) for t in range(tpu.num_hosts)}
