"""What the real-job tests share besides the harness (:class:`harness.clusters.SimCluster`): where the job
scripts are, and the ``RESULT {...}`` line each prints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness import Finished

JOBS_DIR = Path(__file__).resolve().parent


def result_line(finished: Finished) -> dict[str, Any]:
    """The job's ``RESULT {...}`` line."""
    for line in finished.out.splitlines():
        if line.startswith("RESULT "):
            data: dict[str, Any] = json.JSONDecoder().raw_decode(line[len("RESULT ") :])[0]  # text may follow
            return data
    raise AssertionError(f"{finished.label} printed no RESULT line (exit {finished.code})")
