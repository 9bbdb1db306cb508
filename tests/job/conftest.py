from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from harness import Processes
from harness.clusters import SimCluster


@pytest.fixture
def sim_cluster(tmp_path: Path, processes: Processes) -> Iterator[Callable[[str], SimCluster]]:
    """``sim_cluster("v4-16")``: a simulated cluster that is up; its processes are this test's (logs shown on
    failure), and everything it started is stopped after the test."""
    clusters: list[SimCluster] = []

    def make(accelerator: str) -> SimCluster:
        cluster = SimCluster(tmp_path / f"c{len(clusters)}", accelerator, processes)
        clusters.append(cluster)
        cluster.up()
        return cluster

    try:
        yield make
    finally:
        for cluster in clusters:
            cluster.close()
