"""``tpuctl sim status``: every simulated host's agent and what the coordinator says of it, in one table.

Each host's state dir (``ROOT/host-N``) says whether its agent runs (the lock, :func:`live_pids`, one read
of ``/proc/locks`` for all hosts) and what it is (``agent.json``); one live agent is asked for the
cluster's status (one call, as ``tpuctl status``), which gives every task's state and heartbeat. The
cluster is healthy when every agent runs, the coordinator sees every task connected, and there is no
cluster error. Linear in the number of hosts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tpuctl.agent.control import Op, call
from tpuctl.agent.statedir import StateDir, live_pids
from tpuctl.coordination.values import TaskState
from tpuctl.errors import StateError, TpuctlError
from tpuctl.health import FAILED, NOT_MEMBERS, Health, Problem, cluster_health, heartbeat_text
from tpuctl.messages import CELL_CHARS, table

SCHEMA = "tpuctl.sim.status/v1"
MAX_LISTED_PROBLEMS = 10
STATUS_TIMEOUT_S = 10.0
_HOST_DIR = re.compile(r"host-(\d+)")


def host_dirs(root: Path) -> list[tuple[int, Path]]:
    """``(task, ROOT/host-TASK)`` for every host folder under ``root``, by task."""
    found = []
    for path in root.glob("host-*"):
        match = _HOST_DIR.fullmatch(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return sorted(found)


def no_sim(root: Path, why: str) -> StateError:
    return StateError(f"no simulated cluster is running under {root}: {why}", hint=f"start one: {up_command(root)}")


def up_command(root: Path) -> str:
    from tpuctl.agent.statedir import default_sim_root

    return "tpuctl sim up v4-32" + ("" if root == default_sim_root() else f" --root {root}")


def sim_status(root: Path) -> dict[str, Any]:
    """The ``--format json`` document (schema ``tpuctl.sim.status/v1``); StateError (exit 5) when no agent
    of a simulated cluster runs under ``root``."""
    dirs = host_dirs(root)
    if not dirs:
        raise no_sim(root, "it has no host-N state dirs")
    states = [StateDir(path) for _, path in dirs]
    pids = live_pids(states)
    if not any(pids):
        raise no_sim(root, f"none of its {len(dirs)} hosts' agents runs")
    infos: list[Any] = []
    for state in states:
        try:  # a stopped agent's description stays (its address, when no live agent's answer has it)
            infos.append(state.read_info())
        except TpuctlError:
            infos.append(None)
    asked, problem = None, None
    cluster: dict[str, Any] | None = None  # the status document, read as loosely as it is rendered
    for (task, _), state, pid in zip(dirs, states, pids, strict=True):
        if pid is None:
            continue
        try:
            cluster = call(state, Op.STATUS, timeout=STATUS_TIMEOUT_S)
            asked = task
            break
        except TpuctlError as exc:
            problem = f"task {task}'s agent did not answer: {exc.message}"
    seen = {t.get("task"): t for t in (cluster or {}).get("tasks", [])}
    hosts = []
    for (task, path), pid, info in zip(dirs, pids, infos, strict=True):
        view = seen.get(task, {})
        hosts.append(
            {
                "task": task,
                "state_dir": str(path),
                "address": view.get("address") or (info.address if info else None),
                "agent_pid": pid,
                "agent": "running" if pid is not None else "stopped",
                # member, standby (a spare, a host of a slice left out) or out: the coordinator's word, else agent.json's
                "role": view.get("role") or (info.role if info else None),
                "state": view.get("state"),
                "heartbeat_age": view.get("heartbeat_age"),
                "session_open": bool(view.get("session_open")),
                "cause": view.get("cause"),
            }
        )
    first = next((i for i, pid in zip(infos, pids, strict=True) if i is not None and pid is not None), None)
    error = (cluster or {}).get("error") or problem
    health = _health(cluster, hosts, problem)
    healthy = (
        cluster is not None
        and not error
        and all(h["agent"] == "running" and h["state"] == TaskState.CONNECTED.value for h in hosts)
        and len(seen) == len(hosts)
    )
    return {
        "schema": SCHEMA,
        "root": str(root),
        "cluster": first.cluster if first else None,
        "accelerator": first.accelerator if first else None,
        "coordinator": (cluster or {}).get("coordinator") or (first.coordinator if first else None),
        "asked_task": asked,
        "healthy": healthy,
        "health": health.to_json(),
        "error": error,
        "num_hosts": len(hosts),
        "tasks": hosts,
    }


def _health(cluster: dict[str, Any] | None, hosts: list[dict[str, Any]], problem: str | None) -> Health:
    """The shared verdict (:mod:`tpuctl.health`, as ``tpuctl status`` gives it) on the coordinator's view,
    plus what only the sim sees: a host whose agent process is gone is failed here even before the
    coordinator's heartbeat timeout says so."""
    if cluster is None:
        return Health(FAILED, (Problem(FAILED, None, "", "error", problem or "no agent is running"),))
    verdict = cluster_health(cluster)
    outside = {t.get("task") for t in cluster.get("tasks") or () if t.get("role") in NOT_MEMBERS}
    stopped = {
        h["task"]: Problem(FAILED, h["task"], str(h["address"] or "?"), "stopped", _stopped_cause(h["task"]))
        for h in hosts
        if h["agent"] != "running" and h["task"] not in outside  # a spare or a left-out host: not the cluster's
    }
    if not stopped:
        return verdict
    # A host the coordinator names keeps its words (as status, run and barrier say them); one it cannot
    # (gone unnoticed yet, or task 0 itself, which the asked agent can only call unreachable) is named by
    # what the sim sees: its agent is not running. Each host once.
    named = {p.task for p in verdict.problems if p.state not in ("unreachable", "unknown")}
    kept = [p for p in verdict.problems if p.task not in stopped or p.task in named]
    added = [problem for task, problem in stopped.items() if task not in named]
    return Health(FAILED, tuple(sorted((*added, *kept), key=lambda p: (p.verdict != FAILED, p.task or 0))))


