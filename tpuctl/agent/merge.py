"""The core-ID merge of ``tpuctl init``: this host's core IDs from the backend, one record per host, one
gather, the mapping built from it.

Every generation of the cluster merges again, from scratch: a host's VM may have been replaced and report
other core IDs; the mapping follows (checked like the first), and it carries its generation.

Each host publishes one record (its core IDs and the port it reserved for DTensor's server; task 0 also
the mapping's creation time and JAX's coordinator port), the service assembles every host's record once
and sends every host the same bytes, and every host builds the same mapping from them: byte-identical
files, as DTensor's all-reduce of core IDs gives every host the same table.

The mapping is written beside its final place as a hidden *pending* file and moved into place only after
init's final barrier (:func:`commit`), so a cluster that never came up leaves no mapping that loads.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from tpuctl.agent.protocol import JobPorts
from tpuctl.errors import ClusterError, StateError
from tpuctl.spec.model import ClusterSpec

if TYPE_CHECKING:
    from tpuctl.coordination.session import Session
    from tpuctl.mapping.model import DeviceMapping

INIT_GATHER = "tpuctl/init/cores"  # the core-ID merge: core IDs, job ports, creation time
PROGRESS_EVERY_S = 2.0


class _Record(TypedDict):
    cores: list[int]
    dtensor_port: int


class InitRecord(_Record, total=False):
    """One host's part of the init gather (``created``, ``jax_port`` and ``torch_port``: task 0's only)."""

    created: float
    jax_port: int
    torch_port: int


async def merge(
    session: Session,
    spec: ClusterSpec,
    task: int,
    core_ids: list[int],
    *,
    incarnation: int,
    progress: Callable[[str], None],
    generation: int = 1,
    task_ids: list[int] | None = None,
    plan: tuple[tuple[int, int], ...] = (),
) -> tuple[DeviceMapping, JobPorts]:
    """Publish this host's record, gather everyone's, build the mapping: (mapping, the job ports).

    ``spec`` is the generation's (:func:`tpuctl.spec.elastic.for_plan`) and ``task`` this host's rank in it;
    ``task_ids`` and ``plan``: each rank's task id and the plan's runs, recorded in the mapping when the
    generation has a plan of its own."""
    from tpuctl.mapping.model import build_mapping, merged_devices
    from tpuctl.mesh.build import build_declared_meshes
    from tpuctl.tpu.topology import build_topologies, merge_core_ids

    # Ports for the jobs' own runtimes (DTensor's gRPC server on every host; JAX's coordinator and
    # torch.distributed's store on task 0). Each is held open until every host has published, so hosts
    # sharing a machine (a simulated cluster) cannot pick the same one.
    held = [hold_port(spec.coordinator.job_ports)]
    if task == 0:
        held.append(hold_port(spec.coordinator.job_ports))
        held.append(hold_port(spec.coordinator.job_ports))
    mine: InitRecord = {"cores": list(core_ids), "dtensor_port": held[0].getsockname()[1]}
    if task == 0:  # the mapping's creation time and JAX's port come from task 0, so every host agrees
        mine["created"] = time.time()
        mine["jax_port"] = held[1].getsockname()[1]
        mine["torch_port"] = held[2].getsockname()[1]
    try:
        values = await session.gather(  # on the session's stream
            INIT_GATHER,
            json.dumps(mine, separators=(",", ":")).encode(),
            timeout=spec.barrier_timeout,
            progress=lambda p: progress(f"task {task}: core-ID merge: {p.describe()}"),
            progress_every=PROGRESS_EVERY_S,
        )
    finally:
        for sock in held:
            sock.close()
    published = [parse_record(raw, t) for t, raw in enumerate(values)]
    ports = JobPorts(
        dtensor=tuple(int(p["dtensor_port"]) for p in published),
        jax=int(published[0]["jax_port"]),
        torch=int(published[0]["torch_port"]),
    )
    merged = merge_core_ids({t: p["cores"] for t, p in enumerate(published)}, spec.slice)
    meshes = build_declared_meshes(spec.meshes, spec.slice, merged_devices(spec.slice, merged))
    mapping = build_mapping(
        slice=spec.slice,
        cluster=spec.cluster,
        incarnation=incarnation,
        hosts=list(spec.hosts),
        merged=merged,
        topology=build_topologies(merged, spec.slice),
        created=float(published[0]["created"]),
        meshes=meshes,
        generation=generation,
        task_ids=task_ids,
        plan=plan,
    )
    return mapping, ports


def probe_limit(spec: ClusterSpec) -> float:
    """The longest a real backend's core-ID probe may take (the sim backend answers in-process)."""
    if spec.backend == "sim":
        return 0.0
    from tpuctl.backends.probe import PROBE_TIMEOUT_S

    return PROBE_TIMEOUT_S


