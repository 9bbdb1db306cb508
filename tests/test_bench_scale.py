"""``bench/scale.py`` itself, at a size that takes seconds: every implementation it compares (tpuctl's
service, XLA's from jaxlib with its listing paced, the bare grpc.aio floor) completes every phase with
the calls the docstring describes, and the table reports the ratios, so ``make bench-scale`` does not rot
between the runs that feed docs/development/performance.md."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "scale.py"
HOSTS = 16


@pytest.mark.slow
def test_the_scale_bench_runs_every_implementation_and_phase(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    args = ["--sizes", str(HOSTS), "--workers", "2", "--steady", "0.5", "--phase-timeout", "60"]
    args += ["--floor", "--xla-merge-pace", "2", "--no-netns", "--json", str(out)]
    args += ["--heartbeat-timeout", "3", "--dead-host", "kill"]
    proc = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = {run["impl"]: run for run in json.loads(out.read_text())["runs"]}
    assert set(runs) == {"tpuctl", "xla", "floor"}
    # barrier calls per phase: tpuctl's merge is a gather then one barrier; XLA's and the floor's two barriers
    merge_barriers = {"tpuctl": 1, "xla": 2, "floor": 2}
    for impl, run in runs.items():
        assert run["error"] is None, (impl, run["error"])
        phases = {p["phase"]: p for p in run["phases"]}
        dead = ["dead_host"] if impl == "tpuctl" else []
        assert list(phases) == ["register", "merge", "last_barrier", "steady", *dead], impl
        assert all(p["error_count"] == 0 for p in phases.values()), (impl, [p["errors"] for p in phases.values()])
        assert phases["merge"]["barrier_calls"] == HOSTS * merge_barriers[impl], impl
        assert phases["last_barrier"]["barrier_calls"] == HOSTS, impl
        assert phases["last_barrier"]["release_p50_s"] is not None, impl
    assert_told_of_the_dead_host(runs["tpuctl"], timeout=3.0)
    assert runs["xla"]["merge"] == "key_value_dir_get, 2 at a time per driver"
    assert runs["tpuctl"]["merge"] == "gather"
    assert "tpuctl/floor, last barrier: p50 " in proc.stdout


def assert_told_of_the_dead_host(run: dict[str, Any], timeout: float) -> None:
    """Every other host was told of the last host's death, naming it, within the heartbeat timeout + 2 s,
    and not before the timeout less the keepalive window (two ping intervals of a sixth of the timeout)
    and one more interval (the last answered ping may precede the death by that much): not guessed."""
    (dead,) = [p for p in run["phases"] if p["phase"] == "dead_host"]
    assert dead["error_count"] == 0, dead["errors"]
    assert dead["told_hosts"] == HOSTS - 1
    assert timeout / 2 - 0.05 <= dead["told_p50_s"] <= dead["told_max_s"] <= timeout + 2.0
    assert dead["dead_cause"].startswith(f"task {HOSTS - 1} (")
    assert "no heartbeat for " in dead["dead_cause"]


PROGRESS_HOSTS = 32
HANG_TIMEOUT = 6.0


@pytest.mark.slow
def test_progress_reports_reach_the_service_and_a_hang_is_named_to_every_host_in_time(tmp_path: Path) -> None:
    """--progress: every host's simulated agent reports its job's pace as tpuctl's does (the service takes
    every report sent), no verdict while the jobs step, and once they stop every host is pushed the hang
    verdict within hang_timeout + 2 s of its job's last step, not before the hang timeout."""
    out = tmp_path / "scale.json"
    args = ["--sizes", str(PROGRESS_HOSTS), "--workers", "2", "--steady", "2", "--phase-timeout", "60", "--skip-peer"]
    args += ["--no-netns", "--progress", "--hang-timeout", str(HANG_TIMEOUT), "--json", str(out)]
    proc = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = json.loads(out.read_text())["runs"]
    assert run["error"] is None, run["error"]
    phases = {p["phase"]: p for p in run["phases"]}
    assert list(phases) == ["register", "merge", "last_barrier", "steady", "progress", "hang", "dump"]
    progress, hang = phases["progress"], phases["hang"]
    assert progress["error_count"] == 0 and hang["error_count"] == 0, (progress["errors"], hang["errors"])
    # 32 hosts report every second (report_every 1 s): each at least once a second in the 2 s window
    assert phases["steady"]["length_s"] == progress["length_s"] == 2.0
    assert progress["pace_reports"] >= 2 * PROGRESS_HOSTS and progress["pace_unsent"] == 0
    assert progress["service_reports"] == progress["pace_reports"]
    assert progress["verdicts"] == {}
    assert hang["hosts"] == hang["told_hosts"] == PROGRESS_HOSTS
    assert hang["pace_stalled"] == PROGRESS_HOSTS  # each agent says stalled once
    assert hang["service_reports"] == hang["pace_reports"]
    assert hang["verdicts"] == {"hang": PROGRESS_HOSTS}
    assert HANG_TIMEOUT <= hang["told_p50_s"] <= hang["told_max_s"] <= HANG_TIMEOUT + 2.0
    assert f"{PROGRESS_HOSTS} of {PROGRESS_HOSTS} hosts pushed the hang verdict" in proc.stdout
    assert "(target <= 5: " in proc.stdout
    # The black box through the service: every host's digest, the odd one out (task 17) first
    dump = phases["dump"]
    assert dump["error_count"] == 0, dump["errors"]
    assert dump["dump"]["dump_answered"] == dump["dump"]["dump_hosts"] == PROGRESS_HOSTS
    assert dump["dump"]["dump_groups"] == [1, PROGRESS_HOSTS - 1]
    assert dump["dump"]["dump_first"].startswith("next_batch (data.py:41)")
    assert 0 < dump["dump"]["dump_s"] <= 10.0 and dump["dump"]["dump_bytes"] <= 64 * 1024


