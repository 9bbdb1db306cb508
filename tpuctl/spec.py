"""Cluster spec values and their validation: the pure core behind ``tpuctl init --config``.

No YAML, no environment, no I/O. The YAML edge (:mod:`tpuctl.specfile`) turns a file into a tree of
:class:`Node` (a value and where it was written); :func:`check_spec` turns that tree into a
:class:`ClusterSpec`, or into every problem at once, each one formatted as
``FILE:LINE:COL: key.path: what is wrong; expected ...``.

A spec, in full::

    cluster: pod-a                 # required: [a-z0-9][a-z0-9._-]*
    accelerator: v4-32             # or generation: v4 + topology: 2x2x4
    chips_per_host: 4              # optional slice options: num_slices, megacore, device_kind
    backend: sim                   # sim | tensorflow | jax
    hosts: [10.0.0.1, 10.0.0.2, 10.0.0.3, 10.0.0.4]   # task id = position
    coordinator: {port: 8476, heartbeat_interval: 5s, heartbeat_timeout: 30s, register_timeout: 5m}
    barrier_timeout: 10m
    meshes:
      - {name: dp_mp, shape: {data: 4, model: 4}, mode: ring}
    output: /run/tpuctl/mapping.json
    auth: {token_file: /etc/tpuctl/token}
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, cast

from tpuctl.durations import format_duration, parse_duration
from tpuctl.errors import InputError, SpecError, TopologyError
from tpuctl.hardware import find_generation
from tpuctl.tpuslice import TpuSlice, resolve_slice

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


@dataclass(frozen=True)
class SpecCheck:
    """The outcome of checking a spec: the spec, or every problem (sorted by position)."""

    source: str
    spec: ClusterSpec | None
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        return self.spec is not None and not self.problems

    def formatted(self) -> list[str]:
        return [p.format(self.source) for p in self.problems]

    def unwrap(self) -> ClusterSpec:
        """The spec, or SpecError listing every problem."""
        if self.spec is None or self.problems:
            raise SpecError(self.formatted(), source=self.source)
        return self.spec


# --- spec values -----------------------------------------------------------------------------------

Backend = Literal["sim", "tensorflow", "jax"]
BACKENDS: tuple[Backend, ...] = ("sim", "tensorflow", "jax")
MESH_MODES = ("ring", "jax")
RING_OPTIONS = (
    "ring_dims", "ring_axes", "ring_bounds",
    "can_split_host_across_rings", "build_ring_across_rings", "rotate_ring_across_rings", "compat",
)  # fmt: skip
JAX_OPTIONS = ("contiguous_submeshes", "allow_split_physical_axes")
COMMON_MESH_OPTIONS = ("dcn_shape",)  # multislice: slices per axis, in either mode
COMPAT_VALUES = ("dtensor",)
# DTensor layouts spell these as sharding specs; an axis of that name makes a layout ambiguous.
RESERVED_AXIS_NAMES = ("unsharded", "match", "any", "scalar")
DEFAULT_PORT = 8476
DEFAULT_OUTPUT = "/run/tpuctl/mapping.json"


@dataclass(frozen=True)
class CoordinatorSpec:
    """Where the coordination service listens and how long its waits last (seconds)."""

    port: int = DEFAULT_PORT
    heartbeat_interval: float = 5.0
    heartbeat_timeout: float = 30.0
    register_timeout: float = 300.0
    address: str | None = None
    """Override for the address the service listens on and hosts dial; default: ``hosts[0]``."""


@dataclass(frozen=True)
class AuthSpec:
    token_file: str
    """File holding the shared token every host presents (read by the agent, not here)."""


@dataclass(frozen=True)
class MeshSpec:
    """A named logical mesh to build once the topology is known (built later, validated here)."""

    name: str
    axes: tuple[tuple[str, int], ...]
    """(axis name, size) in order, major first."""
    mode: str = "ring"
    """``ring``: DTensor's ring-ordered TPU mesh; ``jax``: JAX's ``create_device_mesh`` algorithm."""
    options: tuple[tuple[str, object], ...] = ()
    """Mode options; lists are stored as tuples."""

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(size for _, size in self.axes)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def option(self, name: str, default: object = None) -> object:
        return dict(self.options).get(name, default)


@dataclass(frozen=True)
class ClusterSpec:
    """A validated cluster: the slice, its hosts in task order, and how they coordinate."""

    cluster: str
    slice: TpuSlice
    backend: Backend
    hosts: tuple[str, ...]
    """One per task; task id = position; ``hosts[0]`` runs the coordination service."""
    coordinator: CoordinatorSpec = CoordinatorSpec()
    barrier_timeout: float = 600.0
    meshes: tuple[MeshSpec, ...] = ()
    output: str = DEFAULT_OUTPUT
    auth: AuthSpec | None = None
    source: str = "<spec>"

    @property
    def coordinator_address(self) -> str:
        return self.coordinator.address or self.hosts[0]

    @property
    def coordinator_target(self) -> str:
        """``host:port`` to dial; an IPv6 address in brackets (``[fd00::1]:8476``)."""
        address = self.coordinator_address
        return f"[{address}]:{self.coordinator.port}" if ":" in address else f"{address}:{self.coordinator.port}"

    def describe(self) -> str:
        """``pod-a v4-32 (2x2x4), 4 hosts, backend sim``."""
        tpu = self.slice
        slices = f" x {tpu.num_slices} slices" if tpu.num_slices > 1 else ""
        return (
            f"{self.cluster} {tpu.accelerator_type} ({tpu.topology_str}){slices}, "
            f"{plural(len(self.hosts), 'host')}, backend {self.backend}"
        )


# --- single-value checks (also used for environment variables) -------------------------------------

_CLUSTER_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_HOST_PORT_RE = re.compile(r"^([^:\[\]]+):(\d+)$")
MAX_NAME = 63


def plural(count: int, noun: str) -> str:
    """``1 host``, ``4 hosts``, ``2 entries``."""
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun[:-1]}ies" if noun.endswith("y") else f"{count} {noun}s"


def did_you_mean(word: str, choices: Sequence[str], what: str = "one of") -> str:
    """``did you mean 'port'?`` or, with no close match, the list of choices."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]!r}?"
    return f"expected {what} {', '.join(choices)}"


