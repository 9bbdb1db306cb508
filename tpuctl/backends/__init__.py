"""Device backends: where a host's TPU core ids come from.

``sim`` derives them from the slice model (no hardware); ``tensorflow`` and ``jax`` ask the real TPU
runtime through that framework, imported only when the backend is used. The names are
:mod:`tpuctl.backends.names`, shared with the spec.
"""

from __future__ import annotations

from tpuctl.backends.base import Backend
from tpuctl.backends.names import BACKEND_NAMES, backend_hint
from tpuctl.errors import InputError
from tpuctl.tpu.slice import TpuSlice

__all__ = ["BACKEND_NAMES", "Backend", "get_backend"]


def get_backend(name: str, slice: TpuSlice) -> Backend:
    """The backend called ``name`` for ``slice``. Cheap: no framework is imported until it is asked."""
    if name == "sim":
        from tpuctl.backends.sim import SimBackend

        return SimBackend(slice)
    if name == "tensorflow":
        from tpuctl.backends.tensorflow import TensorFlowBackend

        return TensorFlowBackend(slice)
    if name == "jax":
        from tpuctl.backends.jax import JaxBackend

        return JaxBackend(slice)
    raise InputError(f"unknown device backend {name!r}", hint=backend_hint(name))
