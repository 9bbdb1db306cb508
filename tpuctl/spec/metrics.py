"""The spec's ``metrics:`` section and its ``log_format``: what a host exposes to Prometheus and log pipelines::

    metrics: {port: 8491}                       # /metrics on this host's own address (its hosts entry)
    metrics: {port: 8491, address: 0.0.0.0}     # ... bound to another address
    metrics: {socket: metrics.sock}             # a Unix socket; a relative path is in the host's state dir
    log_format: json                            # text (the default) or json: the agent log, one object a line

Off unless the section is there (``metrics: off`` says so). ``tpuctl init --metrics`` and
``TPUCTL_METRICS`` override the section with the same values written as one word (``8491``,
``0.0.0.0:8491``, ``unix:metrics.sock``, ``off``); ``--log-format`` and ``TPUCTL_LOG_FORMAT`` override
``log_format`` (:mod:`tpuctl.logformat`). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tpuctl.hosts import normalize_host
from tpuctl.logformat import DEFAULT_LOG_FORMAT, LOG_FORMATS
from tpuctl.spec.checker import Checker, Node, described, host_problem

METRICS_ENV = "TPUCTL_METRICS"
METRICS_KEYS = ("port", "address", "socket")
SUGGESTED_PORT = 8491
"""The port the docs suggest: beside the coordinator's 8490, clear of the TPU software's (``spec.model.DEFAULT_PORT``)."""
_EXPECTED = f"a port (metrics: {{port: {SUGGESTED_PORT}}}) or a Unix socket (metrics: {{socket: metrics.sock}}), or off"
_OPTION_EXPECTED = f"a port ({SUGGESTED_PORT}), ADDRESS:PORT (0.0.0.0:{SUGGESTED_PORT}), unix:PATH or off"
ANY_ADDRESS = ("0.0.0.0", "::")
"""Every address of the host: a scraper elsewhere may reach it (the default is the host's own hosts entry)."""
MAX_SOCKET_PATH = 107
"""Longest Unix socket path Linux binds (``sun_path`` is 108 bytes with its NUL)."""


@dataclass(frozen=True)
class MetricsSpec:
    """Where a host serves ``/metrics``: TCP ``port`` (on ``address``, else the host's own entry in
    ``hosts``), or the Unix socket ``socket``."""

    port: int | None = None
    address: str | None = None
    socket: str | None = None

    def port_for(self, task: int, hosts: Sequence[str]) -> int:
        """The TCP port of ``task``: ``port``, plus one for each task before it on the same machine (a
        machine running several TPU processes lists its tasks side by side, as ``TPU_PROCESS_PORT`` counts)."""
        assert self.port is not None
        me = normalize_host(hosts[task])
        earlier = 0
        while task - earlier - 1 >= 0 and normalize_host(hosts[task - earlier - 1]) == me:
            earlier += 1
        return self.port + earlier

    def describe(self) -> str:
        if self.socket is not None:
            return f"unix:{self.socket}"
        return f"{self.address}:{self.port}" if self.address else f"port {self.port}"


def check_metrics(ck: Checker, node: Node) -> tuple[bool, MetricsSpec | None]:
    """(True, the section's value or None for ``off``), or (False, None) after recording its problems."""
    if node.kind == "scalar" and (node.value is False or node.value == "off"):
        return True, None  # YAML reads an unquoted off as false
    if node.kind != "mapping":
        ck.add(node, "metrics", f"got {described(node)}; expected {_EXPECTED}")
        return False, None
    before = len(ck.problems)
    keys = ck.mapping(node, "metrics", METRICS_KEYS)
    if keys is None or len(ck.problems) > before:  # an unknown key: its "did you mean" says enough
        return False, None
    if ("port" in keys) == ("socket" in keys):
        ck.add(node, "metrics", ("both port and socket given" if "port" in keys else "neither port nor socket") + f"; expected {_EXPECTED}")
        return False, None
    if "socket" in keys:
        if "address" in keys:
            ck.add(keys["address"], "metrics.address", "an address goes with a port, not a socket; expected one of them")
            return False, None
        path = ck.string(keys["socket"], "metrics.socket", "a socket path like metrics.sock")
        problem = socket_problem(path) if path is not None else None
        if problem:
            ck.add(keys["socket"], "metrics.socket", problem)
        return (True, MetricsSpec(socket=path)) if path is not None and not problem else (False, None)
    port = ck.integer(keys["port"], "metrics.port", 1, 65535)
    address = None
    if "address" in keys:
        node = keys["address"]
        text = ck.string(node, "metrics.address", "an address to listen on, like 0.0.0.0 or 10.0.0.2")
        address = text if text in ANY_ADDRESS else ck.host(node, "metrics.address") if text is not None else None
    if port is None or ("address" in keys and address is None):
        return False, None
    return True, MetricsSpec(port=port, address=address)


def check_log_format(ck: Checker, node: Node) -> str | None:
    return ck.choice(node, "log_format", LOG_FORMATS, "a log format")


def socket_problem(path: str) -> str | None:
    if not path.strip() or "\0" in path or path.endswith("/"):
        return f"{path!r} is not a socket path; expected a file path like metrics.sock"
    if len(path.encode()) > MAX_SOCKET_PATH:
        return f"{path[:40]!r}... is {len(path.encode())} bytes long; a Unix socket path has at most {MAX_SOCKET_PATH}"
    return None


def parse_metrics_option(text: str, what: str = "--metrics") -> MetricsSpec | None:
    """``8491``, ``0.0.0.0:8491``, ``[::1]:8491``, ``unix:PATH`` -> the value; ``off`` -> None; InputError
    (exit 2) naming ``what`` otherwise."""
    from tpuctl.errors import InputError

    word = text.strip()
    if word.lower() in ("off", "none", "false", "0"):
        return None
    if word.startswith("unix:"):
        path = word[len("unix:") :]
        problem = socket_problem(path)
        if problem is None:
            return MetricsSpec(socket=path)
        raise InputError(f"{what} {text[:60]!r}: {problem}", hint=f"expected {_OPTION_EXPECTED}")
    address, _, port_text = word.rpartition(":")
    if address.startswith("[") and address.endswith("]"):
        address = address[1:-1]
    if port_text.isdigit() and 1 <= int(port_text) <= 65535 and len(port_text) <= 5:
        if not address:
            return MetricsSpec(port=int(port_text))
        if address in ANY_ADDRESS or host_problem(address) is None:
            return MetricsSpec(port=int(port_text), address=address)
    raise InputError(f"{what} {text[:60]!r} is not a metrics endpoint", hint=f"expected {_OPTION_EXPECTED}")


__all__ = [
    "DEFAULT_LOG_FORMAT",
    "METRICS_ENV",
    "SUGGESTED_PORT",
    "MetricsSpec",
    "check_log_format",
    "check_metrics",
    "parse_metrics_option",
]
