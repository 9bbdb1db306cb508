"""A spec from Cloud TPU / GKE variables (``tpuctl init`` without ``--config``), with realistic sets."""

from __future__ import annotations

import pytest

from tpuctl.errors import SpecError, TopologyError
from tpuctl.spec.detect import identify, parse_host_list, spec_from_tpu_env
from tpuctl.spec.model import CoordinatorSpec, topology_problem
from tpuctl.tpu.slice import resolve_slice


def slice_error(**options: object) -> str:
    """tpuslice's own words for a bad slice (the env layer only says which variable caused it)."""
    try:
        resolve_slice(**options)  # type: ignore[arg-type]
    except TopologyError as exc:
        return topology_problem(exc)
    raise AssertionError(f"{options} is a valid slice")


# What the GKE TPU device plugin and JobSet give a v5e-16 pod (worker 2 of 4), trimmed to what matters.
GKE_V5E_16 = {
    "TPU_ACCELERATOR_TYPE": "v5litepod-16",
    "TPU_TOPOLOGY": "4x4",
    "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
    "TPU_HOST_BOUNDS": "2,2,1",
    "TPU_TOPOLOGY_WRAP": "false,false,false",
    "TPU_SKIP_MDS_QUERY": "true",
    "TPU_RUNTIME_METRICS_PORTS": "8431,8432,8433,8434",
    "TPU_WORKER_ID": "2",
    "TPU_WORKER_HOSTNAMES": "train-0-0.train,train-0-1.train,train-0-2.train,train-0-3.train",
}

# A Cloud TPU VM v4-16 whose worker list uses the old name:uid:address triples.
TPU_VM_V4_16_TRIPLES = {
    "TPU_ACCELERATOR_TYPE": "v4-16",
    "TPU_WORKER_ID": "1",
    "TPU_WORKER_HOSTNAMES": "t1v-n-0f996b37-w-0:12345:10.130.0.26,t1v-n-0f996b37-w-1:12346:10.130.0.27",
}

# Two v5e-16 slices under JobSet: each pod sees only its own slice's workers.
GKE_MULTISLICE = {
    **GKE_V5E_16,
    "MEGASCALE_NUM_SLICES": "2",
    "MEGASCALE_SLICE_ID": "1",
    "MEGASCALE_COORDINATOR_ADDRESS": "train-0-0.train:8080",
    "MEGASCALE_PORT": "8081",
    "TPU_WORKER_HOSTNAMES": "train-1-0.train,train-1-1.train,train-1-2.train,train-1-3.train",
}


def test_gke_single_slice() -> None:
    spec = spec_from_tpu_env(GKE_V5E_16)
    assert spec.describe() == "tpu-v5litepod-16 v5litepod-16 (4x4), 4 hosts, backend jax"
    assert spec.hosts == ("train-0-0.train", "train-0-1.train", "train-0-2.train", "train-0-3.train")
    assert spec.coordinator == CoordinatorSpec() and spec.coordinator_target == "train-0-0.train:8490"
    assert spec.source == "environment" and spec.auth is None and spec.meshes == ()
    found = identify(spec, task_id=None, environ=GKE_V5E_16, local_names=frozenset({"train-0-2"}))
    assert (found.task_id, found.reason) == (2, "TPU_WORKER_ID=2")


def test_tpu_vm_old_triple_format_keeps_the_addresses() -> None:
    spec = spec_from_tpu_env(TPU_VM_V4_16_TRIPLES)
    assert spec.hosts == ("10.130.0.26", "10.130.0.27")
    assert spec.slice.topology == (2, 2, 2)
    names = frozenset({"t1v-n-0f996b37-w-1", "10.130.0.27"})
    assert identify(spec, task_id=None, environ=TPU_VM_V4_16_TRIPLES, local_names=names).task_id == 1


