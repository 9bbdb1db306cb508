"""tpuctl: TPU cluster bootstrap as a standalone, framework-neutral tool."""

__version__ = "0.1.0"

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpuctl.job.api import load_mapping as load_mapping


def __getattr__(name: str) -> object:
    """``tpuctl.load_mapping`` (and ``tpuctl.jobs``, the job helpers of :mod:`tpuctl.job.api`), imported on first use: ``import tpuctl`` stays cheap."""
    if name in ("load_mapping", "jobs"):
        import importlib

        jobs = importlib.import_module("tpuctl.job.api")
        return jobs if name == "jobs" else jobs.load_mapping
    raise AttributeError(f"module 'tpuctl' has no attribute {name!r}")
