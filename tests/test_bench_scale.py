"""``bench/scale.py`` itself, at a size that takes seconds: every implementation it compares (tpuctl's
service, XLA's from jaxlib with its listing paced, the bare grpc.aio floor) completes every phase with
the calls the docstring describes, and the table reports the ratios, so ``make bench-scale`` does not rot
between the runs that feed docs/PERFORMANCE.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "scale.py"
HOSTS = 16


@pytest.mark.slow
def test_the_scale_bench_runs_every_implementation_and_phase(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    args = ["--sizes", str(HOSTS), "--workers", "2", "--steady", "0.5", "--phase-timeout", "60"]
    args += ["--floor", "--xla-merge-pace", "2", "--no-netns", "--json", str(out)]
    proc = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = {run["impl"]: run for run in json.loads(out.read_text())["runs"]}
    assert set(runs) == {"tpuctl", "xla", "floor"}
    # barrier calls per phase: tpuctl's merge is a gather then one barrier; XLA's and the floor's two barriers
    merge_barriers = {"tpuctl": 1, "xla": 2, "floor": 2}
    for impl, run in runs.items():
        assert run["error"] is None, (impl, run["error"])
        phases = {p["phase"]: p for p in run["phases"]}
        assert list(phases) == ["register", "merge", "last_barrier", "steady"], impl
        assert all(p["error_count"] == 0 for p in phases.values()), (impl, [p["errors"] for p in phases.values()])
        assert phases["merge"]["barrier_calls"] == HOSTS * merge_barriers[impl], impl
        assert phases["last_barrier"]["barrier_calls"] == HOSTS, impl
        assert phases["last_barrier"]["release_p50_s"] is not None, impl
    assert runs["xla"]["merge"] == "key_value_dir_get, 2 at a time per driver"
    assert runs["tpuctl"]["merge"] == "gather"
    assert "tpuctl/floor, last barrier: p50 " in proc.stdout
