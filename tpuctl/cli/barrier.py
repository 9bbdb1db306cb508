"""``tpuctl barrier NAME``: block until every host of the cluster reaches NAME."""

from __future__ import annotations

import click

from tpuctl.agent.control import call
from tpuctl.agent.statedir import resolve_state_dir
from tpuctl.cli.common import parse_duration_option, say, state_dir_option

# Extra time the local call waits beyond the barrier's own deadline, so the agent's precise
# "who is missing" answer arrives before the local safety timeout fires.
LOCAL_MARGIN_S = 10.0


@click.command("barrier")
@click.argument("name")
@click.option(
    "--timeout",
    metavar="DURATION",
    help="Give up after this long (e.g. 90s, 10m). Default: the spec's barrier_timeout.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
@state_dir_option
def barrier(name: str, timeout: str | None, quiet: bool, state_dir: str | None) -> None:
    """Wait until every host of the cluster calls `tpuctl barrier NAME`.

    \b
    Each call on a host is the next instance of NAME on that host, so a loop works:
      for step in $(seq 100); do train_step; tpuctl barrier step; done
    On timeout (exit 4) the error lists every host that has not arrived (task id and address);
    if a host has failed (exit 3) the error names it and why.
    """
    seconds = parse_duration_option(timeout, "--timeout")
    state = resolve_state_dir(state_dir)
    info = state.read_info()
    limit = seconds if seconds is not None else float(info.get("barrier_timeout", 600.0))
    result = call(
        state,
        "barrier",
        {"name": name, "timeout": limit},
        timeout=limit + LOCAL_MARGIN_S,
        progress=None if quiet else say,
    )
    if not quiet:
        say(f"barrier {name!r} #{result.get('instance', '?')} passed ({result.get('hosts', '?')} hosts)")
