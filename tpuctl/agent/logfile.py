"""Where an agent logs: its state dir's ``agent.log`` (a background agent) or stderr (``--foreground``)."""

from __future__ import annotations

import logging
from pathlib import Path


def configure_logging(path: Path | None, level: int = logging.INFO) -> None:
    """Every ``tpuctl`` logger to ``path`` (or stderr), one line per record, at ``level``."""
    handler: logging.Handler = logging.FileHandler(path) if path else logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("tpuctl")
    root.handlers[:] = [handler]
    root.setLevel(level)
