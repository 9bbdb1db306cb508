"""The soak's tests import it as ``tools.soak`` (the repository's root on ``sys.path``, as ``python -m`` has it)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
