"""``make bench`` mesh figures: full-pod meshes built by tpuctl beside DTensor's and JAX's own code.

For each full pod (v4 16x16x16, v5p 16x20x28, 7x 16x24x24) and two shapes (rings of 16 under a data
axis, and one axis over every device), in the same process, interleaved, min of ``repeats``, GC off
while timing:

* ring mode (``tpuctl.mesh.build.mesh_order``, DTensor's order with tpuctl's fixes, and with
  ``compat: dtensor``) beside DTensor's helpers doing the same work (``_enumerate_core_locations``, the
  first ring's ``_build_all_reduce_ring`` applied to every block, then ``to_list``, as ``create_tpu_mesh``
  does before its C++ calls);
* JAX mode beside ``jax.experimental.mesh_utils.create_device_mesh`` on the same devices (plain Python
  objects with the attributes jax reads, its fastest input; libtpu's own device objects are slower);
* the per-axis quality figures (tpuctl only; no peer computes them).

Targets: ring mode at most half of DTensor's time, JAX mode at most JAX's. Run: ``python bench/mesh.py``.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

PODS = (("v4", "16x16x16"), ("v5p", "16x20x28"), ("7x", "16x24x24"))


def best(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Min seconds of each function, run in turn (interleaved) ``repeats`` times, GC off while timing."""
    out = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            gc.collect()
            gc.disable()
            try:
                start = time.perf_counter()
                fn()
                out[name] = min(out[name], time.perf_counter() - start)
            finally:
                gc.enable()
    return out


def dtensor_order(tu: Any, bounds: list[int], shape: tuple[int, ...]) -> list[list[int]]:
    """What ``create_tpu_mesh`` computes before its C++ calls, with default ring options."""
    ring_size = shape[-1]  # ring_dims = 1 - len(shape) = -1 for two axes
    locs = tu._enumerate_core_locations(bounds, bounds, ["core", "x", "y", "z"], True, ring_size)
    perm = tu._build_all_reduce_ring(locs[:ring_size])
    for r in range(0, len(locs), ring_size):
        locs[r : r + ring_size] = [locs[r + perm[i]] for i in range(ring_size)]
    return [loc.to_list() for loc in locs]


def contenders(tpu: Any, shape: tuple[int, int]) -> dict[str, Callable[[], object]]:
    """The functions timed for one pod and shape, all on the same devices."""
    from jax._src import mesh_utils
    from tensorflow.dtensor.python import tpu_util

    from tpuctl.mesh.build import mesh_order
    from tpuctl.mesh.model import MeshSpec
    from tpuctl.mesh.quality import mesh_quality

    devices = tpu.devices
    jax_devices = [
        SimpleNamespace(id=d.id, coords=d.coords, core_on_chip=d.core, device_kind=tpu.device_kind, platform="tpu")
        for d in devices
    ]
    bounds = [*tpu.topology, tpu.devices_per_chip]
    axes = (("a", shape[0]), ("b", shape[1]))
    ring, compat = MeshSpec("m", axes), MeshSpec("m", axes, "ring", (("compat", "dtensor"),))
    jax_spec = MeshSpec("m", axes, "jax")
    ids = mesh_order(ring, tpu, devices)[0]
    return {
        "ring": lambda: mesh_order(ring, tpu, devices),
        "ring:dtensor": lambda: mesh_order(compat, tpu, devices),
        "dtensor": lambda: dtensor_order(tpu_util, bounds, shape),
        "jax mode": lambda: mesh_order(jax_spec, tpu, devices),
        "jax": lambda: mesh_utils.create_device_mesh(shape, jax_devices),
        "quality": lambda: mesh_quality(("a", "b"), shape, ids, tpu),
    }


def main(repeats: int = 7) -> None:
    from tpuctl.tpu.slice import resolve_slice

    print(f"## meshes of full pods (ms, min of {repeats}, interleaved; ratio = tpuctl / peer)")
    worst = {"ring": 0.0, "jax": 0.0}
    for generation, topology in PODS:
        tpu = resolve_slice(generation=generation, topology=topology)
        n = tpu.num_devices
        for shape in ((n // 16, 16), (1, n)):
            t = best(contenders(tpu, shape), repeats)
            ring_ratio = t["ring"] / t["dtensor"]
            jax_ratio = t["jax mode"] / t["jax"]
            worst["ring"] = max(worst["ring"], ring_ratio)
            worst["jax"] = max(worst["jax"], jax_ratio)
            label = f"{generation:3} {topology} {n:5} devices {shape!s:>12}"
            print(
                f"{label}  ring {t['ring'] * 1e3:5.1f} (compat {t['ring:dtensor'] * 1e3:5.1f}) vs DTensor "
                f"{t['dtensor'] * 1e3:5.1f}: {ring_ratio:.2f}   jax {t['jax mode'] * 1e3:5.1f} vs JAX "
                f"{t['jax'] * 1e3:5.1f}: {jax_ratio:.2f}   quality {t['quality'] * 1e3:5.1f}"
            )
    print(
        f"worst ratios: ring / DTensor {worst['ring']:.2f} (target <= 0.50), jax / JAX {worst['jax']:.2f} (target <= 1.00)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    main(parser.parse_args().repeats)
