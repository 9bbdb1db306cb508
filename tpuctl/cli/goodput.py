"""``tpuctl goodput``: where the cluster's wall time went, bucket by bucket, from the coordinator's timeline."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from tpuctl.cli.common import say, state_dir_option
from tpuctl.cli.formats import JSON, TEXT
from tpuctl.cli.output import dumps, emit, format_options, out_option
from tpuctl.errors import EXIT_CLUSTER, InputError

TIMEOUT_S = 10.0  # the agent asks the coordinator within 5 s
SVG = "svg"


@click.command("goodput")
@format_options(
    "text: a table of the buckets per generation; json: one document (schema tpuctl.goodput/v1); svg: the "
    "timeline as a picture (with --out FILE).",
    (TEXT, JSON, SVG),
)
@out_option("the ledger")
@state_dir_option
def goodput(fmt: str, out: str | None, state_dir: str | None) -> int:
    """Show where the cluster's wall time went: the goodput ledger.

    \b
      tpuctl goodput
      tpuctl goodput --json | jq '.totals'
      tpuctl goodput --format svg --out goodput.svg

    Task 0's coordinator keeps the cluster's timeline (each generation's bring-up, the wait for hosts,
    the job's start-up, its progress, hangs, failures, restarts, returns, and preemptions) and splits
    the wall time since task 0's init into buckets that add up to the whole: bring-up, waiting for
    hosts, start-up and compilation, productive, hung, detection and restart, lost work (progress after
    the last checkpoint that a failure threw away). Per generation and in total, with the goodput
    fraction (productive / wall). The picture (--format svg) draws generations as bands, the buckets
    along a strip and each failed host's failures and returns. Any host's agent fetches the ledger; it
    is printed even when the cluster is in error. On task 0's host with no agent running, it is read
    from the state dir's journal (goodput.jsonl), as of its last entry.

    Exit codes: 0 printed, 3 printed but the cluster is in error (or the coordinator does not answer),
    5 no agent runs for this state dir and it holds no journal, 2 bad option.
    """
    from tpuctl.agent.statedir import resolve_state_dir

    if fmt == SVG and out is None:
        raise InputError("--format svg needs --out FILE", hint="e.g. tpuctl goodput --format svg --out goodput.svg")
    state = resolve_state_dir(state_dir)
    journal = Path(state.goodput_journal)
    if state.live_pid() is None and journal.exists():
        document = _from_journal(journal)
        say(f"tpuctl: no agent runs for {state.path}: the ledger from its journal, as of {_when(document.get('until'))}")
    else:
        from tpuctl.agent.control import Op, call

        document = call(state, Op.GOODPUT, {}, timeout=TIMEOUT_S)
    from tpuctl.render.goodput import ledger_svg, ledger_text

    if fmt == JSON:
        emit(dumps(document), out)
    elif fmt == SVG:
        emit(ledger_svg(document), out)
    else:
        emit(ledger_text(document) + "\n", out)
    if document.get("error"):
        say(f"tpuctl: error: the cluster is in error: {document['error']}")
        return EXIT_CLUSTER
    return 0


def _from_journal(path: Path) -> dict[str, Any]:
    """The ledger of the journal at ``path`` (task 0's, its agent gone), up to the journal's last mark."""
    from tpuctl.goodput.journal import load
    from tpuctl.goodput.ledger import account

    timeline = load(path)
    last = timeline.current
    error = last.cause if last.final and not last.shutdown else None
    document = account(timeline, timeline.seen, error=error).to_json()
    document["notes"] = [*document["notes"], f"read from {path} (no agent runs): as of its last entry"]
    return document


def _when(at: object) -> str:
    if not isinstance(at, (int, float)) or isinstance(at, bool):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) + f" ({time.time() - at:.0f} s ago)"
