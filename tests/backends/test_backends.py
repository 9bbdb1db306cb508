"""Device backends: the sim backend against libtpu's own numbering, and the real backends without a TPU."""

from __future__ import annotations

import glob
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from tpuctl.backends.base import Backend
from tpuctl.backends.jax import JaxBackend, core_ids_of_devices
from tpuctl.backends.names import BACKEND_NAMES
from tpuctl.backends.registry import get_backend
from tpuctl.backends.sim import SimBackend
from tpuctl.backends.tensorflow import TensorFlowBackend
from tpuctl.errors import InputError, NoTpuError, TopologyError
from tpuctl.tpu.slice import TpuSlice, resolve_slice

V5E_16 = resolve_slice(accelerator="v5litepod-16")


def test_get_backend_by_name() -> None:
    assert isinstance(get_backend("sim", V5E_16), SimBackend)
    assert isinstance(get_backend("tensorflow", V5E_16), TensorFlowBackend)
    assert isinstance(get_backend("jax", V5E_16), JaxBackend)
    for name in BACKEND_NAMES:
        backend = get_backend(name, V5E_16)
        assert isinstance(backend, Backend)
        assert backend.name == name


def test_unknown_backend_suggests_a_name() -> None:
    with pytest.raises(InputError) as info:
        get_backend("jaxx", V5E_16)
    assert str(info.value) == "unknown device backend 'jaxx'\nhint: did you mean 'jax'?"
    with pytest.raises(InputError, match="expected one of sim, tensorflow, jax"):
        get_backend("pytorch", V5E_16)


@pytest.mark.parametrize(("alias", "name"), [("tf", "tensorflow"), ("TF", "tensorflow"), ("simulated", "sim")])
def test_aliases_are_refused_with_the_name_as_the_spec_does(alias: str, name: str) -> None:
    # one table (tpuctl.backends.names): the spec, TPUCTL_BACKEND and get_backend spell a backend one way
    from tpuctl.backends.names import backend_problem

    with pytest.raises(InputError) as info:
        get_backend(alias, V5E_16)
    assert info.value.hint == f"did you mean {name!r}?"
    assert backend_problem(alias) == f"{alias!r} is not a backend; did you mean {name!r}?"


def test_get_backend_imports_no_framework() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from tpuctl.backends.registry import get_backend; from tpuctl.tpu.slice import resolve_slice; "
        "s = resolve_slice(accelerator='v4-8'); [get_backend(n, s) for n in ('sim', 'tensorflow', 'jax')]; "
        "assert 'jax' not in sys.modules and 'tensorflow' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_sim_golden_v5litepod_16() -> None:
    #  y\x  0  1 | 2  3
    #  0    0  1 | 2  3      task 0 | task 1
    #  1    4  5 | 6  7
    #  2    8  9 |10 11      task 2 | task 3
    #  3   12 13 |14 15
    sim = SimBackend(V5E_16)
    assert [sim.local_core_ids(t) for t in range(4)] == [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]


def test_sim_megacore_ids_are_even_and_non_megacore_show_both_cores() -> None:
    assert SimBackend(resolve_slice(accelerator="v4-16")).local_core_ids(1) == [8, 10, 12, 14]
    assert SimBackend(resolve_slice(accelerator="v4-16", megacore=False)).local_core_ids(1) == list(range(8, 16))
    assert SimBackend(resolve_slice(accelerator="v3-32")).local_core_ids(1) == [4, 5, 6, 7, 12, 13, 14, 15]


def test_sim_refuses_a_task_outside_the_slice() -> None:
    with pytest.raises(TopologyError, match=r"task 4 is not in this slice"):
        SimBackend(V5E_16).local_core_ids(4)


# --- the sim backend against libtpu ----------------------------------------------------------------

LIBTPU_SLICES = [
    {"accelerator": "v2-8"},
    {"accelerator": "v3-32"},
    {"accelerator": "v4-32"},
    {"accelerator": "v4-16", "megacore": False},
    {"generation": "v4", "topology": "4x4x8"},
    {"accelerator": "v5p-128"},
    {"accelerator": "v5litepod-16"},
    {"accelerator": "v5litepod-16", "chips_per_host": 8},
    {"accelerator": "v5litepod-8", "num_slices": 2},
    {"accelerator": "v6e-64"},
    {"accelerator": "tpu7x-16"},
    {"accelerator": "tpu7x-128"},
]


