"""tpuctl.lightjson gives json's text and values (it calls json's C accelerator the way json does)."""

from __future__ import annotations

import json
import math
import random

import pytest

from tpuctl import lightjson

DOCUMENTS: list[object] = [
    {},
    [],
    0,
    -1.5,
    1e300,
    2.5e-8,
    "plain",
    "é\u2028\n\"\\\t\x00 \U0001f600",
    None,
    True,
    {"a": [1, 2, {"b": []}], "z": {}, "c": {"d": None, "e": False}},
    [[], [[]], {"k": [1.0, 2.5e-8, -0.0]}],
    {"b": 1, "a": {"d": 2, "c": 3}},
    (1, "tuple", (2,)),
    float("inf"),
    float("-inf"),
    2**70,
]


@pytest.mark.parametrize("doc", DOCUMENTS, ids=range(len(DOCUMENTS)))
@pytest.mark.parametrize(
    "options", [{}, {"indent": 2}, {"sort_keys": True}, {"indent": 2, "sort_keys": True}, {"indent": 0}]
)
def test_dumps_writes_what_json_writes(doc: object, options: dict[str, object]) -> None:
    assert lightjson.dumps(doc, **options) == json.dumps(doc, **options)  # type: ignore[arg-type]


def test_dumps_writes_keys_that_are_not_strings_as_json_does() -> None:
    doc = {7: "i", 2.5: "f", True: "t", None: "n", "s": [1]}
    assert lightjson.dumps(doc) == json.dumps(doc)
    assert lightjson.dumps(doc, indent=2) == json.dumps(doc, indent=2)


@pytest.mark.parametrize("doc", DOCUMENTS, ids=range(len(DOCUMENTS)))
def test_loads_reads_what_json_reads(doc: object) -> None:
    text = json.dumps(doc, indent=2)
    assert repr(lightjson.loads(text)) == repr(json.loads(text))
    assert repr(lightjson.loads(f" \n{text}\r\n".encode())) == repr(json.loads(text))
    assert math.isnan(lightjson.loads("NaN"))


def test_loads_of_random_documents_matches_json() -> None:
    rng = random.Random(7)

    def value(depth: int) -> object:
        kind = rng.randrange(7 if depth < 4 else 4)
        if kind == 0:
            return rng.choice([None, True, False])
        if kind == 1:
            return rng.randint(-(2**40), 2**40)
        if kind == 2:
            return rng.uniform(-1e6, 1e6)
        if kind == 3:
            return "".join(rng.choice("ab\"\\é\n\u00ff ") for _ in range(rng.randrange(6)))
        if kind in (4, 5):
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        return {f"k{rng.randrange(9)}": value(depth + 1) for _ in range(rng.randrange(4))}

    for _ in range(300):
        doc = value(0)
        text = json.dumps(doc)
        assert lightjson.loads(text) == json.loads(text)
        assert lightjson.dumps(doc) == text
        assert lightjson.dumps(doc, indent=2) == json.dumps(doc, indent=2)


@pytest.mark.parametrize(
    "text", ["", "  ", "{", "[1,]", "1 2", "nul", '{"a": 1} x', "\x00", "{'a': 1}", "[" * 100_000 + "]" * 100_000]
)
def test_loads_refuses_what_is_not_one_document(text: str) -> None:
    with pytest.raises(ValueError):
        lightjson.loads(text)


def test_dumps_refuses_what_json_refuses() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        lightjson.dumps({"a": object()})
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        lightjson.dumps(loop)
    assert lightjson.dumps(["after an error the next call starts afresh"]) == '["after an error the next call starts afresh"]'
