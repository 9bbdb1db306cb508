"""The pure spec layer without YAML: host syntax, spec values, defaults, node trees built in Python."""

from __future__ import annotations

import pytest

from tpuctl.errors import SpecError
from tpuctl.hosts import normalize_host
from tpuctl.spec.model import (
    DEFAULT_OUTPUT,
    AuthSpec,
    ClusterSpec,
    CoordinatorSpec,
    MeshSpec,
    build_spec,
    check_spec,
    cluster_name_problem,
    host_count_problem,
    host_problem,
    node_from,
)
from tpuctl.spec.yamlfile import load_spec_text
from tpuctl.tpu.slice import resolve_slice

V4_32 = {"cluster": "pod-a", "accelerator": "v4-32", "backend": "sim", "hosts": ["h0", "h1", "h2", "h3"]}


@pytest.mark.parametrize(
    "host",
    [
        "10.0.0.1",
        "192.0.2.255",
        "w-0",
        "t1v-n-4f1c-w-0",
        "job-0-1.train.default.svc.cluster.local",
        "host.example.",
        "2001:db8::1",
        "::1",
        "fe80::1%eth0",
        "localhost",
        "a" * 63,
    ],
)
def test_good_hosts(host: str) -> None:
    assert host_problem(host) is None


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("", "is empty; expected a host name or an IP address, without a port"),
        (" w-0", "' w-0' contains whitespace; expected a host name or an IP address, without a port"),
        ("w-0:8476", "'w-0:8476' has a port; expected a host name or an IP address, without a port"),
        (
            "[2001:db8::1]",
            "'[2001:db8::1]' has brackets; expected an IPv6 address written without [ ] and without a port",
        ),
        ("2001:db8::g", "'2001:db8::g' is not an IPv6 address; expected a host name or an IP address, without a port"),
        ("10.0.0", "'10.0.0' is not an IPv4 address; expected four numbers 0-255, like 10.0.0.1"),
        ("10.0.0.1.2", "'10.0.0.1.2' is not an IPv4 address; expected four numbers 0-255, like 10.0.0.1"),
        ("0.0.0.0", "'0.0.0.0' is the unspecified address; expected a host name or an IP address, without a port"),
        ("::", "'::' is the unspecified address; expected a host name or an IP address, without a port"),
        ("grpc://w-0", "'grpc://w-0' is a URL; expected a host name or an IP address, without a port"),
        ("w_0", "'w_0' is not a host name: label 'w_0' is not letters, digits and inner '-'"),
        ("w-.example", "'w-.example' is not a host name: label 'w-' is not letters, digits and inner '-'"),
        ("a..b", "'a..b' is not a host name: label '' is not letters, digits and inner '-'"),
        ("a" * 64, "is not a host name: label"),
        ("a." * 127 + "a", "host name is 255 characters long; expected at most 253"),
    ],
)
def test_bad_hosts(host: str, expected: str) -> None:
    problem = host_problem(host)
    assert problem is not None and expected in problem


@pytest.mark.parametrize(
    ("a", "b"), [("W-0.Example.COM.", "w-0.example.com"), ("2001:DB8:0:0::1", "2001:db8::1"), ("10.0.0.1", "10.0.0.1")]
)
def test_normalize_host_identifies_spellings(a: str, b: str) -> None:
    assert normalize_host(a) == normalize_host(b)


@pytest.mark.parametrize("name", ["pod-a", "v5e.multislice_2", "0", "a" * 63])
def test_good_cluster_names(name: str) -> None:
    assert cluster_name_problem(name) is None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("", "is empty; expected a cluster name like pod-a"),
        (
            "-pod",
            "'-pod' is not a cluster name; expected lowercase letters, digits, '.', '_', '-'; did you mean 'pod'?",
        ),
        (
            "My Pod",
            "'My Pod' is not a cluster name; expected lowercase letters, digits, '.', '_', '-'; did you mean 'my-pod'?",
        ),
        ("a" * 64, f"{'a' * 64!r} is 64 characters long; expected at most 63"),
    ],
)
def test_bad_cluster_names(name: str, expected: str) -> None:
    assert cluster_name_problem(name) == expected


