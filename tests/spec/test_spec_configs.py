"""Every example spec in configs/ is valid, and says what its comments say."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuctl.spec.yamlfile import load_spec

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
EXPECTED = {
    # file: (accelerator, topology, slices, hosts, devices, backend)
    "v3-32.yaml": ("v3-32", "4x4", 1, 4, 32, "tensorflow"),
    "v4-32.yaml": ("v4-32", "2x2x4", 1, 4, 16, "jax"),
    "v5litepod-16.yaml": ("v5litepod-16", "4x4", 1, 4, 16, "jax"),
    "v5p-128.yaml": ("v5p-128", "4x4x4", 1, 16, 64, "jax"),
    "v6e-16.yaml": ("v6e-16", "4x4", 1, 4, 16, "jax"),
    "tpu7x-16.yaml": ("tpu7x-16", "2x2x2", 1, 2, 16, "jax"),
    "v5e-2slice.yaml": ("v5litepod-16", "4x4", 2, 8, 32, "jax"),
    "local-v4-32.yaml": ("v4-32", "2x2x4", 1, 4, 16, "sim"),
}


def test_every_config_is_listed() -> None:
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_is_valid(name: str) -> None:
    spec = load_spec(CONFIGS / name)
    tpu = spec.slice
    got = (tpu.accelerator_type, tpu.topology_str, tpu.num_slices, len(spec.hosts), tpu.num_devices, spec.backend)
    assert got == EXPECTED[name]
    assert spec.meshes, "every example shows a mesh"
    assert all(m.size == tpu.num_devices for m in spec.meshes)


def test_local_config_suits_one_machine() -> None:
    spec = load_spec(CONFIGS / "local-v4-32.yaml")
    assert spec.hosts == ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
    assert (spec.coordinator.heartbeat_interval, spec.coordinator.heartbeat_timeout) == (1.0, 5.0)
    assert spec.coordinator.register_timeout == 60.0


def test_ipv6_example_dials_in_brackets() -> None:
    assert load_spec(CONFIGS / "tpu7x-16.yaml").coordinator_target == "[2001:db8::a]:8490"
