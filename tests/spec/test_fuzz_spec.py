"""Fuzzing the spec checker with hypothesis-generated specs (issue 9, "Fuzzing in the suite").

Three generators, from the structured to the raw: a valid spec with its values swapped for others of any
type and size (huge numbers, long text, nested lists, durations in and out of bounds); YAML text built from
the spec's own vocabulary and YAML's punctuation (anchors, aliases, merges, tags, flow and block styles,
tabs, quotes); and a valid spec's bytes cut, spliced and bit-flipped. For every input:

* no traceback: ``check_spec_bytes`` returns a SpecCheck, whatever it is given;
* every problem is ``FILE:LINE:COL: ...`` with a real line and column, inside the document;
* a spec that passes holds what ``init`` needs: every duration within its bounds, the interval below the
  timeout, a cluster name of at most 63 characters;
* each problem's text is bounded (no message quotes a megabyte back).

A few hundred examples run in the fast suite; the slow-marked tests run 10,000 of each.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuctl.durations import BARRIER_TIMEOUT, HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT, REGISTER_TIMEOUT
from tpuctl.spec.checker import MAX_MESSAGE_CHARS, MAX_PATH_CHARS
from tpuctl.spec.model import TOP_KEYS, SpecCheck
from tpuctl.spec.yamlfile import check_spec_bytes

SOURCE = "fuzz.yaml"
PROBLEM = re.compile(r"^fuzz\.yaml:(\d+):(\d+): ")
VALID: dict[str, Any] = {
    "cluster": "pod-a",
    "accelerator": "v4-32",
    "backend": "sim",
    "hosts": ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"],
    "coordinator": {"port": 8490, "heartbeat_interval": "1s", "heartbeat_timeout": "30s", "register_timeout": "5m"},
    "barrier_timeout": "10m",
    "meshes": [{"name": "dp", "shape": {"data": 4, "model": 4}, "mode": "ring"}],
    "output": "/run/tpuctl/mapping.json",
}
VALID_TEXT = yaml.safe_dump(VALID, sort_keys=False)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(data: bytes) -> SpecCheck:
    """The checker's verdict, and every property every verdict must have."""
    result = check_spec_bytes(data, SOURCE)  # no exception of any kind: that is the first property
    assert isinstance(result, SpecCheck)
    assert result.ok != bool(result.problems)
    text = data.decode("utf-8", "replace")
    lines = sum(text.count(c) for c in ("\n", "\r", "\x85", "\u2028", "\u2029")) + 1  # YAML's line breaks
    for problem, text in zip(result.problems, result.formatted(), strict=True):
        match = PROBLEM.match(text)
        assert match, text[:300]
        line, column = int(match.group(1)), int(match.group(2))
        assert 1 <= line <= lines and column >= 1, text[:300]
        assert len(problem.message) <= MAX_MESSAGE_CHARS and len(problem.path) <= MAX_PATH_CHARS
    if result.ok:
        spec = result.unwrap()
        waits = spec.coordinator
        assert HEARTBEAT_INTERVAL.problem(waits.heartbeat_interval, "") is None
        assert HEARTBEAT_TIMEOUT.problem(waits.heartbeat_timeout, "") is None
        assert REGISTER_TIMEOUT.problem(waits.register_timeout, "") is None
        assert BARRIER_TIMEOUT.problem(spec.barrier_timeout, "") is None
        assert waits.heartbeat_interval < waits.heartbeat_timeout
        assert 1 <= len(spec.cluster) <= 63 and 1 <= waits.port <= 65535
    return result


# --- 1. a valid spec, its values swapped -----------------------------------------------------------

durations = st.one_of(
    st.sampled_from(["1ms", "99ms", "100ms", "1s", "59m", "1h", "24h", "25h", "168h", "169h", "1e99", "nan", "0s"]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.from_regex(r"\A[0-9]{1,6}(\.[0-9]{1,3})?(ms|s|m|h)\Z"),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**18, max_value=10**60),
    st.floats(),
    st.text(max_size=20),
    st.text(alphabet="a-._0", min_size=60, max_size=70),
    st.sampled_from(["", "x" * 5000, "v4-8", "v5p-16", "2x2x4", "tpuctl/x", "::1", "0.0.0.0", "h:80", "yes"]),
    st.sampled_from(["v4-" + "9" * 5000, "9" * 5000 + "x2x2", "v5p-" + "1" * 40]),  # found: int() past 4,300 digits
    durations,
)
values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.sampled_from([*TOP_KEYS, "x", "name"]), inner, max_size=4)
    ),
    max_leaves=12,
)
PATHS = [
    ("cluster",), ("accelerator",), ("backend",), ("hosts",), ("hosts", 0), ("coordinator",),
    ("coordinator", "port"), ("coordinator", "heartbeat_interval"), ("coordinator", "heartbeat_timeout"),
    ("coordinator", "register_timeout"), ("barrier_timeout",), ("meshes",), ("meshes", 0, "shape"),
    ("meshes", 0, "name"), ("output",), ("auth",), ("num_slices",), ("chips_per_host",), ("topology",),
]  # fmt: skip


