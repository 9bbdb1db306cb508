"""``python -m tools.soak``: the randomised fault soak over an 8-host simulated cluster (``make soak``).

    python -m tools.soak                          # 500 schedules from a random first seed (printed)
    python -m tools.soak --seed 1234 --schedules 1   # replay the schedule of seed 1234
    python -m tools.soak --seeds 7,19,40          # exactly these schedules
    python -m tools.soak --show 1234              # print a schedule's steps, run nothing

Schedule k of a run has seed FIRST + k. Exit 0 when no invariant was violated, 1 otherwise, 130 on Ctrl-C
(after stopping every process and removing every namespace it made, and writing the report).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from tools.soak import schedule as sched


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--schedules", type=int, default=500, help="how many schedules (default 500)")
    parser.add_argument("--seed", type=int, help="the first schedule's seed (default: random, printed)")
    parser.add_argument("--seeds", help="comma-separated seeds to run, instead of --seed/--schedules")
    parser.add_argument("--show", type=int, metavar="SEED", help="print the schedule of SEED and exit")
    parser.add_argument("--network", choices=("auto", "netns", "loopback"), default="auto",
                        help="netns: a namespace per host, partitions possible (root); loopback: 127.0.0.x, "
                             "partitions skipped; auto (default): netns where possible")  # fmt: skip
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / f"tpuctl-soak-{os.getuid()}",
                        help="where the cluster, the logs and the report go (default: %(default)s)")  # fmt: skip
    parser.add_argument("--time-limit", type=float, default=24 * 3600.0, metavar="SECONDS",
                        help="start no schedule after this long (default: a day)")  # fmt: skip
    parser.add_argument("--keep-logs", action="store_true", help="keep every schedule's command output")
    args = parser.parse_args(argv)
    if args.schedules < 1:
        parser.error("--schedules must be at least 1")
    return args


def seeds(args: argparse.Namespace) -> list[int]:
    if args.seeds:
        try:
            return [int(s) for s in args.seeds.split(",") if s.strip()]
        except ValueError:
            raise SystemExit(f"soak: --seeds {args.seeds!r}: expected comma-separated integers, e.g. --seeds 7,19") from None
    first = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    return list(range(first, first + args.schedules))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.show is not None:
        print(sched.generate(args.show).describe())
        return 0
    from tools.soak.cluster import network
    from tools.soak.report import Report
    from tools.soak.runner import Interrupted, Soak, interrupt_on_signals

    chosen = seeds(args)
    interrupt_on_signals()
    net = network(args.network)
    kind = "netns" if net.partitions else "loopback"
    print(f"soak: {len(chosen)} schedules, seeds {chosen[0]}..{chosen[-1]}, network {kind}, root {args.root}", flush=True)
    report = Report(kind)
    soak = Soak(args.root, net, keep_logs=args.keep_logs, say=lambda text: print(text, flush=True))
    deadline = time.monotonic() + args.time_limit
    try:
        for n, seed in enumerate(chosen, 1):
            if time.monotonic() > deadline:
                report.interrupted = f"--time-limit {args.time_limit:g} s reached"
                break
            result = soak.run_schedule(sched.generate(seed))
            report.results.append(result)
            report.fresh_starts = soak.fresh_starts
            kinds = ",".join(f"{k}" for k in sorted(result.faults))
            state = "ok" if not result.violations else f"{len(result.violations)} VIOLATIONS"
            print(f"[{n}/{len(chosen)}] seed {seed}: {state} ({result.seconds:.1f} s; {kinds}; generation {result.generation})", flush=True)
            for v in result.violations:
                print(f"    {v.invariant}: {v.detail}" + (f" [looks like known defect {v.known}]" if v.known else ""), flush=True)
            if result.violations:
                print(f"    replay: python -m tools.soak --seed {seed} --schedules 1; evidence in {result.logs}", flush=True)
            if n % 25 == 0:
                report.write(args.root)
    except Interrupted as exc:
        report.interrupted = str(exc)
    finally:
        soak.close()
        report.ended = time.time()
        report.fresh_starts = soak.fresh_starts
        paths = report.write(args.root)
        print(report.text(), flush=True)
        print(f"report: {paths[0]} and {paths[1]}", flush=True)
    if report.interrupted and not report.interrupted.startswith("--time-limit"):
        return 130
    return 1 if report.violations() else 0


if __name__ == "__main__":
    sys.exit(main())