async def local_core_ids(spec: ClusterSpec, task: int, progress: Callable[[str], None]) -> list[int]:
    """This host's core IDs from the backend. Real backends run in a short-lived child so this
    long-lived agent never holds the TPU the job needs; the sim backend runs in-process, after the
    simulated runtime start-up time ``TPUCTL_SIM_INIT_DELAY`` (seconds; 0 by default; tests use it
    to kill a host in the middle of init)."""
    if spec.backend != "sim":
        from tpuctl.backends.probe import probe_core_ids

        return await probe_core_ids(spec.backend, task, spec.slice)
    from tpuctl.backends.registry import get_backend
    from tpuctl.spec import hostenv

    delay = float(hostenv.environ().get("TPUCTL_SIM_INIT_DELAY", "0") or 0)
    if delay > 0:
        progress(f"task {task}: simulated TPU runtime starting ({delay:g} s)")
        await asyncio.sleep(delay)
    return get_backend("sim", spec.slice).local_core_ids(task)


def write_pending(output: Path, mapping: DeviceMapping) -> Path:
    """Write the mapping where it waits for init's final barrier; returns that path."""
    from tpuctl.mapping.file import write_mapping

    pending = pending_path(output)
    write_mapping(pending, mapping)
    return pending


def pending_path(output: Path) -> Path:
    """Where the mapping waits for the final barrier: beside the real one, hidden, not loadable by name."""
    return output.with_name(f".{output.name}.pending")


def commit(pending: Path | None, output: Path) -> None:
    """Move the pending mapping into place (atomic rename, then the folder fsynced so it survives a crash)."""
    if pending is None:
        return
    from tpuctl.files import fsync_dir

    try:
        os.replace(pending, output)
        fsync_dir(output.parent)
    except OSError as exc:
        raise StateError(f"cannot put the device mapping in place at {output}: {exc.strerror or exc}") from exc


def remove(path: Path | None) -> None:
    if path is None:
        return
    try:
        path.unlink()
    except (FileNotFoundError, NotADirectoryError):
        pass  # nothing there (writing it will say what is wrong with the folder)
    except OSError as exc:
        raise StateError(
            f"cannot remove the previous device mapping {path}: {exc.strerror or exc}",
            hint="the mapping's folder must be writable by this user (or pass --out FILE)",
        ) from exc


def parse_record(raw: bytes, task: int) -> InitRecord:
    """One host's part of the init gather; ClusterError naming the host when it is not one."""
    try:
        value = json.loads(raw)
        common = isinstance(value, dict) and isinstance(value.get("cores"), list) and isinstance(value.get("dtensor_port"), int)
        first = common and isinstance(value.get("created"), float)
        first = first and all(isinstance(value.get(k), int) for k in ("jax_port", "torch_port"))
        if common and (task != 0 or first):
            record: InitRecord = {"cores": value["cores"], "dtensor_port": value["dtensor_port"]}
            if first:
                record["created"], record["jax_port"] = value["created"], value["jax_port"]
                record["torch_port"] = value["torch_port"]
            return record
    except ValueError:
        pass
    raise ClusterError(
        f"task {task} published {len(raw):,} bytes that are not tpuctl's init record (core ids, job ports)",
        hint="every host must run the same tpuctl version; restart the cluster with one",
    )


def hold_port(port_range: tuple[int, int] | None) -> socket.socket:
    """A TCP socket bound to a free port on every interface (the first free one of ``port_range`` when the
    spec gives ``coordinator.job_ports``), kept open to reserve the port until every host has published."""
    candidates = [0] if port_range is None else range(port_range[0], port_range[1] + 1)
    for port in candidates:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("", port))
        except OSError:
            sock.close()
            continue
        return sock
    first, last = port_range or (0, 0)
    raise StateError(
        f"no free port in coordinator.job_ports {first}-{last} on this host for the job's runtime",
        hint="widen coordinator.job_ports (each host needs one port, task 0 three), or free some of them",
    )
