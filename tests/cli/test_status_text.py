"""What ``tpuctl status``, ``tpuctl sim status`` and ``tpuctl run``'s root-cause table print, from status
documents (issue 24 items 2-4): every column means something, each cause is printed once, tables keep
their width (cells cut with an ellipsis, the JSON document keeps the whole text), hosts are listed when
the coordinator is gone, and a generation's end is never another generation's cause. Pure: no agent."""

from __future__ import annotations

from typing import Any

from tpuctl.agent.protocol import AgentInfo, ErrorReport, Failure, JobPorts
from tpuctl.cli.light import render_status
from tpuctl.health import FAILED, cluster_health, heartbeat_text
from tpuctl.job.rootcause import ClusterDown, headline, root_cause_table
from tpuctl.messages import CELL_CHARS, ELLIPSIS, cell, table
from tpuctl.sim.status import render

LONG = (
    "coordinator at 127.0.0.2:8476 unreachable/frozen: no heartbeat confirmed for 3.1 s (heartbeat timeout 3 s): "
    "coordinator unreachable at 127.0.0.2:8476: failed to connect to all addresses; last error: UNKNOWN: "
    "ipv4:127.0.0.2:8476: Failed to connect to remote host: Connection refused"
)


def doc(tasks: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"cluster": "pod", "task": 1, "coordinator": "127.0.0.2:8476", "service_incarnation": "77",
            "heartbeat_timeout": 3.0, "tasks": tasks, **extra}  # fmt: skip


def row(task: int, state: str = "connected", **extra: Any) -> dict[str, Any]:
    return {"task": task, "address": f"127.0.0.{task + 2}", "state": state, "fingerprint": f"{task:08x}",
            "heartbeat_age": 1.0, "session_open": True, "cause": None, **extra}  # fmt: skip


def host_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line[:1].isdigit()]


def test_the_host_table_shows_the_fingerprint_and_what_the_heartbeat_age_is() -> None:
    text = render_status(doc([row(0), row(1, session_open=False, heartbeat_age=2.34), row(2, "waiting",
                                                                                         heartbeat_age=None)]))  # fmt: skip
    header = next(line for line in text.splitlines() if line.startswith("TASK"))
    assert header.split() == ["TASK", "STATE", "ADDRESS", "FINGERPRINT", "HEARTBEAT"]  # no INCARNATION: never known
    rows = [line.split() for line in host_rows(text)]
    assert rows[0][3:] == ["00000000", "<1.0s", "ago"]  # an open session: the keepalive bound, not "0.0s ago"
    assert rows[1][3:] == ["00000001", "2.3s", "ago"]  # a measured age
    assert rows[2][4:] == ["-"]
    assert heartbeat_text({"heartbeat_age": 0.0, "session_open": False}) == "0.0s ago"
    assert heartbeat_text({}) == "-"


def test_each_cause_is_printed_once_and_rows_keep_their_width() -> None:
    failed = doc([row(0, "failed", cause=LONG), row(1)], error=f"task 0 (127.0.0.2) failed: {LONG}")
    text = render_status(failed)
    assert text.count(LONG) == 1  # the health line has the whole cause, once
    assert "cluster error" not in text
    assert all(len(line) < 80 for line in host_rows(text)), text
    verdict = cluster_health(failed)
    assert verdict.verdict == FAILED
    assert verdict.verdict_line("pod") == "cluster 'pod' is not healthy: failed (1 problem, under health above)"


def test_re_forming_is_said_once() -> None:
    text = render_status(doc([row(0), row(1)], generation=1, rejoining="generation 1 ended: task 2 left"))
    assert text.count("generation 1 ended: task 2 left") == 1, text


