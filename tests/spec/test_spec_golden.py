"""Golden problem reports: each class of spec mistake, with its exact line and column.

Every case is a whole spec file and the complete list ``validate`` prints for it, sorted by position.
Reading a failure: the left side is what tpuctl says now, the right side what a user was promised.
"""

from __future__ import annotations

import pytest

from tpuctl.errors import TopologyError
from tpuctl.spec.model import topology_problem
from tpuctl.spec.yamlfile import check_spec_text
from tpuctl.tpu.slice import resolve_slice

CASES: list[tuple[str, str, list[str]]] = [
    (
        "unknown_key_did_you_mean",
        """\
cluster: pod-a
accelerator: v4-32
backend: sim
hosts: [h0, h1, h2, h3]
barier_timeout: 5m
""",
        [
            "c.yaml:5:1: barier_timeout: unknown key; did you mean 'barrier_timeout'?",
        ],
    ),
    (
        "nested_unknown_key",
        """\
cluster: pod-a
accelerator: v4-32
backend: sim
hosts: [h0, h1, h2, h3]
coordinator:
  heartbeat_intervall: 2s
""",
        [
            "c.yaml:6:3: coordinator.heartbeat_intervall: unknown key; did you mean 'heartbeat_interval'?",
        ],
    ),
    (
        "unknown_key_no_match",
        """\
cluster: pod-a
accelerator: v4-32
backend: sim
hosts: [h0, h1, h2, h3]
zone: us-central2-b
""",
        [
            "c.yaml:5:1: zone: unknown key; expected one of cluster, accelerator, generation, topology, chips_per_host, num_slices, megacore, device_kind, backend, hosts, coordinator, barrier_timeout, meshes, output, auth, restart, watchdog, metrics, log_format, preemption, spares",
        ],
    ),
    (
        "misplaced_keys",
        """\
cluster: pod-a
accelerator: v4-32
backend: sim
hosts: [h0, h1, h2, h3]
port: 9000
slice: {accelerator: v4-32}
token_file: /etc/token
""",
        [
            "c.yaml:5:1: port: unknown key; it belongs under coordinator: (coordinator: {port: ...})",
            "c.yaml:6:1: slice: unknown key; the slice keys (accelerator, generation, topology, chips_per_host, num_slices, megacore, device_kind) sit at the top level",
            "c.yaml:7:1: token_file: unknown key; it belongs under auth: (auth: {token_file: ...})",
        ],
    ),
    (
        "missing_required",
        """\
coordinator: {port: 9000}
""",
        [
            "c.yaml:1:1: cluster: missing; expected a cluster name, e.g. cluster: pod-a",
            "c.yaml:1:1: backend: missing; expected one of sim, tensorflow, jax",
            "c.yaml:1:1: hosts: missing; expected a list of host names or addresses, one per task (task id = position)",
            "c.yaml:1:1: accelerator: missing; expected accelerator: v4-32, or generation: v4 with topology: 2x2x4",
        ],
    ),
    (
        "wrong_types",
        """\
cluster: [pod-a]
accelerator: v4-32
megacore: "true"
backend: 7
hosts: {h0: 1}
coordinator:
  port: "8476"
""",
        [
            "c.yaml:1:10: cluster: got a list; expected a cluster name like pod-a",
            "c.yaml:3:11: megacore: got string 'true'; expected true or false",
            "c.yaml:4:10: backend: '7' is not a backend; expected one of sim, tensorflow, jax",
            "c.yaml:5:8: hosts: got a mapping; expected a list of host names or addresses, one per task (task id = position)",
            "c.yaml:7:9: coordinator.port: got string '8476'; expected an integer from 1 to 65535 (without quotes)",
        ],
    ),
    (
        "durations",
        """\
cluster: pod-a
accelerator: v4-32
backend: sim
hosts: [h0, h1, h2, h3]
coordinator:
  heartbeat_interval: 5 sec
  heartbeat_timeout: -30
  register_timeout: 0s
barrier_timeout: true
""",
        [
            "c.yaml:6:23: coordinator.heartbeat_interval: '5 sec' is not a duration; expected e.g. 250ms, 5s, 10m, 1h30m, or seconds as a number",
            "c.yaml:7:22: coordinator.heartbeat_timeout: -30 is negative; a duration must be positive; expected e.g. 250ms, 5s, 10m, 1h30m, or seconds as a number",
            "c.yaml:8:21: coordinator.register_timeout: '0s' must be a positive, finite duration; expected e.g. 250ms, 5s, 10m, 1h30m, or seconds as a number",
            "c.yaml:9:18: barrier_timeout: got boolean true; expected e.g. 250ms, 5s, 10m, 1h30m, or seconds as a number",
        ],
    ),
    (
        "heartbeat_order",
        """\
cluster: pod-a
accelerator: v4-32
backend: sim
hosts: [h0, h1, h2, h3]
coordinator:
  heartbeat_interval: 1m
""",
        [
            "c.yaml:6:23: coordinator.heartbeat_interval: 1m is not shorter than heartbeat_timeout 30s; expected an interval well below the timeout (a host missing heartbeats for the timeout is dead)",
        ],
    ),
    (
        "port_range",
        """\
cluster: pod-a
accelerator: v4-32
backend: sim
hosts: [h0, h1, h2, h3]
coordinator: {port: 0}
""",
        [
            "c.yaml:5:21: coordinator.port: 0 is out of range; expected an integer from 1 to 65535",
        ],
    ),
    (
        "bad_hosts",
        """\
cluster: pod-a
accelerator: v4-32
backend: sim
hosts:
  - 10.0.0.1:8476
  - host_1
  - 10.0.0.256
  - ""
coordinator: {address: "[::1]"}
""",
        [
            "c.yaml:5:5: hosts[0]: '10.0.0.1:8476' has a port; expected a host name or an IP address, without a port (the coordinator's port is coordinator.port)",
            "c.yaml:6:5: hosts[1]: 'host_1' is not a host name: label 'host_1' is not letters, digits and inner '-' (at most 63 characters); expected a DNS name or an IP address",
            "c.yaml:7:5: hosts[2]: '10.0.0.256' is not an IPv4 address; expected four numbers 0-255, like 10.0.0.1",
            "c.yaml:8:5: hosts[3]: is empty; expected a host name or an IP address, without a port",
            "c.yaml:9:24: coordinator.address: '[::1]' has brackets; expected an IPv6 address written without [ ] and without a port",
        ],
    ),
    (
        "duplicate_hosts",
        """\
cluster: pod-a
accelerator: v4-32
backend: sim
hosts:
  - w-0.example.com
  - 2001:db8::1
  - W-0.Example.com.
  - 2001:db8:0::1
""",
        [
            "c.yaml:7:5: hosts[2]: 'W-0.Example.com.' repeats hosts[0]; expected each host once (position = task id), or, for several TPU processes per machine, each machine's tasks side by side and every machine as often",
            "c.yaml:8:5: hosts[3]: '2001:db8:0::1' repeats hosts[1]; expected each host once (position = task id), or, for several TPU processes per machine, each machine's tasks side by side and every machine as often",
        ],
    ),
    (
        "host_count",
        """\
cluster: pod-a
accelerator: v4-32
backend: sim
hosts:
  - 10.0.0.1
  - 10.0.0.2
  - 10.0.0.3
""",
        [
            "c.yaml:5:3: hosts: 3 entries, but v4-32 has 4 hosts (2x2x4 chips, 4 chips per host); expected one host per task",
        ],
    ),
    (
        "host_count_multislice",
        """\
cluster: pod-a
accelerator: v5litepod-16
num_slices: 2
backend: jax
hosts: [h0, h1, h2, h3]
""",
        [
            "c.yaml:5:8: hosts: 4 entries, but v5litepod-16 x 2 has 8 hosts (2 slices of 4x4 chips, 4 chips per host); expected one host per task",
        ],
    ),
    (
        "slice_both",
        """\
cluster: pod-a
accelerator: v4-32
topology: 2x2x4
backend: sim
hosts: [h0, h1, h2, h3]
""",
        [
            "c.yaml:3:11: topology: given together with accelerator; expected either accelerator: v4-32, or generation: v4 with topology: 2x2x4",
        ],
    ),
    (
        "slice_half",
        """\
cluster: pod-a
generation: v4
backend: sim
hosts: [h0, h1, h2, h3]
""",
        [
            "c.yaml:2:13: topology: missing; expected topology with generation, e.g. accelerator: v4-32, or generation: v4 with topology: 2x2x4",
        ],
    ),
    (
        "names",
        """\
cluster: Pod_A
accelerator: v4-32
backend: tf
hosts: [h0, h1, h2, h3]
output: /run/tpuctl/
auth: {}
""",
        [
            "c.yaml:1:10: cluster: 'Pod_A' is not a cluster name; expected lowercase letters, digits, '.', '_', '-'; did you mean 'pod_a'?",
            "c.yaml:3:10: backend: 'tf' is not a backend; did you mean 'tensorflow'?",
            "c.yaml:5:9: output: '/run/tpuctl/' names a folder; expected a file path like /run/tpuctl/mapping.json",
            "c.yaml:6:7: auth.token_file: missing; expected a file holding the cluster's shared token",
        ],
    ),
    (
        "meshes",
        """\
cluster: pod-a
accelerator: v4-32
backend: sim
hosts: [h0, h1, h2, h3]
meshes:
  - name: dp
    shape: {data: 4, model: 2}
  - name: dp
    shape: {data: 4, data: 4}
    mode: rings
  - name: 2d
    shape: {unsharded: 16}
  - shape: {batch: 16}
    options: {ring_dim: 1, contiguous_submeshes: true}
""",
        [
            "c.yaml:7:12: meshes[0].shape: 4x2 = 8 devices, but v4-32 has 16 devices (16 chips, 1 device per chip); expected sizes whose product is 16",
            "c.yaml:8:11: meshes[1].name: 'dp' repeats meshes[0]; expected unique names",
            "c.yaml:9:22: meshes[1].shape.data: repeated axis name (first at line 9, column 13); expected each axis name once",
            "c.yaml:10:11: meshes[1].mode: 'rings' is not a mesh mode; did you mean 'ring'?",
            "c.yaml:11:11: meshes[2].name: '2d' is not a mesh name; expected letters, digits and '_'",
            "c.yaml:12:13: meshes[2].shape.unsharded: is reserved (unsharded, match, any, scalar are DTensor sharding specs); expected another axis name",
            "c.yaml:13:5: meshes[3].name: missing; expected a mesh name like dp_mp",
            "c.yaml:14:15: meshes[3].options.ring_dim: unknown option; did you mean 'ring_dims'?",
            "c.yaml:14:28: meshes[3].options.contiguous_submeshes: is an option of mode jax, but this mesh has mode ring; expected mode: jax",
        ],
    ),
    (
        "mesh_options",
        """\
cluster: pod-a
accelerator: v4-32
backend: sim
hosts: [h0, h1, h2, h3]
meshes:
  - name: ring
    shape: {data: 4, model: 4}
    options:
      ring_dims: 3
      ring_axes: [x, y, z]
      ring_bounds: [1, 3, 1, 1]
      build_ring_across_rings: 1
  - name: jax
    shape: {data: 4, model: 4}
    mode: jax
    options: {dcn_shape: {data: 2}, allow_split: true}
""",
        [
            "c.yaml:9:18: meshes[0].options.ring_dims: 3 is out of range; expected an integer from -2 to 2",
            "c.yaml:10:18: meshes[0].options.ring_axes: ['x', 'y', 'z'] is not an ordering of core, x, y, z, fastest-varying first, like [core, x, y, z]",
            "c.yaml:11:20: meshes[0].options.ring_bounds: [1, 3, 1, 1] does not divide the slice's bounds [2, 2, 4, 1] (x, y, z, core); expected each entry to divide the matching bound",
            "c.yaml:12:32: meshes[0].options.build_ring_across_rings: got integer 1; expected true or false",
            "c.yaml:16:26: meshes[1].options.dcn_shape: [2, 1] makes 2 slices, but num_slices is 1; expected slices per axis, multiplying to num_slices (1), each dividing its axis",
            "c.yaml:16:37: meshes[1].options.allow_split: unknown option; did you mean 'allow_split_physical_axes'?",
        ],
    ),
    (
        "everything_wrong_at_once",
        """\
cluster: Pod A
acelerator: v4-32
backend: tf
hosts:
  - 10.0.0.1:8476
  - 10.0.0.2
  - 10.0.0.2
coordinator:
  port: 70000
  heartbeat_interval: 30s
  heartbeat_timeout: 5s
meshes:
  - name: dp
    shape: {data: 4, model: 3}
""",
        [
            "c.yaml:1:1: accelerator: missing; expected accelerator: v4-32, or generation: v4 with topology: 2x2x4",
            "c.yaml:1:10: cluster: 'Pod A' is not a cluster name; expected lowercase letters, digits, '.', '_', '-'; did you mean 'pod-a'?",
            "c.yaml:2:1: acelerator: unknown key; did you mean 'accelerator'?",
            "c.yaml:3:10: backend: 'tf' is not a backend; did you mean 'tensorflow'?",
            "c.yaml:5:5: hosts[0]: '10.0.0.1:8476' has a port; expected a host name or an IP address, without a port (the coordinator's port is coordinator.port)",
            "c.yaml:7:5: hosts[2]: '10.0.0.2' repeats hosts[1]; expected each host once (position = task id), or, for several TPU processes per machine, each machine's tasks side by side and every machine as often",
            "c.yaml:9:9: coordinator.port: 70000 is out of range; expected an integer from 1 to 65535",
            "c.yaml:10:23: coordinator.heartbeat_interval: 30s is not shorter than heartbeat_timeout 5s; expected an interval well below the timeout (a host missing heartbeats for the timeout is dead)",
        ],
    ),
    (
        "yaml_syntax",
        """\
cluster: pod-a
hosts: [h0, h1
backend: sim
""",
        [
            "c.yaml:3:8: YAML syntax error: expected ',' or ']', but got ':' (while parsing a flow sequence at line 2, column 8)",
        ],
    ),
    (
        "yaml_tab",
        "cluster: pod-a\n\taccelerator: v4-32\n",
        [
            "c.yaml:2:1: YAML syntax error: found character '\\t' that cannot start any token; expected spaces for indentation (YAML does not allow tabs there)",
        ],
    ),
    (
        "yaml_duplicate_key",
        """\
cluster: pod-a
accelerator: v4-32
backend: sim
hosts: [h0, h1, h2, h3]
coordinator:
  port: 9000
  port: 9001
backend: jax
""",
        [
            "c.yaml:7:3: coordinator.port: repeated key (first at line 6, column 3); expected each key once",
            "c.yaml:8:1: backend: repeated key (first at line 3, column 1); expected each key once",
        ],
    ),
    (
        "yaml_not_a_mapping",
        """\
- cluster: pod-a
""",
        [
            "c.yaml:1:1: the spec is a list; expected a mapping with keys cluster, accelerator, backend, hosts, ...",
        ],
    ),
    (
        "yaml_empty",
        """\
# nothing yet
""",
        [
            "c.yaml:1:1: the spec is empty; expected a mapping with keys cluster, accelerator, backend, hosts, ...",
        ],
    ),
    (
        "yaml_scalar_top",
        """\
just some text
""",
        [
            "c.yaml:1:1: the spec is string 'just some text'; expected a mapping with keys cluster, accelerator, backend, hosts, ...",
        ],
    ),
    (
        "yaml_recursive_alias",
        """\
cluster: pod-a
accelerator: v4-32
backend: sim
hosts: &h [h0, *h, h2, h3]
""",
        [
            "c.yaml:4:8: YAML error: an alias refers to a node that contains it; expected no recursion",
        ],
    ),
    (
        "yaml_tag",
        """\
cluster: !!python/name:os.system pod-a
accelerator: v4-32
backend: sim
hosts: [h0, h1, h2, h3]
""",
        [
            "c.yaml:1:10: YAML error: could not determine a constructor for the tag 'tag:yaml.org,2002:python/name:os.system'; expected a plain value",
        ],
    ),
    (
        "yaml_boolean_host",
        """\
cluster: pod-a
accelerator: v4-8
backend: sim
hosts: [on]
""",
        [
            "c.yaml:4:9: hosts[0]: got boolean on (YAML reads an unquoted on as a boolean: quote it); expected a host name or an IP address",
        ],
    ),
]


