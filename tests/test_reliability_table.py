"""tools/reliability_table.py keeps the reliability page's hand-written sections when it regenerates it."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import reliability_table  # noqa: E402


def test_regenerating_the_page_keeps_every_hand_written_section(tmp_path: Path) -> None:
    page = tmp_path / "reliability.md"
    page.write_text((ROOT / "docs/development/reliability.md").read_text())
    kept = reliability_table.hand_written(page)
    for title in ("## Hosts come back", "## A lost slice", "## Against torchrun elastic", "## The randomised soak"):
        assert title in kept, title
    text = reliability_table.render([], "none", kept=kept)
    assert kept in text and text.index("## The randomised soak") < text.index("## Not covered")
    assert reliability_table.hand_written(tmp_path / "missing.md") == ""
