"""The ``jax`` backend: local TPU core ids from ``jax.local_devices(backend="tpu")``.

jax is imported inside the call (importing it costs about a second, and libtpu then owns the TPU in this
process: call this from a short-lived process, before the job starts). On a host without TPUs
``jax.devices("tpu")`` raises RuntimeError in under a second; that becomes a NoTpuError.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tpuctl.errors import NoTpuError
from tpuctl.tpu.slice import TpuSlice
from tpuctl.tpu.topology import device_core_id

NO_TPU_HINT = "run tpuctl init on a TPU VM, or set `backend: sim` in the spec to simulate the slice"
# libtpu lets one process own the TPU; a second one fails on its lockfile.
BUSY_SIGNS = ("libtpu_lockfile", "multi-process lockfile", "TPU is already in use")
BUSY_HINT = "stop the process using the TPU (`lsof -w /dev/accel* /dev/vfio/*` shows it), then run tpuctl init again"


class TpuDeviceLike(Protocol):
    """The attributes of ``jax.Device`` (and of libtpu's compile-only devices) used here."""

    @property
    def coords(self) -> Sequence[int]: ...

    @property
    def core_on_chip(self) -> int: ...


def core_ids_of_devices(devices: Iterable[TpuDeviceLike], slice: TpuSlice) -> list[int]:
    """Core ids of devices in the order given: ``coords`` and ``core_on_chip`` through the core-id formula."""
    out = []
    for device in devices:
        x, y, z = (int(c) for c in device.coords)
        out.append(device_core_id((x, y, z), int(device.core_on_chip), slice))
    return out


@dataclass(frozen=True)
class JaxBackend:
    slice: TpuSlice
    name = "jax"  # as --backend spells it (a class attribute, not a field)

    def local_core_ids(self, task: int) -> list[int]:
        """This process's TPU devices (``task`` is not needed: the runtime knows its own host)."""
        import jax

        try:
            jax.devices("tpu")
            local: list[Any] = jax.local_devices(backend="tpu")
        except RuntimeError as exc:
            said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if any(sign in said for sign in BUSY_SIGNS):
                raise NoTpuError(
                    f"the TPU on this host is held by another process (backend jax): {said}", hint=BUSY_HINT
                ) from exc
            raise NoTpuError(f"no TPU found on this host (backend jax): {said}", hint=NO_TPU_HINT) from exc
        if not local:
            raise NoTpuError("no TPU found on this host (backend jax): jax lists no local TPU device", hint=NO_TPU_HINT)
        return core_ids_of_devices(local, self.slice)
