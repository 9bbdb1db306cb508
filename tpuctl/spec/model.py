"""Cluster spec values and their validation: the pure core behind ``tpuctl init --config``.

No YAML, no environment, no I/O. The YAML edge (:mod:`tpuctl.spec.yamlfile`) turns a file into a tree of
:class:`Node` (a value and where it was written); :func:`check_spec` turns that tree into a
:class:`ClusterSpec`, or into every problem at once, each one formatted as
``FILE:LINE:COL: key.path: what is wrong; expected ...``. The node tree and the generic checker are in
:mod:`tpuctl.spec.checker`, the meshes section in :mod:`tpuctl.spec.meshes`; this module holds the spec values,
the single-value checks of the top-level keys and the sections that read them.

A spec, in full::

    cluster: pod-a                 # required: [a-z0-9][a-z0-9._-]*
    accelerator: v4-32             # or generation: v4 + topology: 2x2x4
    chips_per_host: 4              # optional slice options: num_slices, megacore, device_kind
    backend: sim                   # sim | tensorflow | jax
    hosts: [10.0.0.1, 10.0.0.2, 10.0.0.3, 10.0.0.4]   # task id = position
    coordinator: {port: 8490, heartbeat_interval: 5s, heartbeat_timeout: 30s, register_timeout: 5m}
    # coordinator: {successors: [0, 2, 4]}         # policy rejoin: who takes over a lost coordinator (spec/successors.py)
    barrier_timeout: 10m
    meshes:
      - {name: dp_mp, shape: {data: 4, model: 4}, mode: ring}
    output: /run/tpuctl/mapping.json
    auth: {token_file: /etc/tpuctl/token}
    restart: {policy: rejoin, timeout: 10m, max: 3}   # default policy fail: a failed host ends the cluster
    # restart: {policy: elastic, min_slices: 2}        # lose whole slices down to min_slices (spec/elastic.py)
    # spares: [10.0.1.1, 10.0.1.2]                     # standby hosts, whole slices (needs rejoin or elastic)
    watchdog: {hang_timeout: 10m, on_hang: warn}      # spec/watchdog.py: read and checked; being wired in
    metrics: {port: 8491}          # spec/metrics.py: /metrics for Prometheus on every host (off by default)
    log_format: json               # text (the default) or json: the agent log, one JSON object a line
    preemption: {grace: 25s, metadata: auto}          # spec/preemption.py: SIGTERM to the agent, the GCE watch
    # or with TLS (client_cert + client_key: mutual TLS):
    # auth: {token_file: ..., tls: {cert: server.pem, key: server.key, ca: ca.pem, client_cert: host.pem, client_key: host.key}}
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from tpuctl.backends.names import BACKEND_NAMES, BackendName
from tpuctl.backends.names import backend_problem as backend_problem
from tpuctl.durations import (
    BARRIER_TIMEOUT,
    HEARTBEAT_INTERVAL,
    HEARTBEAT_TIMEOUT,
    REGISTER_TIMEOUT,
    RESTART_TIMEOUT,
    Bounds,
    format_duration,
)
from tpuctl.errors import SpecError, TopologyError
from tpuctl.hosts import normalize_host
from tpuctl.mesh.model import MeshSpec as MeshSpec
from tpuctl.messages import closest, plural, suggestion
from tpuctl.preemption.settings import PreemptionSettings
from tpuctl.spec.checker import MAX_NAME, Checker, described
from tpuctl.spec.checker import Node as Node
from tpuctl.spec.checker import Problem as Problem
from tpuctl.spec.checker import host_problem as host_problem
from tpuctl.spec.checker import node_from as node_from
from tpuctl.spec.meshes import check_meshes
from tpuctl.spec.metrics import DEFAULT_LOG_FORMAT, MetricsSpec, check_log_format, check_metrics
from tpuctl.spec.preemption import check_preemption
from tpuctl.spec.successors import check_successors, default_successors
from tpuctl.spec.watchdog import check_watchdog
from tpuctl.tpu.hardware import find_generation
from tpuctl.tpu.slice import TpuSlice, resolve_slice
from tpuctl.watchdog.settings import WatchdogSettings

# --- problems --------------------------------------------------------------------------------------


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

Backend = BackendName
BACKENDS: tuple[Backend, ...] = BACKEND_NAMES
DEFAULT_PORT = 8490
"""Clear of the ports TPU software uses: 8476 (TPU_PROCESS_PORT of LeaderWorkerSet and torch_xla, +1 per extra
process; JAX's coordinator up to 0.8.0), 8482 (JAX's coordinator since 0.8.1), 8471 (libtpu's slice builder),
8080/8081 (megascale), 8431-8438 (libtpu runtime metrics, one per chip); docs/reference/ports.md lists them all."""
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
    job_ports: tuple[int, int] | None = None
    """Inclusive port range the jobs' own runtimes get their ports from (DTensor's server on every host,
    JAX's coordinator on task 0), for pods behind a firewall; default: any free port."""
    successors: tuple[int, ...] | None = None
    """The standby list: the tasks that take the service over when the coordinator's host is lost (policy
    rejoin; :mod:`tpuctl.spec.successors`); None: the default (``ClusterSpec.successors``)."""


@dataclass(frozen=True)
class TlsSpec:
    """The coordination service over TLS: PEM files (read by the agent, not here)."""

    cert: str
    """The service's certificate (task 0 serves with it; its subjectAltName names the coordinator address)."""
    key: str
    """Its private key (mode 600)."""
    ca: str
    """The CA every host verifies the service's certificate with (and, for mutual TLS, the service the hosts')."""
    client_cert: str | None = None
    """This host's certificate for mutual TLS (with ``client_key``): the service then refuses hosts without one."""
    client_key: str | None = None
    server_name: str | None = None
    """The name the service's certificate carries, when it is not the coordinator address."""

    @property
    def mutual(self) -> bool:
        return self.client_cert is not None


@dataclass(frozen=True)
class AuthSpec:
    token_file: str | None = None
    """File holding the shared token every host presents (read by the agent, not here)."""
    tls: TlsSpec | None = None


RESTART_POLICIES = ("fail", "rejoin", "elastic")
MAX_RESTARTS = 1000
"""Most restarts ``restart.max`` may allow (each ended generation's cause is kept, one line each)."""


@dataclass(frozen=True)
class RestartSpec:
    """What a host's failure does: ``fail`` ends the cluster (the default); ``rejoin`` ends the cluster's
    generation and waits up to ``timeout`` seconds for every host to register into the next one (the
    failed host's `tpuctl init` run again, or a spare slice in its slice's place), at most ``max_restarts``
    times; ``elastic`` is rejoin that may also go on without a lost slice (down to ``min_slices``) and grows
    back when it returns (docs/how-to/elastic.md)."""

    policy: str = "fail"
    timeout: float = 600.0
    max_restarts: int = 3
    min_slices: int = 0
    """Policy elastic: the fewest slices a generation may have (0: the spec's ``num_slices``, never shrink)."""

    @property
    def rejoin(self) -> bool:
        """The cluster re-forms after a failure: policy rejoin or elastic."""
        return self.policy in ("rejoin", "elastic")

    @property
    def elastic(self) -> bool:
        return self.policy == "elastic"


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """A validated cluster: the slice, its hosts in task order, and how they coordinate."""

    cluster: str
    slice: TpuSlice
    backend: Backend
    hosts: tuple[str, ...]
    """One per task; task id = position; ``hosts[0]`` runs the coordination service."""
    spares: tuple[str, ...] = ()
    """Standby hosts, whole slices, task ids ``len(hosts)`` on: each spare slice can take a lost slice's place."""
    coordinator: CoordinatorSpec = CoordinatorSpec()
    barrier_timeout: float = 600.0
    meshes: tuple[MeshSpec, ...] = ()
    output: str = DEFAULT_OUTPUT
    auth: AuthSpec | None = None
    restart: RestartSpec = RestartSpec()
    watchdog: WatchdogSettings = field(default_factory=WatchdogSettings)
    metrics: MetricsSpec | None = None
    """Where each host serves ``/metrics`` (None: nowhere, the default)."""
    log_format: str = DEFAULT_LOG_FORMAT
    preemption: PreemptionSettings = field(default_factory=PreemptionSettings)
    source: str = "<spec>"

    @property
    def coordinator_address(self) -> str:
        return self.coordinator.address or self.hosts[0]

    @property
    def coordinator_target(self) -> str:
        """``host:port`` to dial; an IPv6 address in brackets (``[fd00::1]:8490``)."""
        address = self.coordinator_address
        return f"[{address}]:{self.coordinator.port}" if ":" in address else f"{address}:{self.coordinator.port}"

    @property
    def roster_hosts(self) -> tuple[str, ...]:
        """Every host the spec names, by task id: ``hosts`` then ``spares``."""
        return self.hosts + self.spares

    @property
    def min_slices(self) -> int:
        """The fewest slices a generation may have (``num_slices`` unless policy elastic says fewer)."""
        return self.restart.min_slices or self.slice.num_slices

    def is_spare(self, task: int) -> bool:
        return task >= len(self.hosts)

    @property
    def successors(self) -> tuple[int, ...]:
        """The coordinator's standby list under policy rejoin (empty under policy fail: nobody takes over)."""
        if not self.restart.rejoin:
            return ()
        if self.coordinator.successors is not None:
            return self.coordinator.successors
        return default_successors(len(self.hosts), self.slice.hosts_per_slice)

    def coordinator_target_at(self, task: int) -> str:
        """``host:port`` of the service when task ``task`` runs it (task 0: ``coordinator_target``)."""
        if task == 0:
            return self.coordinator_target
        address = self.hosts[task]
        return f"[{address}]:{self.coordinator.port}" if ":" in address else f"{address}:{self.coordinator.port}"

    def describe(self) -> str:
        """``pod-a v4-32 (2x2x4), 4 hosts, backend sim``."""
        tpu = self.slice
        slices = f" x {tpu.num_slices} slices" if tpu.num_slices > 1 else ""
        spares = f" + {plural(len(self.spares), 'spare')}" if self.spares else ""
        return (
            f"{self.cluster} {tpu.accelerator_type} ({tpu.topology_str}){slices}, "
            f"{plural(len(self.hosts), 'host')}{spares}, backend {self.backend}"
        )


# --- single-value checks (also used for environment variables) -------------------------------------

_CLUSTER_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def cluster_name_problem(name: str) -> str | None:
    if not name:
        return "is empty; expected a cluster name like pod-a"
    if len(name) > MAX_NAME:
        return f"{name!r} is {len(name)} characters long; expected at most {MAX_NAME}"
    if not _CLUSTER_RE.match(name):
        fixed = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("._-")
        hint = f"; {suggestion(fixed)}" if fixed and _CLUSTER_RE.match(fixed) else ""
        return f"{name!r} is not a cluster name; expected lowercase letters, digits, '.', '_', '-'{hint}"
    return None


REPEAT_RULE = (
    "each host once (position = task id), or, for several TPU processes per machine, "
    "each machine's tasks side by side and every machine as often"
)


def repeated_hosts(hosts: Sequence[str]) -> list[tuple[int, int]]:
    """``(index, first index)`` of each entry repeating an earlier host against the rule.

    A host may repeat only as one run of consecutive entries (one machine's tasks side by side, as
    ``TPU_PROCESS_ADDRESSES`` lists 7x and LeaderWorkerSet processes), and only when every host's run has
    the same length; any other repeat (a copy-paste slip, two runs of one host) is reported.
    """
    keys = [normalize_host(h) for h in hosts]
    runs: list[tuple[int, int]] = []  # (start, length)
    for index, key in enumerate(keys):
        if runs and keys[runs[-1][0]] == key:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((index, 1))
    uniform = len({length for _, length in runs}) == 1
    first: dict[str, int] = {}
    bad: list[tuple[int, int]] = []
    for start, length in runs:
        key = keys[start]
        if key in first:  # a second run of the same host
            bad += [(i, first[key]) for i in range(start, start + length)]
            continue
        first[key] = start
        if length > 1 and not uniform:
            bad += [(i, start) for i in range(start + 1, start + length)]
    return sorted(bad)


def host_count_problem(count: int, tpu: TpuSlice) -> str | None:
    """``3 entries, but v4-32 has 4 hosts (2x2x4 chips, 4 chips per host)``, or None."""
    if count == tpu.num_hosts:
        return None
    if tpu.num_slices > 1:
        layout = f"{tpu.num_slices} slices of {tpu.topology_str} chips, {tpu.chips_per_host} chips per host"
        name = f"{tpu.accelerator_type} x {tpu.num_slices}"
    else:
        per = "process" if tpu.tasks_per_machine > 1 else "host"
        layout = f"{tpu.topology_str} chips, {tpu.chips_per_host} chips per {per}"
        name = tpu.accelerator_type
    if tpu.tasks_per_machine > 1:
        processes = f"{tpu.num_hosts} TPU processes, {tpu.tasks_per_machine} on each of {tpu.num_machines} machines"
        return f"{plural(count, 'entry')}, but {name} has {processes} ({layout}); expected one entry per process"
    hosts = plural(tpu.num_hosts, "host")
    return f"{plural(count, 'entry')}, but {name} has {hosts} ({layout}); expected one host per task"


def topology_problem(exc: TopologyError) -> str:
    return f"{exc.message}; {exc.hint}" if exc.hint else exc.message


# --- sections --------------------------------------------------------------------------------------

TOP_KEYS = (
    "cluster", "accelerator", "generation", "topology", "chips_per_host", "num_slices", "megacore", "device_kind",
    "backend", "hosts", "coordinator", "barrier_timeout", "meshes", "output", "auth", "restart",
    "watchdog", "metrics", "log_format", "preemption", "spares",
)  # fmt: skip
TOP_SUMMARY = "cluster, accelerator, backend, hosts, ..."
SLICE_KEYS = ("accelerator", "generation", "topology", "chips_per_host", "num_slices", "megacore", "device_kind")
COORDINATOR_KEYS = (
    "address", "port", "heartbeat_interval", "heartbeat_timeout", "register_timeout", "job_ports", "successors",
)  # fmt: skip
_PORT_RANGE_RE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$", re.ASCII)
_REQUIRED = {
    "cluster": "a cluster name, e.g. cluster: pod-a",
    "backend": "one of sim, tensorflow, jax",
    "hosts": "a list of host names or addresses, one per task (task id = position)",
}
_SLICE_EXPECTED = "accelerator: v4-32, or generation: v4 with topology: 2x2x4"
_UNKNOWN_HINTS = {
    "slice": f"the slice keys ({', '.join(SLICE_KEYS)}) sit at the top level",
    "task_id": "a host's task id is its position in hosts (or --task-id on the command line)",
    "name": suggestion("cluster"),
    "token_file": "it belongs under auth: (auth: {token_file: ...})",
    "max_restarts": "it belongs under restart: (restart: {policy: rejoin, max: 3})",
    "restart_timeout": "it belongs under restart: (restart: {policy: rejoin, timeout: 10m})",
    "min_slices": "it belongs under restart: (restart: {policy: elastic, min_slices: 2})",
    "spare": suggestion("spares"),
    "hang_timeout": "it belongs under watchdog: (watchdog: {hang_timeout: 10m})",
    "on_hang": "it belongs under watchdog: (watchdog: {on_hang: warn})",
    **{k: f"it belongs under coordinator: (coordinator: {{{k}: ...}})" for k in COORDINATOR_KEYS},
}


MAX_SLICE_TEXT = 32
"""Longest accelerator, generation or topology text (``v5litepod-256`` is 13): a 5,000-digit count is
refused here, before the slice model would convert it."""


def _slice_text(ck: Checker, node: Node, path: str, expected: str) -> str | None:
    text = ck.string(node, path, expected)
    if text is not None and len(text) > MAX_SLICE_TEXT:
        ck.add(node, path, f"{text[:20]!r}... is {len(text):,} characters long; expected {expected}")
        return None
    return text


_READERS: dict[str, Callable[[Checker, Node, str], object]] = {
    "accelerator": lambda ck, n, p: _slice_text(ck, n, p, "an accelerator type like v4-32"),
    "generation": lambda ck, n, p: _slice_text(ck, n, p, "a TPU generation: v2, v3, v4, v5e, v5p, v6e or 7x"),
    "topology": lambda ck, n, p: _slice_text(ck, n, p, "chips per axis, like 2x2x4 (or 4x4 for 2D generations)"),
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


def _slice(ck: Checker, root: Node, keys: dict[str, Node]) -> TpuSlice | None:
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


def _hosts(ck: Checker, node: Node, tpu: TpuSlice | None) -> tuple[str, ...] | None:
    items = ck.sequence(node, "hosts", _REQUIRED["hosts"])
    if items is None:
        return None
    if not items:
        ck.add(node, "hosts", f"is empty; expected {_REQUIRED['hosts']}")
        return None
    hosts: list[str] = []
    checked = [ck.host(item, f"hosts[{index}]") for index, item in enumerate(items)]
    bad = dict(repeated_hosts([h if h is not None else f"\0{i}" for i, h in enumerate(checked)]))
    for index, (item, host) in enumerate(zip(items, checked, strict=True)):
        if host is None:
            continue
        if index in bad:
            ck.add(item, f"hosts[{index}]", f"{host!r} repeats hosts[{bad[index]}]; expected {REPEAT_RULE}")
            continue
        hosts.append(host)
    if tpu is not None:
        problem = host_count_problem(len(items), tpu)
        if problem:
            ck.add(node, "hosts", problem)
            return None
    return tuple(hosts) if len(hosts) == len(items) else None


_WAIT_BOUNDS: dict[str, Bounds] = {
    "heartbeat_interval": HEARTBEAT_INTERVAL,
    "heartbeat_timeout": HEARTBEAT_TIMEOUT,
    "register_timeout": REGISTER_TIMEOUT,
}


def _coordinator(ck: Checker, node: Node, num_hosts: int | None, rejoin: bool | None) -> CoordinatorSpec | None:
    keys = ck.mapping(node, "coordinator", COORDINATOR_KEYS)
    if keys is None:
        return None
    default = CoordinatorSpec()
    address = ck.host(keys["address"], "coordinator.address") if "address" in keys else None
    port = ck.integer(keys["port"], "coordinator.port", 1, 65535) if "port" in keys else default.port
    waits: dict[str, float | None] = {}
    for name in ("heartbeat_interval", "heartbeat_timeout", "register_timeout"):
        given = keys.get(name)
        waits[name] = ck.duration(given, f"coordinator.{name}", _WAIT_BOUNDS[name]) if given else getattr(default, name)
    interval, timeout, register = waits["heartbeat_interval"], waits["heartbeat_timeout"], waits["register_timeout"]
    if interval is not None and timeout is not None and interval >= timeout:
        texts = {n: keys[n].text if n in keys else format_duration(getattr(default, n)) for n in waits}
        ck.add(
            keys.get("heartbeat_interval", keys.get("heartbeat_timeout", node)),
            "coordinator.heartbeat_interval",
            f"{texts['heartbeat_interval']} is not shorter than heartbeat_timeout {texts['heartbeat_timeout']}; "
            "expected an interval well below the timeout (a host missing heartbeats for the timeout is dead)",
        )
        return None
    job_ports = _port_range(ck, keys["job_ports"], "coordinator.job_ports") if "job_ports" in keys else None
    successors = check_successors(ck, keys["successors"], num_hosts, rejoin) if "successors" in keys else None
    if "successors" in keys and successors is None:
        return None
    if port is None or interval is None or timeout is None or register is None or ("address" in keys and not address):
        return None
    if "job_ports" in keys and job_ports is None:
        return None
    return CoordinatorSpec(port, interval, timeout, register, address, job_ports, successors)


def _port_range(ck: Checker, node: Node, path: str) -> tuple[int, int] | None:
    """``8477-8499``: the first and last port, inclusive."""
    expected = "a port range like 8477-8499 (first-last, inclusive, at least 2 ports)"
    match = _PORT_RANGE_RE.match(node.text) if node.kind == "scalar" else None
    if match is None:
        ck.add(node, path, f"got {described(node)}; expected {expected}")
        return None
    first, last = int(match.group(1)), int(match.group(2))
    if not 1 <= first < last <= 65535:
        ck.add(node, path, f"{first}-{last} is not a range of ports; expected {expected}")
        return None
    return (first, last)


def _file_path(ck: Checker, node: Node, path: str, example: str) -> str | None:
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


_TLS_KEYS = ("cert", "key", "ca", "client_cert", "client_key", "server_name")
_TLS_REQUIRED = {
    "cert": "the coordination service's certificate (PEM)",
    "key": "its private key (PEM)",
    "ca": "the CA certificate (PEM) the hosts verify the service with",
}


def _auth(ck: Checker, node: Node) -> AuthSpec | None:
    keys = ck.mapping(node, "auth", ("token_file", "tls"))
    if keys is None:
        return None
    if not keys:  # `auth:` written, with neither a token nor TLS in it
        ck.add(node, "auth.token_file", "missing; expected a file holding the cluster's shared token")
        return None
    token_file = None
    if "token_file" in keys:
        token_file = _file_path(ck, keys["token_file"], "auth.token_file", "/etc/tpuctl/token")
    tls = _tls(ck, keys["tls"]) if "tls" in keys else None
    if token_file is None and tls is None:
        return None
    return AuthSpec(token_file, tls)


def _tls(ck: Checker, node: Node) -> TlsSpec | None:
    keys = ck.mapping(node, "auth.tls", _TLS_KEYS, _TLS_REQUIRED)
    if keys is None:
        return None
    paths = {
        name: _file_path(ck, keys[name], f"auth.tls.{name}", f"/etc/tpuctl/{name.replace('_', '-')}.pem")
        for name in _TLS_KEYS[:5]
        if name in keys
    }
    if ("client_cert" in keys) != ("client_key" in keys):
        given, missing = ("client_cert", "client_key") if "client_cert" in keys else ("client_key", "client_cert")
        ck.add(keys[given], f"auth.tls.{missing}", "missing; mutual TLS needs both client_cert and client_key")
    server_name = None
    if "server_name" in keys:
        server_name = ck.string(keys["server_name"], "auth.tls.server_name", "a host name like coordinator.pod-a")
        if server_name is not None and not 0 < len(server_name) <= 253:
            ck.add(keys["server_name"], "auth.tls.server_name", "expected a host name of 1 to 253 characters")
            server_name = None
    cert, key, ca = paths.get("cert"), paths.get("key"), paths.get("ca")
    if cert is None or key is None or ca is None:
        return None
    return TlsSpec(cert, key, ca, paths.get("client_cert"), paths.get("client_key"), server_name)


def _restart(ck: Checker, node: Node, tpu: TpuSlice | None = None) -> RestartSpec | None:
    keys = ck.mapping(node, "restart", ("policy", "timeout", "max", "min_slices"))
    if keys is None:
        return None
    default = RestartSpec()
    policy: str | None = default.policy
    if "policy" in keys:
        policy = ck.choice(
            keys["policy"], "restart.policy", RESTART_POLICIES, "a restart policy",
            hint=lambda word: "expected fail, rejoin or elastic" + suggestion_for(word, RESTART_POLICIES),
        )  # fmt: skip
    timeout = ck.duration(keys["timeout"], "restart.timeout", RESTART_TIMEOUT) if "timeout" in keys else default.timeout
    most = ck.integer(keys["max"], "restart.max", 1, MAX_RESTARTS) if "max" in keys else default.max_restarts
    fewest: int | None = 0
    if "min_slices" in keys:
        fewest = ck.integer(keys["min_slices"], "restart.min_slices", 1, None)
        if fewest is not None and policy is not None and policy != "elastic":
            ck.add(
                keys["min_slices"], "restart.min_slices",
                f"is for policy elastic, but the policy is {policy}; expected restart: {{policy: elastic, "
                f"min_slices: {fewest}}} (a generation may then go on with fewer slices), or no min_slices",
            )  # fmt: skip
            fewest = None
        elif fewest is not None and tpu is not None and not check_min_slices(ck, keys["min_slices"], fewest, tpu):
            fewest = None
    if policy is None or timeout is None or most is None or fewest is None:
        return None
    return RestartSpec(policy, timeout, most, fewest)


def check_min_slices(ck: Checker, node: Node, fewest: int, tpu: TpuSlice) -> bool:
    """``restart.min_slices`` against the slice count (1 .. num_slices); False after recording a problem."""
    if fewest <= tpu.num_slices:
        return True
    slices = plural(tpu.num_slices, "slice")
    ck.add(
        node, "restart.min_slices",
        f"{fewest} is more than the cluster's {slices} ({tpu.accelerator_type} x {tpu.num_slices}); "
        f"expected 1 to {tpu.num_slices} (the fewest slices a generation may go on with)",
    )  # fmt: skip
    return False


def _spares(
    ck: Checker, node: Node, tpu: TpuSlice | None, hosts: tuple[str, ...] | None, restart: RestartSpec | None
) -> tuple[str, ...] | None:
    """``spares:``: standby hosts, whole slices of the spec's slice, none repeating a host; policy rejoin or elastic."""
    expected = "a list of standby host names or addresses, whole slices (docs/how-to/elastic.md)"
    items = ck.sequence(node, "spares", expected)
    if items is None:
        return None
    checked = [ck.host(item, f"spares[{index}]") for index, item in enumerate(items)]
    seen = {normalize_host(h): f"hosts[{i}]" for i, h in enumerate(hosts or ())}
    spares: list[str] = []
    for index, (item, host) in enumerate(zip(items, checked, strict=True)):
        if host is None:
            continue
        key = normalize_host(host)
        if key in seen:
            ck.add(item, f"spares[{index}]", f"{host!r} repeats {seen[key]}; expected each spare once, not a host")
            continue
        seen[key] = f"spares[{index}]"
        spares.append(host)
    ok = len(spares) == len(items)
    if restart is not None and not restart.rejoin and items:
        ck.add(
            node, "spares",
            f"a spare only takes a lost slice's place when the cluster re-forms, but restart.policy is {restart.policy}; "
            "expected restart: {policy: rejoin} or {policy: elastic}",
        )  # fmt: skip
        ok = False
    if tpu is not None and items and len(items) % tpu.hosts_per_slice:
        per = tpu.hosts_per_slice
        ck.add(
            node, "spares",
            f"{plural(len(items), 'entry')}, but a {tpu.accelerator_type} slice has {plural(per, 'host')}; expected whole "
            f"slices (a multiple of {per}): a slice is replaced whole",
        )  # fmt: skip
        ok = False
    return tuple(spares) if ok else None


def suggestion_for(word: str, choices: Sequence[str]) -> str:
    """ "; did you mean 'rejoin'?" when ``word`` is close to one of ``choices``, else ""."""
    near = closest(word.lower(), choices)
    return f"; {suggestion(near)}" if near else ""


# --- the whole spec --------------------------------------------------------------------------------


def _cluster(ck: Checker, root: Node, source: str) -> ClusterSpec | None:
    if root.kind != "mapping":
        ck.add(root, "", f"the spec is {described(root)}; expected a mapping with keys {TOP_SUMMARY}")
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
    barrier = (
        ck.duration(keys["barrier_timeout"], "barrier_timeout", BARRIER_TIMEOUT) if "barrier_timeout" in keys else 600.0
    )
    meshes = check_meshes(ck, keys["meshes"], tpu) if "meshes" in keys else ()
    output = _file_path(ck, keys["output"], "output", DEFAULT_OUTPUT) if "output" in keys else DEFAULT_OUTPUT
    auth = _auth(ck, keys["auth"]) if "auth" in keys else None
    restart = _restart(ck, keys["restart"], tpu) if "restart" in keys else RestartSpec()
    spares = _spares(ck, keys["spares"], tpu, hosts, restart) if "spares" in keys else ()
    if restart is not None and restart.elastic and meshes and tpu is not None and "meshes" in keys:
        from tpuctl.spec.elastic import resize_problems  # the generation's spec is built there (it imports this)

        for problem in resize_problems(meshes, tpu.num_slices, restart.min_slices or tpu.num_slices):
            ck.add(keys["meshes"], "meshes", problem)
    rejoin = restart.rejoin if restart is not None else None
    count = len(hosts) if hosts is not None else None
    coordinator = _coordinator(ck, keys["coordinator"], count, rejoin) if "coordinator" in keys else CoordinatorSpec()
    watchdog = check_watchdog(ck, keys["watchdog"], rejoin) if "watchdog" in keys else WatchdogSettings()
    metrics_ok, metrics = check_metrics(ck, keys["metrics"]) if "metrics" in keys else (True, None)
    log_format = check_log_format(ck, keys["log_format"]) if "log_format" in keys else DEFAULT_LOG_FORMAT
    if metrics is not None and coordinator is not None and metrics.port == coordinator.port:
        ck.add(keys["metrics"], "metrics.port", f"{metrics.port} is the coordinator's port too; expected another port")
    preemption = check_preemption(ck, keys["preemption"]) if "preemption" in keys else PreemptionSettings()
    if (
        ck.problems
        or cluster is None
        or tpu is None
        or backend is None
        or hosts is None
        or spares is None
        or coordinator is None
        or barrier is None
        or meshes is None
        or output is None
        or restart is None
        or watchdog is None
        or not metrics_ok
        or log_format is None
        or preemption is None
    ):
        return None
    return ClusterSpec(
        cluster=cluster,
        slice=tpu,
        backend=cast(Backend, backend),
        hosts=hosts,
        spares=spares,
        coordinator=coordinator,
        barrier_timeout=barrier,
        meshes=meshes,
        output=output,
        auth=auth,
        restart=restart,
        watchdog=watchdog,
        metrics=metrics,
        log_format=log_format,
        preemption=preemption,
        source=source,
    )


def check_spec(root: Node, source: str = "<spec>") -> SpecCheck:
    """Every problem in the spec ``root`` (sorted by position), or the spec when there is none."""
    ck = Checker()
    spec = _cluster(ck, root, source)
    problems = tuple(sorted(ck.problems, key=lambda p: (p.line, p.column)))
    return SpecCheck(source, None if problems else spec, problems)


def build_spec(root: Node, source: str = "<spec>") -> ClusterSpec:
    """The spec ``root`` describes; SpecError listing every problem otherwise."""
    return check_spec(root, source).unwrap()
