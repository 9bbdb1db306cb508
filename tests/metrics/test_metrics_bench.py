"""``make bench``'s metrics line (bench/metrics.py), at a size that takes a second: it runs, scrapes over real
HTTP, counts the series a scraper parses, and prints the ratio line docs/development/performance.md reads."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "metrics.py"


@pytest.mark.slow
def test_the_metrics_bench_prints_its_figures() -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--hosts", "2000", "--rounds", "3"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    ratio = re.search(r"^scrape ([\d.]+) ms .*; status ([\d.]+) ms .*; ratio ([\d.]+)x$", proc.stdout, re.M)
    wire = re.search(r"^one scrape over HTTP on loopback: [\d.]+ ms, (\d+) series \(limit 300; 50 ms\)$", proc.stdout, re.M)
    assert ratio and wire, proc.stdout
    assert float(ratio[3]) == pytest.approx(float(ratio[1]) / float(ratio[2]), rel=0.1, abs=0.02)
    assert 50 < int(wire[1]) <= 300
