"""``tpuctl status``: every host's state as the coordination service sees it."""

from __future__ import annotations

import json
from typing import Any

import click

from tpuctl.agent.control import call
from tpuctl.agent.statedir import resolve_state_dir
from tpuctl.cli.common import state_dir_option

STATUS_TIMEOUT_S = 10.0


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (stable keys) instead of a table.")
@state_dir_option
def status(as_json: bool, state_dir: str | None) -> int:
    """Show the cluster: every task's state, address, incarnation and last heartbeat age.

    Exit code 0 when every host is connected, 3 when the cluster is in error (a host failed or
    left), 5 when no agent runs for this state dir.
    """
    state = resolve_state_dir(state_dir)
    result = call(state, "status", timeout=STATUS_TIMEOUT_S)
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
    else:
        click.echo(render_status(result))
    return 3 if result.get("error") else 0


def render_status(result: dict[str, Any]) -> str:
    lines = [
        f"cluster      {result.get('cluster')}  (this host: task {result.get('task')})",
        f"coordinator  {result.get('coordinator')}  (service incarnation {result.get('service_incarnation')})",
    ]
    if result.get("mapping"):
        lines.append(f"mapping      {result['mapping']}")
    lines.append("")
    rows = [("TASK", "STATE", "ADDRESS", "INCARNATION", "HEARTBEAT")]
    for task in result.get("tasks", []):
        age = task.get("heartbeat_age")
        rows.append(
            (
                str(task.get("task")),
                str(task.get("state")),
                str(task.get("address")),
                str(task.get("incarnation") or "-"),
                "-" if age is None else f"{age:.1f}s ago",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(f"{c:<{w}}" for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if result.get("barriers"):
        lines.append("")
    for barrier in result.get("barriers", []):
        missing = ", ".join(str(t) for t in barrier.get("missing", []))
        lines.append(
            f"barrier {barrier.get('name')!r} #{barrier.get('instance')}: waiting for task(s) {missing} "
            f"({len(barrier.get('arrived', []))} arrived, times out in {barrier.get('seconds_left', 0):.0f} s)"
        )
    if result.get("error"):
        lines += ["", f"cluster error: {result['error']}"]
    return "\n".join(lines)
