"""Logical device meshes over a TPU slice: DTensor's ring order, JAX's order, and how good each axis is.

Pure: no numpy, grpc, click or I/O, so the mapping loader and the CLI stay light.

* :func:`build_mesh` / :func:`build_declared_meshes` (:mod:`tpuctl.mesh.build`): a spec's meshes;
* :mod:`tpuctl.mesh.ring`: DTensor's ``create_tpu_mesh`` order (exactly, or with tpuctl's fixes);
* :mod:`tpuctl.mesh.jaxmode`: JAX's ``create_device_mesh`` / ``create_hybrid_device_mesh``;
* :mod:`tpuctl.mesh.quality`: per-axis neighbours, ring closure and hops;
* :mod:`tpuctl.mesh.strings`: DTensor's mesh and host-mesh strings.
"""

from __future__ import annotations

from tpuctl.mesh.build import build_declared_meshes, build_mesh
from tpuctl.mesh.model import AxisQuality, Mesh, MeshAxis

__all__ = ["AxisQuality", "Mesh", "MeshAxis", "build_declared_meshes", "build_mesh"]
