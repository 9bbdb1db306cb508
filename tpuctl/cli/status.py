"""``tpuctl status``: every host's state as the coordination service sees it."""

from __future__ import annotations

import click

from tpuctl.cli.common import state_dir_option
from tpuctl.cli.light import run_status
from tpuctl.cli.output import format_options


@click.command("status")
@format_options("text: a table; json: one document (schema tpuctl.status/v1, stable keys).")
@state_dir_option
def status(fmt: str, state_dir: str | None) -> int:
    """Show the cluster: every task's state, address, fingerprint and last heartbeat.

    FINGERPRINT tells registrations apart (8 hex digits of the registration's credential; a new process
    on a host gets a new one). HEARTBEAT is the age of the task's last heartbeat, or `<1.0s ago` while
    its session is open: the coordinator's keepalive pings vouch for it, the last answered less than that
    long ago. Without the coordinator every host is still listed with its address: task 0 `unreachable`,
    the others `unknown` (`failed` when the cluster's error named them).

    Each cause is printed once, under health (stderr says only the verdict). Table cells longer than 60
    characters are cut with an ellipsis; --format json has every text whole.

    \b
      tpuctl status
      tpuctl status --state-dir /tmp/tpuctl-sim-$UID/host-0 -o json | jq '.tasks[].state'

    Exit codes: 0 healthy, 3 the cluster is in error (a host failed or left), 5 no agent runs for
    this state dir, 2 bad option.
    """
    return run_status(fmt, state_dir)
