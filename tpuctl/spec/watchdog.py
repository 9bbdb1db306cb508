"""The spec's ``watchdog:`` section (:mod:`tpuctl.watchdog.settings` holds the value and its defaults)::

    watchdog:
      hang_timeout: 10m      # from 5s to 7 days
      on_hang: warn          # warn | restart (needs restart: {policy: rejoin}) | fail
      report_every: 10s      # from 500ms to 10m
      straggler: {ratio: 1.25, steps: 50}   # or `straggler: off`
"""

from __future__ import annotations

import math

from tpuctl.durations import Bounds
from tpuctl.spec.checker import Checker, Node, described
from tpuctl.watchdog.settings import (
    HANG_TIMEOUT_BOUNDS_S,
    ON_HANG,
    REPORT_EVERY_BOUNDS_S,
    STRAGGLER_RATIO_BOUNDS,
    STRAGGLER_STEPS_BOUNDS,
    StragglerSettings,
    WatchdogSettings,
)

HANG_TIMEOUT = Bounds(*HANG_TIMEOUT_BOUNDS_S, "a step, a checkpoint or an evaluation may take that long")
REPORT_EVERY = Bounds(*REPORT_EVERY_BOUNDS_S, "more often only costs the coordinator")
WATCHDOG_KEYS = ("hang_timeout", "on_hang", "report_every", "straggler")


def check_watchdog(ck: Checker, node: Node, rejoin: bool | None) -> WatchdogSettings | None:
    """The section's value, or None after recording its problems. ``rejoin``: the spec's restart policy
    is rejoin (None: unknown, the restart section has its own problem)."""
    keys = ck.mapping(node, "watchdog", WATCHDOG_KEYS)
    if keys is None:
        return None
    default = WatchdogSettings()
    hang: float | None = default.hang_timeout
    every: float | None = default.report_every
    if "hang_timeout" in keys:
        hang = ck.duration(keys["hang_timeout"], "watchdog.hang_timeout", HANG_TIMEOUT)
    if "report_every" in keys:
        every = ck.duration(keys["report_every"], "watchdog.report_every", REPORT_EVERY)
    on_hang: str | None = default.on_hang
    if "on_hang" in keys:
        on_hang = ck.choice(keys["on_hang"], "watchdog.on_hang", ON_HANG, "an action")
        if on_hang == "restart" and rejoin is False:
            ck.add(
                keys["on_hang"], "watchdog.on_hang",
                "restart needs the cluster to re-form after a generation ends; expected restart: {policy: rejoin} "
                "beside it, or on_hang: warn or fail",
            )  # fmt: skip
            on_hang = None
    ok, straggler = _straggler(ck, keys["straggler"]) if "straggler" in keys else (True, default.straggler)
    if hang is None or every is None or on_hang is None or not ok:
        return None
    return WatchdogSettings(hang, on_hang, every, straggler)


def _straggler(ck: Checker, node: Node) -> tuple[bool, StragglerSettings | None]:
    """(False, None) after a problem; else (True, the settings, or None for ``off``)."""
    if node.kind == "scalar" and (node.value is False or node.value == "off"):
        return True, None  # YAML reads an unquoted off as false
    keys = ck.mapping(node, "watchdog.straggler", ("ratio", "steps"))
    if keys is None:
        return False, None
    default = StragglerSettings()
    ratio = _ratio(ck, keys["ratio"]) if "ratio" in keys else default.ratio
    low, high = STRAGGLER_STEPS_BOUNDS
    steps = ck.integer(keys["steps"], "watchdog.straggler.steps", low, high) if "steps" in keys else default.steps
    if ratio is None or steps is None:
        return False, None
    return True, StragglerSettings(ratio, steps)


def _ratio(ck: Checker, node: Node) -> float | None:
    low, high = STRAGGLER_RATIO_BOUNDS
    value = node.value
    expected = f"expected a number from {low:g} to {high:g} (1.25: 25 % slower than the cluster's median)"
    if node.kind != "scalar" or isinstance(value, bool) or not isinstance(value, int | float):
        ck.add(node, "watchdog.straggler.ratio", f"got {described(node)}; {expected}")
        return None
    if not (math.isfinite(value) and low <= value <= high):
        ck.add(node, "watchdog.straggler.ratio", f"{node.text} is out of range; {expected}")
        return None
    return float(value)
