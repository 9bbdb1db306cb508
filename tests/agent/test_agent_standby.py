"""A standby host's agent and its local commands: ``tpuctl status``, ``env``, ``barrier``, ``run`` and ``down``.

A host registered into a generation without being one of its members (a spare, or a host of a slice the
generation left out) stands by: its agent serves local commands with a standby description. Nothing is faked:
a spec of 3 one-host slices (v4-8, ``num_slices: 3``) and one spare host (task 3), restart policy rejoin; four
agents on loopback in this process (task 0 with the service, tasks 1 and 2, the spare) and the commands as real
``tpuctl`` processes on the spare's state dir. When task 1 leaves, generation 1 ends, the spare slice takes
slice 1's place in generation 2, and ``tpuctl run``, waiting on the spare, starts the job with generation 2's
environment (rank 1, task 3); 2 of the 3 hosts survived, a majority.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness.recorder import Recorder

from tpuctl.agent.bringup import Agent
from tpuctl.agent.control import Op, call
from tpuctl.agent.options import AgentOptions
from tpuctl.agent.protocol import AgentInfo, ErrorReport
from tpuctl.agent.statedir import StateDir
from tpuctl.errors import EXIT_CLUSTER, StandbyError
from tpuctl.sim.cluster import free_port, loopback_hosts
from tpuctl.spec.model import ClusterSpec
from tpuctl.spec.yamlfile import load_spec_text

pytestmark = pytest.mark.slow  # real `tpuctl` processes against in-process agents
DEADLINE_S = 60.0



def spec_of(tmp_path: Path, restart_timeout: str = "1m") -> tuple[ClusterSpec, list[str]]:
    hosts = loopback_hosts(4)
    text = f"""cluster: standby
