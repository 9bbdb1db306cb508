"""The root-cause table ``tpuctl run`` prints when the cluster goes down under a job (pure)."""

from __future__ import annotations

import re

from tpuctl.agent.protocol import AgentInfo, ErrorReport, JobPorts
from tpuctl.job.rootcause import ClusterDown, headline, root_cause_table

INFO = AgentInfo(cluster="pod", task=0, num_tasks=3, coordinator="10.0.0.1:8476", mapping="/run/tpuctl/mapping.json",
                 job_ports=JobPorts(dtensor=(9100, 9100, 9100), jax=9101, torch=9102), address="10.0.0.1",
                 hosts=("10.0.0.1", "10.0.0.2", "10.0.0.3"), pid=77)


def test_table_names_the_first_failure_then_every_other_host() -> None:
    report = {
        "error": "cluster 'pod' is in error: 2 tasks failed",
        "error_type": "ClusterError",
        "failures": [
            {"task": 2, "address": "10.0.0.3", "cause": "no heartbeat for 5.1 s (timeout 5 s)"},
            {"task": 1, "address": "10.0.0.2", "cause": "reported: OOM"},
        ],
        "detected_at": 1000.25,
    }
    status = {
        "tasks": [
            {"task": 0, "state": "connected", "heartbeat_age": 0.5},
            {"task": 1, "state": "failed", "heartbeat_age": 1.0, "cause": "reported: OOM"},
            {"task": 2, "state": "failed", "heartbeat_age": 6.0, "cause": "no heartbeat for 5.1 s (timeout 5 s)"},
        ]
    }
    table = root_cause_table(ClusterDown(ErrorReport.from_json(report)), INFO, status, status_at=1001.0)
    lines = table.splitlines()
    assert re.fullmatch(
        r"cluster 'pod' failed: task 2 \(10\.0\.0\.3\) failed first \(and 1 more\), detected at \d\d:\d\d:\d\d\.250: "
        r"no heartbeat for 5\.1 s \(timeout 5 s\)",
        lines[0],
    )
    assert lines[1].split() == ["#", "TASK", "ADDRESS", "STATE", "LAST", "HEARTBEAT", "CAUSE"]
    assert lines[2].split()[:4] == ["1", "2", "10.0.0.3", "failed"] and lines[2].endswith("(timeout 5 s)")
    assert lines[2].split()[4].endswith(":16:35.000")  # 1001.0 - 6.0 = 995 s
    assert lines[3].split()[:4] == ["2", "1", "10.0.0.2", "failed"] and lines[3].endswith("reported: OOM")
    assert lines[4].split()[:3] == ["0", "10.0.0.1", "connected"] and lines[4].endswith("this host")
    assert len(lines) == 5


def test_table_without_failures_blames_the_coordinator_or_this_agent() -> None:
    unreachable = {"error": "no heartbeat reached the coordinator at 10.0.0.1:8476 for 10.0 s",
                   "error_type": "CoordinatorUnreachable", "failures": [], "detected_at": 5.0}  # fmt: skip
    table = root_cause_table(ClusterDown(ErrorReport.from_json(unreachable)), INFO._replace(task=1), None, 6.0)
    assert table.splitlines()[2].split()[:4] == ["1", "0", "10.0.0.1", "unreachable"]
    assert "its coordinator stopped answering this host" in table
    assert "no heartbeat reached the coordinator at 10.0.0.1:8476 for 10.0 s" in table.splitlines()[0]
    assert all(line.split()[2] == "unknown" for line in table.splitlines()[3:])

    gone = ClusterDown(ErrorReport(), agent_gone="this host's tpuctl agent (pid 77) is gone: closed the connection")
    table = root_cause_table(gone, INFO, None, 6.0)
    assert table.startswith("cluster 'pod': task 0: this host's tpuctl agent (pid 77) is gone: closed the connection")
    assert table.splitlines()[2].split()[:5] == ["1", "0", "10.0.0.1", "agent", "gone"]

    assert "was shut down (tpuctl down --all)" in headline(ClusterDown(ErrorReport(shutdown=True)), INFO)
    assert "this host's agent is stopping (tpuctl down)" in headline(ClusterDown(ErrorReport(stopping=True)), INFO)
