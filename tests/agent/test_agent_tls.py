"""Agents over TLS: the spec's ``auth.tls`` wired through the agent's service (task 0) and client.

Two in-process agents (as ``test_agent_inprocess``) bring a cluster up over mutual TLS from spec paths,
with certificates the test makes with the ``openssl`` CLI, meet at a barrier, and ``tpuctl down --all``
on one host stops every host as a shutdown (the ``shutdown`` flag, not a failure). The spec's
``auth.tls`` section is checked: paths, both halves of a client certificate, the server name.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "coordination"))
from test_agent_inprocess import Recorder
from tls_certs import make_pki

from tpuctl.agent.bringup import Agent
from tpuctl.agent.control import Op, call
from tpuctl.agent.options import AgentOptions
from tpuctl.agent.protocol import BarrierPassed, ErrorReport
from tpuctl.agent.statedir import StateDir
from tpuctl.sim.cluster import free_port, loopback_hosts, sim_spec_text
from tpuctl.spec.model import TlsSpec
from tpuctl.spec.yamlfile import check_spec_text, load_spec_text

HOSTS = 2
DEADLINE_S = 90.0


def tls_section(pki_dir: Path, *, mutual: bool) -> str:
    pki = make_pki(pki_dir)
    client = f", client_cert: {pki.client_cert}, client_key: {pki.client_key}" if mutual else ""
    return f"auth: {{tls: {{cert: {pki.server_cert}, key: {pki.server_key}, ca: {pki.ca}{client}}}}}\n"


def test_a_mutual_tls_cluster_comes_up_meets_and_shuts_down_as_a_shutdown(tmp_path: Path) -> None:
    hosts = loopback_hosts(HOSTS)
    text = sim_spec_text("v4-16", hosts, free_port(hosts[0]), tmp_path) + tls_section(tmp_path / "pki", mutual=True)
    spec = load_spec_text(text)
    assert spec.auth is not None and spec.auth.tls is not None and spec.auth.tls.mutual

    async def scenario() -> None:
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
            agents.append(Agent(options, recorder))
            recorders.append(recorder)
            runs.append(asyncio.create_task(agents[-1].run()))
        try:
            outcomes = await asyncio.wait_for(asyncio.gather(*(r.outcome for r in recorders)), DEADLINE_S)
            assert all(isinstance(o, dict) for o in outcomes), outcomes
            states = [StateDir(tmp_path / f"host-{t}") for t in range(HOSTS)]
            passed = await asyncio.wait_for(
                asyncio.gather(*(asyncio.to_thread(call, s, Op.BARRIER, {"name": "tls"}, timeout=30) for s in states)),
                DEADLINE_S,
            )
            assert {BarrierPassed.from_json(p).instance for p in passed} == {1}
            assert all(a.current is not None and len(a.current.membership.task.credential) == 32 for a in agents)  # credentials passed through
            await asyncio.to_thread(call, states[1], Op.DOWN, {"all": True}, timeout=30)
            codes = await asyncio.wait_for(asyncio.gather(*runs), DEADLINE_S)
        finally:
            for agent in agents:
                agent.stop.set()
                agent.changed.set()
            await asyncio.wait_for(asyncio.gather(*runs, return_exceptions=True), DEADLINE_S)
        assert codes == [0] * HOSTS
        reports = [a.error_report() for a in agents]
        assert all(r.shutdown and r.error is None for r in reports), reports
        assert isinstance(reports[0], ErrorReport)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("tls", "problem"),
    [
        ("{cert: s.pem, key: s.key}", "auth.tls.ca: missing; expected the CA certificate (PEM)"),
        ("{cert: s.pem, key: s.key, ca: ca.pem, client_cert: c.pem}", "auth.tls.client_key: missing; mutual TLS needs both"),
        ("{cert: s.pem, key: s.key, ca: ca/}", "auth.tls.ca: 'ca/' names a folder"),
        ("{cert: s.pem, key: s.key, ca: ca.pem, sni: x}", "auth.tls.sni: unknown key"),
        ("{cert: s.pem, key: s.key, ca: ca.pem, server_name: ''}", "auth.tls.server_name"),
        ("yes", "auth.tls: got"),
    ],
)
def test_the_spec_checks_auth_tls(tls: str, problem: str) -> None:
    text = sim_spec_text("v4-8", ["127.0.0.2"], 8490, Path("/tmp")) + f"auth: {{token_file: /t, tls: {tls}}}\n"
    problems = check_spec_text(text, "c.yaml").formatted()
    assert any(problem in p for p in problems), problems


def test_the_spec_reads_auth_tls() -> None:
    text = sim_spec_text("v4-8", ["127.0.0.2"], 8490, Path("/tmp")) + (
        "auth:\n  tls: {cert: s.pem, key: s.key, ca: ca.pem, client_cert: c.pem, client_key: c.key, "
        "server_name: coordinator.pod}\n"
    )
    spec = load_spec_text(text)
    assert spec.auth is not None and spec.auth.token_file is None
    assert spec.auth.tls == TlsSpec("s.pem", "s.key", "ca.pem", "c.pem", "c.key", "coordinator.pod")
