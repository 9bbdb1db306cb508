"""``make bench``: tpuctl's figures, each beside a peer measured in the same run.

Machines here are noisy, so every figure is reported as a ratio against a peer timed in the same
process run (interleaved, min/median of several repeats):

* slice model: building the largest pods' device lists, beside libtpu building the same pod;
* CLI start-up: ``tpuctl --help`` beside ``python -c pass``;
* ``tpuctl barrier``, ``status`` and ``env`` from a shell on an 8-host simulated cluster, through the
  console script users run (``.venv/bin/tpuctl``; ``--light-entry module``: ``python -m tpuctl``),
  each run interleaved with a ``python -c pass`` (median of 15); ``--light-venv DIR`` times another
  install's console script and python against this venv's cluster (a wheel, without the editable
  install's import hook: ``pip wheel --no-deps -w W .``, ``python -m venv V``,
  ``V/bin/pip install --no-deps W/tpuctl-*.whl``); ``--light-only`` runs only this part;
* wall time of a whole 8-host local ``init`` (``tpuctl sim up``), beside ``python -c pass``;
* full-pod meshes in both modes beside DTensor's helpers and JAX's ``create_device_mesh`` (bench/mesh.py);
* first, ``tpuctl.job.progress(step)`` as a job calls it, beside a bare ``socket.send`` of the same bytes on a
  connected non-blocking unix stream socket, both to one agent-like receiver (another process reading a
  socket bound in a temp dir): median ns per call over alternating rounds, and their ratio (target: at
  most 2x; above 5x the bench fails) (``bench_progress``); ``--progress-only`` runs only this part.

Only loopback addresses are used; every process started here is stopped here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
PY = sys.executable
TPUCTL = [PY, "-m", "tpuctl"]
SCRIPT = [str(Path(PY).parent / "tpuctl")]  # the console script: what a job script runs


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def run_quiet(cmd: list[str], limit: float = 120.0) -> None:
    """Run ``cmd`` to its end, output discarded; CalledProcessError when it fails.

    The wait is a blocking ``wait()``: ``subprocess.run(timeout=...)`` polls the child with sleeps that
    double up to 50 ms, which rounds every wall time up to that schedule (about 31, 63, 113, 163 ms).
    ``limit`` seconds kill a child that hangs.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killer = threading.Timer(limit, proc.kill)
    killer.start()
    try:
        code = proc.wait()
    finally:
        killer.cancel()
    if code:
        raise subprocess.CalledProcessError(code, cmd)


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


