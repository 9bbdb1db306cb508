"""The ledger as text, as an SVG timeline (well-formed XML: a band per generation, the buckets' segments, each
named host's failures and returns) and on the command line: ``tpuctl goodput`` from task 0's journal when no
agent runs, its formats and exit codes; ``tpuctl status``'s one line."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tpuctl.cli import main
from tpuctl.cli.light import BUCKET_LABELS, goodput_line, render_status
from tpuctl.coordination.ledger import ServiceLedger
from tpuctl.goodput.ledger import BUCKETS, LABELS, account, fold
from tpuctl.goodput.timeline import KEEP_GENERATIONS, HostMark, PreemptionNotice, Timeline
from tpuctl.render.goodput import COLOURS, MAX_HOST_ROWS, ledger_svg, ledger_text

NS = "{http://www.w3.org/2000/svg}"
T0 = 1_700_000_000.0


def two_generations() -> Timeline:
    t = Timeline("pod", T0)
    t.registered(T0 + 1.0)
    t.formed(T0 + 2.0)
    t.progress(0, 1, T0 + 3.0, step_time=0.1, at=T0 + 3.0)
    t.progress(0, 30, T0 + 6.0, step_time=0.1, checkpointed=20, at=T0 + 6.0)
    t.record(PreemptionNotice(3, "metadata: preempted", T0 + 30.0, T0 + 7.0))
    t.ended(T0 + 10.0, failed_at=T0 + 9.0, cause="task 2 (10.0.0.3) failed: killed",
            failures=[HostMark(2, T0 + 9.0, "killed")], total=1)  # fmt: skip
    t.next_generation(2, T0 + 10.0)
    t.returned(2, T0 + 12.8)
    t.registered(T0 + 13.0)
    t.formed(T0 + 13.5)
    t.progress(1, 21, T0 + 15.0, step_time=0.1, at=T0 + 15.0)
    return t


def svg_root(document: dict[str, Any]) -> ET.Element:
    root = ET.fromstring(ledger_svg(document).encode())
    assert root.tag == f"{NS}svg"
    return root


def of_class(root: ET.Element, tag: str, cls: str) -> list[ET.Element]:
    return [e for e in root.iter(f"{NS}{tag}") if e.get("class") == cls]


def test_the_svg_has_a_band_per_generation_the_buckets_coloured_and_each_host_s_failure_and_return() -> None:
    document = account(two_generations(), T0 + 20.0).to_json()
    root = svg_root(document)
    bands = of_class(root, "g", "generation")
    assert [b.get("data-generation") for b in bands] == ["1", "2"]
    segments = of_class(root, "rect", "segment")
    expected = [s[2] for g in document["generations"] for s in g["segments"]]
    assert [s.get("data-bucket") for s in segments] == expected
    assert all(s.get("fill") == COLOURS[str(s.get("data-bucket"))] for s in segments)
    widths = [float(s.get("width") or 0) for s in segments]
    lost = next(float(s.get("width") or 0) for s in segments if s.get("data-bucket") == "lost")
    assert lost == pytest.approx(sum(widths) * 4.0 / 20.0, abs=0.05)  # 4 s of 20 s
    rows = [t.text for t in root.iter(f"{NS}text") if t.get("class") == "row"]
    assert "task 2" in rows and "task 3" in rows
    assert len(of_class(root, "g", "failure")) == 1 and len(of_class(root, "path", "return")) == 1
    assert len(of_class(root, "path", "notice")) == 1
    assert len(of_class(root, "rect", "swatch")) == len(BUCKETS)
    title = root.find(f"{NS}title")
    assert title is not None and title.text == "cluster pod: goodput 35.0 % of 20.0 s"


def test_the_svg_stays_bounded_a_band_for_the_folded_generations_and_a_count_of_hosts_not_drawn() -> None:
    t = Timeline("pod", T0)
    at = T0
    for number in range(1, 2 * KEEP_GENERATIONS):
        t.formed(at + 1.0)
        t.ended(at + 2.0, failed_at=at + 1.5, cause="x", failures=[HostMark(number, at + 1.5, "x")], total=1)
        t.next_generation(number + 1, at + 2.0)
        at += 2.0
        fold(t)
    document = account(t, at + 1.0).to_json()
    root = svg_root(document)
    bands = of_class(root, "g", "generation")
    assert len(bands) == KEEP_GENERATIONS + 1 and bands[0].get("data-generation") == f"1-{KEEP_GENERATIONS}"
    rows = [t.text or "" for t in root.iter(f"{NS}text") if t.get("class") == "row"]
    assert sum(r.startswith("task ") for r in rows) == MAX_HOST_ROWS
    assert any(r == f"... and {KEEP_GENERATIONS - 1 - MAX_HOST_ROWS:,} more hosts not drawn" for r in rows), rows
    assert len(ledger_svg(document)) < 200_000


def test_the_text_is_a_table_of_buckets_by_generation_then_how_each_generation_ended() -> None:
    text = ledger_text(account(two_generations(), T0 + 20.0).to_json())
    lines = text.splitlines()
    assert lines[0].startswith("cluster pod: goodput 35.0 % of 20.0 s since ")
    assert lines[0].endswith("(generation 2, now: productive)")
    assert lines[2].split() == ["BUCKET", "TOTAL", "%", "GEN", "1", "GEN", "2"]
    assert "lost work                 4.0 s  20.0  4.0 s      -" in lines
    assert any(line.startswith("generation 2") and "back: task 2 at " in line and line.endswith(":32.8") for line in lines)
    assert any(line.startswith("generation 1") and "task 2 (10.0.0.3) failed: killed" in line and "back:" not in line for line in lines)
    assert any(line.startswith("generation 2") and "back: task 2 at" in line for line in lines)
    assert "1 preemption notice (first: task 3, metadata: preempted)" in text


def test_status_says_the_ledger_in_one_line() -> None:
    assert BUCKET_LABELS == LABELS
    summary = {"fraction": 0.4123, "bucket": "restart", "wall_seconds": 4000.0, "productive_seconds": 1649.2, "generation": 3}
    assert goodput_line(summary) == "goodput      41.2 % of 67 min (now: detection and restart, generation 3)"
    result = {"cluster": "pod", "task": 0, "coordinator": "127.0.0.2:1", "service_incarnation": "5", "tasks": [],
              "goodput": summary}  # fmt: skip
    lines = render_status(result).splitlines()
    assert sum(line.startswith("goodput") for line in lines) == 1
    down = goodput_line({**summary, "bucket": None})
    assert down.endswith("(the cluster is down, generation 3)")


# --- the command ----------------------------------------------------------------------------------------------


def journal_of(folder: Path, final: bool = False) -> None:
    """Task 0's state dir after its agent ended: its journal only."""
    ledger = ServiceLedger.open("pod", generation=1, started=T0, now=T0, journal_path=folder / "goodput.jsonl")
    timeline = two_generations()
    if final:
        timeline.ended(T0 + 18.0, failed_at=T0 + 17.0, cause="task 1 failed: no heartbeat", failures=[], total=1, final=True)
    ledger.timeline = timeline
    ledger.close(T0 + 20.0)


