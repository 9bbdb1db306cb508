"""Logical device meshes over a TPU slice: DTensor's ring order, JAX's order, and how good each axis is.

Imports nothing eagerly (a job loading its mapping needs only the model). Pure: no numpy, grpc, click or I/O, so the mapping loader and the CLI stay light.

* :mod:`tpuctl.mesh.model`: ``MeshSpec`` (what a spec asks for), ``Mesh`` and ``MeshAxis`` (what was built);
* :mod:`tpuctl.mesh.build`: ``build_mesh`` / ``build_declared_meshes``, a spec's meshes on a slice;
* :mod:`tpuctl.mesh.ring`: DTensor's ``create_tpu_mesh`` order (exactly, or with tpuctl's fixes);
* :mod:`tpuctl.mesh.jaxmode`: JAX's ``create_device_mesh`` / ``create_hybrid_device_mesh``;
* :mod:`tpuctl.mesh.quality`: per-axis neighbours, ring closure and hops;
* :mod:`tpuctl.mesh.strings`: DTensor's mesh and host-mesh strings.
"""
