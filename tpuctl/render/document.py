"""The stable JSON document of a slice (``tpuctl topology show --format json``).

Keys are part of tpuctl's interface (documented in docs/reference/json.md); new keys may be added, none removed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tpuctl.tpu.slice import TpuSlice

TOPOLOGY_SCHEMA = "tpuctl.topology/v2"
"""v2: ``tasks[].chips`` is aligned with ``tasks[].device_ids`` (v1 listed each chip once, sorted)."""


def slice_document(tpu: TpuSlice, hosts: Sequence[str | None] | None = None) -> dict[str, Any]:
    """Everything ``topology show`` knows about ``tpu``, as plain JSON values."""
    addresses = list(hosts) if hosts is not None else [None] * tpu.num_hosts
    devices = tpu.devices
    per_host = tpu.devices_per_host
    tasks = []
    for task in range(tpu.num_hosts):
        own = devices[task * per_host : (task + 1) * per_host]
        tasks.append(
            {
                "task": task,
                "address": addresses[task],
                "slice": own[0].slice,
                "device_ids": [d.id for d in own],
                "chips": [list(d.coords) for d in own],  # chips[i] holds device_ids[i]
            }
        )
    return {
        "schema": TOPOLOGY_SCHEMA,
        "accelerator": tpu.accelerator_type,
        "generation": tpu.generation.name,
        "device_kind": tpu.device_kind,
        "topology": list(tpu.topology),
        "topology_name": tpu.topology_str,
        "wraparound": list(tpu.wraparound),
        "num_slices": tpu.num_slices,
        "megacore": tpu.megacore,
        "chips_per_host_bounds": list(tpu.chips_per_host_bounds),
        "host_bounds": list(tpu.host_bounds),
        "hosts_per_slice": tpu.hosts_per_slice,
        "num_hosts": tpu.num_hosts,
        "devices_per_chip": tpu.devices_per_chip,
        "devices_per_host": tpu.devices_per_host,
        "num_devices": tpu.num_devices,
        "tasks": tasks,
        "devices": [
            {
                "id": d.id,
                "task": d.task,
                "slice": d.slice,
                "coords": list(d.coords),
                "core": d.core,
                "ordinal": d.ordinal,
            }
            for d in devices
        ],
    }
