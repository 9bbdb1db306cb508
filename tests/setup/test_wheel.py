"""The wheel, as a user installs it: built from the checkout (``pip wheel --no-deps``), installed into a fresh
venv (its dependencies from pip's cache), then ``tpuctl sim up`` / ``status`` / ``sim status`` /
``sim down`` from that venv, importing tpuctl from its site-packages (not the checkout)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IGNORED = shutil.ignore_patterns(".venv*", ".git", "*.egg-info", "__pycache__", ".*_cache", "build", "dist")


def _run(command: list[str], *, env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_the_wheel_installs_and_runs_a_simulated_cluster(tmp_path: Path) -> None:
    source = tmp_path / "src"  # a copy: an in-tree build would leave build/ and *.egg-info in the checkout
    shutil.copytree(ROOT, source, ignore=IGNORED)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "TPUCTL_", "VIRTUAL_ENV", "PYTHONPATH"))}
    env["TPUCTL_STATE_DIR"] = str(tmp_path / "state")
    wheels = tmp_path / "wheels"
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
        env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("tpuctl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("tpuctl/py.typed", "tpuctl/job/startup/sitecustomize.py", "tpuctl/job/jaxcluster.py"):
        assert needed in names, f"{needed} is not in {wheel.name}"
    assert any(n.startswith("tpuctl/proto/") and n.endswith(".pyi") for n in names)
    assert not any(n.startswith("tests/") for n in names)

    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)], env=env, cwd=tmp_path, timeout=120)
    assert made.returncode == 0, made.stderr
    installed = _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], env=env, cwd=tmp_path,
                     timeout=600)  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    where = _run([str(venv / "bin" / "python"), "-c", "import tpuctl, jax"], env=env, cwd=tmp_path, timeout=60)
    assert where.returncode != 0 and "No module named 'jax'" in where.stderr  # runtime dependencies only

    tpuctl = str(venv / "bin" / "tpuctl")
    root = tmp_path / "sim"
    up = _run([tpuctl, "sim", "up", "v4-16", "--root", str(root)], env=env, cwd=tmp_path, timeout=180)
    try:
        assert up.returncode == 0, up.stderr
        status = _run([tpuctl, "status", "--state-dir", str(root / "host-0")], env=env, cwd=tmp_path, timeout=60)
        assert status.returncode == 0 and "connected" in status.stdout, status.stderr
        sims = _run([tpuctl, "sim", "status", "--root", str(root), "--json"], env=env, cwd=tmp_path, timeout=60)
        assert sims.returncode == 0 and '"healthy": true' in sims.stdout, sims.stderr
        agent = (root / "host-0" / "agent.pid").read_text().strip()
        exe = Path(f"/proc/{agent}/cmdline").read_bytes().split(b"\0")[0].decode()
        assert Path(exe).resolve().parent == (venv / "bin").resolve() or exe.startswith(str(venv)), exe
    finally:
        down = _run([tpuctl, "sim", "down", "--root", str(root)], env=env, cwd=tmp_path, timeout=60)
    assert down.returncode == 0 and "stopped 2 agents" in down.stdout + down.stderr, down.stderr
