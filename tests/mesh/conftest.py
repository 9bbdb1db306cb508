"""Fixtures shared by the mesh tests: TensorFlow's DTensor modules, imported once per session (the dev
extra's tensorflow: no skip, a missing one fails)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest


@pytest.fixture(scope="session")
def tf() -> Iterator[SimpleNamespace]:
    from tensorflow.dtensor.python import config, layout, tpu_util

    yield SimpleNamespace(tpu_util=tpu_util, config=config, Mesh=layout.Mesh)
