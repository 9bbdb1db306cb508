"""Shared test set-up: the environment, the multi-process harness's fixture and its logs on failure."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from harness import Processes

# libtpu (the oracle, via jax.experimental.topologies) takes a machine-wide lock file unless told
# otherwise; several test processes on one machine (or a developer's second run) would then fail.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    """This test's processes: log files under ``tmp_path/logs``, all stopped after the test."""
    procs = Processes(tmp_path / "logs", name="test")
    try:
        yield procs
    finally:
        procs.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing test (or set-up) shows the log files of every multi-process harness open at the time."""
    report: pytest.TestReport = yield
    if report.failed and report.when in ("setup", "call"):
        for procs in Processes.open_now:
            report.sections.append((f"processes ({procs.name}, logs in {procs.folder})", procs.logs() or "(no output)"))
    return report
