"""Per-axis quality figures: against a brute-force reading of the definition, and their properties."""

from __future__ import annotations

import contextlib
import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuctl.errors import InputError
from tpuctl.mesh.build import build_mesh
from tpuctl.mesh.model import MeshSpec, strides
from tpuctl.mesh.quality import Torus, mesh_quality
from tpuctl.tpu.slice import TpuSlice, resolve_slice

SLICES = [
    resolve_slice(accelerator="v4-32"), resolve_slice(accelerator="v4-128"), resolve_slice(accelerator="v3-32"),
    resolve_slice(accelerator="v5litepod-16"), resolve_slice(accelerator="tpu7x-16"),
    resolve_slice(accelerator="v5litepod-256"), resolve_slice(accelerator="v4-16", num_slices=2),
    resolve_slice(accelerator="v4-16", megacore=False), resolve_slice(accelerator="v6e-128"),
]  # fmt: skip


def brute(tpu: TpuSlice, shape: tuple[int, ...], ids: list[int]) -> list[tuple[bool, bool, int, int, int]]:
    """(neighbours, ring, max_hop, closing_hop, dcn_steps) per axis, straight from the definitions."""
    torus = Torus.of(tpu)

    def dist(a: int, b: int) -> int | None:
        (sa, la), (sb, lb) = torus.locate(a), torus.locate(b)
        if sa != sb:
            return None
        total = 0
        for i in range(3):
            d = abs(la[i] - lb[i])
            total += min(d, tpu.topology[i] - d) if tpu.wraparound[i] else d
        return total

    out = []
    for axis, size in enumerate(shape):
        if size == 1:
            out.append((True, True, 0, 0, 0))
            continue
        others = [range(n) for i, n in enumerate(shape) if i != axis]
        st_ = strides(shape)
        inner: list[int] = []
        closing: list[int] = []
        dcn = 0
        for rest in _product(others):
            index = list(rest)
            index.insert(axis, 0)
            line = [
                ids[sum(k * s for k, s in zip([*index[:axis], j, *index[axis + 1 :]], st_, strict=True))]
                for j in range(size)
            ]
            for a, b in itertools.pairwise(line):
                h = dist(a, b)
                dcn += h is None
                inner += [] if h is None else [h]
            if size > 2:
                h = dist(line[-1], line[0])
                dcn += h is None
                closing += [] if h is None else [h]
        neighbours = dcn == 0 and max(inner, default=0) <= 1
        out.append(
            (
                neighbours,
                neighbours and max(closing, default=0) <= 1,
                max(inner, default=0),
                max(closing, default=0),
                dcn,
            )
        )
    return out


def _product(ranges: list[range]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for r in ranges:
        out = [(*o, i) for o in out for i in r]
    return out


def shapes_of(n: int) -> list[tuple[int, ...]]:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return (
        [(n,)]
        + [(a, n // a) for a in divisors]
        + [(a, b, n // a // b) for a in divisors for b in divisors if n % (a * b) == 0]
    )


@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_quality_matches_the_definition(data: st.DataObject) -> None:
    tpu = data.draw(st.sampled_from(SLICES))
    shape = data.draw(st.sampled_from(shapes_of(tpu.num_devices)))
    ids = [d.id for d in tpu.devices]
    order = data.draw(st.sampled_from(["runtime", "shuffled", "ring", "jax"]))
    if order == "shuffled":
        random.Random(data.draw(st.integers(0, 10**6))).shuffle(ids)
    elif order in ("ring", "jax"):
        spec = MeshSpec(
            "m",
            tuple((f"a{i}", s) for i, s in enumerate(shape)),
            order,
            (("allow_split_physical_axes", True),) if order == "jax" else (),
        )
        with contextlib.suppress(InputError):  # a shape the mode refuses: keep the runtime order
            ids = list(build_mesh(spec, tpu).device_ids)
    names = [f"a{i}" for i in range(len(shape))]
    got = mesh_quality(names, shape, ids, tpu)
    assert [(q.neighbours, q.ring, q.max_hop, q.closing_hop, q.dcn_steps) for q in got] == brute(tpu, shape, ids)
    for q in got:
        assert not q.ring or q.neighbours
        assert q.reason.startswith("ring") == q.ring or q.size == 1


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_reversing_an_axis_keeps_its_quality(data: st.DataObject) -> None:
    tpu = data.draw(st.sampled_from(SLICES[:6]))
    shape = data.draw(st.sampled_from([s for s in shapes_of(tpu.num_devices) if len(s) == 2]))
    ids = [d.id for d in tpu.devices]
    random.Random(data.draw(st.integers(0, 10**6))).shuffle(ids)
    rows = [ids[r : r + shape[1]] for r in range(0, len(ids), shape[1])]
    flipped = [i for row in rows for i in reversed(row)]
    a = mesh_quality(["a", "b"], shape, ids, tpu)[1]
    b = mesh_quality(["a", "b"], shape, flipped, tpu)[1]
    assert (a.neighbours, a.ring, a.max_hop, a.closing_hop) == (b.neighbours, b.ring, b.max_hop, b.closing_hop)


FULL_RINGS = ["v4-16", "v4-32", "v4-64", "v4-128", "v4-256", "v3-32", "v3-128", "v5litepod-16", "v5litepod-64", "v6e-256", "tpu7x-16", "tpu7x-128", "v5p-384"]  # fmt: skip


@pytest.mark.parametrize("accelerator", FULL_RINGS)
def test_one_ring_over_every_device_is_a_ring(accelerator: str) -> None:
    """DTensor's snake is a Hamiltonian cycle on even grids; tpuctl keeps it (and it closes with or without
    wraparound)."""
    tpu = resolve_slice(accelerator=accelerator)
    mesh = build_mesh(MeshSpec("m", (("all", tpu.num_devices),), "ring", (("ring_dims", 1),)), tpu)
    q = mesh.quality[0]
    assert q.ring and q.max_hop <= 1 and q.closing_hop <= 1, q.reason


def test_reasons_say_why() -> None:
    tpu = resolve_slice(accelerator="v4-32")
    jax_mesh = build_mesh(MeshSpec("m", (("data", 4), ("model", 4)), "jax"), tpu)
    assert jax_mesh.axis_quality("model").reason == (
        "not neighbours: (0,1,0) -> (1,0,0) is 2 hops; and open: the last device returns to the first over 2 "
        "hops ((1,1,0) -> (0,0,0))"
    )
    assert jax_mesh.axis_quality("data").reason == (
        "open: consecutive devices are neighbours, but the last returns to the first over 3 hops "
        "((0,0,3) -> (0,0,0)); z has no wraparound links on this slice"
    )
    one = build_mesh(MeshSpec("m", (("one", 1), ("all", 16))), tpu)
    assert one.axis_quality("one").reason == "size 1: nothing to exchange"
    assert math.prod(one.shape) == 16
