"""The import contract: which tpuctl layer may import what, read statically from the source with ``ast``.

Nothing under ``tpuctl/`` is imported here: every module's source is parsed and its imports followed
through the tpuctl modules they name. Three kinds of import edge:

* ``load``: a module-level import, run when the module is imported (``if TYPE_CHECKING:`` blocks excluded);
* ``typing``: an import under ``if TYPE_CHECKING:`` (never run, but a dependency all the same);
* ``lazy``: an import inside a function (or ``importlib.import_module("...")`` with a constant name).

Importing ``tpuctl.a.b`` also runs ``tpuctl/__init__.py`` and ``tpuctl/a/__init__.py``, so a closure always
takes in the ancestors of every module it reaches.

The rules (docs/development/layers.md draws the layers):

1. The core (hardware, slices and topology, meshes, spec values and checks, the coordination state machine,
   the mapping value, and the stdlib-only helpers) never imports grpc, yaml, click or asyncio and never reads
   ``os.environ`` / ``os.getenv``, through any tpuctl module it may ever import (function-level imports too).
2. The job-side loader (``tpuctl.job.api``, ``tpuctl.mapping.file``) loads neither grpc nor click nor the
   mesh builders when imported.
3. ``tpuctl.cli`` is imported by no tpuctl module except ``tpuctl.__main__``.
4. No import cycle between tpuctl packages at module level.

Each rule is proved to fail on a small synthetic tree that breaks it (the ``test_checker_*`` tests).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "tpuctl"

LOAD, TYPING, LAZY = "load", "typing", "lazy"
EVERY_KIND = frozenset({LOAD, TYPING, LAZY})
AT_IMPORT = frozenset({LOAD})

CORE = (
    "tpuctl.tpu.*",
    "tpuctl.mesh.*",
    "tpuctl.spec.model",
    "tpuctl.spec.checker",
    "tpuctl.spec.meshes",
    "tpuctl.spec.successors",
    "tpuctl.coordination.state",
    "tpuctl.coordination.values",
    "tpuctl.coordination.taskset",
    "tpuctl.coordination.rendezvous",
    "tpuctl.coordination.kv",
    "tpuctl.coordination.generations",
    "tpuctl.coordination.figures",
    "tpuctl.mapping.model",
    "tpuctl.watchdog.*",
    "tpuctl.goodput.timeline",
    "tpuctl.goodput.ledger",
    "tpuctl.preemption.*",
    "tpuctl.errors",
    "tpuctl.durations",
    "tpuctl.hosts",
    "tpuctl.messages",
    "tpuctl.files",
    "tpuctl.processes",
    "tpuctl.health",
    "tpuctl.loglevel",
    "tpuctl.logformat",
    "tpuctl.spec.metrics",
)
CORE_BANNED = frozenset({"grpc", "yaml", "click", "asyncio"})
ENVIRONMENT = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})

LOADER = ("tpuctl.job.api", "tpuctl.mapping.file")
LOADER_BANNED = frozenset({"grpc", "click"})
MESH_BUILDERS = frozenset({"tpuctl.mesh.build", "tpuctl.mesh.ring", "tpuctl.mesh.jaxmode"})

CLI = "tpuctl.cli"
CLI_USERS = frozenset({"tpuctl.__main__"})

GENERATED = "proto"  # tpuctl.proto, generated protobuf code: followed for its imports, left out of the cycle rule


@dataclass(frozen=True)
class Edge:
    target: str  # a full module name: "tpuctl.mesh.build", or an outside one such as "grpc.aio"
    kind: str
    line: int


@dataclass(frozen=True)
class Module:
    name: str
    path: str  # relative to the root package's folder: "mesh/build.py"
    is_package: bool
    edges: tuple[Edge, ...]
    environment: tuple[tuple[int, str], ...]  # (line, kind) reading os.environ / os.getenv or importing them

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]


@dataclass(frozen=True)
class Graph:
    root: str
    modules: dict[str, Module]

    def reach(self, start: str, kinds: frozenset[str]) -> dict[str, tuple[tuple[str, Edge] | None, bool]]:
        """Every tpuctl module importing ``start`` may run, each with how it got there and whether it is *used*.

        ``start`` and what it imports (by ``kinds`` of edge) are used: their functions may run, so their
        function-level imports count when ``kinds`` has ``lazy``. A package that only runs as the ancestor of
        a module (and what that package imports) is merely loaded: only its module-level imports run (a lazy
        ``__getattr__`` in ``tpuctl/__init__.py`` is not triggered by importing ``tpuctl.errors``).
        """
        reached: dict[str, tuple[tuple[str, Edge] | None, bool]] = {start: (None, True)}
        todo = [start]
        while todo:
            name = todo.pop()
            used = reached[name][1]
            follow = kinds if used else AT_IMPORT
            nexts = [(e.target, e, used) for e in self.modules[name].edges if e.kind in follow]
            nexts += [(parent, Edge(parent, "parent", 0), False) for parent in ancestors(name)]
            for target, edge, target_used in nexts:
                if target not in self.modules:
                    continue
                if target not in reached or (target_used and not reached[target][1]):
                    reached[target] = ((name, edge), target_used)
                    todo.append(target)
        return reached

    def outside(self, start: str, kinds: frozenset[str]) -> Iterator[tuple[str, Edge, str]]:
        """``(module, edge, chain)`` for each outside import reachable from ``start``."""
        reached = self.reach(start, kinds)
        for name in sorted(reached):
            follow = kinds if reached[name][1] else AT_IMPORT
            for edge in self.modules[name].edges:
                if edge.kind in follow and not is_within(edge.target, self.root):
                    yield name, edge, chain(reached, name)


def ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def is_within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def top(name: str) -> str:
    return name.split(".")[0]


def chain(reached: dict[str, tuple[tuple[str, Edge] | None, bool]], name: str) -> str:
    """``a -> b -> name``: how the closure reached ``name``."""
    names = [name]
    while (step := reached[names[-1]][0]) is not None:
        names.append(step[0])
    return " -> ".join(reversed(names))


# --- reading the source --------------------------------------------------------------------------


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Reader(ast.NodeVisitor):
    def __init__(self, name: str, is_package: bool, known: set[str]) -> None:
        self.name, self.is_package, self.known = name, is_package, known
        self.edges: list[Edge] = []
        self.environment: list[tuple[int, str]] = []
        self.os_names: set[str] = set()  # what `os` is called in this file
        self.kind_stack = [LOAD]

    @property
    def kind(self) -> str:
        return self.kind_stack[-1]

    def _add(self, target: str, line: int) -> None:
        self.edges.append(Edge(target, self.kind, line))

    def _in(self, kind: str, body: Iterable[ast.AST]) -> None:
        # a lazy import stays lazy under TYPE_CHECKING inside a function, and typing stays typing inside a def
        self.kind_stack.append(self.kind if self.kind != LOAD else kind)
        for node in body:
            self.visit(node)
        self.kind_stack.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        for decorator in getattr(node, "decorator_list", []):
            self.visit(decorator)
        self.visit(node.args)
        body = node.body if isinstance(node.body, list) else [node.body]
        self._in(LAZY, body)

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_Lambda = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._in(TYPING, node.body)
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)
            if alias.name == "os":
                self.os_names.add(alias.asname or "os")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.name if self.is_package else self.name.rpartition(".")[0]
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            source = f"{base}.{node.module}" if node.module else base
        else:
            source = node.module or ""
        submodules = [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in self.known]
        if len(submodules) < len(node.names):  # names defined in `source` itself
            self._add(source, node.lineno)
        for submodule in submodules:  # `from pkg import submodule` (pkg itself runs as its ancestor)
            self._add(submodule, node.lineno)
        if source == "os" and any(alias.name in ENVIRONMENT for alias in node.names):
            self.environment.append((node.lineno, self.kind))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and node.value.id in self.os_names and node.attr in ENVIRONMENT:
            self.environment.append((node.lineno, self.kind))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if called in ("import_module", "__import__") and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                self.edges.append(Edge(first.value, LAZY if self.kind == LOAD else self.kind, node.lineno))
        self.generic_visit(node)


def module_name(root: Path, path: Path) -> tuple[str, bool]:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


@functools.cache
def read_graph(root: Path) -> Graph:
    paths = sorted(root.rglob("*.py"))
    names = {path: module_name(root, path) for path in paths}
    known = {name for name, _ in names.values()}
    modules = {}
    for path in paths:
        name, is_package = names[path]
        reader = _Reader(name, is_package, known)
        reader.visit(ast.parse(path.read_text(), filename=str(path)))
        modules[name] = Module(
            name,
            path.relative_to(root).as_posix(),
            is_package,
            tuple(reader.edges),
            tuple(sorted(set(reader.environment))),
        )
    return Graph(root.name, modules)


def where(graph: Graph, module: str, line: int) -> str:
    return f"{graph.modules[module].path}:{line}"


def matching(graph: Graph, patterns: Iterable[str]) -> list[str]:
    out = []
    for pattern in patterns:
        if pattern.endswith(".*"):
            out += [n for n in graph.modules if is_within(n, pattern[:-2])]
        elif pattern in graph.modules:
            out.append(pattern)
    return sorted(set(out))


# --- the rules: each returns the violations, one line each -------------------------------------


def core_violations(graph: Graph, core: Iterable[str] = CORE) -> list[str]:
    problems = set()
    for start in matching(graph, core):
        for name, edge, path in graph.outside(start, EVERY_KIND):
            if top(edge.target) in CORE_BANNED:
                problems.add(
                    f"core {start} imports {edge.target} ({edge.kind}, {where(graph, name, edge.line)}; via {path})"
                )
        via = graph.reach(start, EVERY_KIND)
        for name, (_, used) in via.items():
            for line, kind in graph.modules[name].environment:
                if not used and kind != LOAD:
                    continue
                problems.add(f"core {start} reads os.environ ({where(graph, name, line)}; via {chain(via, name)})")
    return sorted(problems)


def loader_violations(graph: Graph, loader: Iterable[str] = LOADER) -> list[str]:
    problems = set()
    for start in matching(graph, loader):
        for name, edge, path in graph.outside(start, AT_IMPORT):
            if top(edge.target) in LOADER_BANNED:
                problems.add(
                    f"loader {start} loads {edge.target} at import ({where(graph, name, edge.line)}; via {path})"
                )
        via = graph.reach(start, AT_IMPORT)
        for builder in sorted(MESH_BUILDERS & via.keys()):
            problems.add(f"loader {start} loads the mesh builder {builder} at import (via {chain(via, builder)})")
    return sorted(problems)


def cli_violations(graph: Graph) -> list[str]:
    cli = f"{graph.root}.cli"
    users = {f"{graph.root}.{m.split('.', 1)[1]}" for m in CLI_USERS}
    return sorted(
        f"{name} imports {edge.target} ({edge.kind}, {where(graph, name, edge.line)}): only the command line's entry point may"
        for name, module in graph.modules.items()
        if not is_within(name, cli) and name not in users
        for edge in module.edges
        if is_within(edge.target, cli)
    )


def package_of(graph: Graph, name: str) -> str:
    """``tpuctl.mesh`` for ``tpuctl.mesh.build``; a top-level module (``tpuctl.errors``) is its own package."""
    return ".".join(name.split(".")[:2])


def cycle_violations(graph: Graph) -> list[str]:
    """One cycle per strongly connected group of packages, each step with the import that makes it."""
    deps: dict[str, dict[str, str]] = {}  # package -> package -> an import making that edge
    for name, module in graph.modules.items():
        generated = f"{graph.root}.{GENERATED}"
        if is_within(name, generated):
            continue
        source = package_of(graph, name)
        for edge in module.edges:
            if edge.kind != LOAD or edge.target not in graph.modules or is_within(edge.target, generated):
                continue
            target = package_of(graph, edge.target)
            if target != source and target != graph.root:
                deps.setdefault(source, {}).setdefault(target, f"{where(graph, name, edge.line)} imports {edge.target}")
    problems = []
    for group in strongly_connected(deps):
        if len(group) < 2:
            continue
        cycle = find_cycle(deps, min(group), group)
        steps = [f"{a} -> {b} ({deps[a][b]})" for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True)]
        problems.append("import cycle: " + "; ".join(steps))
    return sorted(problems)


def strongly_connected(deps: dict[str, dict[str, str]]) -> list[set[str]]:
    """Tarjan's algorithm, iteratively; O(packages + edges)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    nodes = sorted(set(deps) | {t for ts in deps.values() for t in ts})
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(deps.get(root, {}))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    groups.append(group)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(deps.get(child, {})))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return groups