@pytest.fixture(scope="module", autouse=True)
def shared_libtpu() -> Iterator[None]:
    """libtpu takes /tmp/libtpu_lockfile even for compile-only topologies; let concurrent test runs share it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        yield


def libtpu_devices(tpu: TpuSlice) -> list[Any]:
    from jax.experimental import topologies

    kwargs: dict[str, Any] = {"chips_per_host_bounds": tpu.chips_per_host_bounds}
    if tpu.generation.megacore_optional:
        kwargs["chip_config_name"] = "megacore" if tpu.megacore else "default"
    if tpu.num_slices > 1:
        kwargs["num_slices"] = tpu.num_slices
    return list(topologies.get_topology_desc(tpu.libtpu_topology_name, "tpu", **kwargs).devices)


@pytest.mark.oracle
@pytest.mark.parametrize("kw", LIBTPU_SLICES, ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_sim_core_ids_equal_libtpu_devices(kw: dict[str, Any]) -> None:
    pytest.importorskip("jax")
    tpu = resolve_slice(**kw)
    devices = libtpu_devices(tpu)
    assert len(devices) == tpu.num_devices
    local: dict[int, list[Any]] = defaultdict(list)
    for device in devices:  # jax.local_devices() of a process: its devices in jax.devices() order
        local[device.process_index].append(device)
    sim = SimBackend(tpu)
    assert sorted(local) == list(range(tpu.num_hosts))
    for task, devs in local.items():
        assert core_ids_of_devices(devs, tpu) == sim.local_core_ids(task)
        assert [d.id for d in devs] == [d.id for d in tpu.devices_of_task(task)]


# --- real backends on a host without TPUs ---------------------------------------------------------

HAS_TPU = os.path.exists("/dev/accel0") or bool(glob.glob("/dev/vfio/[0-9]*"))
no_tpu_only = pytest.mark.skipif(HAS_TPU, reason="this host has a TPU")


@pytest.mark.oracle
@no_tpu_only
def test_jax_backend_without_tpu_raises_no_tpu_error() -> None:
    pytest.importorskip("jax")
    start = time.monotonic()
    with pytest.raises(NoTpuError) as info:
        JaxBackend(V5E_16).local_core_ids(0)
    assert time.monotonic() - start < 30
    assert info.value.message.startswith("no TPU found on this host (backend jax): Backend 'tpu' failed to initialize")
    assert info.value.exit_code == 6
    assert "backend: sim" in str(info.value.hint)
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.oracle
@pytest.mark.slow
@no_tpu_only
def test_tensorflow_backend_without_tpu_raises_no_tpu_error() -> None:
    pytest.importorskip("tensorflow")
    start = time.monotonic()
    with pytest.raises(NoTpuError) as info:
        TensorFlowBackend(V5E_16).local_core_ids(0)
    assert time.monotonic() - start < 60
    assert info.value.message == (
        "no TPU found on this host (backend tensorflow): tf.config.list_physical_devices('TPU') is empty (devices: CPU)"
    )
    assert info.value.exit_code == 6


# --- the jax backend with a stand-in jax (the TPU paths a CI machine cannot reach) -----------------


def fake_jax(monkeypatch: pytest.MonkeyPatch, devices: list[Any] | None = None, error: str | None = None) -> None:
    def tpu_devices(backend: str | None = None) -> list[Any]:
        if error is not None:
            raise RuntimeError(error)
        return list(devices or [])

    stub = SimpleNamespace(devices=tpu_devices, local_devices=lambda backend=None: tpu_devices(backend))
    monkeypatch.setitem(sys.modules, "jax", stub)


def test_jax_backend_maps_local_devices_to_core_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    # Task 1 of a v4-16 megacore slice (z = 1), listed as jax lists it; tpu7x shows both cores of a chip.
    v4 = resolve_slice(accelerator="v4-16")
    chips = [SimpleNamespace(coords=[x, y, 1], core_on_chip=0) for y in range(2) for x in range(2)]
    fake_jax(monkeypatch, chips)
    assert JaxBackend(v4).local_core_ids(1) == [8, 10, 12, 14] == SimBackend(v4).local_core_ids(1)
    v7 = resolve_slice(accelerator="tpu7x-16")
    cores = [SimpleNamespace(coords=(1, 1, 1), core_on_chip=c) for c in (0, 1)]
    assert core_ids_of_devices(cores, v7) == [14, 15]


def test_jax_backend_reports_a_busy_tpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_jax(
        monkeypatch,
        error="Backend 'tpu' failed to initialize: ABORTED: Internal error when accessing libtpu multi-process "
        'lockfile. Run "$ sudo rm /tmp/libtpu_lockfile".',
    )
    with pytest.raises(NoTpuError) as info:
        JaxBackend(V5E_16).local_core_ids(0)
    assert info.value.message.startswith("the TPU on this host is held by another process (backend jax): Backend")
    assert "lsof" in str(info.value.hint)


def test_jax_backend_with_no_local_tpu_device(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_jax(monkeypatch, [])
    with pytest.raises(NoTpuError, match=r"\(backend jax\): jax lists no local TPU device"):
        JaxBackend(V5E_16).local_core_ids(0)
