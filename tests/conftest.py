"""Shared test helpers."""

from __future__ import annotations
