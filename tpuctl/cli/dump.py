"""``tpuctl dump``: the black box, every host's job stacks grouped by where they are stuck."""

from __future__ import annotations

import json

import click

from tpuctl.cli.common import parse_duration_option, say, state_dir_option
from tpuctl.cli.formats import JSON
from tpuctl.cli.output import format_options
from tpuctl.errors import EXIT_DEADLINE

MARGIN_S = 15.0  # the agent's answer after the hosts' deadline


@click.command("dump")
@format_options("text: the groups, odd ones out first; json: one document (schema tpuctl.dump/v1).")
@click.option("--timeout", metavar="DURATION", default=None,
              help="How long the hosts have to answer (default 10s); the report names those that did not.")  # fmt: skip
@state_dir_option
def dump(fmt: str, timeout: str | None, state_dir: str | None) -> int:
    """Take every host's job stacks (the black box) and group hosts by where their jobs are.

    \b
      tpuctl dump
      tpuctl dump --json | jq '.groups[0]'

    Every agent takes its job's Python stacks (every thread of every process: py-spy where installed
    and allowed to ptrace, else the signal handler `tpuctl run` installs in a Python job), keeps the full
    dump in its state dir and sends the coordinator a digest. Hosts are grouped by state and stack
    signature, the smallest groups (the odd ones out) first, each naming a few hosts and where their
    full dumps lie. The report is at most 64 KiB at any cluster size. A stopped process (SIGSTOP, a
    debugger) is said to be stopped; a job that is not Python says so. The watchdog takes the same dump
    by itself when it declares a hang (in task 0's agent log).

    Exit codes: 0 every host answered, 4 some hosts did not answer in time (the report names them and
    has everyone else's), 3 no generation of the cluster is up, 5 no agent runs for this state dir,
    2 bad option.
    """
    from tpuctl.agent.control import Op, call
    from tpuctl.agent.statedir import resolve_state_dir
    from tpuctl.watchdog.blackbox import render_text

    seconds = parse_duration_option(timeout, "--timeout") or 0.0
    report = call(resolve_state_dir(state_dir), Op.DUMP, {"timeout": seconds}, timeout=(seconds or 10.0) + MARGIN_S)
    click.echo(json.dumps(report, indent=2, ensure_ascii=False) if fmt == JSON else render_text(report))
    missing = report.get("no_answer")
    if isinstance(missing, dict) and missing.get("count"):
        say(f"tpuctl: {missing['count']} hosts did not answer in time")
        return EXIT_DEADLINE
    return 0
