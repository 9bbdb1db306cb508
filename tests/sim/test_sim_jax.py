"""A whole JAX all-gather across a simulated v4-32 in two commands, the job calling plain
``jax.distributed.initialize()``: ``tpuctl sim up v4-32``, then ``tpuctl sim run -- python job.py``."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from harness.clusters import SimCluster

JOB = Path(__file__).resolve().parent / "job_plain_jax.py"


@pytest.mark.slow
def test_plain_jax_initialize_all_gathers_across_a_simulated_v4_32(sim_cluster: Callable[[str], SimCluster]) -> None:
    pytest.importorskip("jax")
    for name in ("JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES", "JAX_CPU_COLLECTIVES_IMPLEMENTATION"):  # what sim run sets itself
        os.environ.pop(name, None)
    c = sim_cluster("v4-32")
    done = c.tpuctl(
        "sim", "run", "--root", str(c.root), "--timeout", "3m", "--", sys.executable, str(JOB), timeout=240, env=c.env
    )  # fmt: skip
    assert done.code == 0, done.err + done.out
    results = {}
    for line in done.out.splitlines():
        prefix, _, rest = line.partition("] RESULT ")
        if rest:
            task = int(prefix.removeprefix("[task "))
            results[task], _ = json.JSONDecoder().raw_decode(rest)  # another thread's text may follow
    assert sorted(results) == [0, 1, 2, 3], done.out
    for task, result in results.items():
        assert result["process"] == task  # the [task N] prefix is that host's process
        assert result["processes"] == 4
        assert result["gathered"] == [100, 101, 102, 103]
        assert result["platform"] == "cpu"
        assert (result["devices"], result["local_devices"]) == (16, 4)  # v4-32: 4 hosts x 4 chips
        assert result["detectors"] == ["tpuctl"]  # no SLURM / MPI / TPU VM pretended
    assert "all 4 tasks exited 0" in done.err
