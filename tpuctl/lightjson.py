"""JSON for the light path (``tpuctl barrier``, ``status``, ``env``) without importing the json package.

``import json`` costs about 10 ms where nothing else loaded ``re`` yet (an installed tpuctl: its
decoder and encoder compile regular expressions when imported); ``python -c pass`` itself takes 15-25
ms. The json package is a thin layer over CPython's C accelerator ``_json``, which imports nothing: this
module calls it the way :mod:`json` does (``json.decoder.JSONDecoder``, ``json.encoder.JSONEncoder``)
and gives the same text and values as ``json.loads`` / ``json.dumps`` with their default options (and
``indent``, ``sort_keys``). Where ``_json`` is missing (another Python), the json package does the work.
"""

# No `from __future__ import annotations` here: that statement imports the __future__ module, about
# 0.15 ms before the light path's request. Annotations naming what only the type checker imports are quoted.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

try:
    import _json
except ImportError:  # pragma: no cover - CPython always has it
    _json = None  # type: ignore[assignment]

__all__ = ["dumps", "loads"]

_WHITESPACE = " \t\n\r"
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _DecoderOptions:
    """What ``_json.make_scanner`` reads from a ``json.JSONDecoder``: its default options."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


def _unserializable(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


if _json is not None:
    _scan = _json.make_scanner(_DecoderOptions())  # type: ignore[arg-type]  # typeshed wants a JSONDecoder


def _encode(value: object, sort_keys: bool = False) -> str:
    """``json.dumps(value)`` by json.encoder's call of ``c_make_encoder``, with its default options (one line,
    ``, `` and ``: ``, ASCII, circular references refused: a new marker table each time, as there)."""
    encoder = _json.make_encoder({}, _unserializable, _json.encode_basestring_ascii, None, ": ", ", ", sort_keys, False, True)
    return "".join(encoder(value, 0))


def loads(text: str | bytes) -> "Any":
    """``json.loads(text)``: ValueError (``json.JSONDecodeError`` where ``_json`` finds the place) when
    ``text`` is not one JSON document, nesting past the recursion limit included."""
    if _json is None:
        import json

        return json.loads(text)
    if isinstance(text, bytes):
        text = text.decode()
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scan(text, start)
    except StopIteration as exc:
        raise ValueError(f"Expecting value: char {exc.value}") from None
    except RecursionError:  # json.loads lets it out; here it is what it is, text that is not a document
        raise ValueError("JSON nested too deeply") from None
    if text[end:].strip(_WHITESPACE):
        raise ValueError(f"Extra data: char {end}")
    return value


def dumps(value: object, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """``json.dumps(value, indent=indent, sort_keys=sort_keys)``, the other options at their defaults."""
    if _json is None:
        import json

        return json.dumps(value, indent=indent, sort_keys=sort_keys)
    if indent is None:
        return _encode(value, sort_keys)
    return _indented(value, " " * indent, "\n", sort_keys)


def _indented(value: object, step: str, newline: str, sort_keys: bool) -> str:
    """One value as json.dumps(indent=...) writes it: containers one item a line, ``,`` and ``: ``."""
    inner = newline + step
    if isinstance(value, dict) and value:
        items = sorted(value.items()) if sort_keys else value.items()
        return (
            "{"
            + inner
            + ("," + inner).join(f"{_key(k)}: {_indented(v, step, inner, sort_keys)}" for k, v in items)
            + newline
            + "}"
        )
    if isinstance(value, (list, tuple)) and value:
        return "[" + inner + ("," + inner).join(_indented(v, step, inner, sort_keys) for v in value) + newline + "]"
    return _encode(value)


def _key(key: object) -> str:
    """A dict key as json writes it: strings as strings, numbers, booleans and None as their JSON text."""
    if isinstance(key, str):
        return str(_json.encode_basestring_ascii(key))
    if key is None or isinstance(key, (bool, int, float)):
        return str(_json.encode_basestring_ascii(_encode(key)))
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")