def test_with_the_coordinator_gone_every_host_is_listed_and_task_0_is_named_once() -> None:
    tasks = [row(0, "unreachable", cause=LONG, fingerprint=None, heartbeat_age=None, session_open=False),
             row(1, "unknown", fingerprint=None, heartbeat_age=None, session_open=False)]  # fmt: skip
    gone = doc(tasks, error=LONG, service_incarnation=None)
    health = cluster_health(gone)
    assert [str(p) for p in health.problems] == [f"task 0 (127.0.0.2) failed: {LONG}"]
    text = render_status(gone, health)
    assert [line.split()[:3] for line in host_rows(text)] == [["0", "unreachable", "127.0.0.2"],
                                                               ["1", "unknown", "127.0.0.3"]]  # fmt: skip
    assert text.count("Connection refused") == 1, text
    # re-forming (not final): the unknown rows are no problem, nor is the coordinator's (the line says it)
    forming = doc(tasks, coordinator_unreachable=LONG, rejoining="generation 1 ended: x", service_incarnation=None)
    assert [p.state for p in cluster_health(forming).problems] == ["re-forming"]


def test_sim_status_keeps_the_cause_out_of_the_state_column() -> None:
    tasks = [
        {"task": 0, "state_dir": "/r/host-0", "address": "127.0.0.2", "agent_pid": None, "agent": "stopped",
         "state": "unreachable", "heartbeat_age": None, "session_open": False, "cause": LONG},
        {"task": 1, "state_dir": "/r/host-1", "address": "127.0.0.3", "agent_pid": 7, "agent": "running",
         "state": "unknown", "heartbeat_age": None, "session_open": False, "cause": None},
    ]  # fmt: skip
    problem = "task 0 (127.0.0.2) failed: its agent is not running"
    text = render({"root": "/r", "cluster": "pod", "accelerator": "v4-16", "coordinator": "127.0.0.2:8476",
                   "asked_task": 1, "healthy": False, "error": LONG, "num_hosts": 2, "tasks": tasks,
                   "health": {"verdict": "failed", "problems": [{"task": 0, "address": "127.0.0.2",
                                                                 "state": "stopped", "problem": problem}]}})  # fmt: skip
    assert all(len(line) < 80 for line in host_rows(text)), text
    assert "(?)" not in text and text.count(problem) == 1 and LONG not in text, text


def test_cells_are_cut_with_an_ellipsis() -> None:
    assert cell("a  b\nc", 10) == "a b c"
    assert cell("x" * 100, 10) == "x" * 9 + ELLIPSIS and len(cell("x" * 100, 10)) == 10
    lines = table([("A", "B", "C"), ("1", "y" * 100, "z" * 100)], widths=(None, 20, None))
    assert lines[1] == "1  " + "y" * 19 + ELLIPSIS + "  " + "z" * 100
    assert max(len(line) for line in table([("A",), ("q" * 500,)], widths=CELL_CHARS)) == CELL_CHARS
    assert table([("A", "B"), ("1", "w" * 100)]) == ["A  B", "1  " + "w" * 100]  # no widths: nothing cut


INFO = AgentInfo(cluster="pod", task=0, num_tasks=3, coordinator="10.0.0.1:8476", mapping="/m.json",
                 job_ports=JobPorts(dtensor=(9100, 9100, 9100), jax=9101, torch=9102), address="10.0.0.1",
                 hosts=("10.0.0.1", "10.0.0.2", "10.0.0.3"), pid=77)  # fmt: skip
HISTORY = (
    {"generation": 1, "formed": 100.0, "ended": 160.5, "cause": "task 2 (10.0.0.3) failed: no heartbeat for 5.2 s"},
    {"generation": 2, "formed": 170.0, "ended": None, "cause": None},
)


def test_a_shutdown_in_generation_2_is_the_shutdown_and_generation_1_is_history() -> None:
    report = ErrorReport(shutdown=True, generation=2, history=HISTORY)
    table_text = root_cause_table(ClusterDown(report), INFO, None, 200.0)
    first, *rest = table_text.splitlines()
    assert "was shut down (tpuctl down --all) in generation 2" in first and "failed" not in first
    history = "\n".join(rest[rest.index("  previous generations (history, not this generation's cause):") :])
    assert "generation 1 (formed " in history and "no heartbeat for 5.2 s" in history
    assert "generation 2 (" not in history  # the generation the job ran in is not history


