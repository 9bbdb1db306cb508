"""Shared test set-up: the environment, the multi-process harness's fixtures (processes, loopback clusters)
and their logs on failure."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from harness import Processes

if TYPE_CHECKING:  # imported where used: harness.clusters loads tpuctl, which most tests never need in-process
    from harness.clusters import Clusters, LocalCluster, SimCluster

# libtpu (the oracle, via jax.experimental.topologies) takes a machine-wide lock file unless told
# otherwise; several test processes on one machine (or a developer's second run) would then fail.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# The environment before any test module is imported (collection imports jax and libtpu, which set
# TPU_* variables in this process as a side effect).
_SUITE_ENVIRON = dict(os.environ)


@pytest.fixture(autouse=True)
def _environment_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test sees the environment the suite started with: importing jax or libtpu in this process
    sets TPU_* variables (TPU_WORKER_ID to a warning text, TPU_SKIP_MDS_QUERY, ...), some of them with
    C's setenv behind os.environ's back, which would leak into every later test and every tpuctl
    process it starts, and tpuctl reads those variables.

    Oracle tests (libtpu's compile-only topologies) get TPU_SKIP_MDS_QUERY=1, as jax sets it itself on a
    machine without TPU chips: off a TPU VM libtpu would otherwise ask the GCE metadata server for each
    topology variable, 30 tries each (minutes, where a metadata address answers at all)."""
    _restore(_SUITE_ENVIRON)
    if request.node.get_closest_marker("oracle") is not None:
        os.environ["TPU_SKIP_MDS_QUERY"] = "1"
    try:
        yield
    finally:
        _restore(_SUITE_ENVIRON)


def _restore(before: dict[str, str]) -> None:
    """Make os.environ, and the C environment children inherit, equal ``before`` (pytest's own names
    kept)."""
    for name in [n for n in os.environ if n not in before and not n.startswith("PYTEST_")]:
        del os.environ[name]
    for name, value in before.items():
        if os.environ.get(name) != value:
            os.environ[name] = value
    for name, value in _c_environ().items():
        if name.startswith("PYTEST_"):
            continue
        if name not in os.environ:
            os.unsetenv(name)
        elif os.environ[name] != value:
            os.putenv(name, os.environ[name])


def _c_environ() -> dict[str, str]:
    """The process's C environment (what a child started without ``env=`` inherits), which a library's
    setenv can change without os.environ knowing."""
    libc = ctypes.CDLL(None)
    environ = ctypes.POINTER(ctypes.c_char_p).in_dll(libc, "environ")
    found: dict[str, str] = {}
    for i in range(100_000):  # bounded: an environment has far fewer entries
        entry = environ[i]
        if entry is None:
            break
        name, _, value = entry.decode("utf-8", "surrogateescape").partition("=")
        found[name] = value
    return found


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    """This test's processes: log files under ``tmp_path/logs``, all stopped after the test."""
    procs = Processes(tmp_path / "logs", name="test")
    try:
        yield procs
    finally:
        procs.close()


@pytest.fixture
def clusters(tmp_path: Path, processes: Processes) -> Iterator[Clusters]:
    """This test's loopback clusters (folders ``c0``, ``c1``, ... under ``tmp_path``), their processes the
    test's; afterwards every process, job and agent they started is stopped, by pid."""
    from harness.clusters import Clusters

    made = Clusters(tmp_path, processes)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def make_cluster(clusters: Clusters) -> Callable[..., LocalCluster]:
    """``make_cluster("v4-32", heartbeat_timeout="2s")``: a loopback cluster's spec; the test starts its hosts
    (``cluster.up()``, ``cluster.start_init(task)``)."""
    return clusters.local


@pytest.fixture
def sim_cluster(clusters: Clusters) -> Callable[..., SimCluster]:
    """``sim_cluster("v4-16")``: ``tpuctl sim up``, a simulated cluster that is up (``sim_cluster("v4-16",
    "-o", "json")``: options for ``sim up``)."""
    return clusters.sim


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
