from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .simjobs import SimCluster


@pytest.fixture
def sim_cluster(tmp_path: Path) -> Iterator[Callable[[str], SimCluster]]:
    """``sim_cluster("v4-16")``: a simulated cluster that is up; torn down (and printed) after the test."""
    clusters: list[SimCluster] = []

    def make(accelerator: str) -> SimCluster:
        cluster = SimCluster(tmp_path / f"c{len(clusters)}", accelerator)
        clusters.append(cluster)
        cluster.up()
        return cluster

    yield make
    for cluster in clusters:
        print(cluster.logs())  # shown by pytest when the test failed
        cluster.close()
