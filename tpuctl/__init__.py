"""tpuctl: TPU cluster bootstrap as a standalone, framework-neutral tool."""

__version__ = "0.1.0"

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpuctl.errors import MappingError as MappingError
    from tpuctl.job.api import load_mapping as load_mapping


def __getattr__(name: str) -> object:
    """``tpuctl.load_mapping`` and the error it raises, ``tpuctl.MappingError`` (and ``tpuctl.jobs``, the job
    helpers of :mod:`tpuctl.job.api`), imported on first use: ``import tpuctl`` stays cheap."""
    import importlib

    if name in ("load_mapping", "jobs"):
        jobs = importlib.import_module("tpuctl.job.api")
        return jobs if name == "jobs" else jobs.load_mapping
    if name == "MappingError":
        return importlib.import_module("tpuctl.errors").MappingError
    raise AttributeError(f"module 'tpuctl' has no attribute {name!r}")
