"""The device backends' names: the one table the spec checks against and :func:`tpuctl.backends.registry.get_backend` dispatches on.

Why a module of its own: the spec (pure, no frameworks) must check ``backend:`` without importing the
backends, and both must take the same names. Names are exact and lowercase; the familiar aliases (``tf``,
``simulated``, ...) are not accepted but answered with the real name, so a spec, ``TPUCTL_BACKEND`` and
the job's environment always spell a backend one way. Standard library only.
"""

from __future__ import annotations

from typing import Literal

from tpuctl.messages import did_you_mean, suggestion

__all__ = ["BACKEND_ALIASES", "BACKEND_NAMES", "BackendName", "backend_hint", "backend_problem"]

BackendName = Literal["sim", "tensorflow", "jax"]
BACKEND_NAMES: tuple[BackendName, ...] = ("sim", "tensorflow", "jax")
BACKEND_ALIASES: dict[str, BackendName] = {"tf": "tensorflow", "simulated": "sim", "simulator": "sim", "fake": "sim"}
"""Names people type for a backend, refused with the real name as the suggestion."""


def backend_hint(name: str) -> str:
    """``did you mean 'tensorflow'?`` for an alias or a near miss, else the names."""
    alias = BACKEND_ALIASES.get(name.strip().lower())
    return suggestion(alias) if alias else did_you_mean(name, BACKEND_NAMES)


def backend_problem(name: str) -> str | None:
    """``'tf' is not a backend; did you mean 'tensorflow'?``, or None for a backend name."""
    if name in BACKEND_NAMES:
        return None
    return f"{name!r} is not a backend; {backend_hint(name)}"
