"""An interrupted ``tpuctl init`` takes its agent down with it, before the cluster formed, and says so.

Ctrl-C (SIGINT), SIGTERM and SIGHUP (a lost ssh session) reach ``init``, not its agent (a session of its
own). ``init`` sends the agent SIGUSR1 ("your init was interrupted"), waits for it (bounded) and exits
128 + the signal's number. Here: a 2-host cluster with only task 0 started, its ``init`` interrupted
while it waits for task 1; its agent must be gone, and task 1 started afterwards must not form a cluster
with it (it finds no coordinator and gives up at the register timeout).

The race (the signal while the cluster forms) is decided by the agent, in one event loop: before the
final barrier passed on this host it leaves; after, the cluster formed and it stays (in-process below).
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from harness import wait_until

from tpuctl.agent.statedir import StateDir

REGISTER_TIMEOUT_S = 4.0


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_an_interrupted_init_stops_its_agent_and_no_cluster_forms_with_it(make_cluster, sig: signal.Signals) -> None:
    c = make_cluster("v4-16", register_timeout=f"{REGISTER_TIMEOUT_S:g}s")
    init = c.start_init(0)
    c.processes.wait_for_output(init, "waiting for every host", timeout=30)
    pid = c.agent_pid(0)
    init.send_signal(sig)
    done = c.wait_init(init.label, timeout=30)
    assert done.code == 128 + sig, done
    assert f"tpuctl: interrupted; stopped this host's agent (pid {pid}) before the cluster formed" in done.err, done.err
    assert not c.processes.ours(pid), f"the agent (pid {pid}) still runs"
    state = StateDir(c.state(0))
    assert state.live_pid() is None
    assert not any((c.state(0) / name).exists() for name in ("agent.pid", "agent.sock", "registration.json"))
    assert not c.mapping(0).exists()
    log = (c.state(0) / "agent.log").read_text()
    assert "its tpuctl init was interrupted before the cluster formed: leaving" in log, log

    worker = c.start_init(1)
    late = c.wait_init(worker.label, timeout=REGISTER_TIMEOUT_S + 30)
    assert late.code not in (0, None), late
    assert "unreachable" in late.err, late.err
    assert not c.mapping(1).exists()


@pytest.mark.slow
def test_an_agent_whose_init_was_killed_leaves_before_the_cluster_formed(make_cluster) -> None:
    """``kill -9`` of ``init`` (no chance to say anything): the agent's next word to it finds the pipe
    broken, and it leaves as for an interrupted init."""
    c = make_cluster("v4-16", register_timeout="30s")
    init = c.start_init(0)
    c.processes.wait_for_output(init, "waiting for every host", timeout=30)
    pid = c.agent_pid(0)
    init.send_signal(signal.SIGKILL)
    wait_until(lambda: not c.processes.ours(pid), 15, "the agent to leave", logs=c.logs)
    assert StateDir(c.state(0)).live_pid() is None
    assert "its tpuctl init went away" in (c.state(0) / "agent.log").read_text()


# --- the race, in-process: the interruption arriving as the cluster forms ------------------------------


def _one_host_agent(tmp_path: Path) -> tuple[Any, Any]:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_agent_inprocess import Recorder

    from tpuctl.agent.bringup import Agent
    from tpuctl.agent.options import AgentOptions
    from tpuctl.sim.cluster import free_port, loopback_hosts, sim_spec_text
    from tpuctl.spec.yamlfile import load_spec_text

    hosts = loopback_hosts(1)
    spec = load_spec_text(sim_spec_text("v4-8", hosts, free_port(hosts[0]), tmp_path))
    options = AgentOptions(spec=spec, task=0, state=StateDir(tmp_path / "host-0"),
                           output=tmp_path / "host-0" / "mapping.json", address=hosts[0])  # fmt: skip
    recorder = Recorder()
    return Agent(options, recorder), recorder


@pytest.mark.parametrize("when", ["before the final barrier", "as the mapping is committed", "SIGTERM then"])
def test_an_interruption_as_the_cluster_forms_leaves_a_whole_state(tmp_path: Path, monkeypatch, when: str) -> None:
    """Before the final barrier passed: the agent leaves, and no mapping is left. Once it passed (the
    mapping is being committed: every host passed it, the cluster formed): the agent finishes, reports
    ready and stays, its mapping in place; never an agent gone with a committed mapping and no word to
    init. A SIGTERM then (``tpuctl down``'s meaning): ready first, then it leaves the cluster."""
    import tpuctl.agent.bringup as bringup

    async def scenario() -> None:
        agent, recorder = _one_host_agent(tmp_path)
        if when == "before the final barrier":
            original_barrier = type(agent)._form_steps

            async def form_steps(self: Any, gen: Any, wait: float) -> None:
                real = gen.session.barrier

                async def barrier(name: str, **kw: Any) -> int:
                    self.init_gone("its tpuctl init was interrupted (SIGINT)")
                    return await real(name, **kw)

                gen.session.barrier = barrier
                await original_barrier(self, gen, wait)

            monkeypatch.setattr(type(agent), "_form_steps", form_steps)
        else:
            commit = bringup.commit

            def committing(pending: Any, output: Any) -> None:
                commit(pending, output)
                if when == "SIGTERM then":
                    agent._on_signal(signal.SIGTERM)
                else:
                    agent.init_gone("its tpuctl init was interrupted (SIGINT)")

            monkeypatch.setattr(bringup, "commit", committing)
        run = asyncio.create_task(agent.run())
        outcome = await asyncio.wait_for(recorder.outcome, 60)
        mapping = tmp_path / "host-0" / "mapping.json"
        try:
            if when == "before the final barrier":
                assert not isinstance(outcome, dict), outcome
                assert "interrupted" in outcome.message
                assert await asyncio.wait_for(run, 30) != 0
                assert not mapping.exists()
            elif when == "SIGTERM then":
                assert isinstance(outcome, dict), outcome
                assert await asyncio.wait_for(run, 30) == 0  # then left, as `tpuctl down` makes it
            else:
                assert isinstance(outcome, dict), outcome
                await asyncio.sleep(0.5)
                assert not run.done() and not agent.stop.is_set()  # it stays: the cluster's now
                assert mapping.exists()
        finally:
            agent.stop.set()
            agent.changed.set()
            await asyncio.wait_for(asyncio.gather(run, return_exceptions=True), 30)
        assert not os.path.exists(tmp_path / "host-0" / "agent.pid")

    asyncio.run(scenario())


def test_an_agent_that_does_not_answer_the_interruption_is_killed(tmp_path: Path, monkeypatch) -> None:
    """Init waits ``STOP_WAIT_S`` for its agent's answer, then kills it and says so (here: a process that
    ignores SIGUSR1, as a frozen agent would not answer)."""
    import subprocess
    import sys
    import time

    import tpuctl.agent.launch as launch
    from tpuctl.agent.options import AgentOptions
    from tpuctl.errors import InterruptError
    from tpuctl.spec.yamlfile import load_spec_text

    monkeypatch.setattr(launch, "STOP_WAIT_S", 0.5)
    deaf = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGUSR1, "
                             "signal.SIG_IGN); print(flush=True); time.sleep(60)"], stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert deaf.stdout is not None and deaf.stdout.readline() == b"\n"  # its handler is set
        spec = load_spec_text("cluster: w\naccelerator: v4-8\nbackend: sim\nhosts: [127.0.0.1]\n")
        options = AgentOptions(spec=spec, task=0, state=StateDir(tmp_path), output=tmp_path / "m.json",
                               address="127.0.0.1")  # fmt: skip
        wait = launch._Wait(options, deaf.pid)
        started = time.monotonic()
        events = iter([{"event": "interrupted", "signal": int(signal.SIGTERM)}])
        with pytest.raises(InterruptError) as excinfo:
            launch._relay(options, deaf.pid, events, wait, lambda text: None)
        assert time.monotonic() - started < 10
        assert excinfo.value.exit_code == 128 + signal.SIGTERM
        assert excinfo.value.message == (
            f"interrupted before the cluster formed; killed this host's agent (pid {deaf.pid}): it did not stop "
            "within 0.5 s"
        )
        assert not os.path.exists(f"/proc/{deaf.pid}")  # killed and reaped
    finally:
        if deaf.poll() is None:
            deaf.kill()
        deaf.wait()
