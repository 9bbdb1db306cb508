"""The commands used in job scripts stay cheap: no grpc, numpy, tensorflow or jax on their path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("grpc", "numpy", "tensorflow", "jax", "yaml")
# barrier, status and env run on the standard library alone (tpuctl.cli.light): not even click
LIGHT_PATH_HEAVY = (*HEAVY, "click", "asyncio", "google")

PROBE = """
import sys
from tpuctl.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
heavy = sorted(m for m in {heavy!r} if m in sys.modules)
print("HEAVY=" + ",".join(heavy))
"""


@pytest.mark.parametrize(
    "args",
    [
        ["barrier", "step"],
        ["barrier", "step", "--timeout", "5s"],
        ["status"],
        ["status", "--json"],
        ["env"],
        ["env", "--format=json"],
        ["--debug", "barrier", "-q", "--timeout=5s", "step"],
        ["down"],
        ["--help"],
    ],
)
def test_agent_commands_import_nothing_heavy(args: list[str], tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            PROBE.format(heavy=HEAVY if args[0] in ("down", "--help") else LIGHT_PATH_HEAVY),
            *args,
            *(["--state-dir", str(tmp_path)] if args != ["--help"] else []),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    heavy_line = [ln for ln in proc.stdout.splitlines() if ln.startswith("HEAVY=")]
    assert heavy_line == ["HEAVY="], proc.stdout + proc.stderr
    if args != ["--help"]:
        assert f"no tpuctl agent is running for state dir {tmp_path}" in proc.stderr
