"""tpuctl: TPU cluster bootstrap as a standalone, framework-neutral tool."""

__version__ = "0.1.0"

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpuctl.jobs import load_mapping as load_mapping


def __getattr__(name: str) -> object:
    """``tpuctl.load_mapping`` (and ``tpuctl.jobs``), imported on first use: ``import tpuctl`` stays cheap."""
    if name in ("load_mapping", "jobs"):
        import importlib

        jobs = importlib.import_module("tpuctl.jobs")
        return jobs if name == "jobs" else jobs.load_mapping
    raise AttributeError(f"module 'tpuctl' has no attribute {name!r}")
