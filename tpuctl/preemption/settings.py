"""The spec's ``preemption:`` section as a value, with its defaults and bounds.

```yaml
preemption:
  grace: 25s         # SIGTERM to the agent: how long the job gets to reach the agreed step, save and exit
                     # before the agent leaves (under GKE's terminationGracePeriodSeconds and systemd's
                     # TimeoutStopSec, both 30 s by default)
  metadata: auto     # auto: watch the GCE metadata server's instance/preempted and maintenance-event where
                     # one answers (off on backend sim unless GCE_METADATA_HOST or GCE_METADATA_IP names
                     # one); off: never ask it
```
"""

from __future__ import annotations

from dataclasses import dataclass

METADATA_WATCH = ("auto", "off")
GRACE_S = 25.0
GRACE_BOUNDS_S = (1.0, 3600.0)


@dataclass(frozen=True)
class PreemptionSettings:
    grace: float = GRACE_S
    """SIGTERM to the agent: the deadline of the notice it raises for its own host, in seconds."""
    metadata: str = "auto"
    """``auto`` or ``off``: whether the agent watches the GCE metadata server for notices."""
