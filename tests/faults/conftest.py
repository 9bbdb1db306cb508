"""Fixtures of the fault catalogue: an xfail mark's reason carried into the measurements, and a session-wide
safety net that removes every network namespace and mount the catalogue's tests created. Its clusters are
``make_cluster``'s (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator

import pytest

from . import netns
from .recorder import CURRENT_XFAIL


@pytest.fixture(autouse=True)
def _xfail_mark_recorded(request: pytest.FixtureRequest) -> Iterator[None]:
    """Measurements of a test marked xfail carry the mark's reason (the defect) into the table."""
    mark = request.node.get_closest_marker("xfail")
    CURRENT_XFAIL.clear()
    if mark is not None:
        CURRENT_XFAIL.update(reason=mark.kwargs.get("reason", ""), strict=mark.kwargs.get("strict", False))
    try:
        yield
    finally:
        CURRENT_XFAIL.clear()


@pytest.fixture(scope="session", autouse=True)
def _no_namespaces_or_mounts_left() -> Iterator[None]:
    """Whatever a test's own ``finally`` missed: this session's namespaces and mounts go at its end."""
    try:
        yield
    finally:
        netns.remove_all_of_this_session()
        for target in list(MOUNTED):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["umount", "-l", target], capture_output=True, timeout=30, check=False)
            MOUNTED.discard(target)


MOUNTED: set[str] = set()
"""Mount points the tests mounted and have not unmounted yet."""


@pytest.fixture(scope="module")
def namespaces_usable() -> None:
    """Skip the module's tests where network namespaces cannot be made (not root, no ``ip``)."""
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)

