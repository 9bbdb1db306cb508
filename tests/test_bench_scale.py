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


def test_a_dead_drivers_reason_is_its_fatal_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A jaxlib client that terminates its process logs one fatal line and then a stack trace: the bench
    reports that line, not the trace's last frames; any other child, its last lines."""
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("bench_scale", BENCH)
    assert spec is not None and spec.loader is not None
    scale = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_scale", scale)  # its dataclasses look their module up
    spec.loader.exec_module(scale)
    log = tmp_path / "driver.stderr"
    fatal = "F1204 18:17:17.725951   28621 client.h:80] Terminating process because the JAX distributed service detected fatal errors."
    log.write_text(f"E1204 18:17:17.7 polled an error\n{fatal}\n    @     0x7f  absl::LocalInvoker<>()\n    @     0x7f  (unknown)\n")
    assert scale.Child.tail(SimpleNamespace(log=log)) == fatal
    log.write_text("one\ntwo\nthree\nfour\n")
    assert scale.Child.tail(SimpleNamespace(log=log)) == "two | three | four"
