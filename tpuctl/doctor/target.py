"""Which cluster ``tpuctl doctor`` checks against: a spec file, the running agent's description, or what
this host's environment (and a Cloud TPU VM's metadata server) describes, in that order.

The answer comes with the ``cluster-spec`` check: what was found, or why nothing was (then the checks
that need the cluster's hosts are skipped, not failed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tpuctl.agent.statedir import StateDir
from tpuctl.doctor.checks import FAIL, OK, SKIP, WARN, Check, Target
from tpuctl.errors import SpecError, StateError, TpuctlError

if TYPE_CHECKING:
    from tpuctl.spec.model import ClusterSpec

NAME = "cluster-spec"


def split_target(text: str) -> tuple[str, int] | None:
    """``host:port`` or ``[v6]:port`` -> (host, port); None when it is neither."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def from_spec(
    spec: ClusterSpec, task_id: int | None, *, environ: Mapping[str, str], local_names: frozenset[str], origin: str
) -> tuple[Target, Check]:
    """The target a validated spec describes, with this host's task when it can be told."""
    from tpuctl.spec.detect import identify

    base = Target(
        hosts=spec.hosts,
        task=None,
        coordinator=spec.coordinator_address,
        port=spec.coordinator.port,
        backend=spec.backend,
        source=origin,
    )
    try:
        identity = identify(spec, task_id=task_id, environ=environ, local_names=local_names)
    except TpuctlError as exc:
        return base, Check(
            NAME, WARN, f"{origin}: {spec.describe()}; {exc.message}", fix=exc.hint or "pass --task-id N"
        )
    target = dataclasses.replace(base, task=identity.task_id)
    return target, Check(
        NAME, OK, f"{origin}: {spec.describe()}; this host is task {identity.task_id} ({identity.reason})"
    )


def from_agent(state: StateDir) -> tuple[Target, Check] | None:
    """The running agent's cluster (``agent.json``), or None when no agent runs for ``state``."""
    try:
        if state.live_pid() is None:
            return None
        info = state.read_info()
    except StateError:
        return None
    where = split_target(info.coordinator)
    if where is None:
        return None
    origin = f"the running agent ({state.info_file})"
    target = Target(
        hosts=tuple(info.hosts) or (where[0],),
        task=info.task,
        coordinator=where[0],
        port=where[1],
        backend=info.backend or _spec_backend(info.config),
        source=str(state.info_file),
    )
    backend = f", backend {target.backend}" if target.backend else ""
    return target, Check(
        NAME,
        OK,
        f"{origin}: cluster {info.cluster!r}, {info.num_tasks} hosts{backend}, this host is task {info.task}, "
        f"coordinator {info.coordinator}",
    )


def _spec_backend(config: str | None) -> str | None:
    """The backend of the spec an agent was started with (an ``agent.json`` written before it named the
    backend); None when there is no such spec or it no longer loads."""
    if not config:
        return None
    from tpuctl.spec.yamlfile import check_spec_file

    try:
        check = check_spec_file(config)
    except TpuctlError:
        return None
    return check.spec.backend if check.spec is not None else None


def find_target(config: str | None, task_id: int | None, state: StateDir) -> tuple[Target | None, Check]:
    """The cluster to check against and the ``cluster-spec`` check saying where it came from."""
    from tpuctl.spec import hostenv

    if config:
        from tpuctl.spec.yamlfile import check_spec_file

        try:
            check = check_spec_file(config)
        except TpuctlError as exc:
            return None, Check(NAME, FAIL, exc.message, fix=exc.hint)
        if not check.ok or check.spec is None:
            problems = check.formatted()
            return None, Check(
                NAME,
                FAIL,
                f"{config}: {len(problems)} problem(s); checks that need the cluster's hosts are skipped",
                fix=f"tpuctl validate --config {config}",
                details=tuple(problems),
            )
        return from_spec(
            check.spec, task_id, environ=hostenv.environ(), local_names=hostenv.local_names(), origin=config
        )
    running = from_agent(state)
    if running is not None:
        return running
    try:
        detection = hostenv.detect_cluster()
    except SpecError as exc:
        return None, Check(
            NAME,
            SKIP,
            f"no --config, no agent running, and the environment describes no complete cluster: "
            f"{'; '.join(exc.problems[:3])}",
            fix="pass --config FILE (tpuctl detect shows what was found)",
        )
    except TpuctlError as exc:
        return None, Check(NAME, SKIP, f"no --config and no agent running; {exc.message}", fix="pass --config FILE")
    return from_spec(
        detection.spec,
        task_id,
        environ=detection.values,
        local_names=hostenv.local_names(),
        origin=f"detected ({detection.platform})",
    )
