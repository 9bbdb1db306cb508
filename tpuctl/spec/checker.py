"""The spec's node tree and the checker that reads it: the generic layer under :mod:`tpuctl.spec.model`.

A :class:`Node` is one value of a spec document and where it was written (:mod:`tpuctl.spec.yamlfile` builds
the tree from YAML, :func:`node_from` from plain Python values); a :class:`Problem` is one thing wrong
with it. ``Checker`` walks a tree collecting problems: each of its methods reads one kind of value (a
mapping's keys, a string, an integer, a boolean, a duration, a list, a host) and returns it, or None
after a problem. The single-value checks it shares with the sections (:func:`host_problem`)
live here too; the wording of suggestions and counts is :mod:`tpuctl.messages`. No YAML, no environment, no I/O.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from tpuctl.durations import Bounds, negative, parse_duration
from tpuctl.errors import InputError
from tpuctl.messages import did_you_mean

# --- the node tree: values with positions ----------------------------------------------------------

NodeKind = Literal["scalar", "mapping", "sequence"]
Scalar = str | int | float | bool | None


@dataclass(frozen=True)
class Node:
    """One value of a spec document and where it was written (1-based; line 0 = no position)."""

    kind: NodeKind
    line: int
    column: int
    value: Scalar = None
    """A scalar's value as YAML reads it (``8476`` -> int, ``yes`` -> True, empty -> None)."""
    text: str = ""
    """A scalar's source text: a plain ``1234`` or ``no`` still spells the string the author meant."""
    plain: bool = True
    """Whether a scalar was written without quotes."""
    entries: tuple[tuple[Node, Node], ...] = ()
    """A mapping's (key, value) pairs in document order, duplicates kept so they can be reported."""
    children: tuple[Node, ...] = ()
    """A sequence's items."""


def node_from(value: object, line: int = 0, column: int = 0) -> Node:
    """A position-less tree from plain Python values (dicts keep their order), for tests and tools."""
    if isinstance(value, dict):
        entries = tuple((node_from(str(k), line, column), node_from(v, line, column)) for k, v in value.items())
        return Node("mapping", line, column, entries=entries)
    if isinstance(value, list | tuple):
        return Node("sequence", line, column, children=tuple(node_from(v, line, column) for v in value))
    if value is None or isinstance(value, str | int | float | bool):
        text = "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        return Node("scalar", line, column, value=value, text=text, plain=not isinstance(value, str))
    raise TypeError(f"node_from: cannot represent {type(value).__name__}")


# --- problems --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec, where it is, and what was expected."""

    line: int
    column: int
    path: str
    """Dotted key path, e.g. ``coordinator.port`` or ``hosts[2]``; empty for the document itself."""
    message: str

    def format(self, source: str) -> str:
        where = f"{source}:{self.line}:{self.column}" if self.line else source
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


# --- single-value checks (also used for environment variables) -------------------------------------

_LABEL_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_HOST_PORT_RE = re.compile(r"^([^:\[\]]+):(\d+)$", re.ASCII)
MAX_NAME = 63


def host_problem(text: str) -> str | None:
    """What is wrong with ``text`` as a host name or IP address (no port), or None."""
    expected = "expected a host name or an IP address, without a port"
    if not text:
        return f"is empty; {expected}"
    if text != text.strip() or any(c.isspace() for c in text):
        return f"{text!r} contains whitespace; {expected}"
    if "://" in text:
        return f"{text!r} is a URL; {expected}"
    if text.startswith("[") or text.endswith("]"):
        return f"{text!r} has brackets; expected an IPv6 address written without [ ] and without a port"
    port = _HOST_PORT_RE.match(text)
    if port:
        return f"{text!r} has a port; {expected}"
    if ":" in text:
        try:
            address = ipaddress.IPv6Address(text)
        except ValueError:
            return f"{text!r} is not an IPv6 address; {expected}"
        return f"{text!r} is the unspecified address; {expected}" if address.is_unspecified else None
    labels = text[:-1].split(".") if text.endswith(".") else text.split(".")
    if all(label.isdigit() for label in labels):
        try:
            ipv4 = ipaddress.IPv4Address(text)
        except ValueError:
            return f"{text!r} is not an IPv4 address; expected four numbers 0-255, like 10.0.0.1"
        return f"{text!r} is the unspecified address; {expected}" if ipv4.is_unspecified else None
    if len(text) > 253:
        return f"host name is {len(text)} characters long; expected at most 253"
    for label in labels:
        if not _LABEL_RE.match(label):
            return (
                f"{text!r} is not a host name: label {label!r} is not letters, digits and inner '-' "
                "(at most 63 characters); expected a DNS name or an IP address"
            )
    return None


