"""The randomised fault soak: ``make soak`` (500 schedules), ``python -m tools.soak --seed N --schedules 1``
(one schedule, replayed). docs/development/reliability.md, "The randomised soak", says what it does.

* :mod:`tools.soak.schedule`: a seed in, a short list of timed steps out (pure);
* :mod:`tools.soak.invariants`: what must hold after every schedule, judged from what was recorded (pure);
* :mod:`tools.soak.cluster`: the 8-host cluster, its network and every command, each with a deadline;
* :mod:`tools.soak.runner`: performs the steps, records, heals the cluster, checks, reports.

It reuses the test suite's multi-process harness (``tests/harness``) and network namespaces
(``tests/faults/netns.py``): ``tests/`` goes on ``sys.path`` here, as pytest puts it there for the tests.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))
