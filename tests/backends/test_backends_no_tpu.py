"""The real-TPU backends on a machine without TPUs, through real ``tpuctl init`` processes.

``backend: jax`` and ``backend: tensorflow`` must fail fast with "no TPU found on this host", naming the
backend, with the documented exit code 6, and leave no agent behind. tensorflow and jax are installed
(the dev extra), so this is the path a CPU machine really takes, not a stand-in.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpuctl.agent.statedir import StateDir
from tpuctl.errors import EXIT_NO_TPU
from tpuctl.sim.cluster import free_port

HAS_TPU = os.path.exists("/dev/accel0") or bool(glob.glob("/dev/vfio/[0-9]*"))

pytestmark = [pytest.mark.slow, pytest.mark.skipif(HAS_TPU, reason="this host has a TPU")]


@pytest.mark.parametrize(
    ("backend", "said"),
    [
        ("jax", "no TPU found on this host (backend jax): Backend 'tpu' failed to initialize"),
        (
            "tensorflow",
            "no TPU found on this host (backend tensorflow): tf.config.list_physical_devices('TPU') is empty",
        ),
    ],
)
def test_init_with_a_real_backend_and_no_tpu_exits_6(backend: str, said: str, tmp_path: Path) -> None:
    pytest.importorskip(backend)
    host = "127.0.0.2"
    spec = tmp_path / "cluster.yaml"
    spec.write_text(
        f"cluster: no-tpu\naccelerator: v4-8\nbackend: {backend}\nhosts: [{host}]\n"
        f"coordinator: {{port: {free_port(host)}}}\nbarrier_timeout: 30s\noutput: {tmp_path / 'mapping.json'}\n"
    )
    state = tmp_path / "state"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "tpuctl", "init", "--config", str(spec), "--state-dir", str(state)],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    took = time.monotonic() - started
    log = (state / "agent.log").read_text() if (state / "agent.log").exists() else "(no log)"
    assert proc.returncode == EXIT_NO_TPU == 6, f"{proc.stderr}\n{log}"
    assert f"tpuctl: error: {said}" in proc.stderr, proc.stderr
    assert "hint: run tpuctl init on a TPU VM" in proc.stderr
    assert "backend: sim" in proc.stderr
    assert took < 60, f"took {took:.1f} s"
    assert StateDir(state).live_pid() is None  # no agent left behind
    assert not (tmp_path / "mapping.json").exists()
