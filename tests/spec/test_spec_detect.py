"""Detection in JAX's order: a host list in the environment (GKE, JobSet, LeaderWorkerSet), else a Cloud TPU
VM's metadata server (a real one on loopback, serving recorded values), every value with its source."""

from __future__ import annotations

import time

import pytest

from tpuctl.errors import InputError, SpecError
from tpuctl.spec.detect import Detection, detect, identify, jobset_hosts
from tpuctl.spec.metadata import MetadataClient, parse_endpoint

from .metadata_server import closed_port, metadata_server, v4_32_attributes, v5e_16_attributes
from .test_spec_tpu_env import GKE_MULTISLICE, GKE_V5E_16

ADDRESSES = ["10.130.0.26", "10.130.0.27", "10.130.0.28", "10.130.0.29"]
NOWHERE: frozenset[str] = frozenset({"build-box"})


def md(where: str) -> MetadataClient:
    return MetadataClient([parse_endpoint("GCE_METADATA_HOST", where)])


def sources(found: Detection) -> dict[str, tuple[str, str]]:
    return {s.key: (s.value, s.origin) for s in found.sources}


def test_a_v4_32_tpu_vm_from_its_metadata_server() -> None:
    with metadata_server(v4_32_attributes(ADDRESSES, 2)) as server:
        found = detect({}, md(server.address))
    spec = found.spec
    assert spec.describe() == "tpu-v4-32 v4-32 (2x2x4), 4 hosts, backend jax"
    assert spec.hosts == tuple(ADDRESSES)  # name:uid:address triples: the addresses
    assert found.platform == f"Cloud TPU VM (metadata server {server.address} from GCE_METADATA_HOST)"
    assert sources(found) == {
        "cluster": ("tpu-v4-32", "default (tpu-<accelerator type>)"),
        "accelerator": ("v4-32", "metadata accelerator-type"),
        "topology": ("2x2x4", "metadata tpu-env TOPOLOGY"),
        "chips_per_host": ("4", "metadata tpu-env CHIPS_PER_HOST_BOUNDS"),
        "num_slices": ("1", "default (1)"),
        "backend": ("jax", "default (jax)"),
        "hosts": (",".join(ADDRESSES), "metadata worker-network-endpoints"),
        "coordinator.address": ("10.130.0.26", "default (hosts[0])"),
        "coordinator.port": ("8490", "default (8490)"),
        "auth.token_file": ("", "unset (no token)"),
    }
    task = identify(spec, task_id=None, environ=found.values, local_names=NOWHERE)
    assert (task.task_id, task.reason) == (2, "metadata agent-worker-number=2")
    # the address match still wins where it applies (a real TPU VM knows its own address)
    assert identify(spec, task_id=None, environ=found.values, local_names=frozenset({"10.130.0.28"})).task_id == 2


def test_v5e_plain_host_list_and_environment_values_win_over_metadata() -> None:
    hosts = [f"t1v-n-5e-w-{i}" for i in range(4)]
    env = {"TPUCTL_BACKEND": "sim", "MEGASCALE_NUM_SLICES": "1", "TPUCTL_CLUSTER": "lite"}
    with metadata_server(v5e_16_attributes(hosts, 1)) as server:
        found = detect(env, md(server.address))
        asked = list(server.requests)
    assert found.spec.hosts == tuple(hosts)
    assert found.spec.slice.topology_str == "4x4"
    got = sources(found)
    assert got["backend"] == ("sim", "env TPUCTL_BACKEND")
    assert got["num_slices"] == ("1", "env MEGASCALE_NUM_SLICES")
    assert got["cluster"] == ("lite", "env TPUCTL_CLUSTER")
    assert not any(path.endswith("MEGASCALE") for path in asked)


def test_gke_pods_never_ask_the_metadata_server() -> None:
    # a closed port: asking it would fail; a GKE pod (TPU_WORKER_HOSTNAMES set) must not ask at all
    found = detect(GKE_V5E_16, md(closed_port()))
    assert found.platform == "GKE"
    assert found.spec.hosts[2] == "train-0-2.train"
    assert "the metadata server was not asked" in found.notes[0]
    assert sources(found)["hosts"][1] == "env TPU_WORKER_HOSTNAMES"