def test_process_addresses_lose_their_ports() -> None:
    env = {"TPU_ACCELERATOR_TYPE": "v4-16", "TPU_PROCESS_ADDRESSES": "10.0.0.1:8471,[2001:db8::2]:8471"}
    assert spec_from_tpu_env(env).hosts == ("10.0.0.1", "2001:db8::2")


def test_single_host_localhost() -> None:
    env = {"TPU_ACCELERATOR_TYPE": "v5litepod-8", "TPU_CHIPS_PER_HOST_BOUNDS": "2,4,1", "TPU_WORKER_ID": "0",
           "TPU_WORKER_HOSTNAMES": "localhost"}  # fmt: skip
    spec = spec_from_tpu_env(env)
    assert spec.hosts == ("localhost",) and spec.slice.chips_per_host == 8
    assert identify(spec, task_id=None, environ=env, local_names=frozenset({"vm"})).task_id == 0


def test_overrides_cluster_backend_token() -> None:
    env = {**GKE_V5E_16, "TPUCTL_CLUSTER": "train", "TPUCTL_BACKEND": "tensorflow", "TPUCTL_TOKEN_FILE": "/t"}
    spec = spec_from_tpu_env(env)
    assert (spec.cluster, spec.backend, spec.auth and spec.auth.token_file) == ("train", "tensorflow", "/t")


def test_multislice_with_one_slice_of_hostnames_is_refused() -> None:
    with pytest.raises(SpecError) as info:
        spec_from_tpu_env(GKE_MULTISLICE)
    assert info.value.problems == [
        "TPU_WORKER_HOSTNAMES lists the 4 hosts of one slice, but MEGASCALE_NUM_SLICES=2 and the other slices' "
        "hosts are not in the environment; expected all 8 hosts in TPUCTL_HOSTS (slice 0's workers, then "
        "slice 1's, ...), or a spec file (--config FILE)"
    ]


def test_multislice_with_every_host_named() -> None:
    every = ",".join(f"train-{s}-{w}.train" for s in range(2) for w in range(4))
    env = {**GKE_MULTISLICE, "TPUCTL_HOSTS": every}
    spec = spec_from_tpu_env(env)
    assert spec.slice.num_slices == 2 and len(spec.hosts) == 8
    assert spec.coordinator.address == "train-0-0.train"  # MEGASCALE_COORDINATOR_ADDRESS without its port
    assert spec.coordinator_target == "train-0-0.train:8490"
    found = identify(spec, task_id=None, environ=env, local_names=frozenset({"train-1-2"}))
    assert found.task_id == 6  # worker 2 of slice 1, 4 hosts per slice


