"""The root-cause table ``tpuctl run`` prints when the cluster goes down under a job.

One headline naming the host that failed first (when, why), then a row per host: the failed ones in
the order the service declared them, then every other host with its state and last heartbeat. Pure:
built from the agent's :class:`~tpuctl.agent.protocol.ErrorReport`, its
:class:`~tpuctl.agent.protocol.AgentInfo` and a status document.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tpuctl.agent.protocol import AgentInfo, ErrorReport
from tpuctl.messages import cell, table


@dataclass
class ClusterDown:
    """Why the job must stop: the agent's error report, or the agent being gone."""

    report: ErrorReport
    agent_gone: str | None = None
    noticed_at: float = field(default_factory=time.time)


def _clock(when: float | None) -> str:
    if when is None:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(when)) + f".{int(when * 1000) % 1000:03d}"


def headline(down: ClusterDown, info: AgentInfo) -> str:
    """One line: what happened to the cluster in this generation, naming the host that failed first. The
    generation is named once the cluster has had more than one (``restart: {policy: rejoin}``): what
    ended an earlier one is history (:func:`previous_generations`), never this one's cause."""
    report = down.report
    cluster = info.cluster
    when = _clock(report.detected_at or down.noticed_at)
    if down.agent_gone:
        return f"cluster {cluster!r}: task {info.task}: {down.agent_gone}, detected at {when}"
    failures = report.failures
    generation = f" in generation {report.generation}" if report.generation > 1 else ""
    if failures:
        first = failures[0]
        more = f" (and {len(failures) - 1:,} more)" if len(failures) > 1 else ""
        what = f": generation {report.generation} ended" if report.rejoining else f" failed{generation}"
        return (
            f"cluster {cluster!r}{what}: task {first.task} ({first.address}) failed first{more}, detected at "
            f"{when}: {first.cause}"
        )
    if report.error:
        return f"cluster {cluster!r} failed{generation}, detected at {when}: {report.error}"
    if report.shutdown:
        return f"cluster {cluster!r} was shut down (tpuctl down --all){generation}, at {when}"
    return f"cluster {cluster!r}: this host's agent is stopping (tpuctl down){generation}, at {when}"


def previous_generations(report: ErrorReport) -> list[str]:
    """``previous generations:`` and a line per earlier generation this host was in that ended (when it
    formed and ended, and why): history, below the table of the generation the job ran in."""
    rows = [
        h
        for h in report.history
        if h.get("ended") is not None and isinstance(h.get("generation"), int) and h["generation"] != report.generation
    ]
    if not rows:
        return []
    lines = ["previous generations (history, not this generation's cause):"]
    for row in rows:
        formed, ended = row.get("formed"), row.get("ended")
        lines.append(
            f"  generation {row['generation']} (formed {_clock(formed if isinstance(formed, float) else None)}, "
            f"ended {_clock(ended if isinstance(ended, float) else None)}): {row.get('cause') or '-'}"
        )
    return lines


def root_cause_rows(
    down: ClusterDown, info: AgentInfo, status: dict[str, Any] | None, status_at: float
) -> list[tuple[str, ...]]:
    """Rows of the table: the failed hosts in the order the service declared them, then every other host."""
    report = down.report
    me = info.task
    hosts = list(info.hosts)
    known = {int(t["task"]): t for t in (status or {}).get("tasks", []) if isinstance(t.get("task"), int)}
    failed: list[tuple[int, str, str, str]] = []  # task, address, state, cause
    for failure in report.failures:
        state = str(known.get(failure.task, {}).get("state") or "failed")
        failed.append((failure.task, failure.address, state, failure.cause))
    if not failed and down.agent_gone:
        pid = f" (pid {info.pid})" if info.pid else ""
        failed.append((me, info.address or "?", "agent gone", f"its tpuctl agent{pid} is gone (this host)"))
    if not failed and report.error_type == "CoordinatorUnreachable" and hosts:
        failed.append((0, hosts[0], "unreachable", "its coordinator stopped answering this host"))

    def last_heartbeat(task: int) -> str:
        age = known.get(task, {}).get("heartbeat_age")
        return "-" if age is None else _clock(status_at - float(age))

    rows: list[tuple[str, ...]] = [("#", "TASK", "ADDRESS", "STATE", "LAST HEARTBEAT", "CAUSE")]
    for order, (task, address, state, cause) in enumerate(failed, 1):
        rows.append((str(order), str(task), address, state, last_heartbeat(task), _short(cause)))
    listed = {entry[0] for entry in failed}
    for task, address in enumerate(hosts):
        if task in listed:
            continue
        entry = known.get(task, {})
        state = str(entry.get("state") or "unknown")
        cause = str(entry.get("cause") or "")
        if task == me:
            cause = (cause + "; " if cause else "") + "this host"
        rows.append(("", str(task), address, state, last_heartbeat(task), _short(cause)))
    return rows


def format_rows(rows: list[tuple[str, ...]]) -> str:
    return "\n".join(table(rows, indent="  "))


def _short(text: str, limit: int = 100) -> str:
    return cell(text, limit)  # one line, cut with an ellipsis: the table keeps its width


def generations_table(rows: list[dict[str, Any]]) -> str:
    """Every start of the job under ``tpuctl run --max-restarts``: its generation, when it started and
    ended, how the job ended, and what ended the generation (one line each; at most max restarts + 1)."""
    out: list[tuple[str, ...]] = [("GENERATION", "JOB STARTED", "ENDED", "JOB", "CAUSE")]
    for row in rows:
        out.append(
            (
                str(row.get("generation")),
                _clock(row.get("started")),
                _clock(row.get("ended")),
                str(row.get("job") or "-"),
                _short(str(row.get("cause") or "-"), 140),
            )
        )
    return format_rows(out)


def root_cause_table(down: ClusterDown, info: AgentInfo, status: dict[str, Any] | None, status_at: float) -> str:
    history = previous_generations(down.report)
    table = headline(down, info) + "\n" + format_rows(root_cause_rows(down, info, status, status_at))
    return table + "".join("\n  " + line for line in history)


