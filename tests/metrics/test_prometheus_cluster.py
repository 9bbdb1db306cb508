"""A real Prometheus server scrapes a simulated cluster: every host's agent and the coordinator (task 0's),
and what its HTTP API answers is what ``tpuctl status --json`` reports, before and after a restart. The
same cluster logs JSON: every line of every agent log parses, with its fields, and the generation follows
the cluster's. A metrics port already taken fails ``init`` naming it, and the JSON log says why on one line.

Real processes on loopback: 4 ``tpuctl init`` (hosts 127.0.0.2-5), Debian's ``prometheus`` on 127.0.0.1
(installed when missing where this user may, else the test is skipped saying why: harness/prometheus.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import wait_until
from harness.clusters import LocalCluster
from harness.prometheus import Prometheus, ensure_prometheus

from tpuctl.sim.cluster import free_port

pytestmark = pytest.mark.slow

STATES = ("waiting", "connected", "failed", "disconnected")
RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
FIELDS = {"ts", "level", "msg", "cluster", "task", "generation", "logger", "pid"}


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    path, why = ensure_prometheus()
    if path is None:
        pytest.skip(why)
    return path


def port_free_on(hosts: list[str]) -> int:
    """A port free on every one of ``hosts`` right now (bounded tries)."""
    for _ in range(20):
        port = free_port(hosts[0])
        try:
            for host in hosts[1:]:
                with socket.socket() as sock:
                    sock.bind((host, port))
        except OSError:
            continue
        return port
    raise AssertionError(f"no port free on all of {hosts}")


def by_task(prom: Prometheus, series: str) -> dict[int, float]:
    """Each agent's ``series``, by the task its ``tpuctl_agent_info`` names."""
    found = prom.values(f"{series} * on(instance) group_left(task) tpuctl_agent_info", by="task")
    return {int(task): value for task, value in found.items()}


def differences(prom: Prometheus, status: dict[str, Any], agents: dict[int, dict[str, Any]], steps: dict[int, int]) -> list[str]:
    """What Prometheus answers that ``status`` (task 0's) and each host's ``agents`` status do not say."""
    counts = Counter(task["state"] for task in status["tasks"])
    expected: dict[str, float] = {f'tpuctl_cluster_hosts{{state="{s}"}}': counts[s] for s in STATES}
    expected |= {
        "tpuctl_cluster_generation": status["generation"],
        "tpuctl_cluster_forming": float(status["forming"]),
        "tpuctl_cluster_restarts_total": len(status["ended"]),
        "tpuctl_heartbeat_age_seconds_gcount": counts["connected"],
        "count(tpuctl_agent_info)": len(status["tasks"]),
        'count(up{job="tpuctl"} == 1)': len(status["tasks"]),
    }
    watchdog = status.get("watchdog")
    expected["tpuctl_watchdog_hosts_reporting"] = watchdog["armed"] if watchdog else 0
    if watchdog:
        expected |= {f'tpuctl_watchdog_step{{quantile="{q}"}}': watchdog["steps"][k] for q, k in (("0", "low"), ("0.5", "median"), ("1", "high"))}
        for rank, host in enumerate(watchdog["slowest"], 1):
            expected[f'tpuctl_furthest_behind_task{{rank="{rank}"}}'] = host["task"]
            expected[f'tpuctl_furthest_behind_step{{rank="{rank}"}}'] = host["step"]
    found = []
    for query, value in expected.items():
        got = prom.values(query)
        if got != {"": value}:
            found.append(f"{query}: Prometheus {got}, status {value}")
    generations = by_task(prom, "tpuctl_agent_generation")
    if generations != {t: a["generation"] for t, a in agents.items()}:
        found.append(f"tpuctl_agent_generation: Prometheus {generations}, each host's status {[a['generation'] for a in agents.values()]}")
    up = by_task(prom, 'tpuctl_agent_state{state="up"}')
    if up != dict.fromkeys(agents, 1.0):
        found.append(f'tpuctl_agent_state{{state="up"}}: {up}')
    reported = by_task(prom, "tpuctl_job_step")
    if reported != {t: float(s) for t, s in steps.items()}:
        found.append(f"tpuctl_job_step: Prometheus {reported}, reported {steps}")
    return found


