"""``make bench-scale``: one coordination service, thousands of simulated hosts, beside XLA's C++ service.

What runs, per implementation (tpuctl's service, then XLA's C++ coordination service from jaxlib, the one
``jax.distributed`` runs) and per size N:

* one service process: tpuctl's ``start_server`` in a child Python (logging INFO to a file, as task 0 of
  ``tpuctl init`` does), or jaxlib's ``get_distributed_runtime_service`` in a child Python;
* W client processes ("drivers", ``--workers``) sharing the N hosts; every host has its own client
  (tpuctl: a ``CoordinationClient``, one ``grpc.aio`` channel; XLA: a ``DistributedRuntimeClient``) and,
  in the default network namespace mode, its own TCP connection: the bench re-runs itself under
  ``unshare -n`` (a fresh network namespace holding only a loopback interface), the service binds
  0.0.0.0 there (that is, loopback only), and host i dials 127.10.x.y, so gRPC cannot fold the hosts of
  one driver into one connection. ``--no-netns`` (or no ``unshare``): everything on 127.0.0.1, and each
  driver's hosts share one connection (gRPC's global subchannel pool); the table says which.

Phases (the orchestrator starts each phase on every driver at once and measures between phases):

1. ``register``: tpuctl, as ``tpuctl init`` does (tpuctl/agent/bringup.py): register, open the
   session stream (``client.session``; heartbeats every 5 s, the spec default), wait for all (with a
   progress callback, re-polled as the client paces it), start the error watch (on the session since
   protocol v6; a parked long poll before). Every barrier goes on the session too (unary before v6). XLA: ``connect()`` (RegisterTask +
   the PjRT_Client_Connect barrier; it starts its own heartbeat thread and error poll).
2. ``merge``: tpuctl: ``client.gather`` of the record ``tpuctl init`` publishes (4 core IDs and a
   DTensor port; task 0 also a time and JAX's port; tpuctl/agent/merge.py), with its progress polls,
   check that all N are there, barrier. XLA: publish 4 core IDs under ``cores/<task>``, barrier,
   ``key_value_dir_get``, check, barrier.
3. ``last barrier``: one more barrier, timed alone (per-host call latency p50/p99).
4. ``steady``: heartbeats only, for ``--steady`` seconds; service CPU per second is the fraction of one
   core that N heartbeating hosts cost.
5. ``dead_host`` (``--dead-host kill|vanish``, tpuctl only): the last host dies. ``kill``: its session
   ends, as when its process is killed. ``vanish``: its address is blackholed (``ip rule``, in the
   bench's own network namespace), as a preempted VM or a cut cable: nothing tells the service but
   unanswered keepalive pings. Every other host's error watch must name it within the heartbeat
   timeout + 2 s (``--heartbeat-timeout``, default the spec's 30 s); the row is the time from the death
   to the last host told.
6. ``progress`` and ``hang`` (``--progress``, tpuctl only; before ``dead_host``): the service's watchdog
   is set to ``hang_timeout`` ``--hang-timeout`` (default 10 s, so the phase is short) and
   ``report_every`` ``--report-every`` (1 s); the steady phase (4) then lasts as long as ``progress``:
   the longer of ``--steady`` and one report interval (``WatchdogSettings.report_interval``: the cluster
   sends at most 100 summaries a second, so at 10,000 hosts a host reports every 100 s). ``progress``:
   every host's job advances a step a second (all at once, in lockstep) and its agent, simulated as
   tpuctl/agent/progress.py runs it (a ``StepPace`` per host, ``due()`` every 0.25 s, what it returns
   sent with ``session.report_pace``), reports; the service CPU per second against the steady phase's
   is what progress costs (target: at most 5 % of one core more). ``hang``: every job stops; each agent
   says stalled once (after ``stall_after``: half the hang timeout at one step a second) and every host
   must be pushed the ``hang`` verdict (``session.on_verdict``) within ``hang_timeout`` + 2 s of its
   job's last step: the row is p50/p99/max of that delay and how many hosts were told.

Measured per phase: wall time from the phase start to the slowest host's end; service CPU seconds
(utime + stime of the service process, all threads, from /proc/PID/stat); service peak RSS (VmHWM from
/proc/PID/status: the peak so far, not per phase); bytes the service sent (the sum of ``bytes_acked``
of every established TCP socket whose local port is the service's, from ``ss -tin`` at each phase end:
payload bytes the service wrote and the hosts' kernels acknowledged, identical for both services);
barrier call latency p50/p99 (every barrier call of the phase, per host); the drivers' CPU (client
side, for context: it competes with the service for this machine's cores); errors, counted, the first
few verbatim. Every phase has a deadline (``--phase-timeout``); a phase that misses it is an error and
stops that run; an implementation that failed at one size is skipped at larger ones. Only loopback is
used; every process is started here and killed here by PID, in ``finally``.

Two more, by option. ``--floor``: the same steps on a bare ``grpc.aio`` service (a stream per host, one
raw message each way per step, tpuctl's gRPC options, no tpuctl code; its merge is two barriers, no
table): what any Python gRPC service pays on this machine, reported as tpuctl's last barrier against it.
``--xla-merge-pace N`` / ``--xla-retry-paced N``: at most N of each XLA driver's hosts list the table at
once (always, or only in a second run after one with every host at once failed); pacing makes XLA's
merge faster on this machine, so a ratio against it is the conservative one. ``make bench-scale`` uses
``--xla-retry-paced 64 --floor``.

Noisy machines: compare the tpuctl/XLA ratios of one run, not absolute figures across runs.

The code: this file is the entry point (the options, the network namespace, the loop over sizes and
implementations), and every child process runs it again (``scale.py _serve IMPL CFG``, ``scale.py _drive
IMPL CFG``); beside it, ``scale_services.py`` (the three services), ``scale_drivers.py`` (the simulated
hosts), ``scale_phases.py`` (one run: its processes, phases and measurements), ``scale_report.py`` (the
results, the table, the JSON) and ``scale_common.py`` (what they all share).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from scale_common import PY, SCRIPT, raise_nofile
from scale_drivers import drive_floor, drive_tpuctl, drive_xla
from scale_phases import run_one
from scale_report import RunResult, print_profiles, report, table
from scale_services import serve_floor, serve_tpuctl, serve_xla

SIZES = (256, 1024, 2304, 4608, 10000)
IMPLS = ("tpuctl", "xla")
HEARTBEAT_TIMEOUT_S = 30  # tpuctl's spec default; XLA's service gets the same
XLA_HEARTBEAT_TIMEOUT_S = 100  # jax.distributed.initialize's default heartbeat_timeout_seconds
NETNS_ENV = "TPUCTL_BENCH_NETNS"
HANG_TIMEOUT_S = 10.0  # --progress: short, so the hang phase is (the spec's default is 10 minutes)


def reexec_in_netns() -> int | None:
    """Run this bench again inside a new network namespace (root, ``unshare``); None if that is not possible."""
    if os.environ.get(NETNS_ENV) == "1" or not shutil.which("unshare") or not shutil.which("ip"):
        return None
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        print("no network namespace (unshare -n failed): hosts share connections", file=sys.stderr)
        return None
    script = 'ip link set lo up && exec "$0" "$@"'
    env = {**os.environ, NETNS_ENV: "1"}
    return subprocess.call(["unshare", "-n", "--", "sh", "-c", script, PY, str(SCRIPT), *sys.argv[1:]], env=env)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="host counts, comma separated")
    parser.add_argument("--workers", type=int, default=3, help="client processes driving the hosts")
    parser.add_argument("--steady", type=float, default=20.0, help="seconds of the heartbeat-only phase")
    parser.add_argument("--phase-timeout", type=float, default=300.0, help="deadline of each phase, seconds")
    parser.add_argument(
        "--xla-heartbeat-timeout",
        type=int,
        default=XLA_HEARTBEAT_TIMEOUT_S,
        help="XLA clients' heartbeat timeout, s: they heartbeat every half of it, each with that deadline "
        "(default: jax.distributed's 100 s; 10 gives tpuctl's 5 s rate, and XLA's clients abort at 4,608 hosts)",
    )
    parser.add_argument(
        "--xla-merge-pace",
        type=int,
        default=0,
        help="at most this many of each XLA driver's hosts list the core-ID table at once (default 0: all "
        "at once, as a pod does; its service breaks connections at 4,608 hosts on a 2-core machine, and "
        "pacing spares it the contention)",
    )
    parser.add_argument(
        "--xla-retry-paced",
        type=int,
        default=0,
        metavar="N",
        help="when XLA's run fails with every host listing at once, run it again with --xla-merge-pace N "
        "and report that run (marked so)",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=HEARTBEAT_TIMEOUT_S,
        help="tpuctl's heartbeat timeout, s (default: the spec's 30); its hosts' keepalive interval is a sixth of it",
    )
    parser.add_argument(
        "--dead-host",
        choices=("kill", "vanish"),
        help="after the steady phase, the last host dies (kill: its session ends, as when its process is "
        "killed; vanish: its address is blackholed, as a preempted VM, which needs the network namespace) "
        "and every other host must be told, naming it, within the heartbeat timeout + 2 s (tpuctl only)",
    )
    parser.add_argument(
        "--progress",
        action="store_true",
        help="tpuctl only: after the steady phase (then as long as the progress phase), a 'progress' phase "
        "(every host's job advances a step a second and its agent reports its pace as tpuctl's does) and a "
        "'hang' phase (every job stops; every host must be pushed the hang verdict within --hang-timeout + 2 s)",
    )
    parser.add_argument(
        "--hang-timeout",
        type=float,
        default=HANG_TIMEOUT_S,
        help="--progress: the watchdog's hang_timeout, s (short, so the hang phase is; the spec's default is 10 min)",
    )
    parser.add_argument(
        "--report-every",
        type=float,
        default=1.0,
        help="--progress: the watchdog's report_every, s (each host reports every max(this, hosts / 100) s)",
    )
    parser.add_argument("--driver-nice", type=int, default=10, help="niceness of the client processes")
    parser.add_argument("--skip-peer", action="store_true", help="do not run XLA's service")
    parser.add_argument("--peer-max", type=int, default=0, help="run XLA's service only up to this size (0: all)")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also run the same steps on a bare grpc.aio service (one message each way per host and step, "
        "no tpuctl code): the floor under tpuctl's figures on this machine",
    )
    parser.add_argument("--no-netns", action="store_true", help="stay on 127.0.0.1 (hosts share connections)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--logs", help="keep the service and driver logs in this folder (default: discarded)")
    parser.add_argument("--profile", help="py-spy tpuctl's service per phase; collapsed stacks go to this folder")
    parser.add_argument("--profile-driver", action="store_true", help="with --profile: the first driver too")
    parser.add_argument("--profile-native", action="store_true", help="with --profile: native frames too")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if not args.no_netns:
        rc = reexec_in_netns()
        if rc is not None:
            return rc
    raise_nofile()
    args.netns = os.environ.get(NETNS_ENV) == "1"
    args.bind = "0.0.0.0" if args.netns else "127.0.0.1"  # in a fresh namespace, 0.0.0.0 is loopback only
    if args.dead_host == "vanish" and not args.netns:
        print("--dead-host vanish needs the network namespace (root and unshare; not --no-netns)", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    impls = (["tpuctl"] if args.skip_peer else list(IMPLS)) + (["floor"] if args.floor else [])
    runs: list[RunResult] = []
    failed_at: dict[str, int] = {}
    xla_args = args  # paced from the size where a run with every host listing at once failed
    with tempfile.TemporaryDirectory(prefix="tpuctl-bench-scale-") as scratch:
        tmp = args.logs or scratch
        Path(tmp).mkdir(parents=True, exist_ok=True)
        for hosts in sizes:
            for impl in impls:
                if impl == "xla" and args.peer_max and hosts > args.peer_max:
                    runs.append(RunResult(impl, hosts, args.workers, args.netns, skipped=f"--peer-max {args.peer_max}"))
                elif impl in failed_at:
                    runs.append(
                        RunResult(impl, hosts, args.workers, args.netns, skipped=f"failed at {failed_at[impl]:,}")
                    )
                else:
                    runs.append(run_one(impl, hosts, xla_args if impl == "xla" else args, Path(tmp)))
                    first = runs[-1]
                    if impl == "xla" and merge_failed(first) and args.xla_retry_paced and not xla_args.xla_merge_pace:
                        # XLA's service breaks connections when every host lists the table at once on
                        # this machine (4,608 hosts and up): run it again with its listing paced, which
                        # makes its merge faster, not slower (docs/development/performance-history.md, "4 December 2026, night": --xla-retry-paced), and say so.
                        print(
                            f"  xla    {hosts:6} failed ({first.error or 'errors'}); again, merge paced",
                            file=sys.stderr,
                        )
                        # ... and at the larger sizes too (it would only fail there first again)
                        xla_args = argparse.Namespace(**{**vars(args), "xla_merge_pace": args.xla_retry_paced})
                        runs[-1] = run_one(impl, hosts, xla_args, Path(tmp))
                        runs[-1].unpaced_error = first.error or next(
                            (e for p in first.phases for e in p.errors), "errors"
                        )
                    if runs[-1].failed:
                        failed_at[impl] = hosts
    print(table(runs))
    print_profiles(runs)
    if args.json:
        Path(args.json).write_text(json.dumps(report(runs, args), indent=1) + "\n")
    return 0


def merge_failed(run: RunResult) -> bool:
    """Whether ``run`` got through registration and failed in its merge (what pacing can help)."""
    merge = next((p for p in run.phases if p.phase == "merge"), None)
    return merge is not None and (merge.error_count > 0 or merge.wall_s is None)


def child_main(role: str, impl: str, cfg: dict[str, Any]) -> None:
    raise_nofile()
    if role == "_drive":  # the simulated hosts yield the CPU to the service (task 0 has a machine of its own)
        os.nice(cfg["nice"])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the bench stops its children itself
    if role == "_serve" and impl == "tpuctl":
        serve_tpuctl(
            cfg["hosts"], cfg["bind"], cfg["timeout"], cfg["log"], cfg["heartbeat_timeout"], cfg.get("watchdog")
        )
    elif role == "_serve" and impl == "floor":
        serve_floor(cfg["hosts"], cfg["bind"], cfg["heartbeat_timeout"])
    elif impl == "floor":
        asyncio.run(drive_floor(cfg))
    elif role == "_serve":
        serve_xla(cfg["hosts"], cfg["bind"], cfg["timeout"], cfg["port"], cfg["heartbeat_timeout"])
    elif impl == "tpuctl":
        asyncio.run(drive_tpuctl(cfg))
    else:
        drive_xla(cfg)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] in ("_serve", "_drive"):
        child_main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
    else:
        sys.exit(main())
