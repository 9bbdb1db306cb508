"""The one health verdict (tpuctl.health) on status documents: golden cases, and the shared wording."""

from __future__ import annotations

from typing import Any

import pytest

from tpuctl.health import DEGRADED, FAILED, HEALTHY, cluster_health, left


def task(n: int, state: str = "connected", age: float | None = 0.5, cause: str | None = None) -> dict[str, Any]:
    return {"task": n, "address": f"10.0.0.{n + 2}", "state": state, "heartbeat_age": age, "cause": cause}


LEFT_1 = "task 1 (10.0.0.3) left the cluster: it disconnected (tpuctl down, or its agent stopped)"


@pytest.mark.parametrize(
    ("tasks", "error", "verdict", "problems"),
    [
        ([task(0), task(1)], None, HEALTHY, []),
        ([task(0), task(1, "disconnected")], None, FAILED, [LEFT_1]),
        (
            [task(0), task(1, "failed", cause="no heartbeat for 31.0 s (timeout 30 s)")],
            "cluster 'pod' is in error: task 1 (10.0.0.3) failed: no heartbeat for 31.0 s (timeout 30 s)",
            FAILED,
            ["task 1 (10.0.0.3) failed: no heartbeat for 31.0 s (timeout 30 s)"],
        ),
        ([task(0), task(1, "waiting", age=None)], None, DEGRADED, ["task 1 (10.0.0.3) has not registered (yet)"]),
        ([task(0), task(1, age=20.0)], None, DEGRADED, ["task 1 (10.0.0.3) is late: last heartbeat 20.0 s ago (timeout 30 s)"]),
        ([task(0), task(1, age=14.9)], None, HEALTHY, []),  # within half the timeout
        ([], "coordinator unreachable at 10.0.0.2:8490: connection refused", FAILED,
         ["coordinator unreachable at 10.0.0.2:8490: connection refused"]),
        # a failure and a straggler: the failure decides, both are named, failures first
        ([task(0, "waiting", age=None), task(1, "disconnected")], None, FAILED,
         [LEFT_1, "task 0 (10.0.0.2) has not registered (yet)"]),
    ],
)  # fmt: skip
def test_verdicts(tasks: list[dict[str, Any]], error: str | None, verdict: str, problems: list[str]) -> None:
    health = cluster_health({"tasks": tasks, "error": error, "heartbeat_timeout": 30.0})
    assert health.verdict == verdict
    assert [str(p) for p in health.problems] == problems
    assert health.ok is (verdict != FAILED)
    assert health.to_json()["problems"] == [
        {"task": p.task, "address": p.address or None, "state": p.state, "problem": str(p)} for p in health.problems
    ]


def test_lateness_needs_a_timeout() -> None:
    assert cluster_health({"tasks": [task(0, age=1e6)]}).verdict == HEALTHY
    assert cluster_health({"tasks": [task(0, age=40.0)]}, heartbeat_timeout=60.0).verdict == DEGRADED


def test_description_is_bounded() -> None:
    health = cluster_health({"tasks": [task(n, "disconnected") for n in range(1000)]})
    assert len(health.problems) == 1000
    text = health.describe()
    assert text.startswith("failed: task 0 (10.0.0.2) left the cluster") and text.endswith(
        "; ... and 990 more (tpuctl status lists all)"
    )
    assert len(text) < 2000


def test_the_services_barrier_verdict_uses_the_same_words() -> None:
    assert left(["task 1 (10.0.0.3)"]) == LEFT_1
    assert left(["task 1 (10.0.0.3)", "task 2 (10.0.0.4)"], 5) == (
        "task 1 (10.0.0.3), task 2 (10.0.0.4), ... and 3 more left the cluster: "
        "they disconnected (tpuctl down, or their agents stopped)"
    )


def test_headlines() -> None:
    assert cluster_health({"tasks": [task(0)]}).headline("pod") == "cluster 'pod' is healthy"
    assert cluster_health({"tasks": [task(0), task(1, "disconnected")]}).headline("pod") == (
        f"cluster 'pod' is not healthy: failed: {LEFT_1}"
    )
    assert cluster_health({"tasks": [task(1, "waiting")]}).headline("pod") == (
        "cluster 'pod' is degraded: task 1 (10.0.0.3) has not registered (yet)"
    )


def test_a_watchdog_verdict_makes_a_live_cluster_degraded_and_says_why() -> None:
    """Every heartbeat is fine, the job is not: a hang (or a straggler) is a problem of the cluster's."""
    tasks = [{"task": t, "address": f"10.0.0.{t + 1}", "state": "connected", "heartbeat_age": 0.1} for t in range(4)]
    hang = "cluster hung at step 1,203 for 10 min: task 2 (10.0.0.3) at 1,202; 3 hosts at 1,203"
    status = {"tasks": tasks, "watchdog": {"verdicts": [{"kind": "hang", "message": hang, "tasks": [2], "step": 1203}]}}
    health = cluster_health(status, 30.0)
    assert health.verdict == "degraded" and health.ok
    assert health.headline("pod-a") == f"cluster 'pod-a' is degraded: watchdog: {hang}"
    assert cluster_health({"tasks": tasks, "watchdog": {"verdicts": []}}, 30.0).verdict == "healthy"
    recovered = {"tasks": tasks, "watchdog": {"verdicts": [{"kind": "recovered", "message": "x", "tasks": [1]}]}}
    assert cluster_health(recovered, 30.0).verdict == "healthy"


def test_spares_and_hosts_a_generation_left_out_are_not_the_clusters_health() -> None:
    """A replaced slice's hosts (``out``: one dead, one standing by) and a dead spare do not make a formed
    generation of members degraded or failed (issue 26); a member waiting still does."""
    members = [dict(task(n), role="member") for n in (0, 1, 6, 7)]
    outside = [
        dict(task(2, "waiting", None), role="out"),
        dict(task(3), role="standby"),
        dict(task(8, "failed", None, "no heartbeat for 5.2 s"), role="standby"),
    ]
    assert cluster_health({"tasks": members + outside}).verdict == HEALTHY
    waiting = [*members[:3], dict(task(7, "waiting", None), role="member"), *outside]
    verdict = cluster_health({"tasks": waiting})
    assert verdict.verdict == DEGRADED and [p.task for p in verdict.problems] == [7]