def test_host_count_problem_single_and_multislice() -> None:
    v4 = resolve_slice(accelerator="v4-32")
    assert host_count_problem(4, v4) is None
    assert host_count_problem(1, v4) == (
        "1 entry, but v4-32 has 4 hosts (2x2x4 chips, 4 chips per host); expected one host per task"
    )
    v5e = resolve_slice(accelerator="v5litepod-8", num_slices=2)  # one 8-chip host per slice
    assert host_count_problem(3, v5e) == (
        "3 entries, but v5litepod-8 x 2 has 2 hosts (2 slices of 2x4 chips, 8 chips per host); expected one host per task"
    )


def test_defaults_and_derived_values() -> None:
    spec = build_spec(node_from(V4_32), "t")
    assert spec.coordinator == CoordinatorSpec(port=8490, heartbeat_interval=5.0, heartbeat_timeout=30.0,
                                               register_timeout=300.0, address=None)  # fmt: skip
    assert spec.barrier_timeout == 600.0
    assert spec.output == DEFAULT_OUTPUT == "/run/tpuctl/mapping.json"
    assert spec.auth is None and spec.meshes == ()
    assert spec.coordinator_address == "h0"
    assert spec.coordinator_target == "h0:8490"
    assert spec.describe() == "pod-a v4-32 (2x2x4), 4 hosts, backend sim"
    assert spec.source == "t"
    assert spec.slice == resolve_slice(accelerator="v4-32")


def test_coordinator_target_brackets_ipv6_and_honours_the_address_override() -> None:
    tpu = resolve_slice(accelerator="v4-16")
    spec = ClusterSpec(
        cluster="c",
        slice=tpu,
        backend="jax",
        hosts=("2001:db8::a", "2001:db8::b"),
        coordinator=CoordinatorSpec(port=9000),
    )
    assert spec.coordinator_target == "[2001:db8::a]:9000"
    moved = ClusterSpec(
        cluster="c",
        slice=tpu,
        backend="jax",
        hosts=("a", "b"),
        coordinator=CoordinatorSpec(address="coord.example", port=9000),
    )
    assert moved.coordinator_address == "coord.example"
    assert moved.coordinator_target == "coord.example:9000"


def test_full_spec_every_key() -> None:
    spec = load_spec_text(
        """
cluster: pod-a
generation: v4
topology: 2x2x2
chips_per_host: 4
num_slices: 1
megacore: false
device_kind: TPU v4
backend: tensorflow
hosts: [10.0.0.1, 10.0.0.2]
coordinator:
  address: coord.example
  port: 9000
  heartbeat_interval: 250ms
  heartbeat_timeout: 2
  register_timeout: 1h30m
barrier_timeout: 10m
meshes:
  - name: m
    shape: {x: 2, y: 8}
    mode: ring
    options:
      ring_dims: -1
      ring_axes: [core, x, y, z]
      ring_bounds: [2, 2, 2, 2]
      can_split_host_across_rings: true
      build_ring_across_rings: false
      rotate_ring_across_rings: false
output: mapping.json
auth: {token_file: /etc/tpuctl/token}
""",
        "full.yaml",
    )
    assert spec.slice.megacore is False and spec.slice.num_devices == 16
    assert spec.coordinator == CoordinatorSpec(9000, 0.25, 2.0, 5400.0, "coord.example")
    assert spec.barrier_timeout == 600.0
    assert spec.meshes == (
        MeshSpec(
            "m",
            (("x", 2), ("y", 8)),
            "ring",
            (
                ("ring_dims", -1),
                ("ring_axes", ("core", "x", "y", "z")),
                ("ring_bounds", (2, 2, 2, 2)),
                ("can_split_host_across_rings", True),
                ("build_ring_across_rings", False),
                ("rotate_ring_across_rings", False),
            ),
        ),
    )
    assert spec.output == "mapping.json"  # relative: to the directory tpuctl init runs in
    assert spec.auth == AuthSpec("/etc/tpuctl/token")
    mesh = spec.meshes[0]
    assert (mesh.axis_names, mesh.shape, mesh.size, mesh.option("ring_dims"), mesh.option("nope", 7)) == (
        ("x", "y"), (2, 8), 16, -1, 7,
    )  # fmt: skip


