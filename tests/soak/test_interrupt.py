"""A SIGINT that arrives while the soak polls a host's state dir stops the soak: the first one, not the
second (a first Ctrl-C was once swallowed by the poll, which tolerated any error there)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tools.soak import cluster as soak_cluster
from tools.soak.runner import Interrupted, interrupt_on_signals


def test_a_sigint_during_a_state_dir_poll_is_not_swallowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = soak_cluster.Cluster.__new__(soak_cluster.Cluster)  # only what agent_pid reads
    hosts.root = tmp_path
    (tmp_path / "host-3").mkdir(mode=0o700)

    def live_pid(self: object) -> int | None:
        os.kill(os.getpid(), signal.SIGINT)  # delivered to this (the main) thread mid-read
        return None

    monkeypatch.setattr(soak_cluster.StateDir, "live_pid", live_pid)
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        interrupt_on_signals()
        with pytest.raises(Interrupted, match="SIGINT"):
            hosts.agent_pid(3)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_a_state_dir_being_replaced_is_only_no_agent(tmp_path: Path) -> None:
    hosts = soak_cluster.Cluster.__new__(soak_cluster.Cluster)
    hosts.root = tmp_path  # host-3 is not there (being replaced): no agent, no error
    assert hosts.agent_pid(3) is None
