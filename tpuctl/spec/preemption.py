"""The spec's ``preemption:`` section (:mod:`tpuctl.preemption.settings` holds the value and its defaults)::

    preemption:
      grace: 25s        # SIGTERM to the agent: how long its job gets to save the agreed step (1s to 1h)
      metadata: auto    # auto | off: the GCE metadata server's preemption and maintenance notices
"""

from __future__ import annotations

from tpuctl.durations import Bounds
from tpuctl.preemption.settings import GRACE_BOUNDS_S, METADATA_WATCH, PreemptionSettings
from tpuctl.spec.checker import Checker, Node

GRACE = Bounds(*GRACE_BOUNDS_S, "the hosts need time to agree on a step and save it")
PREEMPTION_KEYS = ("grace", "metadata")


def check_preemption(ck: Checker, node: Node) -> PreemptionSettings | None:
    """The section's value, or None after recording its problems."""
    keys = ck.mapping(node, "preemption", PREEMPTION_KEYS)
    if keys is None:
        return None
    default = PreemptionSettings()
    grace = ck.duration(keys["grace"], "preemption.grace", GRACE) if "grace" in keys else default.grace
    metadata: str | None = default.metadata
    if "metadata" in keys:
        node = keys["metadata"]
        if node.kind == "scalar" and node.value is False:
            metadata = "off"  # YAML reads an unquoted off as false
        else:
            metadata = ck.choice(node, "preemption.metadata", METADATA_WATCH, "a watch setting")
    if grace is None or metadata is None:
        return None
    return PreemptionSettings(grace, metadata)