_BACKEND_ALIASES = {"tf": "tensorflow", "simulated": "sim", "simulator": "sim", "fake": "sim"}


def backend_problem(name: str) -> str | None:
    if name in BACKENDS:
        return None
    guess = _BACKEND_ALIASES.get(name.lower())
    hint = f"did you mean {guess!r}?" if guess else did_you_mean(name, BACKENDS)
    return f"{name!r} is not a backend; {hint}"


def cluster_name_problem(name: str) -> str | None:
    if not name:
        return "is empty; expected a cluster name like pod-a"
    if len(name) > MAX_NAME:
        return f"{name!r} is {len(name)} characters long; expected at most {MAX_NAME}"
    if not _CLUSTER_RE.match(name):
        fixed = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("._-")
        hint = f"; did you mean {fixed!r}?" if fixed and _CLUSTER_RE.match(fixed) else ""
        return f"{name!r} is not a cluster name; expected lowercase letters, digits, '.', '_', '-'{hint}"
    return None


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


def normalize_host(text: str) -> str:
    """The form two spellings of one host share: lowercase, no trailing dot, compressed IPv6."""
    try:
        return ipaddress.ip_address(text).compressed
    except ValueError:
        return text.lower().rstrip(".")


def host_count_problem(count: int, tpu: TpuSlice) -> str | None:
    """``3 entries, but v4-32 has 4 hosts (2x2x4 chips, 4 chips per host)``, or None."""
    if count == tpu.num_hosts:
        return None
    if tpu.num_slices > 1:
        layout = f"{tpu.num_slices} slices of {tpu.topology_str} chips, {tpu.chips_per_host} chips per host"
        name = f"{tpu.accelerator_type} x {tpu.num_slices}"
    else:
        layout = f"{tpu.topology_str} chips, {tpu.chips_per_host} chips per host"
        name = tpu.accelerator_type
    hosts = plural(tpu.num_hosts, "host")
    return f"{plural(count, 'entry')}, but {name} has {hosts} ({layout}); expected one host per task"