# --- the checker ------------------------------------------------------------------------------------

MAX_MESSAGE_CHARS = 1000
"""Longest problem message: one quoting a huge value keeps its start and its end (what was expected)."""
MAX_PATH_CHARS = 200


def elided(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text``, or its first and last ``limit / 2`` characters around ``...N characters...``."""
    if len(text) <= limit:
        return text
    half = limit // 2 - 20
    return f"{text[:half]} ...({len(text) - 2 * half:,} characters)... {text[-half:]}"


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def described(node: Node) -> str:
    """How a message names a YAML value: its kind and text (``integer 3``, ``string 'x'``, ``a mapping``)."""
    if node.kind == "mapping":
        return "a mapping"
    if node.kind == "sequence":
        return "a list"
    if node.value is None:
        return "an empty value"
    if isinstance(node.value, bool):
        return f"boolean {node.text}"
    if isinstance(node.value, int):
        return f"integer {node.text}"
    if isinstance(node.value, float):
        return f"number {node.text}"
    return f"string {node.value!r}"


def _is_null(node: Node) -> bool:
    return node.kind == "scalar" and node.value is None and node.plain


class Checker:
    """Walks a node tree collecting problems; each method returns the value or None after a problem."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, node: Node, path: str, message: str) -> None:
        """Record a problem; a path or message quoting a huge value is elided in the middle."""
        self.problems.append(Problem(node.line, node.column, elided(path, MAX_PATH_CHARS), elided(message)))

    def entries(self, node: Node, path: str, what: str = "key") -> list[tuple[str, Node, Node]]:
        """A mapping's (name, key node, value node), first occurrence of each name; repeats reported."""
        first: dict[str, Node] = {}
        out: list[tuple[str, Node, Node]] = []
        for key, value in node.entries:
            if key.kind != "scalar" or key.value is None:
                self.add(key, path, f"a key is {described(key)}; expected a plain name")
                continue
            name = key.text
            if name in first:
                seen = first[name]
                self.add(
                    key, join_path(path, name),
                    f"repeated {what} (first at line {seen.line}, column {seen.column}); expected each {what} once",
                )  # fmt: skip
                continue
            first[name] = key
            out.append((name, key, value))
        return out

    def mapping(
        self,
        node: Node,
        path: str,
        known: Sequence[str],
        required: dict[str, str] | None = None,
        hints: dict[str, str] | None = None,
    ) -> dict[str, Node] | None:
        """Known keys -> value nodes (an empty value counts as absent); unknown keys get a "did you mean"
        (or the matching entry of ``hints``); missing required keys are reported at the mapping."""
        if node.kind != "mapping":
            self.add(node, path, f"got {described(node)}; expected a mapping with keys {', '.join(known)}")
            return None
        found: dict[str, Node] = {}
        for name, key, value in self.entries(node, path):
            if name in known:
                found[name] = value
            else:
                self.add(key, join_path(path, name), "unknown key; " + (hints or {}).get(name, did_you_mean(name, known)))
        for name, expected in (required or {}).items():
            if name not in found or _is_null(found[name]):
                where = found.get(name, node)
                self.add(where, join_path(path, name), f"missing; expected {expected}")
        return {k: v for k, v in found.items() if not _is_null(v)}

    def string(self, node: Node, path: str, expected: str) -> str | None:
        if node.kind == "scalar" and isinstance(node.value, str):
            return node.value
        if node.kind == "scalar" and node.plain and type(node.value) in (int, float):
            return node.text  # a plain 1234 is the string the author typed
        why = ""
        if isinstance(node.value, bool) and node.plain:
            why = f" (YAML reads an unquoted {node.text} as a boolean: quote it)"
        self.add(node, path, f"got {described(node)}{why}; expected {expected}")
        return None

    def choice(
        self, node: Node, path: str, choices: Sequence[str], what: str, hint: Callable[[str], str] | None = None
    ) -> str | None:
        """One of ``choices``, a string as :meth:`string` reads it; another word is "'x' is not ``what``; "
        and ``hint(word)``, by default a "did you mean" or the list of choices."""
        value = self.string(node, path, ", ".join(choices[:-1]) + " or " + choices[-1])
        if value is not None and value not in choices:
            tail = hint(value) if hint is not None else did_you_mean(value, choices)
            self.add(node, path, f"{value!r} is not {what}; {tail}")
            return None
        return value

    def integer(self, node: Node, path: str, low: int, high: int | None = None) -> int | None:
        bounds = f"from {low} to {high}" if high is not None else f">= {low}"
        value = node.value
        if node.kind != "scalar" or isinstance(value, bool) or not isinstance(value, int):
            quoted = " (without quotes)" if isinstance(value, str) and value.strip().isdigit() else ""
            self.add(node, path, f"got {described(node)}; expected an integer {bounds}{quoted}")
            return None
        if value < low or (high is not None and value > high):
            self.add(node, path, f"{value} is out of range; expected an integer {bounds}")
            return None
        return value

    def boolean(self, node: Node, path: str) -> bool | None:
        if node.kind == "scalar" and isinstance(node.value, bool):
            return node.value
        self.add(node, path, f"got {described(node)}; expected true or false")
        return None

    def duration(self, node: Node, path: str, bounds: Bounds | None = None) -> float | None:
        """A positive duration within ``bounds``: a number of seconds, or text like ``250ms``, ``5s``, ``1h30m``."""
        value = node.value
        expected = "expected e.g. 250ms, 5s, 10m, 1h30m, or seconds as a number"
        seconds: float
        if node.kind == "scalar" and not isinstance(value, bool) and isinstance(value, int | float):
            if value < 0:
                self.add(node, path, f"{negative(node.text)}; {expected}")
                return None
            if not (value > 0 and (isinstance(value, int) or math.isfinite(value))):
                self.add(node, path, f"{node.text} is not a positive, finite duration; {expected}")
                return None
            if isinstance(value, int) and value > 10**9:  # beyond every bound, and float(10**400) overflows
                value = math.inf
            seconds, written = float(value), node.text
        elif node.kind == "scalar" and isinstance(value, str):
            try:
                seconds = parse_duration(value, what=path)
            except InputError as exc:
                message = exc.message.removeprefix(f"{path}: ")
                self.add(node, path, f"{message}; {expected}")
                return None
            written = repr(value)
        else:
            self.add(node, path, f"got {described(node)}; {expected}")
            return None
        if bounds is not None and (problem := bounds.problem(seconds, written)):
            self.add(node, path, problem)
            return None
        return seconds

    def sequence(self, node: Node, path: str, expected: str) -> tuple[Node, ...] | None:
        if node.kind == "sequence":
            return node.children
        self.add(node, path, f"got {described(node)}; expected {expected}")
        return None

    def host(self, node: Node, path: str) -> str | None:
        text = self.string(node, path, "a host name or an IP address")
        if text is None:
            return None
        problem = host_problem(text)
        if problem:
            port = " (the coordinator's port is coordinator.port)" if _HOST_PORT_RE.match(text) else ""
            self.add(node, path, problem + port)
            return None
        return text
