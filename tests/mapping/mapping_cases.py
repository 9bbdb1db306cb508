"""Mappings the mapping tests start from: built the way every host builds them after the merge."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from tpuctl.backends.sim import SimBackend
from tpuctl.mapping.model import DeviceMapping, build_mapping
from tpuctl.tpu.slice import resolve_slice
from tpuctl.tpu.topology import build_topologies, merge_core_ids

CREATED = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc)
INCARNATION = 0xFEDC_BA98_7654_3210  # above 2**53: JSON numbers would lose it


def sim_mapping(cluster: str = "pod-a", incarnation: int = INCARNATION, **slice_kw: Any) -> DeviceMapping:
    tpu = resolve_slice(**(slice_kw or {"accelerator": "v4-32"}))
    sim = SimBackend(tpu)
    merged = merge_core_ids({t: sim.local_core_ids(t) for t in range(tpu.num_hosts)}, tpu)
    hosts = [f"10.0.{t // 256}.{t % 256}" for t in range(tpu.num_hosts)]
    return build_mapping(
        slice=tpu,
        cluster=cluster,
        incarnation=incarnation,
        hosts=hosts,
        merged=merged,
        topology=build_topologies(merged, tpu),
        created=CREATED,
    )
