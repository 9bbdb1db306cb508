"""What one host's agent is asked to be: :class:`AgentOptions`, and :func:`build_options`, which resolves
them from ``tpuctl init``'s arguments (``tpuctl detect`` builds them from what it detected)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from tpuctl.agent.statedir import StateDir, resolve_state_dir
from tpuctl.processes import started_at
from tpuctl.spec.model import ClusterSpec


@dataclass(frozen=True)
class AgentOptions:
    """One host's agent: the cluster's spec, this host's task and address, where its mapping goes and
    the state dir it keeps its socket, lock, log and description in."""

    spec: ClusterSpec
    task: int
    state: StateDir
    output: Path
    address: str
    config_path: str | None = None
    started: float = 0.0
    """When ``tpuctl init`` started (wall seconds; 0.0: unknown): task 0's is the goodput ledger's start."""


def build_options(config: str | None, task_id: int | None, output: str | None, state_dir: str | None) -> AgentOptions:
    """Resolve the spec, this host's task id, the output path and the state dir (no side effects)."""
    from tpuctl.spec import hostenv
    from tpuctl.spec.detect import resolve_task_id, spec_from_tpu_env
    from tpuctl.spec.yamlfile import load_spec

    environ = hostenv.environ()
    spec = load_spec(config) if config else spec_from_tpu_env(environ)
    task = resolve_task_id(spec, task_id=task_id, environ=environ, local_names=hostenv.local_names())
    state = resolve_state_dir(state_dir)
    return AgentOptions(
        spec=spec,
        task=task,
        state=state,
        output=Path(output or spec.output).absolute(),
        address=spec.roster_hosts[task],
        config_path=str(Path(config).absolute()) if config else None,
        started=started_at(os.getpid()) or time.time(),
    )


def observed(
    options: AgentOptions, metrics: str | None, log_format: str | None, environ: Mapping[str, str]
) -> AgentOptions:
    """``options`` with ``init --metrics`` (else ``TPUCTL_METRICS``) over the spec's ``metrics:`` and
    ``--log-format`` (else ``TPUCTL_LOG_FORMAT``) over its ``log_format``; InputError (exit 2) for a value
    that is neither."""
    from tpuctl.errors import InputError
    from tpuctl.logformat import LOG_FORMAT_ENV, chosen_log_format
    from tpuctl.spec.metrics import METRICS_ENV, parse_metrics_option

    spec = options.spec
    endpoint = spec.metrics
    if metrics is not None:
        endpoint = parse_metrics_option(metrics)
    elif environ.get(METRICS_ENV):
        endpoint = parse_metrics_option(environ[METRICS_ENV], what=METRICS_ENV)
    if endpoint is not None and endpoint.port == spec.coordinator.port:
        raise InputError(
            f"metrics port {endpoint.port} is the coordinator's port too", hint="choose another port for metrics"
        )
    fmt = chosen_log_format(log_format, environ.get(LOG_FORMAT_ENV), spec.log_format)
    if endpoint == spec.metrics and fmt == spec.log_format:
        return options
    return replace(options, spec=replace(spec, metrics=endpoint, log_format=fmt))


__all__ = ["AgentOptions", "build_options", "observed"]
