"""``tpuctl doctor``: this host's preflight, each check with a verdict, what it saw and a fix."""

from __future__ import annotations

import click

from tpuctl.cli.common import WholeNumber, state_dir_option
from tpuctl.cli.output import dumps, emit, format_options
from tpuctl.errors import EXIT_CLUSTER


@click.command("doctor")
@click.option(
    "--config", "-c", "config", metavar="FILE", help="The cluster spec (else the running agent's, else detected)."
)
@click.option("--task-id", type=WholeNumber(min=0), metavar="N", help="This host's task (else found as tpuctl init finds it).")
@state_dir_option
@format_options("text: a line per check; json: one document (schema tpuctl.doctor/v1: verdict, counts, checks).")
def doctor(config: str | None, task_id: int | None, state_dir: str | None, fmt: str) -> int:
    """Check this host before (or after) a failed start: TPU devices and the processes holding them, a
    stale /tmp/libtpu_lockfile, transparent hugepages, the state dir, the coordinator port (task 0),
    every peer's name and TCP reachability, the clock.

    \b
    Each check says ok, warn, fail or skip, what it saw and how to fix it. Read-only: nothing is
    changed, stopped or removed.

    \b
      tpuctl doctor --config cluster.yaml
      tpuctl doctor --json | jq '.checks[] | select(.verdict == "fail")'

    Exit codes: 0 no check failed (warnings allowed), 3 a check failed, 2 bad option.
    """
    from tpuctl.agent.statedir import resolve_state_dir
    from tpuctl.doctor.checks import FAIL, document, render, run_checks
    from tpuctl.doctor.host import Host
    from tpuctl.doctor.target import find_target

    state = resolve_state_dir(state_dir)
    target, spec_check = find_target(config, task_id, state)
    checks = run_checks(Host(), state, target, spec_check)
    if fmt == "json":
        emit(dumps(document(checks, state=state, target=target)), None)
    else:
        click.echo(render(checks))
    return EXIT_CLUSTER if any(c.verdict == FAIL for c in checks) else 0