@pytest.mark.parametrize(("text", "expected"), [(t, e) for _, t, e in CASES], ids=[c[0] for c in CASES])
def test_golden_problems(text: str, expected: list[str]) -> None:
    check = check_spec_text(text, "c.yaml")
    assert check.formatted() == expected
    assert check.spec is None


def slice_error(**options: object) -> str:
    """What tpuslice says about a slice (its wording is its own; these tests pin where the spec shows it)."""
    with pytest.raises(TopologyError) as info:
        resolve_slice(**options)  # type: ignore[arg-type]
    return topology_problem(info.value)


SLICE_CASES: list[tuple[str, str, list[tuple[str, dict[str, object]]]]] = [
    (
        "slice_bad_type",
        "cluster: pod-a\naccelerator: v4-33\nbackend: sim\nhosts: [h0, h1, h2, h3]\n",
        [("c.yaml:2:14: accelerator: ", {"accelerator": "v4-33"})],
    ),
    (
        "slice_bad_generation",
        "cluster: pod-a\ngeneration: v4p\ntopology: 2x2x4\nbackend: sim\nhosts: [h0, h1, h2, h3]\n",
        [("c.yaml:2:13: generation: ", {"generation": "v4p", "topology": "2x2x4"})],
    ),
    (
        "slice_bad_topology",
        "cluster: pod-a\ngeneration: v5e\ntopology: 2x2x4\nbackend: sim\nhosts: [h0, h1, h2, h3]\n",
        [("c.yaml:3:11: topology: ", {"generation": "v5e", "topology": "2x2x4"})],
    ),
    (
        "slice_options_each_blamed",
        "cluster: pod-a\naccelerator: v5litepod-16\nchips_per_host: 2\nmegacore: true\ndevice_kind: TPU v4\n"
        "num_slices: 0\nbackend: sim\nhosts: [h0, h1, h2, h3]\n",
        [
            ("c.yaml:3:17: chips_per_host: ", {"accelerator": "v5litepod-16", "chips_per_host": 2}),
            ("c.yaml:4:11: megacore: ", {"accelerator": "v5litepod-16", "megacore": True}),
            ("c.yaml:5:14: device_kind: ", {"accelerator": "v5litepod-16", "device_kind": "TPU v4"}),
            ("c.yaml:6:13: num_slices: 0 is out of range; expected an integer >= 1", {}),
        ],
    ),
]


@pytest.mark.parametrize(("text", "expected"), [(t, e) for _, t, e in SLICE_CASES], ids=[c[0] for c in SLICE_CASES])
def test_slice_problems_point_at_the_key(text: str, expected: list[tuple[str, dict[str, object]]]) -> None:
    check = check_spec_text(text, "c.yaml")
    assert check.formatted() == [where + (slice_error(**options) if options else "") for where, options in expected]
