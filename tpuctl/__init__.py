"""tpuctl: TPU cluster bootstrap as a standalone, framework-neutral tool."""

__version__ = "0.1.0"

TYPE_CHECKING = False  # not typing's: importing typing costs `tpuctl barrier` about 15 ms
if TYPE_CHECKING:
    from tpuctl.errors import MappingError as MappingError
    from tpuctl.job.api import load_mapping as load_mapping


def __getattr__(name: str) -> object:
    """``tpuctl.load_mapping`` and the error it raises, ``tpuctl.MappingError`` (and ``tpuctl.jobs``, the job
    helpers of :mod:`tpuctl.job.api`), imported on first use: ``import tpuctl`` stays cheap."""
    if name in ("load_mapping", "jobs"):
        import importlib

        jobs = importlib.import_module("tpuctl.job.api")
        return jobs if name == "jobs" else jobs.load_mapping
    if name == "MappingError":
        from tpuctl.errors import MappingError

        return MappingError
    # Not importlib for other names: `from tpuctl import lightjson` asks here before importing the module.
    raise AttributeError(f"module 'tpuctl' has no attribute {name!r}")
