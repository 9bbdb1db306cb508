"""Shared test set-up."""

from __future__ import annotations

import os

# libtpu (the oracle, via jax.experimental.topologies) takes a machine-wide lock file unless told
# otherwise; several test processes on one machine (or a developer's second run) would then fail.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
