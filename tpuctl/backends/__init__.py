"""Device backends: where a host's TPU core ids come from.

``sim`` derives them from the slice model (no hardware); ``tensorflow`` and ``jax`` ask the real TPU
runtime through that framework, imported only when the backend is used.
"""

from __future__ import annotations

import difflib

from tpuctl.backends.base import Backend
from tpuctl.errors import InputError
from tpuctl.tpu.slice import TpuSlice

BACKEND_NAMES = ("sim", "tensorflow", "jax")

__all__ = ["BACKEND_NAMES", "Backend", "get_backend"]


def get_backend(name: str, slice: TpuSlice) -> Backend:
    """The backend called ``name`` for ``slice``. Cheap: no framework is imported until it is asked."""
    key = name.strip().lower()
    if key == "sim":
        from tpuctl.backends.sim import SimBackend

        return SimBackend(slice)
    if key in ("tensorflow", "tf"):
        from tpuctl.backends.tensorflow import TensorFlowBackend

        return TensorFlowBackend(slice)
    if key == "jax":
        from tpuctl.backends.jax import JaxBackend

        return JaxBackend(slice)
    guess = difflib.get_close_matches(key, BACKEND_NAMES, n=1, cutoff=0.5)
    raise InputError(
        f"unknown device backend {name!r}",
        hint=f"did you mean {guess[0]}?" if guess else f"backends are {', '.join(BACKEND_NAMES)}",
    )