def test_a_failure_names_its_generation_and_an_ended_one_says_it_ended() -> None:
    failed = Failure(task=1, address="10.0.0.2", cause="reported an error: OOM")
    final = headline(ClusterDown(ErrorReport(error="x", failures=(failed,), generation=2, history=HISTORY)), INFO)
    assert final.startswith("cluster 'pod' failed in generation 2: task 1 (10.0.0.2) failed first")
    ended = headline(ClusterDown(ErrorReport(failures=(failed,), generation=2, rejoining=True)), INFO)
    assert ended.startswith("cluster 'pod': generation 2 ended: task 1 (10.0.0.2) failed first")
    first_generation = headline(ClusterDown(ErrorReport(error="x", failures=(failed,), generation=1)), INFO)
    assert first_generation.startswith("cluster 'pod' failed: task 1")  # one generation: nothing to tell apart


def test_a_cut_cell_on_a_terminal_that_is_not_utf8_prints_instead_of_crashing(tmp_path) -> None:
    import os
    import subprocess
    import sys

    script = (
        "import sys\nfrom tpuctl.cli import main\ntry:\n    main(['status', '--state-dir', sys.argv[1]])\n"
        "except SystemExit:\n    pass\nsys.stdout.write('TASK  ' + sys.argv[2] + '\\n')\n"
    )
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "none"), cell("x" * 80, 10)],
                          capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "TASK  " + "x" * 9 + "?\n"


def test_an_error_no_health_line_says_is_still_printed_once() -> None:
    # this host's agent gave up on the coordinator, which now answers and names another host failed
    mine = "coordinator at 127.0.0.2:8476 unreachable/frozen: no heartbeat confirmed for 3.1 s"
    text = render_status(doc([row(0), row(1), row(2, "failed", cause="reported an error: OOM")], error=mine))
    assert text.count(mine) == 1 and text.count("reported an error: OOM") == 1, text


def test_roles_ranks_the_plan_and_the_spares_when_the_service_sends_them() -> None:
    """Spares and policy elastic (issue 26): a ROLE and RANK column, the plan, and a spares section; a
    document without them (an older service) renders as before."""
    tasks = [row(0, role="member", rank=0), row(1, role="standby", rank=None), row(2, role="member", rank=1)]
    text = render_status(
        doc(
            tasks,
            plan={"slices": 2, "runs": [[0, 1], [2, 1]], "description": "roster slices 0, 2"},
            spares=[
                {
                    "roster_slice": 1,
                    "tasks": [1, 1],
                    "spare": False,
                    "registered": 1,
                    "ready": True,
                    "can_replace": "any slice",
                },
                {
                    "roster_slice": 3,
                    "tasks": [6, 7],
                    "spare": True,
                    "registered": 1,
                    "ready": False,
                    "can_replace": None,
                },
            ],
        )
    )
    header = next(line for line in text.splitlines() if line.startswith("TASK"))
    assert header.split() == ["TASK", "STATE", "ADDRESS", "FINGERPRINT", "HEARTBEAT", "ROLE", "RANK"]
    assert [line.split()[-2:] for line in host_rows(text)] == [["member", "0"], ["standby", "-"], ["member", "1"]]
    assert "plan         2 slices: roster slices 0, 2" in text.splitlines()
    assert text.splitlines()[-3:] == [
        "spares",
        "  roster slice 1 (task 1): 1 of 1 hosts standing by; can replace any slice",
        "  spare slice 3 (tasks 6-7): 1 of 2 hosts standing by; not ready (every host of it must stand by)",
    ]
    plain = render_status(doc([row(0), row(1)]))
    assert "ROLE" not in plain and "spares" not in plain and "plan " not in plain
