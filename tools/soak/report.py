"""The soak's report: schedules run, faults injected by kind, invariant violations with their seeds, time."""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tools.soak.runner import Result
from tools.soak.schedule import FAULT_KINDS


@dataclass
class Report:
    network: str
    started: float = field(default_factory=time.time)
    results: list[Result] = field(default_factory=list)
    fresh_starts: int = 0
    interrupted: str = ""
    ended: float | None = None

    @property
    def wall_s(self) -> float:
        return (self.ended or time.time()) - self.started

    def faults(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for r in self.results:
            total.update(r.faults)
        return total

    def skipped(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for r in self.results:
            total.update(r.skipped)
        return total

    def violations(self) -> list[tuple[int, str, str, str]]:
        """(seed, invariant, detail, known) of every violation."""
        return [(r.seed, v.invariant, v.detail, v.known) for r in self.results for v in r.violations]

    def detection(self) -> dict[str, dict[str, float]]:
        by_kind: dict[str, list[float]] = {}
        for r in self.results:
            for kind, seconds in r.detections:
                by_kind.setdefault(kind, []).append(seconds)
        return {k: {"count": len(v), "median_s": round(statistics.median(v), 2), "max_s": round(max(v), 2)}
                for k, v in sorted(by_kind.items())}  # fmt: skip

    def to_json(self) -> dict[str, object]:
        seconds = [r.seconds for r in self.results]
        settle = [r.settle_s for r in self.results if r.settle_s is not None]
        return {
            "schema": "tpuctl.soak/v1",
            "network": self.network,
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started)),
            "wall_s": round(self.wall_s, 1),
            "schedules": len(self.results),
            "seeds": [r.seed for r in self.results],
            "seconds_per_schedule": _spread(seconds),
            "settle_s": _spread(settle),
            "fresh_starts": self.fresh_starts,
            "faults": {k: self.faults()[k] for k in FAULT_KINDS},
            "skipped": dict(self.skipped()),
            "detection": self.detection(),
            "violations": [{"seed": s, "invariant": i, "detail": d, "known": k} for s, i, d, k in self.violations()],
            "schedules_with_violations": sorted({r.seed for r in self.results if r.violations}),
            "logs": {str(r.seed): r.logs for r in self.results if r.logs},
            "interrupted": self.interrupted,
        }

    def text(self) -> str:
        doc = self.to_json()
        per = doc["seconds_per_schedule"]
        assert isinstance(per, dict)
        lines = [
            f"soak: {len(self.results)} schedules in {self.wall_s:.0f} s "
            f"({per.get('mean', 0):.1f} s per schedule, median {per.get('median', 0):.1f}, max {per.get('max', 0):.1f}), "
            f"network {self.network}, {self.fresh_starts} fresh cluster starts"
            + (f"; interrupted ({self.interrupted})" if self.interrupted else ""),
            "faults injected: " + ", ".join(f"{k} {n}" for k, n in self.faults().items() if n),
        ]
        if self.skipped():
            lines.append("skipped: " + ", ".join(f"{k} {n}" for k, n in self.skipped().items())
                         + (" (no network namespaces here)" if self.network == "loopback" else ""))  # fmt: skip
        if self.detection():
            lines.append("detection, fault to the last host naming it: " + "; ".join(
                f"{k} median {v['median_s']:.1f} s, max {v['max_s']:.1f} s ({v['count']:g})" for k, v in self.detection().items()))  # fmt: skip
        bad = self.violations()
        seeds = sorted({s for s, *_ in bad})
        lines.append(f"invariant violations: {len(bad)}" + (f" in {len(seeds)} schedules (seeds {', '.join(map(str, seeds))})" if bad else ""))
        for seed, invariant, detail, known in bad:
            lines.append(f"  seed {seed}: {invariant}: {detail}" + (f" [looks like known defect {known}]" if known else ""))
        if seeds:
            lines.append(f"replay one: python -m tools.soak --seed {seeds[0]} --schedules 1   (or make soak SEED={seeds[0]} SCHEDULES=1)")
        return "\n".join(lines)

    def write(self, folder: Path) -> tuple[Path, Path]:
        folder.mkdir(parents=True, exist_ok=True)
        as_json, as_text = folder / "report.json", folder / "report.txt"
        as_json.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        as_text.write_text(self.text() + "\n")
        return as_json, as_text


def _spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"mean": round(statistics.fmean(values), 2), "median": round(statistics.median(values), 2),
            "max": round(max(values), 2), "total": round(sum(values), 1)}  # fmt: skip
