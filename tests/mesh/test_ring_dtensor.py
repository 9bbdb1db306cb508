"""Ring mode against DTensor's own ``create_tpu_mesh`` (installed TensorFlow) on synthetic pods.

For every slice below, every 1-, 2- and 3-axis mesh shape and a spread of ring options, DTensor builds
the mesh for task 0 and the last task (its ``Mesh.to_string()`` and the core ids it registers for the
mesh name), and tpuctl builds the same mesh with ``compat: dtensor``; both must agree exactly, or both
refuse. Where DTensor accepts options it then mishandles (ring bounds that do not divide the slice: it
compares lists lexicographically), tpuctl refuses and DTensor's result is shown to be garbage. The default
(fixed) mode must equal DTensor wherever DTensor's rings are perfect, and never be worse elsewhere.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from dtensor_harness import fake_pod

from tpuctl.errors import InputError
from tpuctl.mesh.build import build_mesh
from tpuctl.mesh.model import Mesh, MeshSpec
from tpuctl.mesh.quality import Torus, ring_cost
from tpuctl.mesh.strings import default_job_name, dtensor_mesh_string, local_device_ids
from tpuctl.tpu.slice import TpuSlice, resolve_slice
from tpuctl.tpu.topology import core_id_of

pytestmark = pytest.mark.oracle

SLICES: list[tuple[str, dict[str, Any]]] = [
    ("v4-8", {"accelerator": "v4-8"}),
    ("v4-16", {"accelerator": "v4-16"}),
    ("v4-32", {"accelerator": "v4-32"}),
    ("v4-64", {"accelerator": "v4-64"}),
    ("v4-128", {"accelerator": "v4-128"}),
    ("v4-256", {"accelerator": "v4-256"}),
    ("v4-16-two-cores", {"accelerator": "v4-16", "megacore": False}),
    ("v3-8", {"accelerator": "v3-8"}),
    ("v3-32", {"accelerator": "v3-32"}),
    ("v3-64", {"accelerator": "v3-64"}),
    ("v2-8", {"accelerator": "v2-8"}),
    ("v5litepod-8", {"accelerator": "v5litepod-8"}),
    ("v5litepod-16", {"accelerator": "v5litepod-16"}),
    ("v5litepod-32-8chip-hosts", {"accelerator": "v5litepod-32", "chips_per_host": 8}),
    ("v6e-64", {"accelerator": "v6e-64"}),
    ("tpu7x-16", {"accelerator": "tpu7x-16"}),
    ("tpu7x-64", {"accelerator": "tpu7x-64"}),
    ("v5p-64", {"accelerator": "v5p-64"}),
    ("tpu7x-2", {"accelerator": "tpu7x-2"}),
    ("v5litepod-1", {"accelerator": "v5litepod-1"}),
]
RING_AXES = [None, ("core", "y", "z", "x"), ("z", "y", "x", "core"), ("x", "z", "y", "core"), ("y", "core", "x", "z")]


def shapes(n: int) -> list[tuple[int, ...]]:
    two = [(a, n // a) for a in range(1, n + 1) if n % a == 0]
    three = [(a, b, n // a // b) for a, b in itertools.product([2, 4], [2, 4]) if n % (a * b) == 0]
    return [(n,), *two, *three]


def variants(shape: tuple[int, ...], tpu: TpuSlice) -> Iterator[dict[str, Any]]:
    """Ring options to try on ``shape``: defaults, every ring_dims, orderings, orthogonal rings, whole
    hosts, and ring bounds (valid tiles and, where DTensor's lexicographic check lets them through, not)."""
    yield {}
    for rd in range(-len(shape), len(shape) + 1):
        if rd != 1 - len(shape):
            yield {"ring_dims": rd}
    for axes in RING_AXES[1:]:
        yield {"ring_axes": axes}
    yield {"build_ring_across_rings": True}
    yield {"build_ring_across_rings": True, "rotate_ring_across_rings": True}
    yield {"can_split_host_across_rings": False}
    yield {"can_split_host_across_rings": False, "ring_axes": ("core", "y", "x", "z")}
    x, y, z = tpu.topology
    c = tpu.devices_per_chip
    for rb in {(max(1, x // 2), y, z, c), (x, max(1, y // 2), z, c), (x, y, max(1, z // 2), c), (2, 2, 1, c)}:
        if all(r <= b for r, b in zip(rb, (x, y, z, c), strict=True)):
            yield {"ring_bounds": rb}
            yield {"ring_bounds": rb, "can_split_host_across_rings": False}
    yield {"ring_bounds": (1, y * 2, 1, 1)}  # lexicographically <= [x, y, z, c] when x > 1, but y is too big
    yield {"ring_bounds": (x, y, z, 1) if c == 2 else (max(1, x - 1), y, z, c)}


def ours(tpu: TpuSlice, shape: tuple[int, ...], options: dict[str, Any], compat: bool) -> Mesh:
    axes = tuple((f"d{i}", s) for i, s in enumerate(shape))
    opts = dict(options) | ({"compat": "dtensor"} if compat else {})
    return build_mesh(MeshSpec("m", axes, "ring", tuple(opts.items())), tpu)


def core_ids(mesh: Mesh, tpu: TpuSlice) -> list[int]:
    torus = Torus.of(tpu)
    return [core_id_of(loc[:3], loc[3], tpu) for _, loc in (torus.locate(d) for d in mesh.device_ids)]


def theirs(tf: SimpleNamespace, device: Any, shape: tuple[int, ...], options: dict[str, Any], name: str) -> str:
    kw = {k: list(v) if isinstance(v, tuple) else v for k, v in options.items()}
    mesh = tf.tpu_util.create_tpu_mesh([f"d{i}" for i in range(len(shape))], list(shape), name, **kw)
    return str(mesh.to_string())


def ring_blocks(order: list[int], shape: tuple[int, ...], ring_dims: int | None) -> list[list[int]]:
    rd = 1 - len(shape) if ring_dims is None else ring_dims
    size = math.prod(shape[:rd]) if rd > 0 else math.prod(shape[rd:]) if rd < 0 else 1
    return [order[r : r + size] for r in range(0, len(order), size)]


@pytest.mark.parametrize(("label", "kw"), SLICES, ids=[label for label, _ in SLICES])
def test_compat_equals_create_tpu_mesh(
    tf: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, label: str, kw: dict[str, Any]
) -> None:
    tpu = resolve_slice(**kw)
    torus = Torus.of(tpu)
    counter = itertools.count()
    checked = refused = garbage = 0
    for client in sorted({0, tpu.num_hosts - 1}):
        with fake_pod(tf, tpu, client, monkeypatch) as device:
            for shape in shapes(tpu.num_devices):
                for options in variants(shape, tpu):
                    name = f"m{next(counter)}"
                    what = f"{label} client {client} shape {shape} {options}"
                    try:
                        text = theirs(tf, device, shape, options, name)
                    except ValueError:
                        text = None
                    try:
                        mesh = ours(tpu, shape, options, compat=True)
                    except InputError:
                        mesh = None
                    if text is None:
                        assert mesh is None, f"DTensor refused but tpuctl built: {what}"
                        refused += 1
                        continue
                    if mesh is None:  # DTensor accepted options whose output is not the slice's devices
                        every = sorted(core_id_of(d.coords, d.core, tpu) for d in tpu.devices)
                        assert sorted(device.core_ids[name]) != every, f"tpuctl refused a good mesh: {what}"
                        garbage += 1
                        continue
                    local = local_device_ids(mesh, [d.id for d in tpu.devices_of_task(client)])
                    expected = dtensor_mesh_string(mesh, client, local, default_job_name(tpu.num_hosts))
                    assert text == expected.replace("m|", f"{name}|", 1), what
                    assert device.core_ids[name] == core_ids(mesh, tpu), what
                    checked += 1
                    try:
                        fixed = ours(tpu, shape, options, compat=False)
                    except InputError as exc:  # whole hosts of the real host block (v5e/v6e: 2x4 chips)
                        assert options.get("can_split_host_across_rings") is False, f"{what}: {exc}"
                        assert tpu.chips_per_host_bounds != (2, 2, 1) or "cannot hold whole hosts" in exc.message
                        continue
                    _fixed_not_worse(fixed, mesh, torus, shape, options, what)
    assert checked > 20 and refused + garbage >= 0


def _fixed_not_worse(
    fixed: Mesh, dtensor: Mesh, torus: Torus, shape: tuple[int, ...], options: dict[str, Any], what: str
) -> None:
    """Fixed mode = DTensor where DTensor's rings are perfect; else every ring block is at least as good."""
    assert sorted(fixed.device_ids) == sorted(dtensor.device_ids), what
    if options.get("build_ring_across_rings") or options.get("can_split_host_across_rings") is False:
        return  # secondary rings and host blocks: checked by the golden tests
    ring_dims = options.get("ring_dims")
    for a, b in zip(
        ring_blocks(list(fixed.device_ids), shape, ring_dims),
        ring_blocks(list(dtensor.device_ids), shape, ring_dims),
        strict=True,
    ):
        cost_a = ring_cost([torus.locate(d)[1] for d in a], torus)
        cost_b = ring_cost([torus.locate(d)[1] for d in b], torus)
        if cost_b == (0, 0, 0, 0):
            assert a == b, f"fixed mode changed a perfect DTensor ring: {what}"
        else:
            assert cost_a <= cost_b, f"fixed mode is worse than DTensor ({cost_a} > {cost_b}): {what}"
