"""``make bench``: tpuctl's figures, each beside a peer measured in the same run.

Machines here are noisy, so every figure is reported as a ratio against a peer timed in the same
process run (interleaved, min/median of several repeats):

* slice model: building the largest pods' device lists, beside libtpu building the same pod;
* CLI start-up: ``tpuctl --help`` beside ``python -c pass``;
* ``tpuctl barrier``, ``status`` and ``env`` from a shell on an 8-host simulated cluster, beside
  ``python -c pass`` (median of 15);
* wall time of a whole 8-host local ``init`` (``tpuctl sim up``), beside ``python -c pass``;
* full-pod meshes in both modes beside DTensor's helpers and JAX's ``create_device_mesh`` (bench/mesh.py).

Only loopback addresses are used; every process started here is stopped here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
PY = sys.executable
TPUCTL = [PY, "-m", "tpuctl"]


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def run_quiet(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def bench_slice_model(repeats: int) -> None:
    from jax.experimental import topologies

    from tpuctl.tpu.slice import resolve_slice

    print(f"## slice model: device list of the largest pods (min of {repeats})")
    for accel in ("v5p-17920", "tpu7x-18432", "v4-8192"):

        def ours(accel: str = accel) -> object:
            return resolve_slice(accelerator=accel).devices

        tpu = resolve_slice(accelerator=accel)
        kw: dict[str, object] = {"chips_per_host_bounds": tpu.chips_per_host_bounds}
        if tpu.generation.megacore:
            kw["chip_config_name"] = "megacore"

        def theirs(tpu: object = tpu, kw: dict[str, object] = kw) -> object:
            return topologies.get_topology_desc(tpu.libtpu_topology_name, "tpu", **kw).devices  # type: ignore[attr-defined]

        a = min(timed(ours, repeats))
        b = min(timed(theirs, repeats))
        print(f"{accel:12} {tpu.num_devices:6} devices  tpuctl {ms(a):>10}  libtpu {ms(b):>10}  ratio {a / b:.3f}")


def bench_startup(repeats: int) -> None:
    print(f"## CLI start-up (median of {repeats}, interleaved)")
    base, ours = [], []
    for _ in range(repeats):
        base += timed(lambda: run_quiet([PY, "-c", "pass"]), 1)
        ours += timed(lambda: run_quiet([*TPUCTL, "--help"]), 1)
    b, o = statistics.median(base), statistics.median(ours)
    print(f"python -c pass {ms(b)}   tpuctl --help {ms(o)}   ratio {o / b:.1f}x")


def bench_cluster(hosts_accel: str, repeats: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="tpuctl-bench-"))
    print(f"## simulated cluster {hosts_accel} under {root}")
    base = statistics.median(timed(lambda: run_quiet([PY, "-c", "pass"]), 5))
    start = time.perf_counter()
    proc = subprocess.run(
        [*TPUCTL, "sim", "up", hosts_accel, "--root", str(root)], capture_output=True, text=True, timeout=300
    )
    up = time.perf_counter() - start
    if proc.returncode != 0:
        print(proc.stderr)
        raise SystemExit("sim up failed")
    init_lines = [ln for ln in proc.stderr.splitlines() if "hosts up in" in ln]
    print(f"sim up (all inits, wall) {up:.2f} s; {init_lines[0] if init_lines else ''}")
    try:
        state = root / "host-0"
        # One host's barrier blocks until all arrive: run every host's barrier, time them as a batch,
        # and the single-process cost with the others already waiting.
        samples = []
        for i in range(repeats):
            others = [
                subprocess.Popen(
                    [*TPUCTL, "barrier", f"b{i}", "-q", "--state-dir", str(root / f"host-{t}")],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for t in range(1, len(list(root.glob("host-*"))))
            ]
            time.sleep(0.5)  # the others are parked at the barrier
            start = time.perf_counter()
            run_quiet([*TPUCTL, "barrier", f"b{i}", "-q", "--state-dir", str(state)])
            samples.append(time.perf_counter() - start)
            for p in others:
                p.wait(timeout=60)
        med = statistics.median(samples)
        print(
            f"tpuctl barrier (last arrival, median of {repeats}) {ms(med)}; python -c pass {ms(base)}; ratio {med / base:.2f}x"
        )
        # The other light commands (tpuctl/cli/light.py: no click, asyncio or grpc), each interleaved with
        # its own `python -c pass` so both see the same machine.
        for what in (["status"], ["status", "--json"], ["env"]):
            pairs = [
                (
                    timed(lambda: run_quiet([PY, "-c", "pass"]), 1)[0],
                    timed(lambda what=what: run_quiet([*TPUCTL, *what, "--state-dir", str(state)]), 1)[0],
                )
                for _ in range(repeats)
            ]
            b = statistics.median(p[0] for p in pairs)
            o = statistics.median(p[1] for p in pairs)
            name = " ".join(what)
            print(f"tpuctl {name} (median of {repeats}) {ms(o)}; python -c pass {ms(b)}; ratio {o / b:.2f}x")
        print(f"8-host init wall (from sim up) {init_lines[0] if init_lines else up}")
    finally:
        subprocess.run([*TPUCTL, "sim", "down", "--root", str(root)], capture_output=True, timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--skip-cluster", action="store_true")
    args = parser.parse_args()
    bench_slice_model(5)
    bench_startup(args.repeats)
    sys.path.insert(0, str(Path(__file__).parent))
    from mesh import main as bench_mesh

    bench_mesh(7)
    if not args.skip_cluster:
        bench_cluster("v4-64", args.repeats)  # 8 hosts


if __name__ == "__main__":
    main()
