"""Device mappings and agent descriptions for the job-side tests, built the way ``tpuctl init`` builds them."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from tpuctl.backends.sim import SimBackend
from tpuctl.mapping.model import DeviceMapping, MappedMesh, MeshAxis, build_mapping
from tpuctl.tpu.slice import resolve_slice
from tpuctl.tpu.topology import build_topologies, merge_core_ids

CREATED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def sim_mapping(hosts: list[str] | None = None, *, cluster: str = "pod-a", **slice_kw: Any) -> DeviceMapping:
    tpu = resolve_slice(**(slice_kw or {"accelerator": "v4-32"}))
    sim = SimBackend(tpu)
    merged = merge_core_ids({t: sim.local_core_ids(t) for t in range(tpu.num_hosts)}, tpu)
    addresses = hosts or [f"10.0.0.{t + 1}" for t in range(tpu.num_hosts)]
    return build_mapping(
        slice=tpu,
        cluster=cluster,
        incarnation=7,
        hosts=addresses,
        merged=merged,
        topology=build_topologies(merged, tpu),
        created=CREATED,
    )


def with_mesh(mapping: DeviceMapping, name: str, axes: dict[str, int], device_ids: list[int]) -> DeviceMapping:
    mesh = MappedMesh(name, tuple(MeshAxis(k, v) for k, v in axes.items()), tuple(device_ids), "test")
    return replace(mapping, meshes=(*mapping.meshes, mesh))


def agent_info(
    mapping: DeviceMapping,
    task: int,
    *,
    dtensor: list[int] | None = None,
    jax: int = 9002,
    torch: int = 9003,
    coordinator_port: int = 8490,  # tpuctl's default coordinator port
    path: str = "/run/tpuctl/mapping.json",
) -> dict[str, Any]:
    """What the agent of ``task`` writes to agent.json (the keys the job environment reads)."""
    hosts = [t.address for t in mapping.tasks]
    first = hosts[0]
    return {
        "cluster": mapping.cluster,
        "task": task,
        "address": hosts[task],
        "hosts": hosts,
        "num_tasks": len(hosts),
        "coordinator": f"[{first}]:{coordinator_port}" if ":" in first else f"{first}:{coordinator_port}",
        "mapping": path,
        "job_ports": {"dtensor": dtensor or [9100 + t for t in range(len(hosts))], "jax": jax, "torch": torch},
        "pid": 4242,
    }