def replaced(spec: dict[str, Any], path: tuple[Any, ...], value: object) -> dict[str, Any]:
    """A deep copy of ``spec`` with ``path`` set to ``value`` (created where missing)."""
    out = copy.deepcopy(spec)  # (a YAML round trip here cost the 10,000-example run 3 of its 4 minutes)
    target: Any = out
    for step in path[:-1]:
        if isinstance(target, dict):
            if not isinstance(target.get(step), (dict, list)):
                target[step] = {}
            target = target[step]
        elif isinstance(target, list) and isinstance(step, int) and step < len(target):
            target = target[step]
        else:
            return out
    last = path[-1]
    if isinstance(target, dict) or (isinstance(target, list) and isinstance(last, int) and last < len(target)):
        target[last] = value
    return out


edits = st.lists(st.tuples(st.sampled_from(PATHS), values), min_size=1, max_size=4)
styles = st.sampled_from([{"default_flow_style": False}, {"default_flow_style": True}, {"default_flow_style": None}])


def render(edit_list: list[tuple[tuple[Any, ...], Any]], style: dict[str, Any]) -> bytes:
    spec = VALID
    for path, value in edit_list:
        spec = replaced(spec, path, value)
    return yaml.safe_dump(spec, sort_keys=False, width=10**6, **style).encode()


@FAST
@given(edits, styles)
def test_swapped_values_are_problems_with_positions(edit_list: list[Any], style: dict[str, Any]) -> None:
    check(render(edit_list, style))


@pytest.mark.slow
@pytest.mark.fuzz
@pytest.mark.timeout(900)  # 10,000 examples: minutes on a loaded 2-core machine
@SLOW
@given(edits, styles)
def test_swapped_values_10000(edit_list: list[Any], style: dict[str, Any]) -> None:
    check(render(edit_list, style))


@FAST
@given(st.sampled_from(["heartbeat_interval", "heartbeat_timeout", "register_timeout"]), durations, durations)
def test_any_pair_of_waits_passes_only_within_bounds(name: str, first: object, second: object) -> None:
    waits = {"heartbeat_interval": "1s", "heartbeat_timeout": "30s", "register_timeout": "5m", name: first}
    check(yaml.safe_dump({**VALID, "coordinator": waits, "barrier_timeout": second}).encode())


# --- 2. YAML text from the spec's vocabulary and YAML's punctuation -----------------------------------

TOKENS = [
    *TOP_KEYS, "port", "heartbeat_interval", "name", "shape", "mode", "token_file", "data", "model",
    ": ", ":", "- ", "-", "\n", "\n  ", "\n    ", "\t", " ", "[", "]", "{", "}", ", ", "'", '"', "#", "&a ", "*a",
    "&b ", "*b", "<<: ", "!!str ", "!!int ", "!!map ", "!!binary ", "!x ", "? ", "|", ">", "---\n", "...\n",
    "~", "null", "yes", "no", "0x1f", "0o17", "1_000", "1:30", "1.0e+400", "9" * 80, "1e99", ".inf", ".nan",
    "v4-32", "sim", "10.0.0.1", "fd00::1", "8490", "5s", "250ms", "1h30m", "\\", "\u00e9", "\x85", "\ufeff", "%",
    "@", "`", "\r\n", "\x00", "\x7f", "\U0001f600",
]  # fmt: skip
yaml_texts = st.lists(st.sampled_from(TOKENS), max_size=60).map("".join)


@FAST
@given(yaml_texts)
def test_yaml_from_tokens_never_escapes(text: str) -> None:
    check(text.encode("utf-8", "surrogatepass"))


@pytest.mark.slow
@pytest.mark.fuzz
@pytest.mark.timeout(900)  # 10,000 examples: minutes on a loaded 2-core machine
@SLOW
@given(yaml_texts)
def test_yaml_from_tokens_10000(text: str) -> None:
    check(text.encode("utf-8", "surrogatepass"))


# --- 3. a valid spec's bytes, damaged ---------------------------------------------------------------


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from([VALID_TEXT, yaml.safe_dump(VALID, default_flow_style=True)])).encode())
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        kind = draw(st.sampled_from(["cut", "insert", "delete", "flip", "repeat"]))
        at = draw(st.integers(min_value=0, max_value=max(0, len(data) - 1)))
        if kind == "cut":
            del data[at:]
        elif kind == "insert":
            data[at:at] = draw(st.one_of(st.binary(max_size=8), st.sampled_from([t.encode() for t in TOKENS])))
        elif kind == "delete":
            del data[at : at + draw(st.integers(min_value=1, max_value=8))]
        elif kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif kind == "repeat":
            end = at + draw(st.integers(min_value=1, max_value=40))
            data[at:at] = bytes(data[at:end]) * draw(st.integers(min_value=1, max_value=50))
    return bytes(data)


@FAST
@given(damaged())
def test_damaged_specs_are_problems_with_positions(data: bytes) -> None:
    check(data)


@pytest.mark.slow
@pytest.mark.fuzz
@pytest.mark.timeout(900)  # 10,000 examples: minutes on a loaded 2-core machine
@SLOW
@given(damaged())
def test_damaged_specs_10000(data: bytes) -> None:
    check(data)


def test_the_valid_spec_passes() -> None:
    assert check(VALID_TEXT.encode()).ok
