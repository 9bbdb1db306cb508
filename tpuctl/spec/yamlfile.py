"""The YAML edge of the cluster spec: a file becomes a position-carrying node tree, then a ClusterSpec.

``yaml.compose`` (SafeLoader) keeps every value's line and column, so the pure checker in
:mod:`tpuctl.spec.model` can point at each problem; scalars are typed by the SafeLoader's own constructors.
Nothing here raises a YAML exception or a traceback at a user: syntax errors, bytes that are not UTF-8,
unknown tags and recursive aliases all become problems (``FILE:LINE:COL: YAML syntax error: ...``).
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from yaml.constructor import SafeConstructor

from tpuctl.errors import InputError
from tpuctl.spec.checker import Node, Problem, Scalar
from tpuctl.spec.model import TOP_SUMMARY, ClusterSpec, SpecCheck, check_spec

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
MAX_DEPTH = 64  # a spec is 4 levels deep; deeper is a mistake or an attack on the recursion limit


class _TreeBuilder:
    """yaml.Node -> spec.Node. Aliases are shared (memo), cycles and bad tags become problems."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self._constructor = SafeConstructor()
        self._memo: dict[int, Node] = {}
        self._active: set[int] = set()

    def _problem(self, node: yaml.Node, message: str) -> None:
        mark = node.start_mark
        self.problems.append(Problem(mark.line + 1, mark.column + 1, "", message))

    def build(self, node: yaml.Node, depth: int = 0) -> Node:
        key = id(node)
        if key in self._memo:
            return self._memo[key]
        line, column = node.start_mark.line + 1, node.start_mark.column + 1
        if key in self._active:
            self._problem(node, "YAML error: an alias refers to a node that contains it; expected no recursion")
            return Node("scalar", line, column)
        if depth > MAX_DEPTH:
            self._problem(node, f"YAML error: nested deeper than {MAX_DEPTH} levels")
            return Node("scalar", line, column)
        self._active.add(key)
        try:
            built = self._build(node, depth, line, column)
        finally:
            self._active.discard(key)
        self._memo[key] = built
        return built

    def _build(self, node: yaml.Node, depth: int, line: int, column: int) -> Node:
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, line, column)
        if node.tag not in (_MAP_TAG, _SEQ_TAG):
            self._problem(node, f"YAML error: tag {node.tag!r} is not supported; expected plain mappings and lists")
        if isinstance(node, yaml.SequenceNode):
            return Node("sequence", line, column, children=tuple(self.build(n, depth + 1) for n in node.value))
        assert isinstance(node, yaml.MappingNode)
        return Node("mapping", line, column, entries=self._entries(node, depth))

    def _entries(self, node: yaml.MappingNode, depth: int) -> tuple[tuple[Node, Node], ...]:
        """Pairs in order; ``<<: *defaults`` merge keys add the keys not written out (YAML merge rules)."""
        own = [(k, v) for k, v in node.value if k.tag != _MERGE_TAG]
        entries = [(self.build(k, depth + 1), self.build(v, depth + 1)) for k, v in own]
        names = {k.text for k, _ in entries}
        for merge_key, source in ((k, v) for k, v in node.value if k.tag == _MERGE_TAG):
            sources = source.value if isinstance(source, yaml.SequenceNode) else [source]
            for part in sources:
                if not isinstance(part, yaml.MappingNode):
                    self._problem(merge_key, "YAML error: << merges a mapping (or a list of them), e.g. <<: *defaults")
                    continue
                for key, value in self.build(part, depth + 1).entries:
                    if key.text not in names:
                        names.add(key.text)
                        entries.append((key, value))
        return tuple(entries)

    def _scalar(self, node: yaml.ScalarNode, line: int, column: int) -> Node:
        value: object
        try:
            value = self._constructor.construct_object(node)
        except yaml.YAMLError as exc:
            self._problem(node, f"YAML error: {getattr(exc, 'problem', None) or exc}; expected a plain value")
            value = node.value
        # timestamps, !!binary and the like: keep the text the author wrote
        scalar: Scalar = value if value is None or isinstance(value, str | int | float | bool) else node.value
        return Node("scalar", line, column, value=scalar, text=node.value, plain=node.style is None)


def _position(text: str, index: int) -> tuple[int, int]:
    """1-based line and column of character ``index``."""
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def _yaml_problem(exc: yaml.YAMLError, text: str) -> Problem:
    if isinstance(exc, yaml.reader.ReaderError):
        line, column = _position(text, exc.position)
        char = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
        return Problem(line, column, "", f"YAML syntax error: character {char} is not allowed in YAML text")
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        message = f"YAML syntax error: {exc.problem}"
        if exc.problem and "'\\t'" in exc.problem:
            message += "; expected spaces for indentation (YAML does not allow tabs there)"
        if exc.context and exc.context_mark is not None:
            where = f"line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1}"
            message += f" ({exc.context} at {where})"
        return Problem(mark.line + 1, mark.column + 1, "", message)
    return Problem(1, 1, "", f"YAML syntax error: {exc}")


def parse_tree(text: str) -> tuple[Node | None, list[Problem]]:
    """The node tree of a YAML document (None when empty or unreadable) and the problems met."""
    try:
        document = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        return None, [_yaml_problem(exc, text)]
    except RecursionError:
        return None, [Problem(1, 1, "", f"YAML syntax error: nested deeper than {MAX_DEPTH} levels")]
    if document is None:
        return None, []
    builder = _TreeBuilder()
    return builder.build(document), builder.problems


def check_spec_text(text: str, source: str = "<spec>") -> SpecCheck:
    """Every problem in the spec ``text`` (YAML and spec alike), or the spec."""
    root, problems = parse_tree(text)
    if root is None and not problems:
        problems = [Problem(1, 1, "", f"the spec is empty; expected a mapping with keys {TOP_SUMMARY}")]
    if root is None:
        return SpecCheck(source, None, tuple(problems))
    check = check_spec(root, source)
    # A YAML problem (bad tag, recursive alias) already explains what the checker says at the same spot.
    marked = {(p.line, p.column) for p in problems}
    spec_problems = [p for p in check.problems if (p.line, p.column) not in marked]
    merged = tuple(sorted([*problems, *spec_problems], key=lambda p: (p.line, p.column)))
    return SpecCheck(source, check.spec if not merged else None, merged)


def check_spec_bytes(data: bytes, source: str) -> SpecCheck:
    """As :func:`check_spec_text`, for a file's bytes: text that is not UTF-8 is one problem."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        byte = data[exc.start]
        message = f"not UTF-8 text: byte 0x{byte:02x} cannot be decoded; expected a YAML text file"
        return SpecCheck(source, None, (Problem(line, column, "", message),))
    return check_spec_text(text, source)


def read_spec_file(path: str | os.PathLike[str]) -> bytes:
    """A spec file's bytes; InputError naming the path when it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InputError(
            f"cannot read cluster spec {os.fspath(path)}: {reason}",
            hint="check the path, and that this user may read the file",
        ) from exc


def check_spec_file(path: str | os.PathLike[str]) -> SpecCheck:
    """Every problem in the spec file ``path``; InputError if it cannot be read at all."""
    return check_spec_bytes(read_spec_file(path), os.fspath(path))


def load_spec_text(text: str, source: str = "<spec>") -> ClusterSpec:
    """The spec in ``text``; SpecError listing every problem otherwise."""
    return check_spec_text(text, source).unwrap()


def load_spec(path: str | os.PathLike[str]) -> ClusterSpec:
    """The spec in file ``path``; SpecError listing every problem, InputError if unreadable."""
    return check_spec_file(path).unwrap()
