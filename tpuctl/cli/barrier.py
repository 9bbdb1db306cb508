"""``tpuctl barrier NAME``: block until every host of the cluster reaches NAME (run by :mod:`tpuctl.cli.light`)."""

from __future__ import annotations

import click

from tpuctl.cli.common import state_dir_option
from tpuctl.cli.light import run_barrier


@click.command("barrier")
@click.argument("name")
@click.option(
    "--timeout",
    metavar="DURATION",
    help="Give up after this long (e.g. 90s, 10m). Default: the spec's barrier_timeout.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
@state_dir_option
def barrier(name: str, timeout: str | None, quiet: bool, state_dir: str | None) -> int:
    """Wait until every host of the cluster calls `tpuctl barrier NAME`.

    \b
    Each call on a host is the next instance of NAME on that host, so a loop works:
      for step in $(seq 100); do train_step; tpuctl barrier step; done
    On timeout the error lists every host that has not arrived (task id and address); when a host
    failed or left, the error names it and why, in the words of `tpuctl status`.

    \b
    A round that timed out is over for every host: each host's next call joins a new round,
    so a retry is safe and the next round in which every host calls NAME passes:
      until tpuctl barrier --timeout 60s sync; do [ $? -eq 4 ] || exit 1; done
    `tpuctl status` lists open rounds and the last 16 that failed, with who was missing.

    A call that gives up (its --timeout ran out in a round another host opened with a
    longer one; Ctrl-C; SIGTERM) withdraws its arrival: the round waits for this host
    again and its next call joins it. A round that passed first stays passed.

    Exit codes: 0 passed, 2 bad name or timeout, 3 a host failed or left (or the coordinator is
    unreachable, or this host is a spare standing by: it takes part in no barrier), 4 timed out (the round, or this call's --timeout), 5 no agent runs for this
    state dir.
    """
    return run_barrier(name, timeout, quiet, state_dir)