def test_no_metadata_server_is_a_fast_clear_error() -> None:
    where = closed_port()
    started = time.monotonic()
    with pytest.raises(InputError) as info:
        detect({}, md(where))
    assert time.monotonic() - started < 1.0
    assert info.value.message == (
        "no cluster spec given and none detected: no TPU host list in the environment (TPUCTL_HOSTS, "
        f"TPU_PROCESS_ADDRESSES, TPU_WORKER_HOSTNAMES unset) and no metadata server answered: {where} "
        "(from GCE_METADATA_HOST): connection refused"
    )
    assert "pass --config FILE" in (info.value.hint or "")


def test_a_gce_vm_that_is_not_a_tpu_vm() -> None:
    with metadata_server({"other": "x"}) as server, pytest.raises(InputError) as info:
        detect({}, md(server.address))
    assert "has no instance attribute agent-worker-number: a GCE VM, but not a Cloud TPU VM" in info.value.message


def test_skip_mds_query_is_honoured() -> None:
    with pytest.raises(SpecError) as info:
        detect({"TPU_SKIP_MDS_QUERY": "true", "TPU_ACCELERATOR_TYPE": "v4-8"}, md(closed_port()))
    assert any(p.startswith("TPU_WORKER_HOSTNAMES is not set") for p in info.value.problems)


def test_malformed_metadata_values_name_their_key() -> None:
    attributes = {**v4_32_attributes(ADDRESSES, 7), "accelerator-type": "v4-32"}
    with metadata_server(attributes) as server:
        found = detect({}, md(server.address))
        with pytest.raises(InputError) as info:
            identify(found.spec, task_id=None, environ=found.values, local_names=NOWHERE)
    assert info.value.message == (
        "metadata agent-worker-number=7 is out of range; expected a worker index of v4-32 from 0 to 3"
    )
    bad = {**v4_32_attributes(ADDRESSES, 0), "tpu-env": "TOPOLOGY: '2x2x2'\n"}
    with metadata_server(bad) as server, pytest.raises(SpecError) as spec_info:
        detect({}, md(server.address))
    assert spec_info.value.problems == [
        "metadata tpu-env TOPOLOGY='2x2x2' has 8 chips, but metadata accelerator-type='v4-32' has 16; "
        "expected the two to describe the same slice"
    ]


# --- several TPU processes per machine (7x, LeaderWorkerSet): TPU_PROCESS_ADDRESSES first ---------------

LWS_V5E_16 = {  # two 8-chip v5e machines, two 4-chip TPU containers each
    "TPU_ACCELERATOR_TYPE": "v5litepod-16",
    "TPU_TOPOLOGY": "4x4",
    "TPU_WORKER_HOSTNAMES": "lws-0.lws,lws-0.lws,lws-0-1.lws,lws-0-1.lws",
    "TPU_PROCESS_ADDRESSES": "lws-0.lws:8476,lws-0.lws:8477,lws-0-1.lws:8476,lws-0-1.lws:8477",
    "TPU_PROCESS_PORT": "8477",
    "TPU_WORKER_ID": "1",
    "LWS_LEADER_ADDRESS": "lws-0.lws.default",
    "LWS_GROUP_SIZE": "2",
    "LWS_WORKER_INDEX": "0",
}


