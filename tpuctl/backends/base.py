"""What a device backend is: something that reports the TPU core ids this host's runtime sees."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Backend(Protocol):
    """Reports one host's TPU core ids, as ``tpu_system_init_helper`` reads them from the runtime.

    Core ids are TensorCore numbers within the host's slice, ``core + cores_per_chip * (x + X * (y + Y * z))``,
    in local device-ordinal order; a megacore device is its chip's core 0 (even ids; DTensor's ``* 2``).
    """

    @property
    def name(self) -> str:
        """The backend's name as ``--backend`` spells it: ``sim``, ``tensorflow``, ``jax``."""
        ...

    def local_core_ids(self, task: int) -> list[int]:
        """Core ids of task ``task``'s local devices, in local ordinal order.

        Raises NoTpuError when a real backend finds no TPU on this host.
        """
        ...
