"""Agents in one process: the bring-up use case over a real gRPC service on loopback, without forking.

Each ``Agent`` is what ``tpuctl init`` runs on one host; here four of them share one event loop, each
with its own state dir and mapping file, so the whole bring-up (registration, the core-ID gather,
the mapping, the final barrier, the control socket) is tested in-process, where a failure points at
one line of the agent rather than at a child process's log.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from harness.recorder import Recorder

from tpuctl.agent.bringup import Agent
from tpuctl.agent.control import Op, call
from tpuctl.agent.options import AgentOptions
from tpuctl.agent.protocol import AgentInfo, BarrierPassed, ErrorReport
from tpuctl.agent.statedir import StateDir
from tpuctl.errors import ClusterError, TpuctlError
from tpuctl.job.env import JobEnv
from tpuctl.sim.cluster import free_port, loopback_hosts, sim_spec_text
from tpuctl.spec.yamlfile import load_spec_text

HOSTS = 4
DEADLINE_S = 60.0



async def start_cluster(tmp_path: Path) -> tuple[list[Agent], list[Recorder], list[asyncio.Task[int]]]:
    hosts = loopback_hosts(HOSTS)
    spec = load_spec_text(sim_spec_text("v4-32", hosts, free_port(hosts[0]), tmp_path))
    agents, recorders, runs = [], [], []
    for task in range(HOSTS):
        recorder = Recorder()
        options = AgentOptions(
            spec=spec,
            task=task,
            state=StateDir(tmp_path / f"host-{task}"),
            output=tmp_path / f"host-{task}" / "mapping.json",
            address=hosts[task],
        )
        agent = Agent(options, recorder)
        agents.append(agent)
        recorders.append(recorder)
        runs.append(asyncio.create_task(agent.run()))
    return agents, recorders, runs


async def stop_cluster(agents: list[Agent], runs: list[asyncio.Task[int]]) -> list[int]:
    for agent in reversed(agents):  # task 0 (the service) last
        agent.stop.set()
        agent.changed.set()
    return list(await asyncio.wait_for(asyncio.gather(*runs), DEADLINE_S))


def test_four_agents_bring_the_cluster_up_and_answer_local_commands(tmp_path: Path) -> None:
    async def scenario() -> None:
        agents, recorders, runs = await start_cluster(tmp_path)
        try:
            outcomes = await asyncio.wait_for(asyncio.gather(*(r.outcome for r in recorders)), DEADLINE_S)
            assert all(isinstance(o, dict) for o in outcomes), outcomes
            assert [o["task"] for o in outcomes] == list(range(HOSTS))  # type: ignore[index]
            files = {(tmp_path / f"host-{t}" / "mapping.json").read_bytes() for t in range(HOSTS)}
            assert len(files) == 1  # byte-identical on every host

            state = StateDir(tmp_path / "host-2")
            info = AgentInfo.from_json(await asyncio.to_thread(call, state, Op.INFO, timeout=10))
            assert (info.task, info.num_tasks, len(set(info.job_ports.dtensor))) == (2, HOSTS, HOSTS)
            assert state.read_info() == info

            env = JobEnv.from_message(await asyncio.to_thread(call, state, Op.ENV, timeout=10))
            assert env.set["TPUCTL_TASK_ID"] == "2" and env.set["DTENSOR_JOBS"].count(",") == HOSTS - 1

            # every host at a user barrier, through the control socket as `tpuctl barrier` does it
            passed = await asyncio.wait_for(
                asyncio.gather(*(
                    asyncio.to_thread(call, StateDir(tmp_path / f"host-{t}"), Op.BARRIER, {"name": "step"}, timeout=30)
                    for t in range(HOSTS)
                )),
                DEADLINE_S,
            )  # fmt: skip
            assert {BarrierPassed.from_json(p) for p in passed} == {BarrierPassed(name="step", instance=1, hosts=HOSTS)}

            report = ErrorReport.from_json(await asyncio.to_thread(call, state, Op.WAIT_ERROR, {"timeout": 0}, timeout=10))
            assert not report.down
            with pytest.raises(TpuctlError, match="does not know the operation 'reboot'"):
                await asyncio.to_thread(_raw_call, state, "reboot")
        finally:
            codes = await stop_cluster(agents, runs)
        assert codes == [0] * HOSTS
        assert "wrote" in " ".join(recorders[1].lines)

    asyncio.run(scenario())


def test_a_host_that_leaves_fails_the_next_barrier_of_every_other_host_naming_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        agents, recorders, runs = await start_cluster(tmp_path)
        try:
            await asyncio.wait_for(asyncio.gather(*(r.outcome for r in recorders)), DEADLINE_S)
            agents[3].stop.set()  # task 3 leaves (as `tpuctl down` on its host)
            agents[3].changed.set()
            assert await asyncio.wait_for(runs[3], DEADLINE_S) == 0
            waits = [
                asyncio.to_thread(call, StateDir(tmp_path / f"host-{t}"), Op.BARRIER, {"name": "after"}, timeout=30)
                for t in range(3)
            ]
            results = await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), DEADLINE_S)
            for result in results:
                assert isinstance(result, ClusterError) and "task 3" in result.message, result
        finally:
            await stop_cluster(agents[:3], runs[:3])

    asyncio.run(scenario())


def _raw_call(state: StateDir, op: str) -> dict[str, Any]:
    """A request naming an operation no agent knows (as a newer tpuctl might send)."""
    import socket

    from tpuctl.errors import error_from_payload

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(state.socket))
        sock.sendall(json.dumps({"op": op, "args": {}}).encode() + b"\n")
        answer = json.loads(sock.makefile().readline())
    raise error_from_payload(answer["error"])


def test_a_host_that_cannot_write_its_mapping_fails_every_host_with_the_real_cause(tmp_path: Path) -> None:
    async def scenario() -> None:
        hosts = loopback_hosts(HOSTS)
        spec = load_spec_text(sim_spec_text("v4-32", hosts, free_port(hosts[0]), tmp_path))
        (tmp_path / "not-a-folder").write_text("a file where host 2's mapping folder should be\n")
        agents, recorders, runs = [], [], []
        for task in range(HOSTS):
            output = tmp_path / ("not-a-folder" if task == 2 else f"host-{task}") / "mapping.json"
            recorder = Recorder()
            options = AgentOptions(spec=spec, task=task, state=StateDir(tmp_path / f"host-{task}"), output=output,
                                   address=hosts[task])  # fmt: skip
            agents.append(Agent(options, recorder))
            recorders.append(recorder)
            runs.append(asyncio.create_task(agents[-1].run()))
        outcomes = await asyncio.wait_for(asyncio.gather(*(r.outcome for r in recorders)), DEADLINE_S)
        codes = await asyncio.wait_for(asyncio.gather(*runs), DEADLINE_S)
        assert all(isinstance(o, TpuctlError) for o in outcomes), outcomes
        assert "cannot write device mapping" in str(outcomes[2])
        for task in (0, 1, 3):  # every peer names host 2 and why, not a heartbeat timeout
            text = str(outcomes[task])
            assert "task 2" in text and "init failed on this host: cannot write device mapping" in text, text
        assert all(code != 0 for code in codes)
        for task in (0, 1, 3):  # no mapping that loads as valid, pending or not, on any host
            assert not list((tmp_path / f"host-{task}").glob("*mapping.json*")), task

    asyncio.run(scenario())


def test_an_agent_whose_state_dir_is_deleted_leaves_the_cluster(tmp_path: Path) -> None:
    import shutil

    async def scenario() -> None:
        agents, recorders, runs = await start_cluster(tmp_path)
        try:
            await asyncio.wait_for(asyncio.gather(*(r.outcome for r in recorders)), DEADLINE_S)
            shutil.rmtree(tmp_path / "host-3")
            assert await asyncio.wait_for(runs[3], DEADLINE_S) == 0  # it noticed and left cleanly
        finally:
            await stop_cluster(agents[:3], runs[:3])

    asyncio.run(scenario())


def test_waiting_for_hosts_says_how_long_and_until_when_and_the_timeout_names_its_spec_key(tmp_path: Path) -> None:
    # issue 24: init's waiting lines lacked the elapsed time and the deadline a barrier's have, and the
    # registration timeout's hint did not say which spec key to raise.
    import re

    hosts = loopback_hosts(2)
    text = sim_spec_text("v4-16", hosts, free_port(hosts[0]), tmp_path).replace("register_timeout: 2m", "register_timeout: 5s")

    async def scenario() -> None:
        recorder = Recorder()
        options = AgentOptions(
            spec=load_spec_text(text), task=0, state=StateDir(tmp_path / "host-0"),
            output=tmp_path / "host-0" / "mapping.json", address=hosts[0],
        )  # fmt: skip
        run = asyncio.create_task(Agent(options, recorder).run())
        outcome = await asyncio.wait_for(recorder.outcome, DEADLINE_S)
        await asyncio.wait_for(run, DEADLINE_S)
        waiting = [line for line in recorder.lines if "hosts:" in line]
        assert waiting, recorder.lines
        for line in waiting:
            match = re.fullmatch(
                r"task 0: waiting (\d+) s for 1 of 2 hosts: task 1 \(127\.0\.0\.3\) \(registration times out in (\d+) s\)",
                line,
            )
            assert match is not None, line
            assert 4 <= int(match[1]) + int(match[2]) <= 6, line  # elapsed + left: the 5 s window
        assert isinstance(outcome, TpuctlError) and outcome.exit_code == 4
        assert outcome.hint is not None
        assert "raise coordinator.register_timeout in the cluster spec (now 5s)" in outcome.hint

    asyncio.run(scenario())


def test_a_barrier_call_its_agent_reads_late_keeps_its_callers_timeout_and_is_not_counted_in_a_later_round(
    tmp_path: Path,
) -> None:
    # Soak seed 2548: host 0's agent was stopped for 1.1 s right after `tpuctl barrier --timeout 1.2s` asked
    # it; when it resumed it took the call with the full 1.2 s again, the caller waited on, and the call
    # was counted in the round the other hosts' next calls made: that round passed with a call whose
    # caller's timeout had run out, and host 0's own next call waited alone one round ahead, for good.
    # Here the requests say they were made seconds ago (`asked_at`), as one sitting in a stopped agent's
    # socket queue does.
    import re
    import time

    def barrier(task: int, timeout: float, asked_ago: float = 0.0) -> dict[str, Any]:
        args = {"name": "step", "timeout": timeout, "asked_at": time.monotonic() - asked_ago}
        return call(StateDir(tmp_path / f"host-{task}"), Op.BARRIER, args, timeout=timeout + 30)

    async def scenario() -> None:
        agents, recorders, runs = await start_cluster(tmp_path)
        try:
            await asyncio.wait_for(asyncio.gather(*(r.outcome for r in recorders)), DEADLINE_S)
            # 0.5 s of its 5.5 s left: it waits that long, not 5.5 s, and the others' round (1.5 s later) does
            # not pass with it.
            started = time.monotonic()
            stale = asyncio.create_task(asyncio.to_thread(barrier, 1, 5.5, 5.0))
            await asyncio.sleep(1.5)
            others = [asyncio.create_task(asyncio.to_thread(barrier, t, 20.0)) for t in (0, 2, 3)]
            with pytest.raises(TpuctlError) as timed_out:
                await asyncio.wait_for(stale, DEADLINE_S)
            assert timed_out.value.exit_code == 4, timed_out.value
            assert re.search(r"barrier 'step' #1 timed out after 0\.[345] s", timed_out.value.message), timed_out.value
            assert time.monotonic() - started < 5.0  # its own 0.5 s and the session's 1 s grace, not 5.5 s
            await asyncio.sleep(0.5)
            assert not any(o.done() for o in others)  # #2 waits for host 1's next call
            mine = await asyncio.to_thread(barrier, 1, 20.0)
            passed = await asyncio.wait_for(asyncio.gather(*others), DEADLINE_S)
            assert {BarrierPassed.from_json(p) for p in [mine, *passed]} == {BarrierPassed("step", 2, HOSTS)}

            # Past its timeout already: answered at once, and counted nowhere (the next round is #3).
            with pytest.raises(TpuctlError) as late:
                await asyncio.to_thread(barrier, 1, 1.2, 5.0)
            assert late.value.exit_code == 4
            assert "barrier 'step': this host's agent took the call 5.0 s after it was made, past its timeout of " \
                "1.2 s (the agent was busy or stopped); it was not counted" in late.value.message
            passed = await asyncio.wait_for(
                asyncio.gather(*(asyncio.to_thread(barrier, t, 20.0) for t in range(HOSTS))), DEADLINE_S
            )
            assert {BarrierPassed.from_json(p) for p in passed} == {BarrierPassed("step", 3, HOSTS)}
        finally:
            await stop_cluster(agents, runs)

    asyncio.run(scenario())