def bench_cluster(hosts_accel: str, repeats: int, light: list[str], base_py: str) -> None:
    """``light``: how the light commands are started; ``base_py``: the python whose ``-c pass`` they are
    compared with (the same install's)."""
    root = Path(tempfile.mkdtemp(prefix="tpuctl-bench-"))
    print(f"## simulated cluster {hosts_accel} under {root}")
    print(f"light commands run as {' '.join(light)}; beside {base_py} -c pass")
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
        hosts = len(list(root.glob("host-*")))
        last = root / f"host-{hosts - 1}"  # a host without the coordinator, as nearly every host of a pod is
        # One host's barrier blocks until all arrive: park every other host at the barrier, then time the
        # last arrival alone (and a `python -c pass` just before it, on the same machine). Two ways:
        # - the others waiting through their agents from threads of this process: what the last host's
        #   command costs, its agent's call and the release included;
        # - the others as `tpuctl barrier` processes too: those 7 then wake, print and exit on the same 2
        #   cores as the timed command (on a pod each is on its own machine), so this figure is higher.
        pairs = []
        for i in range(repeats):
            waiters = [
                threading.Thread(target=_wait_at, args=(root / f"host-{t}", f"t{i}"), daemon=True)
                for t in range(hosts - 1)
            ]
            for w in waiters:
                w.start()
            time.sleep(0.5)  # the others are parked at the barrier
            b = timed(lambda: run_quiet([base_py, "-c", "pass"]), 1)[0]
            o = timed(lambda i=i: run_quiet([*light, "barrier", f"t{i}", "-q", "--state-dir", str(last)]), 1)[0]
            pairs.append((b, o))
            for w in waiters:
                w.join(timeout=60)
        report(
            f"barrier (last arrival of {hosts}, the others waiting in threads)" if hosts > 1 else "barrier (one host)",
            pairs,
        )
        pairs = []
        for i in range(repeats if hosts > 1 else 0):
            others = [
                subprocess.Popen(
                    [*light, "barrier", f"b{i}", "-q", "--state-dir", str(root / f"host-{t}")],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for t in range(hosts - 1)
            ]
            time.sleep(0.5)
            b = timed(lambda: run_quiet([base_py, "-c", "pass"]), 1)[0]
            o = timed(lambda i=i: run_quiet([*light, "barrier", f"b{i}", "-q", "--state-dir", str(last)]), 1)[0]
            pairs.append((b, o))
            for p in others:
                p.wait(timeout=60)
        if pairs:
            report(f"barrier (last arrival of {hosts}, the others tpuctl processes on these cores too)", pairs)
        # The other light commands (tpuctl/cli/light.py: no click, asyncio or grpc), each interleaved with
        # its own `python -c pass` so both see the same machine.
        for what in (["status"], ["status", "--json"], ["env"]):
            pairs = [
                (
                    timed(lambda: run_quiet([base_py, "-c", "pass"]), 1)[0],
                    timed(lambda what=what: run_quiet([*light, *what, "--state-dir", str(state)]), 1)[0],
                )
                for _ in range(repeats)
            ]
            report(" ".join(what), pairs)
        print(f"{hosts}-host init wall (from sim up) {init_lines[0] if init_lines else up}")
    finally:
        subprocess.run([*TPUCTL, "sim", "down", "--root", str(root)], capture_output=True, timeout=60)


def _wait_at(state: Path, name: str) -> None:
    """Wait at barrier ``name`` through ``state``'s agent, from this process (one control-socket call)."""
    from tpuctl.agent.control import Op, call
    from tpuctl.agent.statedir import StateDir

    call(StateDir(state), Op.BARRIER, {"name": name, "timeout": 60.0}, timeout=70.0)


def report(name: str, pairs: list[tuple[float, float]]) -> None:
    """One line: the command's median, its interleaved ``python -c pass`` median, their ratio."""
    b = statistics.median(p[0] for p in pairs)
    o = statistics.median(p[1] for p in pairs)
    print(f"tpuctl {name} (median of {len(pairs)}) {ms(o)}; python -c pass {ms(b)}; ratio {o / b:.2f}x")


PROGRESS_RECEIVER = r"""
import selectors, socket, sys
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
listener.listen(8)
listener.setblocking(False)
select = selectors.DefaultSelector()
select.register(listener, selectors.EVENT_READ)
print("ready", flush=True)
lines, accepted, closed = 0, 0, 0
while closed < 2 or accepted < 2:  # tpuctl's connection and the bare one, each until it closes
    events = select.select(timeout=120.0)  # bounded: a sender that died leaves nothing waiting
    if not events:
        break
    for key, _ in events:
        if key.fileobj is listener:
            conn, _ = listener.accept()
            conn.setblocking(False)
            select.register(conn, selectors.EVENT_READ)
            accepted += 1
            continue
        chunk = key.fileobj.recv(1 << 16)
        if chunk:
            lines += chunk.count(b"\n")
        else:
            select.unregister(key.fileobj)
            key.fileobj.close()
            closed += 1
print(lines, flush=True)
"""
"""The agent's end of ``progress.sock``, stripped to its receiving: a process of its own (as the agent is)
reading each connection where the job looks for it, counting lines."""


def bench_progress(rounds: int, calls: int) -> float:
    """``tpuctl.job.progress(i)`` against a bare ``socket.send`` of the same bytes; returns the ratio of
    the medians (ns per call, over ``rounds`` rounds of ``calls`` calls each side, alternating which goes
    first). Both send to one receiver process, which counts the lines that arrived (a send the kernel
    refused, EAGAIN, is counted and printed: a figure with many is not a fair one)."""
    import socket

    tmp = Path(tempfile.mkdtemp(prefix="tpuctl-bench-progress-"))
    path = tmp / "progress.sock"  # tpuctl.job.steps.SOCKET_NAME, in the job's TPUCTL_STATE_DIR
    receiver = subprocess.Popen(
        [PY, "-c", PROGRESS_RECEIVER, str(path)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert receiver.stdout is not None
        if receiver.stdout.readline().strip() != "ready":
            raise SystemExit("progress bench: the receiver did not start")
        generation = 1
        os.environ["TPUCTL_STATE_DIR"] = str(tmp)  # as `tpuctl run` hands the job its host's state dir
        os.environ["TPUCTL_GENERATION"] = str(generation)
        import tpuctl.job

        if "tpuctl.job.steps" in sys.modules:  # looked for its agent before this bench set the environment
            sys.modules["tpuctl.job.steps"]._reset_for_tests()
        tpuctl.job.progress(0)  # connects (once per process), as a job's first step does
        bare = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bare.setblocking(False)
        bare.connect(str(path))
        pid = os.getpid()
        step = [1]
        refused = [0]

        def ours() -> int:
            progress, first = tpuctl.job.progress, step[0]
            start = time.perf_counter_ns()
            for i in range(first, first + calls):
                progress(i)
            took = time.perf_counter_ns() - start
            step[0] = first + calls
            return took

        def theirs() -> int:
            send, first, no = bare.send, step[0], 0
            start = time.perf_counter_ns()
            for i in range(first, first + calls):
                try:
                    send(b"P %d %d %d\n" % (i, generation, pid))
                except BlockingIOError:
                    no += 1
            took = time.perf_counter_ns() - start
            step[0] = first + calls
            refused[0] += no
            return took

        def drain() -> None:
            """Wait (5 s at most) until the receiver has read everything both sockets sent: a receiver
            starved of CPU (a loaded machine) would otherwise fill the kernel's queue, and sends would be
            refused mid-round. Not timed."""
            import fcntl
            import termios

            queued = bytearray(4)
            socks = [bare, sys.modules["tpuctl.job.steps"]._REPORTER.sock]
            until = time.monotonic() + 5.0
            while time.monotonic() < until:
                pending = 0
                for sock in socks:
                    if sock is not None:
                        fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, queued)  # bytes not yet read (SIOCOUTQ)
                        pending += int.from_bytes(queued, sys.byteorder)
                if not pending:
                    return
                time.sleep(0.001)

        sent = 1
        ns_ours: list[float] = []
        ns_theirs: list[float] = []
        for r in range(rounds):
            for side in (ours, theirs) if r % 2 == 0 else (theirs, ours):
                drain()
                took = side()
                (ns_ours if side is ours else ns_theirs).append(took / calls)
                sent += calls
        bare.close()
        sys.modules["tpuctl.job.steps"]._reset_for_tests()  # closes tpuctl's connection: the receiver ends
        out, _ = receiver.communicate(timeout=60)
        received = int(out.split()[-1])
        a, b = statistics.median(ns_ours), statistics.median(ns_theirs)
        ratio = a / b
        print(
            f"## job progress: tpuctl.job.progress(step) beside a bare socket.send (median of {rounds} rounds "
            f"x {calls} calls each, alternating)"
        )
        print(
            f"tpuctl.job.progress {a:.0f} ns/call (min {min(ns_ours):.0f}); socket.send {b:.0f} ns/call "
            f"(min {min(ns_theirs):.0f}); ratio {ratio:.2f}x (target <= 2x: {'met' if ratio <= 2 else 'MISSED'})"
        )
        print(f"receiver got {received:,} of {sent:,} lines; bare sends refused (EAGAIN) {refused[0]:,}")
        return ratio
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


def progress_section(rounds: int, calls: int) -> None:
    """:func:`bench_progress`; exits non-zero when the ratio is above ``PROGRESS_RATIO_LIMIT``."""
    ratio = bench_progress(rounds, calls)
    if ratio > PROGRESS_RATIO_LIMIT:
        raise SystemExit(f"tpuctl.job.progress costs {ratio:.1f}x a bare socket.send (limit {PROGRESS_RATIO_LIMIT:g}x)")


PROGRESS_RATIO_LIMIT = 5.0
"""Above this, ``make bench`` fails: the light path is broken, not just slower than its 2x target."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--skip-cluster", action="store_true")
    parser.add_argument("--light-only", action="store_true", help="only the light commands on the cluster")
    parser.add_argument("--light-entry", choices=("script", "module"), default="script")
    parser.add_argument("--light-venv", type=Path, help="time this venv's bin/tpuctl and bin/python instead")
    parser.add_argument("--progress-only", action="store_true", help="only tpuctl.job.progress beside socket.send")
    parser.add_argument("--progress-rounds", type=int, default=101, help="rounds per side")
    parser.add_argument("--progress-calls", type=int, default=200, help="calls per round and side")
    args = parser.parse_args()
    progress_section(args.progress_rounds, args.progress_calls)
    if args.progress_only:
        return
    if args.light_venv is not None:
        light, base_py = [str(args.light_venv / "bin" / "tpuctl")], str(args.light_venv / "bin" / "python")
    else:
        light, base_py = (SCRIPT if args.light_entry == "script" else TPUCTL), PY
    if args.light_only:
        bench_cluster("v4-8", args.repeats, light, base_py)  # one host: the measurement
        bench_cluster("v4-64", args.repeats, light, base_py)
        return
    bench_slice_model(5)
    bench_startup(args.repeats)
    sys.path.insert(0, str(Path(__file__).parent))
    from mesh import main as bench_mesh

    bench_mesh(7)
    if not args.skip_cluster:
        bench_cluster("v4-8", args.repeats, light, base_py)  # one host
        bench_cluster("v4-64", args.repeats, light, base_py)  # 8 hosts


if __name__ == "__main__":
    main()
