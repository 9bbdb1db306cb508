"""The simulated TPU runtime: core ids derived from the slice model, for tests and dry runs.

Faithful to libtpu's numbering (checked against ``jax.experimental.topologies`` in the tests): task t
holds the devices ``TpuSlice.devices_of_task(t)`` in their runtime (local ordinal) order, and each reports
``core + cores_per_chip * (x + X * (y + Y * z))``, its chip's core 0 under megacore. It never touches
hardware and works for any task of the slice, so one process can play every host.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuctl.tpu.slice import TpuSlice
from tpuctl.tpu.topology import device_core_id


@dataclass(frozen=True)
class SimBackend:
    slice: TpuSlice
    name = "sim"  # as --backend spells it (a class attribute, not a field)

    def local_core_ids(self, task: int) -> list[int]:
        """Raises TopologyError for a task outside the slice. O(devices per host)."""
        return [device_core_id(d.coords, d.core, self.slice) for d in self.slice.devices_of_task(task)]
