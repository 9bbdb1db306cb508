"""Which backend a name stands for: :func:`get_backend`, the one place a backend is chosen by name."""

from __future__ import annotations

from tpuctl.backends.base import Backend
from tpuctl.backends.names import backend_hint
from tpuctl.errors import InputError
from tpuctl.tpu.slice import TpuSlice

__all__ = ["get_backend"]


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
