from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import LocalCluster


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[object]:
    clusters: list[LocalCluster] = []

    def make(accelerator: str, **options: str) -> LocalCluster:
        root = tmp_path / f"c{len(clusters)}"
        root.mkdir()
        cluster = LocalCluster(root, accelerator, **options)
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        print(cluster.logs())  # shown by pytest when the test failed
        cluster.close()
