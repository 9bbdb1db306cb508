"""configs/Dockerfile, built for real where a container engine is usable; otherwise its RUN and CMD lines run
as one shell script here: ``${PREFIX}`` in a temp folder, COPY as a copy of the checkout, ENV as the
script's environment, BuildKit's ``--mount`` options dropped (they only name a cache)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "configs" / "Dockerfile"
IGNORED = shutil.ignore_patterns(".venv", ".git", "*.egg-info", "__pycache__", ".*_cache", "build", "dist")
GKE_POD = {  # what GKE sets in a v5litepod-16 TPU container (tpuctl detect needs nothing else)
    "TPU_ACCELERATOR_TYPE": "v5litepod-16", "TPU_WORKER_ID": "0", "TPU_SKIP_MDS_QUERY": "true",
    "TPU_WORKER_HOSTNAMES": "train-slice-0-0.train,train-slice-0-1.train,train-slice-0-2.train,train-slice-0-3.train",
}  # fmt: skip


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; comments dropped, continuation lines joined."""
    out = []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, rest = line.partition(" ")
            out.append((name.upper(), rest.strip()))
    return out


def expand(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m.group(1) or m.group(2), m.group(0)), text)


def as_script(prefix: Path) -> tuple[str, dict[str, str], list[str]]:
    """The Dockerfile as (shell script of its RUN lines, its ENV, its CMD), with ARG PREFIX=``prefix``."""
    values = {"PATH": os.environ["PATH"]}
    env: dict[str, str] = {}
    lines = ["set -eux"]
    cmd: list[str] = []
    for name, rest in instructions(DOCKERFILE.read_text()):
        if name == "ARG":
            key, _, default = rest.partition("=")
            values[key] = str(prefix) if key == "PREFIX" else default
        elif name == "ENV":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                env[key] = values[key] = expand(value, values)
        elif name == "COPY":
            source, target = shlex.split(rest)
            assert source == ".", "the image is built from the checkout"
            shutil.copytree(ROOT, expand(target, values), ignore=IGNORED)
        elif name == "RUN":
            lines.append(re.sub(r"--mount=\S+\s*", "", expand(rest, values)))
        elif name == "CMD":
            cmd = json.loads(rest)
        else:
            assert name in ("FROM", "WORKDIR"), f"an instruction this test cannot run: {name}"
    return "\n".join(lines) + "\n", env, cmd


@pytest.mark.slow
def test_the_dockerfile_installs_tpuctl_and_its_cmd_runs(tmp_path: Path) -> None:
    prefix = tmp_path / "opt-tpuctl"
    script, env, cmd = as_script(prefix)
    assert cmd == ["tpuctl", "detect"]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "TPUCTL_", "VIRTUAL_ENV"))}
    shim = tmp_path / "bin"  # `python` is the image's interpreter: here, the one running the tests
    shim.mkdir()
    (shim / "python").symlink_to(Path(sys.executable).resolve())
    environ = {**base, **env, "PATH": f"{prefix}/venv/bin{os.pathsep}{shim}{os.pathsep}{base['PATH']}"}
    environ["TPUCTL_STATE_DIR"] = str(tmp_path / "run-tpuctl")  # the image's /run/tpuctl
    built = subprocess.run(["sh", "-c", script], env=environ, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    tpuctl = prefix / "venv" / "bin" / "tpuctl"
    assert tpuctl.is_file() and "site-packages" in subprocess.run(
        [str(prefix / "venv" / "bin" / "python"), "-c", "import tpuctl; print(tpuctl.__file__)"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    ).stdout  # fmt: skip  # installed, not the checkout
    done = subprocess.run(cmd, env={**environ, **GKE_POD}, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "v5litepod-16" in done.stdout and "train-slice-0-3.train" in done.stdout


def _engine() -> str | None:
    for name in ("docker", "podman"):
        path = shutil.which(name)
        if path and subprocess.run([path, "info"], capture_output=True, timeout=30).returncode == 0:
            return path
    return None


@pytest.mark.slow
@pytest.mark.skipif(_engine() is None, reason="no usable container engine (the script form above runs instead)")
def test_the_dockerfile_builds_with_a_container_engine(tmp_path: Path) -> None:
    engine = _engine()
    assert engine is not None
    tag = f"tpuctl-test-{os.getpid()}"
    try:
        built = subprocess.run([engine, "build", "-f", str(DOCKERFILE), "-t", tag, str(ROOT)], capture_output=True,
                               text=True, timeout=900)  # fmt: skip
        assert built.returncode == 0, built.stderr[-4000:]
        env = [f"--env={k}={v}" for k, v in GKE_POD.items()]
        done = subprocess.run([engine, "run", "--rm", *env, tag], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "v5litepod-16" in done.stdout, done.stderr
    finally:
        subprocess.run([engine, "rmi", "-f", tag], capture_output=True, timeout=120)
