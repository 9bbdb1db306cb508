"""The YAML edge of the cluster spec: a file becomes a position-carrying node tree, then a ClusterSpec.

``yaml.compose`` (SafeLoader) keeps every value's line and column, so the pure checker in
:mod:`tpuctl.spec.model` can point at each problem; scalars are typed by the SafeLoader's own constructors.
Nothing here raises a YAML exception or a traceback at a user: syntax errors, bytes that are not UTF-8,
unknown tags and recursive aliases all become problems (``FILE:LINE:COL: YAML syntax error: ...``).

Every input is bounded before it costs much: only a regular file is read, at most ``MAX_SPEC_BYTES``; the
parse stops at ``MAX_NODES`` values or ``MAX_DEPTH`` levels; aliases may not expand past ``MAX_NODES``
values (a "billion laughs" is one problem, not gigabytes); a number is at most ``MAX_NUMBER_CHARS`` long.
"""

from __future__ import annotations

import os

import yaml
from yaml.constructor import SafeConstructor

from tpuctl.errors import InputError
from tpuctl.files import FileTooLarge, NotRegularFile, read_regular_file
from tpuctl.spec.checker import Node, Problem, Scalar
from tpuctl.spec.model import TOP_SUMMARY, ClusterSpec, SpecCheck, check_spec

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
MAX_DEPTH = 64  # a spec is 4 levels deep; deeper is a mistake or an attack on the recursion limit
MAX_SPEC_BYTES = 4 * 1024 * 1024
"""Largest spec file read: 10,000 hosts with long DNS names take about 0.6 MiB."""
MAX_NODES = 100_000
"""Most values (scalars, lists, mappings) a spec may hold, aliases expanded: ten times 10,000 hosts."""
MAX_NUMBER_CHARS = 64
"""Longest number read: ``port: 9999...`` with 100,000 digits is refused before Python converts it."""
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


class _Limit(Exception):
    """The document is past a bound; where and which."""

    def __init__(self, mark: yaml.Mark, message: str) -> None:
        super().__init__(message)
        self.problem = Problem(mark.line + 1, mark.column + 1, "", message)


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader's composer with a node count and a nesting depth: the parse stops at the first value past them."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._nodes = 0
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._nodes += 1
        self._depth += 1
        try:
            if self._nodes > MAX_NODES:
                raise _Limit(self._mark(), f"YAML error: more than {MAX_NODES:,} values; expected a cluster spec")
            if self._depth > MAX_DEPTH:
                raise _Limit(self._mark(), f"YAML error: nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def _mark(self) -> yaml.Mark:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        return event.start_mark  # type: ignore[no-any-return]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _expansion_problem(root: yaml.Node) -> Problem | None:
    """The first node whose aliases expand past ``MAX_NODES`` values (iteratively: no recursion limit)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_nodes.discard(key)
            size = 1 + sum(sizes.get(id(child), 1) for child in _children(node))  # a cycle counts once
            sizes[key] = size
            if size > MAX_NODES:
                mark = node.start_mark
                message = f"YAML error: aliases here expand to more than {MAX_NODES:,} values; expected a cluster spec"
                return Problem(mark.line + 1, mark.column + 1, "", message)
            continue
        if key in sizes or key in open_nodes:
            continue
        open_nodes.add(key)
        stack.append((node, True))
        stack += [(child, False) for child in _children(node)]
    return None


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
        if node.tag in _NUMBER_TAGS and len(node.value) > MAX_NUMBER_CHARS:
            self._problem(
                node, f"a number {len(node.value):,} characters long; expected at most {MAX_NUMBER_CHARS} characters"
            )
            return Node("scalar", line, column, value=node.value, text=node.value, plain=node.style is None)
        try:
            value = self._constructor.construct_object(node)
        except yaml.YAMLError as exc:
            self._problem(node, f"YAML error: {getattr(exc, 'problem', None) or exc}; expected a plain value")
            value = node.value
        except Exception:  # pyyaml's constructors fail in other ways too: ``!!int ''`` is an IndexError
            tag = node.tag.rsplit(":", 1)[-1]
            self._problem(node, f"YAML error: {node.value[:40]!r} cannot be read as !!{tag}; expected a plain value")
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
        document = yaml.compose(text, Loader=_BoundedLoader)
    except _Limit as exc:
        return None, [exc.problem]
    except yaml.YAMLError as exc:
        return None, [_yaml_problem(exc, text)]
    except RecursionError:
        return None, [Problem(1, 1, "", f"YAML syntax error: nested deeper than {MAX_DEPTH} levels")]
    if document is None:
        return None, []
    expansion = _expansion_problem(document)
    if expansion is not None:
        return None, [expansion]
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
    """A spec file's bytes; InputError naming the path when it cannot be read, is not a regular file (a
    folder, a FIFO, a device: refused at once, never read) or is over ``MAX_SPEC_BYTES``."""
    source = os.fspath(path)
    try:
        return read_regular_file(source, MAX_SPEC_BYTES)
    except NotRegularFile as exc:
        raise InputError(
            f"cannot read cluster spec {source}: it is {exc.kind}, not a regular file",
            hint="pass the path of a YAML file (copy a pipe's output to a file first)",
        ) from None
    except FileTooLarge as exc:
        raise InputError(
            f"cannot read cluster spec {source}: it is over {MAX_SPEC_BYTES // 2**20} MiB ({exc.size})",
            hint="a cluster spec is a small YAML file: check the path",
        ) from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InputError(
            f"cannot read cluster spec {source}: {reason}",
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
