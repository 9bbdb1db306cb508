"""``tpuctl status``: every host's state as the coordination service sees it."""

from __future__ import annotations

import click

from tpuctl.cli.common import state_dir_option
from tpuctl.cli.light import run_status


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (stable keys) instead of a table.")
@state_dir_option
def status(as_json: bool, state_dir: str | None) -> int:
    """Show the cluster: every task's state, address, incarnation and last heartbeat age.

    Exit code 0 when every host is connected, 3 when the cluster is in error (a host failed or
    left), 5 when no agent runs for this state dir.
    """
    return run_status(as_json, state_dir)
