"""JAX mode against the installed jax's ``mesh_utils`` on libtpu's own device lists.

For each slice libtpu builds (compile-only devices, no TPU needed) and every 1-, 2- and 3-axis shape of
its device count, with each combination of ``contiguous_submeshes`` and ``allow_split_physical_axes``,
``create_device_mesh`` and tpuctl must give the same device ids, or both refuse. jax 0.10.2's prime
factorisation bug (``_get_prime_factors(10) == [5]``; jax-ml/jax#38286) makes jax crash on some split
shapes; there tpuctl must give what jax gives once the factorisation is corrected (jax HEAD's behaviour),
and a result that is a permutation of the devices. Multislice lists go through
``create_hybrid_device_mesh``. libtpu prints warnings on stderr.
"""

from __future__ import annotations

import functools
import itertools
import math
from types import SimpleNamespace
from typing import Any

import jax.experimental.topologies as jax_topologies
import pytest

# jax's own module, private: the dev extra pins the jax (0.10.2) that tpuctl's JAX mode reproduces, and the
# test patches its _get_prime_factors; no skip, so a missing jax, or one without it, fails here
from jax._src import mesh_utils

from tpuctl.errors import InputError
from tpuctl.mesh import jaxmode
from tpuctl.tpu.slice import Device, TpuSlice, resolve_slice

pytestmark = pytest.mark.oracle


def correct_prime_factors(n: int) -> list[int]:
    return jaxmode.prime_factors(n)


@functools.cache
def libtpu_devices(tpu: TpuSlice) -> tuple[Any, ...]:
    kwargs: dict[str, Any] = {}
    if tpu.generation.name in ("v4", "v5p"):
        kwargs["chip_config_name"] = "megacore" if tpu.megacore else "default"
    desc: Any = jax_topologies.get_topology_desc(
        tpu.libtpu_topology_name,
        "tpu",
        chips_per_host_bounds=tpu.chips_per_host_bounds,
        num_slices=tpu.num_slices,
        **kwargs,
    )
    return tuple(desc.devices)


def as_records(devices: tuple[Any, ...]) -> list[Device]:
    seen: dict[int, int] = {}
    out = []
    for d in devices:
        ordinal = seen.get(d.process_index, 0)
        seen[d.process_index] = ordinal + 1
        out.append(
            Device(d.id, d.process_index, getattr(d, "slice_index", 0), tuple(d.coords), d.core_on_chip, ordinal)
        )
    return out


def with_kind(devices: tuple[Any, ...], kind: str) -> tuple[Any, ...]:
    """The same devices reporting another device_kind (e.g. v5p's Pathways name "TPU v5p")."""
    return tuple(
        SimpleNamespace(
            id=d.id, platform="tpu", device_kind=kind, process_index=d.process_index, coords=tuple(d.coords),
            core_on_chip=d.core_on_chip, slice_index=getattr(d, "slice_index", 0),
        )
        for d in devices
    )  # fmt: skip