def wait_to_agree(c: LocalCluster, prom: Prometheus, steps: dict[int, int], timeout: float = 60.0) -> None:
    """Until Prometheus's answers agree with a fresh ``tpuctl status --json`` of every host (it scrapes every
    second); on timeout, the last differences."""
    last: list[str] = []

    def check() -> bool:
        agents = {t: json.loads(c.tpuctl("status", "--json", task=t).out) for t in range(c.num_hosts)}
        last[:] = differences(prom, agents[0], agents, steps)
        return not last

    try:
        wait_until(check, timeout, "Prometheus to agree with tpuctl status", interval=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n" + "\n".join(last) + f"\n{c.logs()}") from None


def json_lines(path: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]  # each parses on its own
    for line in lines:
        assert set(line) >= FIELDS, line
        assert RFC3339_UTC.match(line["ts"]) and line["level"] in ("debug", "info", "warning", "error", "critical"), line
        assert ("cause" in line) == (line["level"] in ("error", "critical")), line
    return lines


def test_prometheus_scrapes_every_agent_and_the_coordinator_and_agrees_with_status(
    make_cluster: Callable[..., LocalCluster], tmp_path: Path, prometheus_binary: str
) -> None:
    extra = "log_format: json\nrestart: {policy: rejoin, timeout: 60s, max: 2}\n"
    c = make_cluster("v4-32", heartbeat_timeout="3s", register_timeout="60s", barrier_timeout="60s", extra=extra)
    port = port_free_on(c.hosts)
    c.spec.write_text(c.spec.read_text() + f"metrics: {{port: {port}}}\n")
    c.up()
    steps = {0: 20, 1: 20, 2: 20, 3: 17}  # task 3 is behind
    for task, step in steps.items():
        assert c.tpuctl("progress", str(step), task=task).code == 0
    wait_until(lambda: (json.loads(c.tpuctl("status", "--json", task=0).out).get("watchdog") or {}).get("armed") == 4,
               30, "every host's report to reach the watchdog", interval=0.2, logs=c.logs)  # fmt: skip
    prom = Prometheus(prometheus_binary, c.processes, tmp_path / "prometheus", [f"{h}:{port}" for h in c.hosts], free_port("127.0.0.1"))
    wait_to_agree(c, prom, steps)
    assert prom.values('tpuctl_furthest_behind_task{rank="1"}') == {"": 3.0}
    assert prom.values('tpuctl_agent_info{task="3"}', by="instance") == {f"{c.hosts[3]}:{port}": 1.0}
    assert prom.values("count(tpuctl_coordinator_info)") == {"": 1.0}  # task 0's endpoint alone

    # a restart: task 3's agent is killed and comes back; the cluster re-forms as generation 2
    os.kill(c.agent_pid(3), signal.SIGKILL)
    c.start_init(3, label="init-again-3")
    assert c.wait_init("init-again-3", 60).code == 0, c.logs()
    wait_until(lambda: json.loads(c.tpuctl("status", "--json", task=0).out)["generation"] == 2, 30, "generation 2", interval=0.2)
    wait_to_agree(c, prom, {})  # the job's steps were generation 1's
    assert prom.values("tpuctl_cluster_restarts_total") == {"": 1.0}

    # the JSON logs of the same cluster: every line parses, with its fields; the generation follows
    for task in range(c.num_hosts):
        lines = json_lines(c.state(task) / "agent.log")
        assert {line["cluster"] for line in lines} == {"test-pod"} and {line["task"] for line in lines} == {task}
        assert (c.state(task) / "agent.out").exists()
    survivor = json_lines(c.state(1) / "agent.log")
    reform = next(i for i, line in enumerate(survivor) if "re-forming as the next generation" in line["msg"])
    assert survivor[reform]["generation"] == 1 and survivor[reform]["level"] == "warning"
    formed = [line for line in survivor if line["msg"] == "task 1: generation 2 formed"]
    assert len(formed) == 1 and formed[0]["generation"] == 2
    assert [line["generation"] for line in survivor] == sorted(line["generation"] for line in survivor)


def test_a_metrics_port_in_use_fails_init_naming_it_and_the_json_log_says_why(make_cluster: Callable[..., LocalCluster]) -> None:
    c = make_cluster("v4-8", extra="log_format: json\n")
    with socket.socket() as taken:
        taken.bind((c.hosts[0], 0))
        taken.listen()
        port = taken.getsockname()[1]
        c.spec.write_text(c.spec.read_text() + f"metrics: {{port: {port}}}\n")
        c.start_init(0)
        done = c.wait_init("init-0", 60)
    message = f"task 0: cannot serve metrics on {c.hosts[0]}:{port}: Address already in use"
    assert done.code == 5 and f"tpuctl: error: {message}" in done.err, done.err
    assert "another process may listen there" in done.err
    errors = [line for line in json_lines(c.state(0) / "agent.log") if line["level"] == "error"]
    assert len(errors) == 1 and errors[0]["cause"] == message
    assert errors[0]["msg"].startswith(f"init failed: {message}\nhint: ")  # a multi-line message, on one line
