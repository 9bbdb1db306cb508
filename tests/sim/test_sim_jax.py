"""A whole JAX all-gather across a simulated v4-32 in two commands, the job calling plain
``jax.distributed.initialize()``: ``tpuctl sim up v4-32``, then ``tpuctl sim run -- python job.py``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from harness import TPUCTL, Processes

JOB = Path(__file__).resolve().parent / "job_plain_jax.py"


@pytest.mark.slow
def test_plain_jax_initialize_all_gathers_across_a_simulated_v4_32(tmp_path: Path, processes: Processes) -> None:
    pytest.importorskip("jax")
    root = tmp_path / "sim"
    env = {"TPUCTL_STATE_DIR": str(tmp_path / "state")}
    for name in ("JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES", "JAX_CPU_COLLECTIVES_IMPLEMENTATION"):  # what sim run sets itself
        os.environ.pop(name, None)
    up = processes.run("sim-up", [*TPUCTL, "sim", "up", "v4-32", "--root", str(root)], timeout=120, env=env)
    try:
        assert up.code == 0, up.err
        done = processes.run(
            "sim-run", [*TPUCTL, "sim", "run", "--root", str(root), "--timeout", "3m", "--", sys.executable, str(JOB)],
            timeout=240, env=env,
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
    finally:
        processes.run("sim-down", [*TPUCTL, "sim", "down", "--root", str(root)], timeout=60, env=env)
