"""The spec's coordinator, as one host's agent meets it: task 0 starts the coordination service, and every
host makes its client of it, both with the spec's token and TLS (``auth``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from tpuctl.spec.model import ClusterSpec, TlsSpec

if TYPE_CHECKING:
    from tpuctl.coordination.client import CoordinationClient
    from tpuctl.coordination.plan import Plan
    from tpuctl.coordination.server import CoordinationServer
    from tpuctl.coordination.tls import ClientTls
    from tpuctl.coordination.values import ServiceConfig


def load_token(spec: ClusterSpec) -> str | None:
    """The spec's shared token (``auth.token_file``), if it has one."""
    if spec.auth is None or spec.auth.token_file is None:
        return None
    from tpuctl.coordination.auth import load_token as read_token

    return read_token(spec.auth.token_file)


def service_config(
    spec: ClusterSpec, token: str | None, *, first_generation: int = 1, coordinator_task: int = 0,
    previous_plan: Plan | None = None, lost: tuple[int, ...] = (),
) -> ServiceConfig:  # fmt: skip
    """The coordination service's configuration for the spec: every roster host (hosts, then spares), the
    roster's slices and the cluster's slice shape (a spare must match it), the restart policy; a successor's
    also the lost coordinator's generation's plan and the tasks lost with it."""
    from tpuctl.coordination.values import RestartPolicy, ServiceConfig, TaskSpec
    from tpuctl.spec.elastic import cluster_shape, roster_of

    restart = spec.restart
    return ServiceConfig(
        cluster=spec.cluster,
        tasks=tuple(TaskSpec(address=h) for h in spec.roster_hosts),
        heartbeat_timeout=spec.coordinator.heartbeat_timeout,
        register_timeout=spec.coordinator.register_timeout,
        barrier_timeout=spec.barrier_timeout,
        token=token,
        restart=RestartPolicy(
            restart.rejoin, restart.timeout, restart.max_restarts, elastic=restart.elastic,
            min_slices=spec.min_slices if restart.elastic else 0,
        ),
        roster=roster_of(spec),
        slice_shape=cluster_shape(spec),
        first_generation=first_generation,
        watchdog=spec.watchdog,
        coordinator_task=coordinator_task,
        previous_plan=previous_plan,
        lost=lost,
    )


async def start_service(
    spec: ClusterSpec,
    token: str | None,
    *,
    first_generation: int = 1,
    journal: Path | None = None,
    started: float | None = None,
    task: int = 0,
    previous_plan: Plan | None = None,
    lost: tuple[int, ...] = (),
) -> CoordinationServer:
    """Task 0's coordination service for the spec's cluster, listening at the spec's address. ``journal``: the
    goodput ledger's journal (task 0's state dir), continued when the service starts above generation 1;
    ``started``: when task 0's init started (wall seconds; default: now), the ledger's start. ``task``: the
    task serving it (a successor, after the coordinator's host was lost: on its own address, same port);
    ``previous_plan`` and ``lost``: a successor's, the lost coordinator's generation's plan and the tasks lost
    with it (:class:`ServiceConfig`)."""
    from tpuctl.coordination.ledger import ServiceLedger
    from tpuctl.coordination.server import start_server

    config = service_config(
        spec, token, first_generation=first_generation, coordinator_task=task, previous_plan=previous_plan, lost=lost
    )
    tls = spec.auth.tls if spec.auth is not None else None
    server_tls = None
    if tls is not None:
        from tpuctl.coordination.tls import load_server_tls

        server_tls = load_server_tls(tls.cert, tls.key, client_ca=tls.ca if tls.mutual else None)
    # Task 0's agent is a process of its own that serves and keeps one session: its heap may be frozen
    # for the garbage collector while the cluster stands (``start_server``'s ``freeze_heap``).
    now = time.time()
    ledger = ServiceLedger.open(
        spec.cluster, generation=first_generation, started=now if started is None else started, now=now,
        journal_path=journal,
    )  # fmt: skip
    return await start_server(
        config, host=spec.coordinator_address if task == 0 else spec.hosts[task], port=spec.coordinator.port,
        tls=server_tls, freeze_heap=True, ledger=ledger,
    )  # fmt: skip


def connect(spec: ClusterSpec, token: str | None, *, target: str | None = None) -> CoordinationClient:
    """This host's client of the spec's coordinator (``target``: of the one serving at that address instead,
    a successor's)."""
    from tpuctl.coordination.client import CoordinationClient  # grpc: imported when the agent runs

    tls = spec.auth.tls if spec.auth is not None else None
    # Keepalive pings at the heartbeat interval: with the spec's defaults (5 s, 30 s) they vouch for the
    # coordinator, and the session sends no heartbeat messages.
    return CoordinationClient(
        target or spec.coordinator_target, token=token, tls=client_tls(tls), keepalive=spec.coordinator.heartbeat_interval
    )


def check_tls(spec: ClusterSpec, task: int) -> None:
    """Load the spec's TLS files as this host's agent will (task 0: its service's too): ``InputError``
    naming a file that cannot work (not PEM, encrypted, another certificate's key, ...) before anything
    starts."""
    tls = spec.auth.tls if spec.auth is not None else None
    if tls is None:
        return
    client_tls(tls)
    if task == 0:
        from tpuctl.coordination.tls import load_server_tls

        load_server_tls(tls.cert, tls.key, client_ca=tls.ca if tls.mutual else None)


def client_tls(tls: TlsSpec | None) -> ClientTls | None:
    """The client side of the spec's ``auth.tls`` (None: plaintext)."""
    if tls is None:
        return None
    from tpuctl.coordination.tls import load_client_tls

    return load_client_tls(tls.ca, cert=tls.client_cert, key=tls.client_key, server_name=tls.server_name)


__all__ = ["check_tls", "client_tls", "connect", "load_token", "service_config", "start_service"]