def netns_available() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not netns_available(), reason="needs root and a network namespace (unshare -n)")
def test_a_host_that_vanishes_is_named_to_every_other_host_in_time(tmp_path: Path) -> None:
    """--dead-host vanish: the last host's address is blackholed (a preempted VM sends nothing, not even a
    FIN); only the keepalive pings can tell, and every other host must still be told in time."""
    out = tmp_path / "scale.json"
    args = ["--sizes", str(HOSTS), "--workers", "2", "--steady", "0.5", "--phase-timeout", "60", "--skip-peer"]
    args += ["--heartbeat-timeout", "3", "--dead-host", "vanish", "--json", str(out)]
    proc = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = json.loads(out.read_text())["runs"]
    assert run["netns"] and run["error"] is None, run["error"]
    assert_told_of_the_dead_host(run, timeout=3.0)


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """bench/scale.py and the modules beside it, imported for this test (scripts in one folder, not a
    package: bench/ goes on sys.path, as when the script runs), and forgotten afterwards."""
    monkeypatch.syspath_prepend(str(BENCH.parent))
    names = ("scale", "scale_common", "scale_services", "scale_drivers", "scale_phases", "scale_report")
    try:
        yield SimpleNamespace(**{name.removeprefix("scale_"): importlib.import_module(name) for name in names})
    finally:
        for name in names:
            sys.modules.pop(name, None)


def test_a_dead_drivers_reason_is_its_fatal_line(tmp_path: Path, bench: SimpleNamespace) -> None:
    """A jaxlib client that terminates its process logs one fatal line and then a stack trace: the bench
    reports that line and the error logged before it, not the trace's last frames; any other child, its
    last lines."""
    log = tmp_path / "driver.stderr"
    cause = "E1204 18:17:17.7 polled an error: sendmsg: Broken pipe"
    fatal = "F1204 18:17:17.725951   28621 client.h:80] Terminating process because the JAX distributed service detected fatal errors."
    log.write_text(f"E1204 18:17:17.1 older\n{cause}\n{fatal}\n    @     0x7f  absl::LocalInvoker<>()\n    @     0x7f  (unknown)\n")
    assert bench.phases.Child.tail(SimpleNamespace(log=log)) == f"{cause} | {fatal}"
    log.write_text("one\ntwo\nthree\nfour\n")
    assert bench.phases.Child.tail(SimpleNamespace(log=log)) == "two | three | four"


def test_xla_hosts_list_the_table_at_most_pace_at_once(bench: SimpleNamespace) -> None:
    """--xla-merge-pace 2: of 8 hosts listing at once, never more than 2 are in key_value_dir_get (counted
    on fake jaxlib clients), and all get their table."""
    lock, inside, most = threading.Lock(), [0], [0]

    class FakeClient:
        def key_value_set(self, key: str, value: str) -> None:
            pass

        def wait_at_barrier(self, name: str, timeout_ms: int) -> None:
            pass

        def key_value_dir_get(self, prefix: str) -> list[tuple[str, str]]:
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.05)
            with lock:
                inside[0] -= 1
            return [(f"{prefix}{t}", "[]") for t in range(8)]

    driver = object.__new__(bench.drivers.XlaDriver)
    driver.total, driver.timeout, driver.steps, driver.lock = 8, 30.0, {}, threading.Lock()
    driver.clients = {t: FakeClient() for t in range(8)}
    driver.listing = threading.BoundedSemaphore(2)
    driver.deadline = time.monotonic() + 30
    threads = [threading.Thread(target=driver.merge, args=(t, [])) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert most[0] == 2
    assert all(step == "barrier done" for step in driver.steps.values()) and len(driver.steps) == 8


def test_a_failed_xla_merge_is_run_again_paced_and_larger_sizes_stay_paced(
    bench: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--xla-retry-paced 64: XLA's run whose merge failed with every host at once is run again paced and
    reported with the first run's error; the next size starts paced; tpuctl's runs are never paced."""
    scale, report = bench.scale, bench.report
    calls: list[tuple[str, int, int]] = []

    def phase(name: str, errors: int) -> Any:
        return report.PhaseResult(name, None if errors else 1.0, 0.0, 0.0, 0, 0, None, None, 0, 0.0, errors,
                                 ["merge: a driver died"] if errors else [])  # fmt: skip

    def run_one(impl: str, hosts: int, args: Any, tmp: Path) -> Any:
        calls.append((impl, hosts, args.xla_merge_pace))
        result = report.RunResult(impl, hosts, 3, False)
        failing = impl == "xla" and not args.xla_merge_pace and hosts >= 200
        result.phases = [phase("register", 0), phase("merge", int(failing))]
        return result

    monkeypatch.setattr(scale, "run_one", run_one)
    monkeypatch.setattr(sys, "argv", ["scale.py", "--sizes", "100,200,300", "--no-netns", "--xla-retry-paced", "64"])
    assert scale.main() == 0
    assert calls == [("tpuctl", 100, 0), ("xla", 100, 0), ("tpuctl", 200, 0), ("xla", 200, 0), ("xla", 200, 64),
                     ("tpuctl", 300, 0), ("xla", 300, 64)]  # fmt: skip