def goodput(folder: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``tpuctl goodput --state-dir FOLDER ARGS`` in this process, through the entry point (errors reported)."""
    with pytest.raises(SystemExit) as exited:
        main(["goodput", "--state-dir", str(folder), *args])
    out, err = capsys.readouterr()
    return int(exited.value.code or 0), out, err


def test_with_no_agent_the_command_reads_task_0_s_journal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal_of(tmp_path)
    code, out, err = goodput(tmp_path, "--json", capsys=capsys)
    assert code == 0, err
    document = json.loads(out)
    assert document["schema"] == "tpuctl.goodput/v1" and document["until"] == T0 + 20.0
    assert "the ledger from its journal" in err
    assert any("no agent runs" in note for note in document["notes"])
    code, out, err = goodput(tmp_path, capsys=capsys)
    assert code == 0 and out.startswith("cluster pod: goodput 35.0 % of 20.0 s"), err
    svg = tmp_path / "ledger.svg"
    code, out, err = goodput(tmp_path, "--format", "svg", "--out", str(svg), capsys=capsys)
    assert code == 0 and ET.fromstring(svg.read_bytes()).tag == f"{NS}svg" and f"wrote {svg}" in err


def test_a_cluster_that_failed_for_good_is_printed_then_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal_of(tmp_path, final=True)
    code, out, err = goodput(tmp_path, capsys=capsys)
    assert code == 3 and "final: task 1 failed: no heartbeat" in out
    assert "tpuctl: error: the cluster is in error: task 1 failed: no heartbeat" in err


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--format", "svg"], 2, "--format svg needs --out FILE"),
        (["--format", "jsno"], 2, "did you mean 'json'"),
        ([], 5, "no tpuctl agent is running for state dir"),
    ],
)
def test_bad_options_and_no_agent_without_a_journal_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], code: int, message: str
) -> None:
    got, out, err = goodput(tmp_path, *args, capsys=capsys)
    assert (got, out) == (code, "") and message in err and "Traceback" not in err, err


def test_a_corrupt_journal_is_refused_with_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "goodput.jsonl").write_text('{"journal": "tpuctl.goodput-journal/v1", "cluster": "pod", "started": 1}\n[]\n')
    code, _, err = goodput(tmp_path, capsys=capsys)
    assert code == 5 and "line 2: not one of the journal's records" in err and "hint: move" in err, err
