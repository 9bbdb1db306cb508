"""tpuctl.messages: the one wording of suggestions, counts, bounded lists and tables."""

from __future__ import annotations

import pytest

from tpuctl.messages import closest, did_you_mean, listed, plural, sample, suggestion, table


def test_closest_finds_the_nearest_choice_or_none() -> None:
    assert closest("jaxx", ["sim", "jax", "tensorflow"]) == "jax"
    assert closest("zzz", ["sim", "jax"]) is None
    assert closest("v4-8", iter(["v4-8", "v5p-8"])) == "v4-8"  # any iterable
    assert closest("tf", ["tensorflow"]) is None
    assert closest("tensorflw", ["tensorflow"], cutoff=0.9) == "tensorflow"


def test_suggestion_quotes_the_value() -> None:
    assert suggestion("v4-8") == "did you mean 'v4-8'?"
    assert suggestion("2x2x4") == "did you mean '2x2x4'?"


def test_did_you_mean_suggests_or_falls_back() -> None:
    assert did_you_mean("prot", ["host", "port"]) == "did you mean 'port'?"
    assert did_you_mean("zzz", ["ring", "jax"]) == "expected one of ring, jax"
    assert did_you_mean("zzz", ["ring"], otherwise="modes are ring") == "modes are ring"
    assert did_you_mean("zzz", ["ring"], otherwise="") == ""
    assert did_you_mean("v4_8", ["v4-8"], cutoff=0.5, otherwise="") == "did you mean 'v4-8'?"


@pytest.mark.parametrize(
    ("count", "noun", "expected"),
    [
        (0, "host", "0 hosts"),
        (1, "host", "1 host"),
        (4, "host", "4 hosts"),
        (2, "entry", "2 entries"),
        (1, "entry", "1 entry"),
    ],
)
def test_plural(count: int, noun: str, expected: str) -> None:
    assert plural(count, noun) == expected


def test_listed_indents_and_bounds() -> None:
    assert listed([]) == ""
    assert listed(["a", "b"]) == "  a\n  b"
    assert listed([f"p{i}" for i in range(12)]) == "\n".join([f"  p{i}" for i in range(10)] + ["  ... and 2 more"])
    assert listed(["x", "y", "z"], limit=2) == "  x\n  y\n  ... and 1 more"
    assert listed(["two\nlines", "c"]) == "  two\n  lines\n  c"
    assert listed(["p"] * 1_502, limit=2).endswith("... and 1,500 more")


def test_sample_bounds_one_line() -> None:
    assert sample([]) == ""
    assert sample(["h0", "h1"]) == "h0, h1"
    assert sample(range(10)) == "0, 1, 2, 3, 4, 5, 6, 7, 8, 9"
    hosts = [f"h{i}" for i in range(2_274)]
    assert sample(hosts, limit=3) == "h0, h1, h2, ... and 2,271 more"
    assert sample(range(11)) == "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ... and 1 more"
    # a sample of a larger whole: the count is of the whole
    assert sample(["task 7", "task 8"], total=2_273) == "task 7, task 8, ... and 2,271 more"
    assert sample(["a", "b"], total=2) == "a, b"
    assert sample(["a", "b", "c"], limit=2, total=10) == "a, b, ... and 8 more"


def test_table_aligns_left_and_strips() -> None:
    rows = [["HOST", "STATE", "NOTE"], ["h-1", "up", ""], ["host-10", "down", "lost"]]
    assert table(rows) == ["HOST     STATE  NOTE", "h-1      up", "host-10  down   lost"]
    assert table(rows, indent="  ") == ["  HOST     STATE  NOTE", "  h-1      up", "  host-10  down   lost"]
    assert table([]) == []
    assert table([["only"], ["column"]]) == ["only", "column"]
    # the last cell is never padded, even when long; a short row does not widen others
    assert table([["a", "a very long last cell"], ["bb", "c"], ["ccc"]]) == [
        "a   a very long last cell",
        "bb  c",
        "ccc",
    ]