def test_every_problem_names_the_variable_its_value_and_the_form() -> None:
    env = {
        "TPU_ACCELERATOR_TYPE": "v5litepod-16",
        "TPU_CHIPS_PER_HOST_BOUNDS": "2x2",
        "TPU_WORKER_HOSTNAMES": "a,,b_c,d",
        "TPUCTL_CLUSTER": "My Pod",
        "TPUCTL_BACKEND": "tf",
        "MEGASCALE_COORDINATOR_ADDRESS": "http://x",
    }
    with pytest.raises(SpecError) as info:
        spec_from_tpu_env(env)
    assert info.value.problems == [
        "TPU_CHIPS_PER_HOST_BOUNDS='2x2' is not x,y,z; expected chips per host, e.g. 2,2,1",
        "TPU_WORKER_HOSTNAMES='a,,b_c,d': item 1 is empty; expected a host name or an IP address, without a port",
        "TPU_WORKER_HOSTNAMES='a,,b_c,d': item 2 'b_c' is not a host name: label 'b_c' is not letters, digits and "
        "inner '-' (at most 63 characters); expected a DNS name or an IP address",
        "MEGASCALE_COORDINATOR_ADDRESS='http://x': 'http://x' is a URL; expected a host name or an IP address, "
        "without a port",
        "TPUCTL_CLUSTER='My Pod': 'My Pod' is not a cluster name; expected lowercase letters, digits, '.', '_', '-'; "
        "did you mean 'my-pod'?",
        "TPUCTL_BACKEND='tf': 'tf' is not a backend; did you mean 'tensorflow'?",
    ]
    assert str(info.value).startswith("environment: 6 problems\n")


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({}, "TPU_ACCELERATOR_TYPE is not set; expected the slice's accelerator type, e.g. v4-32"),
        ({"TPU_ACCELERATOR_TYPE": "v4-33"}, "TPU_ACCELERATOR_TYPE='v4-33': " + slice_error(accelerator="v4-33")),
        ({"TPU_ACCELERATOR_TYPE": "v4-32", "TPU_TOPOLOGY": "4x2x2"},
         "TPU_TOPOLOGY='4x2x2': " + slice_error(generation="v4", topology="4x2x2")),
        ({"TPU_ACCELERATOR_TYPE": "v4-32", "TPU_TOPOLOGY": "2x2x2"},
         "TPU_TOPOLOGY='2x2x2' has 8 chips, but TPU_ACCELERATOR_TYPE='v4-32' has 16"),
        ({"TPU_ACCELERATOR_TYPE": "v5litepod-16", "TPU_CHIPS_PER_HOST_BOUNDS": "4,2,1"},
         "TPU_CHIPS_PER_HOST_BOUNDS='4,2,1': tpuctl lays 8-chip hosts out as 2,4,1; expected 2,4,1"),
        ({"TPU_ACCELERATOR_TYPE": "v4-32", "TPU_CHIPS_PER_HOST_BOUNDS": "1,1,1"},
         "TPU_CHIPS_PER_HOST_BOUNDS='1,1,1': " + slice_error(accelerator="v4-32", chips_per_host=1)),
        ({"TPU_ACCELERATOR_TYPE": "v4-32", "MEGASCALE_NUM_SLICES": "two"},
         "MEGASCALE_NUM_SLICES='two' is not an integer; expected a slice count from 1 to 1048576"),
        ({"TPU_ACCELERATOR_TYPE": "v4-32", "MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "2"},
         "MEGASCALE_SLICE_ID=2 is out of range; expected a slice index from 0 to 1"),
        ({"TPU_ACCELERATOR_TYPE": "v4-8"}, "TPU_WORKER_HOSTNAMES is not set (nor TPU_PROCESS_ADDRESSES)"),
        ({"TPU_ACCELERATOR_TYPE": "v4-32", "TPU_WORKER_HOSTNAMES": "a,b"},
         "TPU_WORKER_HOSTNAMES: 2 entries, but v4-32 has 4 hosts (2x2x4 chips, 4 chips per host)"),
        ({"TPU_ACCELERATOR_TYPE": "v4-16", "TPU_WORKER_HOSTNAMES": "a,A."},
         "TPU_WORKER_HOSTNAMES: item 1 (A.) repeats item 0; expected each host once"),
        ({"TPU_ACCELERATOR_TYPE": "v4-16", "TPU_WORKER_HOSTNAMES": "a:8471,b:8471"},
         "TPU_WORKER_HOSTNAMES='a:8471,b:8471': item 0 'a:8471' has a port"),
    ],
)  # fmt: skip
def test_missing_and_malformed_variables(env: dict[str, str], problem: str) -> None:
    with pytest.raises(SpecError) as info:
        spec_from_tpu_env(env)
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems


@pytest.mark.parametrize(
    ("value", "ports", "hosts"),
    [
        ("a, b ,c", False, ["a", "b", "c"]),
        ("w-0:1:10.0.0.1,w-1:2:2001:db8::2", False, ["10.0.0.1", "2001:db8::2"]),
        ("2001:db8::1,fe80::1", False, ["2001:db8::1", "fe80::1"]),
        ("h:8471,[::1]:8471,10.0.0.3:1", True, ["h", "::1", "10.0.0.3"]),
    ],
)
def test_host_list_forms(value: str, ports: bool, hosts: list[str]) -> None:
    assert parse_host_list("V", value, ports=ports) == (hosts, [])