def topology_problem(exc: TopologyError) -> str:
    return f"{exc.message}; {exc.hint}" if exc.hint else exc.message


# --- the checker ------------------------------------------------------------------------------------


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _shown(node: Node) -> str:
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


class _Checker:
    """Walks a node tree collecting problems; each method returns the value or None after a problem."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, node: Node, path: str, message: str) -> None:
        self.problems.append(Problem(node.line, node.column, path, message))

    def entries(self, node: Node, path: str, what: str = "key") -> list[tuple[str, Node, Node]]:
        """A mapping's (name, key node, value node), first occurrence of each name; repeats reported."""
        first: dict[str, Node] = {}
        out: list[tuple[str, Node, Node]] = []
        for key, value in node.entries:
            if key.kind != "scalar" or key.value is None:
                self.add(key, path, f"a key is {_shown(key)}; expected a plain name")
                continue
            name = key.text
            if name in first:
                seen = first[name]
                self.add(
                    key, _join(path, name),
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
            self.add(node, path, f"got {_shown(node)}; expected a mapping with keys {', '.join(known)}")
            return None
        found: dict[str, Node] = {}
        for name, key, value in self.entries(node, path):
            if name in known:
                found[name] = value
            else:
                self.add(key, _join(path, name), "unknown key; " + (hints or {}).get(name, did_you_mean(name, known)))
        for name, expected in (required or {}).items():
            if name not in found or _is_null(found[name]):
                where = found.get(name, node)
                self.add(where, _join(path, name), f"missing; expected {expected}")
        return {k: v for k, v in found.items() if not _is_null(v)}

    def string(self, node: Node, path: str, expected: str) -> str | None:
        if node.kind == "scalar" and isinstance(node.value, str):
            return node.value
        if node.kind == "scalar" and node.plain and type(node.value) in (int, float):
            return node.text  # a plain 1234 is the string the author typed
        why = ""
        if isinstance(node.value, bool) and node.plain:
            why = f" (YAML reads an unquoted {node.text} as a boolean: quote it)"
        self.add(node, path, f"got {_shown(node)}{why}; expected {expected}")
        return None

    def integer(self, node: Node, path: str, low: int, high: int | None = None) -> int | None:
        bounds = f"from {low} to {high}" if high is not None else f">= {low}"
        value = node.value
        if node.kind != "scalar" or isinstance(value, bool) or not isinstance(value, int):
            quoted = " (without quotes)" if isinstance(value, str) and value.strip().isdigit() else ""
            self.add(node, path, f"got {_shown(node)}; expected an integer {bounds}{quoted}")
            return None
        if value < low or (high is not None and value > high):
            self.add(node, path, f"{value} is out of range; expected an integer {bounds}")
            return None
        return value

    def boolean(self, node: Node, path: str) -> bool | None:
        if node.kind == "scalar" and isinstance(node.value, bool):
            return node.value
        self.add(node, path, f"got {_shown(node)}; expected true or false")
        return None

    def duration(self, node: Node, path: str) -> float | None:
        """A positive duration: a number of seconds, or text like ``250ms``, ``5s``, ``10m``, ``1h30m``."""
        value = node.value
        expected = "expected e.g. 250ms, 5s, 10m, 1h30m, or seconds as a number"
        if node.kind == "scalar" and not isinstance(value, bool) and isinstance(value, int | float):
            if math.isfinite(value) and value > 0:
                return float(value)
            self.add(node, path, f"{node.text} is not a positive, finite duration; {expected}")
            return None
        if node.kind == "scalar" and isinstance(value, str):
            try:
                return parse_duration(value, what=path)
            except InputError as exc:
                message = exc.message.removeprefix(f"{path}: ")
                self.add(node, path, f"{message}; {expected}")
                return None
        self.add(node, path, f"got {_shown(node)}; {expected}")
        return None

    def sequence(self, node: Node, path: str, expected: str) -> tuple[Node, ...] | None:
        if node.kind == "sequence":
            return node.children
        self.add(node, path, f"got {_shown(node)}; expected {expected}")
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


# --- sections --------------------------------------------------------------------------------------

TOP_KEYS = (
    "cluster", "accelerator", "generation", "topology", "chips_per_host", "num_slices", "megacore", "device_kind",
    "backend", "hosts", "coordinator", "barrier_timeout", "meshes", "output", "auth",
)  # fmt: skip
TOP_SUMMARY = "cluster, accelerator, backend, hosts, ..."
SLICE_KEYS = ("accelerator", "generation", "topology", "chips_per_host", "num_slices", "megacore", "device_kind")
COORDINATOR_KEYS = ("address", "port", "heartbeat_interval", "heartbeat_timeout", "register_timeout")
MESH_KEYS = ("name", "shape", "mode", "options")
_REQUIRED = {
    "cluster": "a cluster name, e.g. cluster: pod-a",
    "backend": "one of sim, tensorflow, jax",
    "hosts": "a list of host names or addresses, one per task (task id = position)",
}
_SLICE_EXPECTED = "accelerator: v4-32, or generation: v4 with topology: 2x2x4"
_UNKNOWN_HINTS = {
    "slice": f"the slice keys ({', '.join(SLICE_KEYS)}) sit at the top level",
    "task_id": "a host's task id is its position in hosts (or --task-id on the command line)",
    "name": "did you mean 'cluster'?",
    "token_file": "it belongs under auth: (auth: {token_file: ...})",
    **{k: f"it belongs under coordinator: (coordinator: {{{k}: ...}})" for k in COORDINATOR_KEYS},
}


_READERS: dict[str, Callable[[_Checker, Node, str], object]] = {
    "accelerator": lambda ck, n, p: ck.string(n, p, "an accelerator type like v4-32"),
    "generation": lambda ck, n, p: ck.string(n, p, "a TPU generation: v2, v3, v4, v5e, v5p, v6e or 7x"),
    "topology": lambda ck, n, p: ck.string(n, p, "chips per axis, like 2x2x4 (or 4x4 for 2D generations)"),
    "chips_per_host": lambda ck, n, p: ck.integer(n, p, 1),
    "num_slices": lambda ck, n, p: ck.integer(n, p, 1),
    "megacore": lambda ck, n, p: ck.boolean(n, p),
    "device_kind": lambda ck, n, p: ck.string(n, p, "a device kind like 'TPU v4'"),
}


def _resolve(options: dict[str, object]) -> TpuSlice:
    return resolve_slice(
        accelerator=cast("str | None", options.get("accelerator")),
        generation=cast("str | None", options.get("generation")),
        topology=cast("str | None", options.get("topology")),
        chips_per_host=cast("int | None", options.get("chips_per_host")),
        num_slices=cast(int, options.get("num_slices", 1)),
        megacore=cast("bool | None", options.get("megacore")),
        device_kind=cast("str | None", options.get("device_kind")),
    )


def _slice(ck: _Checker, root: Node, keys: dict[str, Node]) -> TpuSlice | None:
    """Resolve the slice; a TopologyError becomes a problem at the key that caused it."""
    parsed: dict[str, object] = {}
    failed = False
    for name, read in _READERS.items():
        if name in keys:
            value = read(ck, keys[name], name)
            failed |= value is None
            if value is not None:
                parsed[name] = value
    named = [k for k in ("accelerator", "generation", "topology") if k in keys]
    if "accelerator" in named and len(named) > 1:
        other = named[1]
        ck.add(keys[other], other, f"given together with accelerator; expected either {_SLICE_EXPECTED}")
        return None
    if not named:
        ck.add(root, "accelerator", f"missing; expected {_SLICE_EXPECTED}")
        return None
    if named == ["generation"] or named == ["topology"]:
        have = named[0]
        lack = "topology" if have == "generation" else "generation"
        ck.add(keys[have], lack, f"missing; expected {lack} with {have}, e.g. {_SLICE_EXPECTED}")
        return None
    if any(k not in parsed for k in named):
        return None
    base: dict[str, object] = {k: parsed[k] for k in named}
    try:
        _resolve(base)
    except TopologyError as exc:
        bad = "topology"
        if "accelerator" in base:
            bad = "accelerator"
        elif find_generation(cast(str, base["generation"])) is None:
            bad = "generation"
        ck.add(keys[bad], bad, topology_problem(exc))
        return None
    for name in ("chips_per_host", "num_slices", "megacore", "device_kind"):  # each alone, to blame the key
        if name in parsed:
            try:
                _resolve({**base, name: parsed[name]})
            except TopologyError as exc:
                ck.add(keys[name], name, topology_problem(exc))
                failed = True
    if failed:
        return None
    try:
        return _resolve(parsed)
    except TopologyError as exc:  # options that are fine alone but not together
        ck.add(root, "", topology_problem(exc))
        return None


def _hosts(ck: _Checker, node: Node, tpu: TpuSlice | None) -> tuple[str, ...] | None:
    items = ck.sequence(node, "hosts", _REQUIRED["hosts"])
    if items is None:
        return None
    if not items:
        ck.add(node, "hosts", f"is empty; expected {_REQUIRED['hosts']}")
        return None
    hosts: list[str] = []
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        path = f"hosts[{index}]"
        host = ck.host(item, path)
        if host is None:
            continue
        key = normalize_host(host)
        if key in first:
            ck.add(item, path, f"{host!r} repeats hosts[{first[key]}]; expected each host once (position = task id)")
            continue
        first[key] = index
        hosts.append(host)
    if tpu is not None:
        problem = host_count_problem(len(items), tpu)
        if problem:
            ck.add(node, "hosts", problem)
            return None
    return tuple(hosts) if len(hosts) == len(items) else None


def _coordinator(ck: _Checker, node: Node) -> CoordinatorSpec | None:
    keys = ck.mapping(node, "coordinator", COORDINATOR_KEYS)
    if keys is None:
        return None
    default = CoordinatorSpec()
    address = ck.host(keys["address"], "coordinator.address") if "address" in keys else None
    port = ck.integer(keys["port"], "coordinator.port", 1, 65535) if "port" in keys else default.port
    waits: dict[str, float | None] = {}
    for name in ("heartbeat_interval", "heartbeat_timeout", "register_timeout"):
        given = keys.get(name)
        waits[name] = ck.duration(given, f"coordinator.{name}") if given else getattr(default, name)
    interval, timeout, register = waits["heartbeat_interval"], waits["heartbeat_timeout"], waits["register_timeout"]
    if interval is not None and timeout is not None and interval >= timeout:
        shown = {n: keys[n].text if n in keys else format_duration(getattr(default, n)) for n in waits}
        ck.add(
            keys.get("heartbeat_interval", keys.get("heartbeat_timeout", node)),
            "coordinator.heartbeat_interval",
            f"{shown['heartbeat_interval']} is not shorter than heartbeat_timeout {shown['heartbeat_timeout']}; "
            "expected an interval well below the timeout (a host missing heartbeats for the timeout is dead)",
        )
        return None
    if port is None or interval is None or timeout is None or register is None or ("address" in keys and not address):
        return None
    return CoordinatorSpec(port, interval, timeout, register, address)


def _file_path(ck: _Checker, node: Node, path: str, example: str) -> str | None:
    text = ck.string(node, path, f"a file path like {example}")
    if text is None:
        return None
    if not text.strip():
        ck.add(node, path, f"is empty; expected a file path like {example}")
    elif "\0" in text:
        ck.add(node, path, f"{text!r} contains a NUL character; expected a file path like {example}")
    elif text.endswith("/"):
        ck.add(node, path, f"{text!r} names a folder; expected a file path like {example}")
    else:
        return text
    return None


def _auth(ck: _Checker, node: Node) -> AuthSpec | None:
    keys = ck.mapping(node, "auth", ("token_file",), {"token_file": "a file holding the cluster's shared token"})
    if keys is None or "token_file" not in keys:
        return None
    token_file = _file_path(ck, keys["token_file"], "auth.token_file", "/etc/tpuctl/token")
    return AuthSpec(token_file) if token_file is not None else None


# --- meshes ----------------------------------------------------------------------------------------


def _devices_text(tpu: TpuSlice) -> str:
    per_chip = "1 device" if tpu.devices_per_chip == 1 else f"{tpu.devices_per_chip} devices"
    if tpu.num_slices > 1:
        return (
            f"{tpu.accelerator_type} x {tpu.num_slices} has {tpu.num_devices} devices "
            f"({tpu.num_slices} slices of {tpu.chips_per_slice} chips, {per_chip} per chip)"
        )
    return f"{tpu.accelerator_type} has {tpu.num_devices} devices ({tpu.chips_per_slice} chips, {per_chip} per chip)"


def _shape(ck: _Checker, node: Node, path: str, tpu: TpuSlice | None) -> tuple[tuple[str, int], ...] | None:
    expected = "axis sizes in order, major first, like {data: 4, model: 4}"
    if node.kind != "mapping":
        ck.add(node, path, f"got {_shown(node)}; expected {expected}")
        return None
    entries = ck.entries(node, path, what="axis name")
    if not entries:
        ck.add(node, path, f"has no axes; expected {expected}")
        return None
    axes: list[tuple[str, int]] = []
    failed = len(entries) != len(node.entries)
    for name, key, value in entries:
        axis = _join(path, name)
        if not _IDENT_RE.match(name) or len(name) > MAX_NAME:
            ck.add(key, axis, "is not an axis name; expected letters, digits and '_', not starting with a digit")
            failed = True
        elif name in RESERVED_AXIS_NAMES:
            reserved = ", ".join(RESERVED_AXIS_NAMES)
            ck.add(key, axis, f"is reserved ({reserved} are DTensor sharding specs); expected another axis name")
            failed = True
        size = ck.integer(value, axis, 1)
        if size is None:
            failed = True
        else:
            axes.append((name, size))
    if failed:
        return None
    total = math.prod(size for _, size in axes)
    if tpu is not None and total != tpu.num_devices:
        dims = "x".join(str(size) for _, size in axes)
        ck.add(
            node, path,
            f"{dims} = {total} devices, but {_devices_text(tpu)}; expected sizes whose product is {tpu.num_devices}",
        )  # fmt: skip
        return None
    return tuple(axes)


_PHYSICAL_AXES = ("core", "x", "y", "z")


def _int_list(ck: _Checker, node: Node, path: str, length: int, expected: str) -> tuple[int, ...] | None:
    items = ck.sequence(node, path, expected)
    if items is None:
        return None
    values = [ck.integer(item, f"{path}[{i}]", 1) for i, item in enumerate(items)]
    if any(v is None for v in values):
        return None
    if len(values) != length:
        ck.add(node, path, f"has {plural(len(values), 'entry')}; expected {expected}")
        return None
    return tuple(cast(list[int], values))


def _option_value(
    ck: _Checker, name: str, node: Node, path: str, axes: tuple[tuple[str, int], ...] | None, tpu: TpuSlice | None
) -> object:
    """A mesh option's value (lists as tuples), or None after a problem."""
    if name == "ring_dims":
        n = len(axes) if axes else 2**31
        return ck.integer(node, path, -n, n)
    if name == "ring_axes":
        expected = "an ordering of core, x, y, z, fastest-varying first, like [core, x, y, z]"
        items = ck.sequence(node, path, expected)
        if items is None:
            return None
        names = [ck.string(item, f"{path}[{i}]", "core, x, y or z") for i, item in enumerate(items)]
        if None in names:
            return None
        if sorted(cast(list[str], names)) != sorted(_PHYSICAL_AXES):
            ck.add(node, path, f"{names} is not {expected}")
            return None
        return tuple(names)
    if name == "ring_bounds":
        bounds = _int_list(ck, node, path, 4, "4 positive integers: ring extent along x, y, z, core")
        if bounds is None or tpu is None:
            return bounds
        physical = (*tpu.topology, tpu.devices_per_chip)
        if any(b > p or p % b for b, p in zip(bounds, physical, strict=True)):
            ck.add(
                node, path,
                f"{list(bounds)} does not divide the slice's bounds {list(physical)} (x, y, z, core); "
                "expected each entry to divide the matching bound",
            )  # fmt: skip
            return None
        return bounds
    if name == "dcn_shape":
        return _dcn_shape(ck, node, path, axes, tpu)
    if name == "compat":
        value = ck.string(node, path, "dtensor")
        if value is not None and value not in COMPAT_VALUES:
            ck.add(node, path, f"{value!r} is not a compatibility mode; expected dtensor (reproduce DTensor exactly)")
            return None
        return value
    return ck.boolean(node, path)


def _dcn_shape(
    ck: _Checker, node: Node, path: str, axes: tuple[tuple[str, int], ...] | None, tpu: TpuSlice | None
) -> tuple[int, ...] | None:
    """Slices along each axis (JAX's ``dcn_mesh_shape``): a list, one per axis, or {axis: slices}."""
    if axes is None:
        return None
    names = [a for a, _ in axes]
    expected = f"slices per axis: a list of {len(axes)} integers, or a mapping like {{{names[0]}: 2}}"
    if node.kind == "mapping":
        counts = dict.fromkeys(names, 1)
        for axis, key, value in ck.entries(node, path, what="axis name"):
            if axis not in counts:
                ck.add(key, _join(path, axis), "is not an axis of this mesh; " + did_you_mean(axis, names))
                return None
            count = ck.integer(value, _join(path, axis), 1)
            if count is None:
                return None
            counts[axis] = count
        dcn = tuple(counts.values())
    else:
        found = _int_list(ck, node, path, len(axes), expected)
        if found is None:
            return None
        dcn = found
    slices = tpu.num_slices if tpu is not None else math.prod(dcn)
    expected = f"expected slices per axis, multiplying to num_slices ({slices}), each dividing its axis"
    if math.prod(dcn) != slices:
        ck.add(node, path, f"{list(dcn)} makes {math.prod(dcn)} slices, but num_slices is {slices}; {expected}")
        return None
    for (axis, size), count in zip(axes, dcn, strict=True):
        if size % count:
            ck.add(node, path, f"{list(dcn)}: axis {axis} ({size}) does not split into {count} slices; {expected}")
            return None
    return dcn


def _options(
    ck: _Checker, node: Node, path: str, mode: str | None, axes: tuple[tuple[str, int], ...] | None,
    tpu: TpuSlice | None,
) -> tuple[tuple[str, object], ...] | None:  # fmt: skip
    every = RING_OPTIONS + JAX_OPTIONS + COMMON_MESH_OPTIONS
    if node.kind != "mapping":
        ck.add(node, path, f"got {_shown(node)}; expected a mapping of mesh options")
        return None
    out: list[tuple[str, object]] = []
    failed = False
    for name, key, value in ck.entries(node, path):
        option = _join(path, name)
        if name not in every:
            ck.add(key, option, "unknown option; " + did_you_mean(name, every))
            failed = True
        elif mode is not None and name not in (RING_OPTIONS if mode == "ring" else JAX_OPTIONS) + COMMON_MESH_OPTIONS:
            other = "jax" if mode == "ring" else "ring"
            ck.add(key, option, f"is an option of mode {other}, but this mesh has mode {mode}; expected mode: {other}")
            failed = True
        else:
            parsed = _option_value(ck, name, value, option, axes, tpu)
            failed |= parsed is None
            out.append((name, parsed))
    return None if failed else tuple(out)


def _mesh_build_problem(mesh: MeshSpec, tpu: TpuSlice) -> str | None:
    """Build the mesh on the slice now, so that `validate` reports what `init` would refuse."""
    from tpuctl.mesh.build import build_mesh

    try:
        build_mesh(mesh, tpu)
    except InputError as exc:
        return exc.message + (f"; {exc.hint}" if exc.hint else "")
    return None


def _meshes(ck: _Checker, node: Node, tpu: TpuSlice | None) -> tuple[MeshSpec, ...] | None:
    items = ck.sequence(node, "meshes", "a list of meshes, each with name and shape")
    if items is None:
        return None
    meshes: list[MeshSpec] = []
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        path = f"meshes[{index}]"
        required = {"name": "a mesh name like dp_mp", "shape": "axis sizes in order, like {data: 4, model: 4}"}
        keys = ck.mapping(item, path, MESH_KEYS, required)
        if keys is None:
            continue
        name = ck.string(keys["name"], f"{path}.name", "a mesh name like dp_mp") if "name" in keys else None
        if name is not None and (not _IDENT_RE.match(name) or len(name) > MAX_NAME):
            ck.add(keys["name"], f"{path}.name", f"{name!r} is not a mesh name; expected letters, digits and '_'")
            name = None
        elif name is not None and name in first:
            ck.add(keys["name"], f"{path}.name", f"{name!r} repeats meshes[{first[name]}]; expected unique names")
            name = None
        elif name is not None:
            first[name] = index
        axes = _shape(ck, keys["shape"], f"{path}.shape", tpu) if "shape" in keys else None
        mode: str | None = "ring"
        if "mode" in keys:
            mode = ck.string(keys["mode"], f"{path}.mode", "ring or jax")
            if mode is not None and mode not in MESH_MODES:
                ck.add(keys["mode"], f"{path}.mode", f"{mode!r} is not a mesh mode; {did_you_mean(mode, MESH_MODES)}")
                mode = None
        options = _options(ck, keys["options"], f"{path}.options", mode, axes, tpu) if "options" in keys else ()
        if name is not None and axes is not None and mode is not None and options is not None:
            mesh = MeshSpec(name, axes, mode, options)
            if tpu is not None and (problem := _mesh_build_problem(mesh, tpu)):
                ck.add(item, path, problem)
                continue
            meshes.append(mesh)
    return tuple(meshes) if len(meshes) == len(items) else None


# --- the whole spec --------------------------------------------------------------------------------


def _cluster(ck: _Checker, root: Node, source: str) -> ClusterSpec | None:
    if root.kind != "mapping":
        ck.add(root, "", f"the spec is {_shown(root)}; expected a mapping with keys {TOP_SUMMARY}")
        return None
    keys = ck.mapping(root, "", TOP_KEYS, _REQUIRED, _UNKNOWN_HINTS) or {}
    cluster = ck.string(keys["cluster"], "cluster", "a cluster name like pod-a") if "cluster" in keys else None
    if cluster is not None and (problem := cluster_name_problem(cluster)):
        ck.add(keys["cluster"], "cluster", problem)
        cluster = None
    tpu = _slice(ck, root, keys)
    backend = ck.string(keys["backend"], "backend", "sim, tensorflow or jax") if "backend" in keys else None
    if backend is not None and (problem := backend_problem(backend)):
        ck.add(keys["backend"], "backend", problem)
        backend = None
    hosts = _hosts(ck, keys["hosts"], tpu) if "hosts" in keys else None
    coordinator = _coordinator(ck, keys["coordinator"]) if "coordinator" in keys else CoordinatorSpec()
    barrier = ck.duration(keys["barrier_timeout"], "barrier_timeout") if "barrier_timeout" in keys else 600.0
    meshes = _meshes(ck, keys["meshes"], tpu) if "meshes" in keys else ()
    output = _file_path(ck, keys["output"], "output", DEFAULT_OUTPUT) if "output" in keys else DEFAULT_OUTPUT
    auth = _auth(ck, keys["auth"]) if "auth" in keys else None
    if (
        ck.problems
        or cluster is None
        or tpu is None
        or backend is None
        or hosts is None
        or coordinator is None
        or barrier is None
        or meshes is None
        or output is None
    ):
        return None
    return ClusterSpec(cluster, tpu, cast(Backend, backend), hosts, coordinator, barrier, meshes, output, auth, source)


def check_spec(root: Node, source: str = "<spec>") -> SpecCheck:
    """Every problem in the spec ``root`` (sorted by position), or the spec when there is none."""
    ck = _Checker()
    spec = _cluster(ck, root, source)
    problems = tuple(sorted(ck.problems, key=lambda p: (p.line, p.column)))
    return SpecCheck(source, None if problems else spec, problems)


def build_spec(root: Node, source: str = "<spec>") -> ClusterSpec:
    """The spec ``root`` describes; SpecError listing every problem otherwise."""
    return check_spec(root, source).unwrap()
