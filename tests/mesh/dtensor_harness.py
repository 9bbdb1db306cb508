"""DTensor's own ``create_tpu_mesh`` run on CPU against a synthetic pod (reference dtensor.md §6.6).

``create_tpu_mesh`` needs a TPU runtime for three things, all faked here with tpuctl's own slice model:
the topology (``tpu_util._tpu_topology``, built by DTensor's ``_create_tpu_topology`` from the locations
tpuctl's merge produces), the C++ device (``_dtensor_device``: core locations <-> core ids, and the
per-mesh core-id map it records), and the local TPU count (``config.num_local_devices``). The client is
chosen with ``DTENSOR_JOBS`` / ``DTENSOR_CLIENT_ID``, as a real cluster would set them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from tpuctl.tpu.slice import TpuSlice
from tpuctl.tpu.topology import core_id_of, core_location, merge_core_ids


class FakeDevice:
    """The three calls ``create_tpu_mesh`` makes on ``_dtensor_device``, over tpuctl's core numbering."""

    def __init__(self, tpu: TpuSlice) -> None:
        self.tpu = tpu
        self.core_ids: dict[str, list[int]] = {}

    def tpu_core_locations_to_ids(self, locations: Sequence[Sequence[int]]) -> list[int]:
        return [core_id_of((x, y, z), c, self.tpu) for x, y, z, c in locations]

    def set_tpu_core_ids(self, name: str, ids: Sequence[int]) -> None:
        if name in self.core_ids:
            raise ValueError(f"Mesh name already in use: {name}")
        self.core_ids[name] = list(ids)


@contextmanager
def fake_pod(tf: Any, tpu: TpuSlice, client: int, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDevice]:
    """DTensor's module state for task ``client`` of a single-slice ``tpu``."""
    tu, config = tf.tpu_util, tf.config
    per_task = {t: [core_id_of(d.coords, d.core, tpu) for d in tpu.devices_of_task(t)] for t in range(tpu.num_hosts)}
    merged = merge_core_ids(per_task, tpu)
    locations = []
    for core_id in merged.all_core_ids:
        loc = core_location(core_id, tpu)  # a megacore device is its chip's core 0
        locations.append(tu._CoreLocation(loc.x, loc.y, loc.z, loc.core))
    topology = tu._create_tpu_topology(locations, tpu.num_hosts, tpu.devices_per_host)
    device = FakeDevice(tpu)
    with monkeypatch.context() as m:
        if tpu.num_hosts > 1:
            m.setenv("DTENSOR_JOBS", ",".join(f"host{t}:8470" for t in range(tpu.num_hosts)))
        else:
            m.delenv("DTENSOR_JOBS", raising=False)
        m.delenv("DTENSOR_JOB_NAME", raising=False)
        m.setenv("DTENSOR_CLIENT_ID", str(client))
        real = config.num_local_devices
        m.setattr(config, "num_local_devices", lambda kind: tpu.devices_per_host if kind == "TPU" else real(kind))
        m.setattr(tu, "_tpu_topology", topology)
        m.setattr(tu, "_dtensor_device", device)
        yield device
