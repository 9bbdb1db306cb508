"""tpuctl: TPU cluster bootstrap as a standalone, framework-neutral tool."""

__version__ = "0.1.0"