def test_process_addresses_come_first_and_may_repeat_a_machine() -> None:
    found = detect(LWS_V5E_16, None)
    spec = found.spec
    assert found.platform == "LeaderWorkerSet"
    assert spec.hosts == ("lws-0.lws", "lws-0.lws", "lws-0-1.lws", "lws-0-1.lws")
    assert spec.slice.chips_per_host == 4 and spec.slice.num_hosts == 4
    got = sources(found)
    assert got["hosts"][1] == "env TPU_PROCESS_ADDRESSES"
    assert got["chips_per_host"] == (
        "4",
        "TPU_PROCESS_ADDRESSES lists 4 TPU processes, 2 per machine: 4 of the slice's 16 chips each",
    )
    # this machine matches two tasks; the worker id picks one of them
    task = identify(spec, task_id=None, environ=found.values, local_names=frozenset({"lws-0.lws"}))
    assert (task.task_id, task.reason) == (1, "TPU_WORKER_ID=1")


@pytest.mark.parametrize(
    ("addresses", "problem"),
    [
        (
            "a:8476,a:8476,b:8476,b:8477",
            "TPU_PROCESS_ADDRESSES: item 1 (a:8476) repeats item 0; expected each process once",
        ),
        ("a:8476,b:8476,a:8477,b:8477", "TPU_PROCESS_ADDRESSES: item 2 (a) repeats item 0; expected each host once"),
        ("a:8476,a:8477,a:8478,b:8476", "TPU_PROCESS_ADDRESSES: item 1 (a) repeats item 0; expected each host once"),
    ],
)
def test_process_addresses_repeats_follow_the_rule(addresses: str, problem: str) -> None:
    env = {"TPU_ACCELERATOR_TYPE": "v5litepod-16", "TPU_PROCESS_ADDRESSES": addresses}
    with pytest.raises(SpecError) as info:
        detect(env, None)
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems


def test_a_machine_too_small_to_split_is_reported_with_the_reason() -> None:
    env = {"TPU_ACCELERATOR_TYPE": "tpu7x-16", "TPU_PROCESS_ADDRESSES": "a:8476,a:8477,b:8476,b:8477"}
    with pytest.raises(SpecError) as info:
        detect(env, None)
    assert info.value.problems[0].startswith(
        "TPU_PROCESS_ADDRESSES lists 4 TPU processes, 2 per machine: 2 of the slice's 8 chips each: 7x hosts cannot "
        "have 2 chips"
    )


# --- JobSet multislice: every slice's names from one slice's -------------------------------------------


def test_jobset_multislice_hosts_are_derived_from_the_pod_names() -> None:
    names = ",".join(f"train-slice-1-{p}.train" for p in range(4))
    env = {**GKE_MULTISLICE, "TPU_WORKER_HOSTNAMES": names, "JOBSET_NAME": "train", "REPLICATED_JOB_NAME": "slice"}
    found = detect(env, None)
    assert found.platform == "GKE JobSet"
    assert found.spec.hosts == tuple(f"train-slice-{j}-{p}.train" for j in (0, 1) for p in range(4))
    assert sources(found)["hosts"][1] == "derived from env TPU_WORKER_HOSTNAMES: JobSet pod names, one job per slice"
    assert found.spec.coordinator_address == "train-0-0.train"  # MEGASCALE_COORDINATOR_ADDRESS, port dropped
    task = identify(found.spec, task_id=None, environ=found.values, local_names=NOWHERE)
    assert task.task_id == 6


def test_jobset_names_must_agree_to_be_derived() -> None:
    assert jobset_hosts(("js-rj-1-0.s", "js-rj-1-1.s"), 1, 2, {}) == (
        "js-rj-0-0.s",
        "js-rj-0-1.s",
        "js-rj-1-0.s",
        "js-rj-1-1.s",
    )
    assert jobset_hosts(("js-rj-1-0.s", "js-rj-1-1.s"), 0, 2, {}) is None  # job index is not the slice id
    assert jobset_hosts(("js-rj-1-1.s", "js-rj-1-0.s"), 1, 2, {}) is None  # pods out of order
    assert jobset_hosts(("js-rj-1-0.s", "js-rj-1-1.s"), 1, 2, {"JOBSET_NAME": "x", "REPLICATED_JOB_NAME": "y"}) is None
    assert jobset_hosts(("train-1-0.train", "train-1-1.train"), 1, 2, {}) is None  # no jobset-replicatedjob prefix
