"""Fuzzing the mapping loader with mutations of a valid mapping file (issue 9, "Fuzzing in the suite").

Mutations: truncation at any byte, a value swapped for another type (or a huge number, a deep nesting, a
long text), a key renamed or repeated, bytes inserted, deleted or flipped. ``tpuctl.load_mapping`` reads
each file and must return a mapping or raise MappingError (exit 7) whose message names the file: never a
ValueError, RecursionError, KeyError or any other traceback. A mutated file that still loads must be
consistent (its own checks pass when it is written back and read again).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mapping_cases import sim_mapping

import tpuctl
from tpuctl.mapping.file import from_json, to_json
from tpuctl.mapping.model import DeviceMapping

GOOD_TEXT = to_json(sim_mapping(accelerator="v4-16"))
MULTI_TEXT = to_json(sim_mapping(accelerator="v5litepod-8", num_slices=2))
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=5_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])

replacements = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=10),
    st.sampled_from([-1, 0, 2**31, 2**63, 2**64, 10**30, "", "x" * 10_000, [], {}, [[[]]], {"a": {}}]),
    st.lists(st.integers(min_value=-3, max_value=40), max_size=6),
)  # fmt: skip
RAW = ["9" * 400, "1e999", "-0", "1.5", "[" * 200 + "]" * 200, '"\\ud800"', '"\\u0000"', "NaN", "true", "null"]


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON document (keys and list indexes)."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:6]):
            found += paths(item, (*prefix, index))
    return found


@st.composite
def mutated(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from([GOOD_TEXT, MULTI_TEXT]))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        kind = draw(st.sampled_from(["swap", "swap", "raw", "rename", "repeat", "cut", "insert", "delete", "flip"]))
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if kind in ("swap", "raw", "rename", "repeat") and isinstance(data, dict):
            path = draw(st.sampled_from(paths(data)[1:]))
            parent: Any = data
            for step in path[:-1]:
                parent = parent[step]
            last = path[-1]
            if kind == "swap":
                parent[last] = draw(replacements)
                text = json.dumps(data, indent=draw(st.sampled_from([None, 1])))
            elif kind == "raw":
                marker = "\u0001MARK\u0001"
                parent[last] = marker
                text = json.dumps(data).replace(json.dumps(marker), draw(st.sampled_from(RAW)))
            elif kind == "rename" and isinstance(parent, dict):
                parent[draw(st.sampled_from(["x", last + "_", last.upper(), "schema_version"]))] = parent.pop(last)
                text = json.dumps(data)
            elif kind == "repeat" and isinstance(parent, dict):
                item = json.dumps({last: parent[last]})[1:-1]
                text = json.dumps(data)[:-1] + ", " + item + "}"
            continue
        at = draw(st.integers(min_value=0, max_value=max(0, len(text) - 1)))
        if kind == "cut":
            text = text[:at]
        elif kind == "insert":
            text = text[:at] + draw(st.sampled_from([",", "]", "}", "{", "[", '"', "0", "-", "\\", " ", *RAW])) + text[at:]
        elif kind == "delete":
            text = text[:at] + text[at + draw(st.integers(min_value=1, max_value=10)) :]
        elif text:
            text = text[:at] + chr(ord(text[at]) ^ (1 << draw(st.integers(min_value=0, max_value=6)))) + text[at:]
    return text


def load(tmp_path: Path, text: str) -> None:
    path = tmp_path / "mapping.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        loaded = tpuctl.load_mapping(path, task=0)
    except tpuctl.MappingError as exc:
        assert exc.exit_code == 7
        assert str(path) in exc.message, exc.message[:300]
        assert len(exc.message) < 20_000
        return
    assert isinstance(loaded, DeviceMapping)
    again = from_json(to_json(loaded), "again")  # a file that loads is a consistent mapping
    assert again.tasks == loaded.tasks and again.devices == loaded.devices


@FAST
@given(mutated())
def test_mutated_mappings_load_or_name_the_file(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    load(tmp_path_factory.mktemp("fuzz"), text)


@pytest.mark.slow
@pytest.mark.fuzz
@SLOW
@given(mutated())
def test_mutated_mappings_5000(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    load(tmp_path_factory.mktemp("fuzz"), text)


def test_the_unmutated_mappings_load(tmp_path: Path) -> None:
    for text in (GOOD_TEXT, MULTI_TEXT):
        load(tmp_path, text)