def find_cycle(deps: dict[str, dict[str, str]], start: str, group: set[str]) -> list[str]:
    """The shortest cycle through ``start`` inside ``group`` (breadth first)."""
    via: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(deps.get(node, {})):
                if child not in group:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(via[path[-1]])
                    return list(reversed(path))
                if child not in via:
                    via[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


# --- the contract on tpuctl ----------------------------------------------------------------------


def test_every_module_is_read() -> None:
    graph = read_graph(ROOT)
    assert {"tpuctl", "tpuctl.__main__", "tpuctl.cli", "tpuctl.job.api", "tpuctl.mapping.file"} <= graph.modules.keys()
    core = matching(graph, CORE)
    assert "tpuctl.tpu.topology" in core and "tpuctl.mesh.build" in core and "tpuctl.coordination.state" in core


def test_the_core_imports_no_grpc_yaml_click_or_asyncio_and_reads_no_environment() -> None:
    assert core_violations(read_graph(ROOT)) == []


def test_the_job_side_loader_loads_no_grpc_click_or_mesh_builders() -> None:
    assert loader_violations(read_graph(ROOT)) == []


def test_nothing_imports_the_cli_but_its_entry_point() -> None:
    assert cli_violations(read_graph(ROOT)) == []


def test_no_import_cycle_between_packages() -> None:
    assert cycle_violations(read_graph(ROOT)) == []


# --- the checker fails when a rule is broken ----------------------------------------------------

SYNTHETIC = {
    # not a violation: the root's lazy attribute does not run when a core module's ancestor is imported
    "__init__.py": "def __getattr__(name: str) -> object:\n    import tpuctl.edge\n",
    "edge.py": "import os\n\nimport yaml\n\nENV = os.environ\n",
    "__main__.py": "from tpuctl.cli import main\nmain()\n",
    "errors.py": "class TpuctlError(Exception):\n    pass\n",
    "cli/__init__.py": "import click\nfrom tpuctl.job import api\n\ndef main() -> None:\n    pass\n",
    # rule 1: grpc reached through a function-level import, two tpuctl modules away
    "tpu/__init__.py": "",
    "tpu/slice.py": "from tpuctl.errors import TpuctlError\n\ndef probe() -> None:\n    import tpuctl.backends.probe\n",
    "backends/__init__.py": "",
    "backends/probe.py": "from tpuctl.backends import wire\n",
    "backends/wire.py": "import grpc.aio\n",
    # rule 1: the environment, read as an attribute of an aliased os and imported from os; os.path is fine
    "mesh/__init__.py": "",
    "mesh/model.py": "import os as _os\n\nHOME = _os.environ.get('HOME')\nJOIN = _os.path.join\n",
    "mesh/strings.py": "from os import getenv\n",
    "mesh/build.py": "from tpuctl.mesh.model import HOME\n",
    # rule 1: yaml under TYPE_CHECKING counts too
    "spec/__init__.py": "",
    "spec/model.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import yaml\n",
    # rule 2: the loader reaches click (relative import) and a mesh builder (`from pkg import submodule`)
    "job/__init__.py": "",
    "job/api.py": "from .env import environment\n",
    "job/env.py": "import click\n\ndef environment() -> None:\n    import grpc  # lazy: not loaded at import\n",
    "mapping/__init__.py": "",
    "mapping/file.py": "from tpuctl.mesh import build\n",
    "mapping/model.py": "import os\n\nSEP = os.sep\n",
    # rule 3: a use case importing the command line
    "sim/__init__.py": "",
    "sim/cluster.py": "def start() -> None:\n    from tpuctl.cli import main\n",
    # rule 4: agent -> render -> agent at module level; render/svg's function-level import is no cycle
    "agent/__init__.py": "",
    "agent/a.py": "from tpuctl.render import text\n",
    "render/__init__.py": "",
    "render/text.py": "import tpuctl.agent.b\n",
    "render/svg.py": "def draw() -> None:\n    from tpuctl.sim import cluster\n",
    "agent/b.py": "",
}


@pytest.fixture
def synthetic(tmp_path: Path) -> Graph:
    root = tmp_path / "tpuctl"
    for relative, text in SYNTHETIC.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    return read_graph(root)


def test_checker_finds_a_core_module_reaching_grpc_yaml_or_the_environment(synthetic: Graph) -> None:
    assert core_violations(synthetic) == [
        "core tpuctl.mesh.build reads os.environ (mesh/model.py:3; via tpuctl.mesh.build -> tpuctl.mesh.model)",
        "core tpuctl.mesh.model reads os.environ (mesh/model.py:3; via tpuctl.mesh.model)",
        "core tpuctl.mesh.strings reads os.environ (mesh/strings.py:1; via tpuctl.mesh.strings)",
        "core tpuctl.spec.model imports yaml (typing, spec/model.py:4; via tpuctl.spec.model)",
        "core tpuctl.tpu.slice imports grpc.aio (load, backends/wire.py:1; "
        "via tpuctl.tpu.slice -> tpuctl.backends.probe -> tpuctl.backends.wire)",
    ]


def test_checker_finds_the_loader_loading_click_or_a_mesh_builder(synthetic: Graph) -> None:
    assert loader_violations(synthetic) == [
        "loader tpuctl.job.api loads click at import (job/env.py:1; via tpuctl.job.api -> tpuctl.job.env)",
        "loader tpuctl.mapping.file loads the mesh builder tpuctl.mesh.build at import "
        "(via tpuctl.mapping.file -> tpuctl.mesh.build)",
    ]


def test_checker_finds_a_module_importing_the_cli(synthetic: Graph) -> None:
    assert cli_violations(synthetic) == [
        "tpuctl.sim.cluster imports tpuctl.cli (lazy, sim/cluster.py:2): only the command line's entry point may"
    ]


def test_checker_finds_a_cycle_between_packages(synthetic: Graph) -> None:
    assert cycle_violations(synthetic) == [
        "import cycle: tpuctl.agent -> tpuctl.render (agent/a.py:1 imports tpuctl.render.text); "
        "tpuctl.render -> tpuctl.agent (render/text.py:1 imports tpuctl.agent.b)"
    ]


def test_checker_accepts_a_tree_that_keeps_the_rules(tmp_path: Path) -> None:
    root = tmp_path / "tpuctl"
    clean = {
        "__init__.py": "",
        "__main__.py": "from tpuctl.cli import main\n",
        "cli/__init__.py": "import click\nfrom tpuctl.mapping import file\n\ndef main() -> None:\n    import grpc\n",
        "mapping/__init__.py": "",
        "mapping/file.py": "import json\n\nfrom . import model\n\ndef build() -> None:\n    from tpuctl.mesh import build\n",
        "mapping/model.py": "import os\n\nfrom tpuctl.mesh.model import Mesh\n\nSEP = os.sep\n",
        "mesh/__init__.py": "",
        "mesh/model.py": "class Mesh:\n    pass\n",
        "mesh/build.py": "from tpuctl.mesh.model import Mesh\n",
    }
    for relative, text in clean.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    graph = read_graph(root)
    assert core_violations(graph) == loader_violations(graph) == cli_violations(graph) == cycle_violations(graph) == []
