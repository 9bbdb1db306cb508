from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from harness import Processes
from harness.clusters import LocalCluster


@pytest.fixture
def make_cluster(tmp_path: Path, processes: Processes) -> Iterator[Callable[..., LocalCluster]]:
    """``make_cluster("v4-32", heartbeat_timeout="2s")``: a spec for a loopback cluster; its processes are this
    test's (logs shown on failure), and whatever it started is stopped after the test."""
    clusters: list[LocalCluster] = []

    def make(accelerator: str, **options: str) -> LocalCluster:
        cluster = LocalCluster(tmp_path / f"c{len(clusters)}", accelerator, processes, **options)
        clusters.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in clusters:
            cluster.close()
