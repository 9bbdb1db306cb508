"""What every process of ``bench/scale.py`` shares: where its entry point and the repository are, the names
all implementations use, the loopback address of each simulated host, and the JSON lines the children print."""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path
from typing import Any

PY = sys.executable
SCRIPT = Path(__file__).resolve().with_name("scale.py")
"""The entry point; the bench runs it again as each service and driver process (``_serve`` / ``_drive``)."""
REPO = SCRIPT.parent.parent
PHASES = ("register", "merge", "last_barrier", "steady")
CLUSTER = "bench"
MAX_ERRORS_KEPT = 5
FLOOR_METHOD = "/floor.Floor/Session"


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def host_address(task: int, netns: bool) -> str:
    """The loopback address host ``task`` dials: its own in a network namespace, else 127.0.0.1."""
    if not netns:
        return "127.0.0.1"
    return f"127.10.{task // 250}.{task % 250 + 1}"


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()