def _stopped_cause(task: int) -> str:
    if task == 0:
        return "its agent is not running (it was the coordinator: no other host can reach the cluster)"
    return "its agent is not running"


def render(doc: dict[str, Any]) -> str:
    """The document as text: a header, one row per host, the verdict (and the cluster's error)."""
    lines = [
        f"cluster      {doc['cluster']}  ({doc['accelerator']}, {doc['num_hosts']} hosts under {doc['root']})",
        f"coordinator  {doc['coordinator']}  (as task {doc['asked_task']}'s agent sees it)"
        if doc["asked_task"] is not None
        else f"coordinator  {doc['coordinator']}  (no agent answered)",
        "",
    ]
    roles = any(host.get("role") not in (None, "member") for host in doc["tasks"])  # spares: a ROLE column
    rows: list[tuple[str, ...]] = [("TASK", "ADDRESS", "AGENT", "PID", "STATE", "HEARTBEAT") + (("ROLE",) if roles else ())
                                   + ("STATE DIR",)]  # fmt: skip
    for host in doc["tasks"]:
        rows.append(
            (
                str(host["task"]),
                str(host["address"] or "-"),
                host["agent"],
                str(host["agent_pid"] or "-"),
                str(host["state"] or "-"),  # the cause is under health, once
                heartbeat_text(host),
            )
            + ((str(host.get("role") or "-"),) if roles else ())
            + (host["state_dir"],)
        )
    lines += table(rows, widths=(None, None, None, None, CELL_CHARS, None) + ((None,) if roles else ()) + (None,))
    lines.append("")
    if doc["error"] and not _named(doc["error"], doc["health"]["problems"]):
        lines.append(f"cluster error: {doc['error']}")
    if doc["healthy"]:
        lines.append("healthy: every agent runs and every task is connected")
    else:
        verdict = doc["health"]
        lines.append(f"health: {verdict['verdict']}")
        lines += [f"  {p['problem']}" for p in verdict["problems"][:MAX_LISTED_PROBLEMS]]
        more = len(verdict["problems"]) - MAX_LISTED_PROBLEMS
        if more > 0:
            lines.append(f"  ... and {more:,} more (--format json lists all)")
    return "\n".join(lines)


def _named(error: str, problems: list[dict[str, Any]]) -> bool:
    """Whether a problem under health already says the cluster's error (a failed task's cause, the
    error itself), so the text does not print it twice."""
    failed = ("failed", "disconnected", "unreachable", "stopped")  # a host's failure: the error names it
    return any(p["problem"] == error or (p["state"] in failed and p["task"] is not None) for p in problems)