def shapes(n: int, limit: int = 3) -> list[tuple[int, ...]]:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    out: list[tuple[int, ...]] = [(n,)]
    out += [(a, n // a) for a in divisors]
    if limit >= 3:
        out += [(a, b, n // a // b) for a in divisors for b in divisors if n % (a * b) == 0]
    return out


def jax_ids(shape: tuple[int, ...], devices: Any, **kw: Any) -> list[int] | Exception:
    try:
        return [d.id for d in mesh_utils.create_device_mesh(shape, devices, **kw).flat]
    except (ValueError, NotImplementedError, AssertionError, TypeError) as exc:
        return exc


def ours(shape: tuple[int, ...], records: list[Device], kind: str, **kw: Any) -> list[int] | InputError:
    try:
        return jaxmode.create_device_mesh(shape, records, kind, **kw)
    except InputError as exc:
        return exc


def compare(
    devices: tuple[Any, ...], kind: str, cases: list[tuple[int, ...]], monkeypatch: pytest.MonkeyPatch
) -> dict[str, int]:
    records = as_records(devices)
    counts = {"equal": 0, "refused": 0, "jax_bug": 0}
    for shape, contiguous, split in itertools.product(cases, (False, True), (False, True)):
        kw = {"contiguous_submeshes": contiguous, "allow_split_physical_axes": split}
        what = f"{kind} {len(devices)} devices shape {shape} {kw}"
        theirs = jax_ids(shape, devices, **kw)
        mine = ours(shape, records, kind, **kw)
        if isinstance(theirs, TypeError) or (isinstance(theirs, ValueError) and split and "reshape" in str(theirs)):
            with monkeypatch.context() as m:  # jax HEAD's factorisation
                m.setattr(mesh_utils, "_get_prime_factors", correct_prime_factors)
                fixed = jax_ids(shape, devices, **kw)
            assert not isinstance(fixed, Exception), f"{what}: corrected jax still fails: {fixed!r}"
            assert mine == fixed, what
            assert sorted(mine) == sorted(d.id for d in devices), what
            counts["jax_bug"] += 1
        elif isinstance(theirs, Exception):
            assert isinstance(mine, InputError), f"{what}: jax refused ({theirs!r}), tpuctl built {mine}"
            counts["refused"] += 1
        else:
            assert mine == theirs, what
            counts["equal"] += 1
    return counts


def case(accelerator: str, **kw: Any) -> Any:
    return pytest.param(accelerator, kw, id="-".join([accelerator, *(f"{k}={v}" for k, v in kw.items())]))


SLICES = [
    *(case(a) for a in ("v2-8", "v2-32", "v3-8", "v3-32", "v3-64", "v3-128")),
    *(case(a) for a in ("v4-8", "v4-16", "v4-32", "v4-64", "v4-128", "v4-256", "v4-512")),
    case("v4-16", megacore=False),
    case("v4-8", megacore=False),
    *(case(a) for a in ("v5litepod-1", "v5litepod-4", "v5litepod-8", "v5litepod-16", "v5litepod-32", "v5litepod-64")),
    case("v5litepod-16", chips_per_host=8),
    case("v5litepod-256"),
    *(case(a) for a in ("v6e-8", "v6e-16", "v6e-128")),
    *(case(a) for a in ("v5p-8", "v5p-16", "v5p-32", "v5p-64", "v5p-128", "v5p-384", "v5p-640")),
    *(case(a) for a in ("tpu7x-2", "tpu7x-8", "tpu7x-16", "tpu7x-32", "tpu7x-64", "tpu7x-128")),
]


@pytest.mark.parametrize(("accelerator", "kw"), SLICES)
def test_create_device_mesh_equals_jax(accelerator: str, kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    tpu = resolve_slice(accelerator=accelerator, **kw)
    devices = libtpu_devices(tpu)
    cases = shapes(len(devices), 3 if len(devices) <= 320 else 2)
    counts = compare(devices, devices[-1].device_kind, cases, monkeypatch)
    # v4 with two devices per chip: JAX refuses every shape ("requires one device per chip")
    assert counts["equal"] > 0 or (tpu.devices_per_chip == 2 and counts["refused"] == 4 * len(cases))
    if tpu.generation.name == "v5p":  # Pathways' kind name has a 2x2x2 handler that "TPU v5" lacks in 0.10.2
        compare(with_kind(devices, "TPU v5p"), "TPU v5p", cases, monkeypatch)


def test_unordered_device_lists_equal_jax(monkeypatch: pytest.MonkeyPatch) -> None:
    """Handlers and the physical box read coords, not list order (except v2/v3 and 7x, which use it)."""
    for accelerator in ("v4-32", "v5litepod-16", "v3-32", "tpu7x-16", "v5p-16"):
        devices = libtpu_devices(resolve_slice(accelerator=accelerator))
        shuffled = tuple(devices[i] for i in sorted(range(len(devices)), key=lambda i: (i * 7) % len(devices)))
        compare(shuffled, devices[-1].device_kind, shapes(len(devices), 2), monkeypatch)


HYBRID = [
    ("v4-32", 2), ("v5litepod-16", 2), ("v5litepod-8", 4), ("v4-128", 2), ("tpu7x-16", 2), ("v3-32", 2),
]  # fmt: skip


@pytest.mark.parametrize(("accelerator", "slices"), HYBRID, ids=[f"{a}x{n}" for a, n in HYBRID])
def test_hybrid_equals_jax(accelerator: str, slices: int) -> None:
    tpu = resolve_slice(accelerator=accelerator, num_slices=slices)
    devices = libtpu_devices(tpu)
    records = as_records(devices)
    kind = devices[-1].device_kind
    per = tpu.devices_per_slice
    checked = 0
    for ici in shapes(per, 2):
        for k in range(len(ici)):
            dcn = tuple(slices if i == k else 1 for i in range(len(ici)))
            for split in (False, True):
                try:
                    theirs = [
                        d.id
                        for d in mesh_utils.create_hybrid_device_mesh(
                            ici, dcn, devices, allow_split_physical_axes=split
                        ).flat
                    ]
                except (ValueError, NotImplementedError, AssertionError):
                    with pytest.raises(InputError):
                        jaxmode.create_hybrid_device_mesh(ici, dcn, records, kind, allow_split_physical_axes=split)
                    continue
                assert (
                    jaxmode.create_hybrid_device_mesh(ici, dcn, records, kind, allow_split_physical_axes=split)
                    == theirs
                )
                checked += 1
    assert checked > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("generation", "topology", "shape"),
    [
        ("v4", "16x16x16", (16, 256)),
        ("v4", "16x16x16", (64, 64)),
        ("v5p", "16x16x24", (96, 64)),
        ("v5p", "16x20x28", (28, 320)),
        ("v5p", "16x20x28", (140, 64)),
        ("7x", "16x24x24", (384, 48)),
        ("7x", "16x24x24", (192, 96)),
    ],
)
def test_full_pods_equal_jax(
    generation: str, topology: str, shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    tpu = resolve_slice(generation=generation, topology=topology)
    devices = libtpu_devices(tpu)
    compare(devices, devices[-1].device_kind, [shape], monkeypatch)


def test_prime_factors_and_the_v5p_pod_jax_0_10_2_crashes_on() -> None:
    assert [jaxmode.prime_factors(n) for n in (1, 12, 121, 43, 10, 14, 22, 26, 28)] == [
        [], [2, 2, 3], [11, 11], [43], [2, 5], [2, 7], [2, 11], [2, 13], [2, 2, 7],
    ]  # fmt: skip
    assert mesh_utils._get_prime_factors(10) in ([5], [2, 5])  # [5] on jax <= 0.10.2
    tpu = resolve_slice(generation="v5p", topology="16x20x28")
    ids = jaxmode.create_device_mesh((140, 64), tpu.devices, tpu.device_kind, allow_split_physical_axes=True)
    assert sorted(ids) == list(range(math.prod(tpu.topology)))
