"""The fixed-seed slice of the randomised soak (``make soak`` runs 500 schedules): the schedules of
``tools.soak.schedule.SLICE`` on one 8-host cluster under ``restart: rejoin`` (network namespaces where
the test may make them, else loopback without the partition), every invariant checked after each.

Together the seeds inject every fault kind (kill -9 and SIGSTOP of the coordinator and of workers, a cut
about the heartbeat timeout, restarts with the same and a fresh state dir, ``tpuctl down`` and ``down
--all``, a barrier timeout and its retry). A violation fails the test, naming its seed and the replay
command.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tools.soak.cluster import network
from tools.soak.runner import Soak
from tools.soak.schedule import FAULT_KINDS, SLICE, generate

# `make test` runs it beside the rest, after the fuzz tests (marked soak: the rest deselects it); `make
# soak-slice` runs it alone. The coordinator may move (coordinator.successors, the default): the invariants
# follow whichever task serves.
pytestmark = [pytest.mark.slow, pytest.mark.soak]

BUDGET_S = 120.0  # the slice's share of `make test`


def test_the_fixed_seed_slice_of_the_soak_keeps_every_invariant(tmp_path: Path) -> None:
    net = network("auto")
    soak = Soak(tmp_path / "soak", net, say=print)
    started = time.monotonic()
    results = []
    try:
        for seed in SLICE:
            results.append(soak.run_schedule(generate(seed)))
    finally:
        soak.close()
    took = time.monotonic() - started
    injected = set().union(*(r.faults for r in results))
    expected = set(FAULT_KINDS) - (set() if net.partitions else {"partition"})
    assert injected == expected, f"the slice injected {sorted(injected)}"
    found = [(r.seed, v) for r in results for v in r.violations]
    shown = "\n".join(
        f"seed {seed}: {v.invariant}: {v.detail}" + (f" [looks like known defect {v.known}]" if v.known else "")
        for seed, v in found
    )
    replay = "; ".join(f"python -m tools.soak --seed {seed} --schedules 1" for seed in sorted({s for s, _ in found}))
    assert not found, f"invariant violations (replay: {replay}; logs: {[r.logs for r in results if r.logs]}):\n{shown}"
    assert took < BUDGET_S * 1.5, f"the slice took {took:.0f} s (budget {BUDGET_S:g} s)"