accelerator: v4-8
num_slices: 3
backend: sim
hosts: [{hosts[0]}, {hosts[1]}, {hosts[2]}]
spares: [{hosts[3]}]
coordinator: {{port: {free_port(hosts[0])}, heartbeat_interval: 1s, heartbeat_timeout: 5s, register_timeout: 1m}}
barrier_timeout: 1m
restart: {{policy: rejoin, timeout: {restart_timeout}}}
output: {tmp_path / "mapping.json"}
"""
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return load_spec_text(text, str(path)), hosts


def agent(spec: ClusterSpec, tmp_path: Path, task: int, name: str, address: str) -> tuple[Agent, Recorder]:
    recorder = Recorder()
    folder = tmp_path / name
    options = AgentOptions(spec=spec, task=task, state=StateDir(folder), output=folder / "mapping.json",
                           address=address, config_path=str(tmp_path / "cluster.yaml"))  # fmt: skip
    return Agent(options, recorder), recorder


async def standby_cluster(
    tmp_path: Path, restart_timeout: str = "1m"
) -> tuple[list[Agent], list[asyncio.Task[int]], Recorder]:
    """Tasks 0, 1 and 2 form generation 1; the spare, task 3 (state dir ``spare``), stands by."""
    spec, hosts = spec_of(tmp_path, restart_timeout)
    members = [agent(spec, tmp_path, task, f"host-{task}", hosts[task]) for task in range(3)]
    spare, recorder = agent(spec, tmp_path, 3, "spare", hosts[3])
    runs = [asyncio.create_task(a.run()) for a, _ in [*members, (spare, recorder)]]
    outcomes = await asyncio.wait_for(asyncio.gather(*(r.outcome for _, r in members)), DEADLINE_S)
    assert all(isinstance(o, dict) for o in outcomes), outcomes
    summary = await asyncio.wait_for(recorder.outcome, DEADLINE_S)
    assert isinstance(summary, dict) and summary.get("role") == "standby", summary
    return [*(a for a, _ in members), spare], runs, recorder


async def stop_all(agents: list[Agent], runs: list[asyncio.Task[int]]) -> list[int]:
    for a in reversed(agents):
        a.stop.set()
        a.notify()
    return list(await asyncio.wait_for(asyncio.gather(*runs, return_exceptions=True), DEADLINE_S))  # type: ignore[arg-type]


async def tpuctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "tpuctl", *args], capture_output=True, text=True, timeout=DEADLINE_S,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_a_standby_agent_serves_status_and_refuses_env_and_barrier_naming_why(tmp_path: Path) -> None:
    async def scenario() -> None:
        agents, runs, recorder = await standby_cluster(tmp_path)
        state = StateDir(tmp_path / "spare")
        try:
            assert any("standing by in generation 1" in line for line in recorder.lines), recorder.lines
            info = state.read_info()  # agent.json: role standby, its task, the cluster, the generation
            assert (info.role, info.task, info.cluster, info.generation, info.rank) == (
                "standby",
                3,
                "standby",
                1,
                None,
            )
            assert AgentInfo.from_json(await asyncio.to_thread(call, state, Op.INFO, timeout=10)) == info
            report = ErrorReport.from_json(
                await asyncio.to_thread(call, state, Op.WAIT_ERROR, {"timeout": 0}, timeout=10)
            )
            assert report.standby and not report.formed and not report.down

            status = await tpuctl("status", "--state-dir", str(state.path))
            assert status.returncode == 0, status.stderr
            assert "(this host: task 3, standing by in generation 1" in status.stdout, status.stdout

            env = await tpuctl("env", "--state-dir", str(state.path))
            assert env.returncode == EXIT_CLUSTER and env.stdout == "", (env.returncode, env.stdout)
            assert "task 3 (127.0.0.5) is a spare standing by in generation 1; it has no " \
                   "job environment until it takes a place" in env.stderr, env.stderr  # fmt: skip

            barrier = await tpuctl("barrier", "step", "--state-dir", str(state.path))
            assert barrier.returncode == EXIT_CLUSTER, barrier.stderr
            assert "barrier 'step': task 3 (127.0.0.5) is a spare standing by" in barrier.stderr
            with pytest.raises(StandbyError):  # the error's own class crosses the control socket
                await asyncio.to_thread(call, state, Op.ENV, timeout=10)
        finally:
            codes = await stop_all(agents, runs)
        assert codes == [0, 0, 0, 0], codes

    asyncio.run(scenario())


def test_tpuctl_down_stops_a_standby_agent_over_its_control_socket_and_the_members_stay(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        agents, runs, _ = await standby_cluster(tmp_path)
        try:
            caplog.set_level(logging.INFO, logger="tpuctl.agent.bringup")
            caplog.clear()
            down = await tpuctl("down", "--state-dir", str(tmp_path / "spare"))
            assert down.returncode == 0, down.stderr
            # the command, not the SIGTERM `tpuctl down` falls back on for an agent that takes no command (here:
            # this test's process, every agent's pid)
            assert not [r for r in caplog.records if "received SIGTERM" in r.getMessage()]
            assert await asyncio.wait_for(runs[3], DEADLINE_S) == 0
            assert StateDir(tmp_path / "spare").live_pid() is None
            status = await tpuctl("status", "--state-dir", str(tmp_path / "host-1"))
            assert status.returncode == 0, status.stdout + status.stderr  # the members' cluster is untouched
        finally:
            await stop_all(agents[:3], runs[:3])

    asyncio.run(scenario())


def test_tpuctl_run_on_a_standby_host_waits_then_starts_the_job_in_the_generation_that_takes_it_in(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        agents, runs, _ = await standby_cluster(tmp_path)
        job = "echo generation=$TPUCTL_GENERATION task=$TPUCTL_TASK_ID rank=$TPUCTL_RANK"
        try:
            run = await asyncio.to_thread(
                subprocess.Popen, [sys.executable, "-m", "tpuctl", "run", "--state-dir", str(tmp_path / "spare"), "--",
                                   "sh", "-c", job], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                await asyncio.sleep(3.0)  # it waits: no job while the host stands by
                assert run.poll() is None
                agents[1].stop.set()  # task 1 leaves (as `tpuctl down` on its host): generation 1 ends
                agents[1].notify()
                assert await asyncio.wait_for(runs[1], DEADLINE_S) == 0
                out, err = await asyncio.to_thread(run.communicate, timeout=DEADLINE_S)
            finally:
                if run.poll() is None:
                    run.send_signal(signal.SIGKILL)
                    run.wait()
            assert run.returncode == 0, err
            assert "tpuctl: standing by: task 3 is not a member of generation 1" in err, err
            assert "task 3 took a place in generation 2; starting the job" in err, err
            assert out == "generation=2 task=3 rank=1\n"  # the spare slice in slice 1's place
            assert agents[3].description.role == "member" and agents[3].generation == 2
        finally:
            codes = await stop_all([agents[0], agents[2], agents[3]], [runs[0], runs[2], runs[3]])
        assert codes == [0, 0, 0], codes

    asyncio.run(scenario())


def test_tpuctl_run_on_a_standby_host_waits_at_most_the_restart_timeout_and_a_signal_ends_the_wait(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        agents, runs, _ = await standby_cluster(tmp_path, restart_timeout="2s")
        state = str(tmp_path / "spare")
        try:
            timed_out = await tpuctl("run", "--state-dir", state, "--", "true")
            assert timed_out.returncode == 4, timed_out.stderr  # EXIT_DEADLINE: no generation took it in
            assert "task 3 stood by for 2 s (restart.timeout) and no generation took it in; the job was not " \
                   "started" in timed_out.stderr, timed_out.stderr  # fmt: skip

            run = await asyncio.to_thread(
                subprocess.Popen, [sys.executable, "-m", "tpuctl", "run", "--state-dir", state, "--", "true"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                assert run.stderr is not None
                first = await asyncio.wait_for(asyncio.to_thread(run.stderr.readline), DEADLINE_S)
                assert first.startswith("tpuctl: standing by: task 3"), first  # its handlers are in place by now
                run.send_signal(signal.SIGTERM)
                _, err = await asyncio.to_thread(run.communicate, timeout=DEADLINE_S)
            finally:
                if run.poll() is None:
                    run.kill()
                    run.wait()
            assert run.returncode == 128 + signal.SIGTERM, err
            assert "stopped by SIGTERM while this host stood by; the job was not started" in err, err
        finally:
            codes = await stop_all(agents, runs)
        assert codes == [0, 0, 0, 0], codes

    asyncio.run(scenario())
