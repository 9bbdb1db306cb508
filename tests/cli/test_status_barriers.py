"""`tpuctl status`'s text for open and recently failed barriers and gathers, from the status document."""

from __future__ import annotations

from tpuctl.cli.light import render_status
from tpuctl.coordination.values import ClusterStatus, FailedBarrier, OpenBarrier, TaskInfo, TaskState, TaskStatus

HOSTS = 40


def document(status: ClusterStatus) -> dict[str, object]:
    return {"cluster": "pod", "task": 0, "coordinator": "127.0.0.1:1", "heartbeat_timeout": 10.0, **status.as_dict()}


def test_open_and_failed_rounds_are_listed_with_who_is_missing_bounded() -> None:
    tasks = tuple(TaskInfo(i, f"127.0.0.{i + 1}") for i in range(HOSTS))
    rows = tuple(TaskStatus(t, TaskState.CONNECTED, 0, f"h{t.task_id}", "p", 0.5, "") for t in tasks)
    timed_out = FailedBarrier(
        "sync", 1, "barrier", "timed out", "barrier 'sync' #1 timed out after 2.0 s: ...", 12.4, 1,
        tasks[1:11], HOSTS - 1,
    )  # fmt: skip
    left = FailedBarrier("ids", 3, "gather", "host left", "gather 'ids' #3 cannot pass: ...", 3.0, 38, tasks[2:4], 2)
    status = ClusterStatus(
        "pod", 7, rows, None,
        barriers=(OpenBarrier("ids", 4, (0, 1), 20.2, "gather"),),
        failed_barriers=(timed_out, left),
    )  # fmt: skip
    text = render_status(document(status))
    assert text.endswith(
        "\n\n"
        "gather 'ids' #4: waiting for task(s) 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, ... and 28 more (2 arrived, times out in 20 s)\n"
        "recently failed (every host's next call to the name joins a new round):\n"
        "  barrier 'sync' #1, 12 s ago: timed out; missing task(s) 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, ... and 29 more "
        "(1 arrived)\n"
        "  gather 'ids' #3, 3 s ago: host left; missing task(s) 2, 3 (38 arrived)"
    )


def test_no_barrier_section_without_barriers() -> None:
    task = TaskInfo(0, "127.0.0.1")
    status = ClusterStatus("pod", 7, (TaskStatus(task, TaskState.CONNECTED, 0, "h", "p", 0.5, ""),), None)
    text = render_status(document(status))
    assert "waiting for" not in text and "recently failed" not in text
    assert document(status)["failed_barriers"] == []
