"""What each fault test measured, one JSON line per test, for ``tools/reliability_table.py``.

The file is ``$TPUCTL_FAULT_RECORD`` (default: ``tpuctl-faults-UID.jsonl`` in the temp folder). A test
records before it asserts, so a fault that shows a defect is in the table too, with what went wrong.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

CURRENT_XFAIL: dict[str, object] = {}
"""The running test's xfail mark (``reason``, ``strict``), set by the catalogue's conftest."""


def record_path() -> Path:
    return Path(
        os.environ.get("TPUCTL_FAULT_RECORD") or Path(tempfile.gettempdir()) / f"tpuctl-faults-{os.getuid()}.jsonl"
    )


def first_error(text: str) -> str:
    """The line a host said about the fault: its first ``tpuctl: error`` line, else the first line that
    says error/failed/unreachable, else its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("tpuctl: error"):
            return line
    for line in lines:
        if "error:" in line or "in error" in line:
            return line
    for line in lines:
        lower = line.lower()
        if any(word in lower for word in ("error", "failed", "unreachable", "refused", "not answering")):
            return line
    return lines[-1] if lines else ""


@dataclass
class HostOutcome:
    """One host after the fault: what ran there, its exit code (None: still running at the deadline),
    the line it said, and when (seconds after the fault) it ended or noticed."""

    task: int
    role: str  # "victim" (the host the fault hit) or "peer"
    what: str  # the command watched: "init", "barrier", "run", "status", "agent"
    code: int | None
    said: str
    seconds: float | None
    text: str = field(default="", repr=False)  # everything it printed (not recorded)


@dataclass
class Measurement:
    test: str
    fault: str
    phase: str
    victim: str
    detected_by: str
    limit_s: float | None
    hosts: list[HostOutcome]
    problems: list[str]
    expected_defect: str | None = None
    notes: str = ""

    @property
    def detection_s(self) -> float | None:
        """When the last peer knew (None: no peer did, or nothing was to be detected)."""
        times = [h.seconds for h in self.hosts if h.role == "peer" and h.seconds is not None]
        return max(times) if times else None

    def write(self, path: Path | None = None) -> None:
        path = path or record_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = asdict(self)
        for host in doc["hosts"]:
            host.pop("text", None)
        doc["detection_s"] = self.detection_s
        if CURRENT_XFAIL:
            doc["expected_defect"] = doc["expected_defect"] or CURRENT_XFAIL.get("reason")
            doc["xfail_strict"] = CURRENT_XFAIL.get("strict")
        doc["recorded"] = time.time()
        with path.open("a") as handle:
            handle.write(json.dumps(doc, sort_keys=True) + "\n")
