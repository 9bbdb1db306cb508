"""A real Prometheus server for a test: Debian's ``prometheus`` package, started on loopback with a generated
config, asked through its HTTP API (``/api/v1/query``).

``ensure_prometheus()`` finds the server, installing the package when it is missing and this process may
(root, with apt-get): ``make test`` runs it first (``python tests/harness/prometheus.py``), and the test's
fixture again, so a plain ``pytest`` installs it too; where it cannot be installed the test is skipped
with the reason. Only loopback is used; the server is one of the test's processes (stopped by pid).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # run as a script by `make test` (tests/ not on sys.path then): nothing of harness is loaded
    from harness.processes import Processes

PACKAGE = "prometheus"
INSTALL_TIMEOUT_S = 600.0
START_TIMEOUT_S = 60.0
APT = ["apt-get", "-y", "-q", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=120"]


def find_prometheus() -> str | None:
    return shutil.which("prometheus") or next((p for p in ("/usr/bin/prometheus",) if os.access(p, os.X_OK)), None)


def ensure_prometheus() -> tuple[str | None, str]:
    """``(path of the server, "")``, or ``(None, why it is not there)`` after trying to install it."""
    found = find_prometheus()
    if found:
        return found, ""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return None, f"the {PACKAGE} server is not installed, and installing it needs root and apt-get (apt-get install {PACKAGE})"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    outputs = []
    for command in ([*APT, "install", PACKAGE], ["apt-get", "-q", "update"], [*APT, "install", PACKAGE]):
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, env=env)
        except subprocess.TimeoutExpired:
            return None, f"`{' '.join(command)}` did not finish within {INSTALL_TIMEOUT_S:.0f} s"
        outputs.append(done.stdout[-300:] + done.stderr[-300:])
        if command[-1] == PACKAGE and done.returncode == 0 and find_prometheus():
            return find_prometheus(), ""
    return None, f"apt-get install {PACKAGE} failed: {outputs[-1].strip()[-300:]}"


class Prometheus:
    """A server scraping ``targets`` every ``interval``, its data and config under ``folder``."""

    def __init__(
        self, binary: str, processes: Processes, folder: Path, targets: Sequence[str], port: int, interval: str = "1s"
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / "prometheus.yml"
        listed = ", ".join(f'"{t}"' for t in targets)
        config.write_text(
            f"global: {{scrape_interval: {interval}, scrape_timeout: {interval}, evaluation_interval: {interval}}}\n"
            f"scrape_configs:\n  - job_name: tpuctl\n    static_configs:\n      - targets: [{listed}]\n"
        )
        from harness.processes import wait_until

        self.url = f"http://127.0.0.1:{port}"
        self.proc = processes.start(
            "prometheus",
            [
                binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h",
            ],
        )  # fmt: skip
        wait_until(self._ready, START_TIMEOUT_S, "Prometheus to be ready", interval=0.2, logs=processes.logs)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector ``promql`` evaluates to now: ``[{"metric": {...}, "value": [t, "1"]}, ...]``."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as answer:
            data = json.loads(answer.read())
        assert data["status"] == "success", data
        result: list[dict[str, Any]] = data["data"]["result"]
        return result

    def values(self, promql: str, by: str | None = None) -> dict[str, float]:
        """``promql``'s samples as ``{label by's value (or ""): value}``."""
        return {(s["metric"].get(by, "") if by else ""): float(s["value"][1]) for s in self.query(promql)}


if __name__ == "__main__":  # `make test`: install the server when it is missing and this user may
    path, why = ensure_prometheus()
    print(f"prometheus: {path}" if path else f"prometheus: not installed ({why}); the metrics test will be skipped")
    sys.exit(0)