def test_jax_mesh_options_and_dcn_shape_forms() -> None:
    base = {**V4_32, "accelerator": "v5litepod-16", "num_slices": 2, "hosts": [f"h{i}" for i in range(8)]}
    as_list = {"name": "a", "shape": {"data": 8, "model": 4}, "mode": "jax", "options": {"dcn_shape": [2, 1]}}
    as_map = {**as_list, "name": "b", "options": {"dcn_shape": {"data": 2}, "allow_split_physical_axes": True}}
    spec = build_spec(node_from({**base, "meshes": [as_list, as_map]}))
    assert spec.meshes[0].options == (("dcn_shape", (2, 1)),)
    assert spec.meshes[1].options == (("dcn_shape", (2, 1)), ("allow_split_physical_axes", True))
    # what the mesh builder refuses, validate reports too (JAX's hybrid mesh has no contiguous_submeshes)
    hybrid = {**as_list, "options": {"dcn_shape": [2, 1], "contiguous_submeshes": True}}
    check = check_spec(node_from({**base, "meshes": [hybrid]}))
    assert [p.path for p in check.problems] == ["meshes[0]"]
    assert "contiguous_submeshes does not apply to a multislice mesh" in check.problems[0].message
    expected = "expected slices per axis, multiplying to num_slices (2), each dividing its axis"
    for dcn, message in [
        ({"model": 2}, f"[1, 2]: axis model (1) does not split into 2 slices; {expected}"),
        ([4, 1], f"[4, 1] makes 4 slices, but num_slices is 2; {expected}"),
        ([2], "has 1 entry; expected slices per axis: a list of 2 integers, or a mapping like {data: 2}"),
    ]:
        bad = {**as_list, "shape": {"data": 32, "model": 1}, "options": {"dcn_shape": dcn}}
        check = check_spec(node_from({**base, "meshes": [bad]}))
        assert [p.message for p in check.problems] == [message]


def test_position_less_problems_format_without_line() -> None:
    check = check_spec(node_from({**V4_32, "backend": "jaxx"}), "env")
    assert check.formatted() == ["env: backend: 'jaxx' is not a backend; did you mean 'jax'?"]
    with pytest.raises(SpecError) as info:
        check.unwrap()
    assert info.value.problems == check.formatted()
    assert str(info.value).startswith("env: 1 problem\n")


def test_empty_values_mean_defaults() -> None:
    spec = load_spec_text("cluster: a\naccelerator: v4-8\nbackend: sim\nhosts: [h]\ncoordinator:\nmeshes:\noutput: ~\n")
    assert spec.coordinator == CoordinatorSpec() and spec.meshes == () and spec.output == DEFAULT_OUTPUT


def test_plain_numbers_are_names_where_names_are_expected() -> None:
    spec = load_spec_text("cluster: 1234\naccelerator: v4-8\nbackend: sim\nhosts: [h]\n")
    assert spec.cluster == "1234"


def test_anchors_and_merge_keys() -> None:
    spec = load_spec_text(
        """
cluster: a
accelerator: v4-16
backend: sim
hosts: [h0, h1]
meshes:
  - &base {name: one, shape: {data: 8}, mode: ring, options: {ring_dims: 1}}
  - <<: *base
    name: two
"""
    )
    assert [m.name for m in spec.meshes] == ["one", "two"]
    assert spec.meshes[1].options == spec.meshes[0].options == (("ring_dims", 1),)


def test_job_ports_range() -> None:
    base = {**V4_32}
    spec = build_spec(node_from({**base, "coordinator": {"job_ports": "8477-8499"}}))
    assert spec.coordinator.job_ports == (8477, 8499)
    assert build_spec(node_from(base)).coordinator.job_ports is None
    expected = "expected a port range like 8477-8499 (first-last, inclusive, at least 2 ports)"
    for value, message in [
        ("8477", f"got string '8477'; {expected}"),
        (8477, f"got integer 8477; {expected}"),
        ("9000-8000", f"9000-8000 is not a range of ports; {expected}"),
        ("8477-70000", f"8477-70000 is not a range of ports; {expected}"),
        ([8477, 8499], f"got a list; {expected}"),
        ("\u0668477-8499", f"got string '\u0668477-8499'; {expected}"),  # digits are ASCII (issue 24)
    ]:
        check = check_spec(node_from({**base, "coordinator": {"job_ports": value}}))
        assert [(p.path, p.message) for p in check.problems] == [("coordinator.job_ports", message)]
