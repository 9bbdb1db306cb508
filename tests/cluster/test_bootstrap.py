"""Whole clusters of real ``tpuctl`` processes on 127.0.0.x: the bootstrap end to end."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time

import pytest
from harness import TPUCTL, alive, wait_until

from tpuctl.mapping.file import read_mapping

pytestmark = pytest.mark.slow


def test_four_hosts_write_identical_mappings_and_pass_repeated_barriers(make_cluster) -> None:
    c = make_cluster("v4-32")
    results = c.up()
    for task, r in enumerate(results):
        assert f"tpuctl: cluster 'test-pod' up: task {task} of 4, v4-32 (2x2x4)" in r.out
    first = c.mapping(0).read_bytes()
    assert all(c.mapping(t).read_bytes() == first for t in range(4))
    mapping = read_mapping(str(c.mapping(2)))
    assert [d.id for d in mapping.devices_of_task(2)] == [8, 9, 10, 11]
    assert [t.address for t in mapping.tasks] == c.hosts
    shown = c.tpuctl("topology", "show", "--mapping", str(c.mapping(1)))
    assert shown.code == 0 and "3     127.0.0.5  0      12 13 14 15" in shown.out

    for round_ in range(1, 6):  # a shell loop calling `tpuctl barrier step` on every host
        procs = [c.spawn("barrier", "step", task=t) for t in range(4)]
        outs = c.processes.wait_all(procs, timeout=60)
        assert [p.code for p in outs] == [0, 0, 0, 0], outs
        assert all(f"barrier 'step' #{round_} passed (4 hosts)" in p.err for p in outs)

    status = c.tpuctl("status", "--json", task=3)
    assert status.code == 0
    doc = json.loads(status.out)
    assert [t["state"] for t in doc["tasks"]] == ["connected"] * 4
    assert doc["error"] is None


def test_barrier_timeout_names_every_missing_host(make_cluster) -> None:
    c = make_cluster("v4-32")
    c.up()
    r = c.tpuctl("barrier", "lonely", "--timeout", "1500ms", task=1)
    assert r.code == 4
    assert (
        "barrier 'lonely' #1 timed out after 1.5 s: 1 of 4 hosts arrived; "
        "missing: task 0 (127.0.0.2), task 2 (127.0.0.4), task 3 (127.0.0.5)" in r.err
    )
    assert "Traceback" not in r.err


def test_init_again_on_a_host_that_is_up_is_refused(make_cluster) -> None:
    c = make_cluster("v4-16")
    c.up()
    c.start_init(1, label="again")
    r = c.wait_init("again")
    assert r.code == 5
    assert "this host is already up: a tpuctl agent" in r.err
    assert "cluster 'test-pod' as task 1" in r.err


def test_registration_timeout_lists_all_missing_hosts(make_cluster) -> None:
    c = make_cluster("v4-32", register_timeout="2s")
    c.start_init(0)
    c.start_init(2)
    r0, r2 = c.wait_init("init-0"), c.wait_init("init-2")
    for r in (r0, r2):
        assert r.code == 4, c.logs()
        assert "task 1 (127.0.0.3), task 3 (127.0.0.5)" in r.err
    assert "waiting for" in r0.err  # progress named the missing hosts while it waited


def test_wrong_cluster_name_is_rejected(make_cluster) -> None:
    c = make_cluster("v4-16", register_timeout="5s")
    other = c.root / "other.yaml"
    other.write_text(c.spec.read_text().replace("cluster: test-pod", "cluster: pod-b"))
    c.start_init(0)
    c.start_init(1, spec=other, label="intruder")
    r = c.wait_init("intruder")
    assert r.code == 3, c.logs()
    assert "pod-b" in r.err and "test-pod" in r.err


def test_duplicate_task_id_is_rejected(make_cluster) -> None:
    c = make_cluster("v4-16", register_timeout="5s")
    c.start_init(0)
    c.start_init(1)
    c.wait_for_log(1, "registered with")
    c.start_init(1, state=c.root / "dup-1", label="dup")
    r = c.wait_init("dup")
    assert r.code == 3, c.logs()
    assert "task 1 is already registered by another live process" in r.err


def test_port_in_use_is_refused_naming_it(make_cluster) -> None:
    c = make_cluster("v4-8")
    with socket.socket() as holder:
        holder.bind((c.hosts[0], c.port))
        holder.listen()
        c.start_init(0)
        r = c.wait_init("init-0")
    assert r.code == 5
    assert f"{c.hosts[0]}:{c.port} is already in use" in r.err


def test_worker_killed_during_init_fails_the_others_naming_it(make_cluster) -> None:
    c = make_cluster("v4-32", heartbeat_timeout="2s")
    for task in range(3):
        c.start_init(task)
    c.start_init(3, env={"TPUCTL_SIM_INIT_DELAY": "60"})
    c.wait_for_log(3, "simulated TPU runtime starting")
    os.kill(c.agent_pid(3), signal.SIGKILL)
    killed = time.monotonic()
    for task in range(3):
        r = c.wait_init(f"init-{task}", timeout=30)
        assert r.code == 3, c.logs()
        assert "task 3 (127.0.0.5) failed: no heartbeat" in r.err
    assert time.monotonic() - killed < 2.0 + 5.0


def test_worker_killed_in_steady_state_fails_barriers_at_once(make_cluster) -> None:
    c = make_cluster("v4-32", heartbeat_timeout="2s")
    c.up()
    waiting = c.spawn("barrier", "step", task=0)  # parked, waiting for the others
    os.kill(c.agent_pid(2), signal.SIGKILL)
    killed = time.monotonic()
    done = c.processes.wait(waiting, timeout=30)
    err = done.err
    assert done.code == 3
    assert "task 2 (127.0.0.4) failed: no heartbeat" in err
    assert time.monotonic() - killed < 2.0 + 3.0
    later = c.tpuctl("barrier", "after", task=1)
    assert later.code == 3 and "task 2 (127.0.0.4) failed" in later.err
    status = c.tpuctl("status", "--json", task=3)
    assert status.code == 3
    assert json.loads(status.out)["tasks"][2]["state"] == "failed"


def test_coordinator_killed_clients_say_unreachable(make_cluster) -> None:
    c = make_cluster("v4-16", heartbeat_timeout="2s")
    c.up()
    os.kill(c.agent_pid(0), signal.SIGKILL)
    r = c.tpuctl("barrier", "after", "--timeout", "10s", task=1)
    assert r.code == 3
    assert "coordinator unreachable at 127.0.0.2" in r.err


def test_down_all_stops_every_agent(make_cluster) -> None:
    c = make_cluster("v4-32")
    c.up()
    pids = [c.agent_pid(t) for t in range(4)]
    r = c.tpuctl("down", "--all", task=2)
    assert r.code == 0 and "cluster shut down" in r.err
    wait_until(lambda: not any(alive(p) for p in pids), 15, "every agent to stop", logs=c.logs)
    assert not any(alive(p) for p in pids)


def test_sixteen_hosts_come_up_with_identical_mappings(make_cluster) -> None:
    c = make_cluster("v4-128", heartbeat="1s", heartbeat_timeout="10s")
    c.up(timeout=120)
    digest = c.mapping(0).read_bytes()
    assert all(c.mapping(t).read_bytes() == digest for t in range(16))
    procs = [c.spawn("barrier", "all16", task=t) for t in range(16)]
    assert [p.code for p in c.processes.wait_all(procs, timeout=60)] == [0] * 16


def test_shared_token_cluster_comes_up_and_refuses_strangers(make_cluster, tmp_path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    token.chmod(0o600)
    c = make_cluster("v4-16", extra=f"auth: {{token_file: {token}}}\n")
    c.up()
    assert c.tpuctl("barrier", "authed", "--timeout", "1s", task=0).code == 4  # reached the service, alone

    import asyncio

    from tpuctl.coordination.client import CoordinationClient
    from tpuctl.errors import TpuctlError

    async def stranger() -> str:
        async with CoordinationClient(f"{c.hosts[0]}:{c.port}", token="wrong") as client:
            try:
                await client.status()
            except TpuctlError as exc:
                return exc.message
        return "accepted"

    assert "token" in asyncio.run(stranger()).lower()
    token.chmod(0o644)
    r = c.tpuctl("init", "--config", str(c.spec), "--task-id", "1", "--state-dir", str(c.root / "late"))
    assert r.code == 2 and "chmod 600" in r.err


def start_foreground_init(c, *options: str):
    state = c.state(0)
    return c.start("init-foreground", [*TPUCTL, "init", "--config", str(c.spec), "--task-id", "0", "--foreground",
                                       *options, "--state-dir", str(state), "--out", str(state / "mapping.json")])  # fmt: skip


def test_foreground_init_stays_attached_until_down(make_cluster) -> None:
    c = make_cluster("v4-8")
    proc = start_foreground_init(c)
    out = c.processes.wait_for_output(proc, "\n", stream="out", timeout=60)  # the summary, once the cluster is up
    line = out.splitlines(keepends=True)[0]
    assert "tpuctl: cluster 'test-pod' up: task 0 of 1" in line
    assert proc.poll() is None  # still attached
    assert c.tpuctl("barrier", "solo", task=0).code == 0
    assert c.tpuctl("down", task=0).code == 0
    assert c.processes.wait(proc, timeout=15).code == 0


def test_a_host_arriving_later_than_the_heartbeat_timeout_still_joins(make_cluster) -> None:
    # Hosts waiting for a late one keep heartbeating: waiting is not silence.
    c = make_cluster("v4-32", heartbeat_timeout="1500ms")
    for task in range(3):
        c.start_init(task)
    c.wait_for_log(2, "registered with")
    # the others go on waiting (and heartbeating) for longer than the heartbeat timeout: registration reports
    # the missing host every 2 s, so its third report comes at least 4 s (2.7 timeouts) after everyone else is in
    c.processes.wait_for_output("init-0", "for 1 of 4 hosts: task 3 (127.0.0.5)", count=3, timeout=30)
    c.start_init(3)
    results = [c.wait_init(f"init-{t}", timeout=60) for t in range(4)]
    assert [r.code for r in results] == [0, 0, 0, 0], c.logs()
    assert re.search(
        r"waiting \d+ s for 1 of 4 hosts: task 3 \(127\.0\.0\.5\) \(registration times out in \d+ s\)", results[0].err
    )


def test_a_waiting_barrier_names_the_missing_hosts_in_status_and_progress(make_cluster) -> None:
    c = make_cluster("v4-32")
    c.up()
    waiting = [c.spawn("barrier", "step", "--timeout", "60s", task=t) for t in range(3)]

    def three_arrived() -> dict[str, object]:
        doc: dict[str, object] = json.loads(c.tpuctl("status", "--json", task=1).out)
        return doc if doc["barriers"] and doc["barriers"][0]["arrived"] == [0, 1, 2] else {}  # type: ignore[index]

    doc = wait_until(three_arrived, 20, "tasks 0, 1 and 2 at barrier 'step'", interval=0.1, logs=c.logs)
    assert doc["barriers"] == [
        {
            "name": "step",
            "instance": 1,
            "arrived": [0, 1, 2],
            "missing": [3],
            "seconds_left": doc["barriers"][0]["seconds_left"],
        }  # type: ignore[index]
    ]
    text = c.tpuctl("status", task=0).out
    assert "barrier 'step' #1: waiting for task(s) 3 (3 arrived" in text
    for proc in waiting:  # the barrier command says who it waits for every 5 s
        c.processes.wait_for_output(proc, "waiting at barrier 'step' #1 for 5 s", timeout=20)
    assert c.tpuctl("barrier", "step", task=3).code == 0
    finished = c.processes.wait_all(waiting, timeout=30)
    errs = [f.err for f in finished]
    assert all(f.code == 0 for f in finished), errs
    assert all(
        "waiting at barrier 'step' #1 for 5 s: 3 of 4 hosts arrived; missing: task 3 (127.0.0.5)" in err for err in errs
    ), errs


def test_job_ports_come_from_the_configured_range_and_never_collide(make_cluster) -> None:
    from tpuctl.sim.cluster import free_port

    first = free_port("127.0.0.1")
    first = min(first, 65000)
    c = make_cluster("v4-32", job_ports=f"{first}-{first + 40}")
    c.up()
    env = [json.loads(c.tpuctl("env", "--format", "json", task=t).out)["set"] for t in range(4)]
    jobs = env[0]["DTENSOR_JOBS"].split(",")
    ports = [int(job.rsplit(":", 1)[1]) for job in jobs]
    jax_port = int(env[0]["JAX_COORDINATOR_ADDRESS"].rsplit(":", 1)[1])
    assert len(set([*ports, jax_port])) == 5  # hosts sharing this machine got distinct ports
    assert all(first <= p <= first + 40 for p in [*ports, jax_port])
    assert all(e["DTENSOR_JOBS"] == env[0]["DTENSOR_JOBS"] for e in env)


def test_foreground_init_honours_json(make_cluster) -> None:
    c = make_cluster("v4-8")
    proc = start_foreground_init(c, "--json")
    out = c.processes.wait_for_output(proc, "\n}\n", stream="out", timeout=60)  # the summary, once the cluster is up
    summary = json.loads(out[: out.index("\n}\n") + 3])
    assert (summary["cluster"], summary["task"], summary["num_hosts"]) == ("test-pod", 0, 1)
    assert c.tpuctl("down", task=0).code == 0
    assert c.processes.wait(proc, timeout=15).code == 0
