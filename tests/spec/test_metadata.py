"""The GCE metadata client against a real HTTP server on 127.0.0.1: answers, absent keys, overrides, bounds."""

from __future__ import annotations

import time

import pytest

from tpuctl.spec.metadata import (
    Endpoint,
    MetadataClient,
    MetadataUnavailable,
    endpoints,
    parse_endpoint,
    parse_tpu_env,
)

from .metadata_server import V4_32_TPU_ENV, closed_port, metadata_server, silent_server, v4_32_attributes

ADDRESSES = ["10.130.0.26", "10.130.0.27", "10.130.0.28", "10.130.0.29"]


def client(where: str, *, deadline: float = 3.0, connect_timeout: float = 1.0) -> MetadataClient:
    return MetadataClient(
        [parse_endpoint("GCE_METADATA_HOST", where)], deadline=deadline, connect_timeout=connect_timeout
    )


def test_reads_attributes_with_the_flavor_header_and_none_for_an_absent_key() -> None:
    with metadata_server(v4_32_attributes(ADDRESSES, 3)) as server:
        md = client(server.address)
        assert md.get("agent-worker-number") == "3"
        assert md.get("accelerator-type") == "v4-32"
        workers = str(md.get("worker-network-endpoints"))
        assert workers.split(",")[0] == "t1v-n-0f996b37-w-0:12345:10.130.0.26"
        assert md.get("no-such-key") is None
        assert md.get("agent-worker-number") == "3"  # cached: asked once
        assert server.requests.count("/computeMetadata/v1/instance/attributes/agent-worker-number") == 1
        assert md.answered == Endpoint("127.0.0.1", int(server.address.split(":")[1]), "GCE_METADATA_HOST")
        assert md.describe() == f"{server.address} from GCE_METADATA_HOST"


def test_a_server_without_the_flavor_header_is_not_a_metadata_server() -> None:
    with (
        metadata_server(v4_32_attributes(ADDRESSES, 0), flavor=False) as server,
        pytest.raises(MetadataUnavailable) as info,
    ):
        client(server.address).get("agent-worker-number")
    assert str(info.value) == (
        f"no metadata server answered: {server.address} (from GCE_METADATA_HOST): answered HTTP 200 without "
        "Metadata-Flavor: Google (not a metadata server)"
    )


def test_connection_refused_fails_at_once_and_is_remembered() -> None:
    where = closed_port()
    md = client(where)
    started = time.monotonic()
    with pytest.raises(MetadataUnavailable) as info:
        md.get("agent-worker-number")
    assert str(info.value) == f"no metadata server answered: {where} (from GCE_METADATA_HOST): connection refused"
    with pytest.raises(MetadataUnavailable):
        md.get("tpu-env")  # no second attempt
    assert time.monotonic() - started < 1.0


def test_a_server_that_never_answers_costs_at_most_the_deadline() -> None:
    with silent_server() as where:
        md = client(where, deadline=0.6, connect_timeout=0.3)
        started = time.monotonic()
        with pytest.raises(MetadataUnavailable) as info:
            md.get("agent-worker-number")
        took = time.monotonic() - started
    assert 0.4 < took < 1.5
    assert "connected, but no answer to agent-worker-number within" in str(info.value)


def test_endpoint_order_and_forms() -> None:
    assert endpoints({}) == [
        Endpoint("metadata.google.internal", 80, "default"),
        Endpoint("169.254.169.254", 80, "default"),
    ]
    assert endpoints({"GCE_METADATA_IP": "10.1.2.3"}) == [Endpoint("10.1.2.3", 80, "GCE_METADATA_IP")]
    assert endpoints({"GCE_METADATA_HOST": "h:81", "GCE_METADATA_IP": "10.1.2.3:82"}) == [
        Endpoint("h", 81, "GCE_METADATA_HOST"),
        Endpoint("10.1.2.3", 82, "GCE_METADATA_IP"),
    ]
    assert parse_endpoint("X", "http://[::1]:8080/") == Endpoint("::1", 8080, "X")
    assert parse_endpoint("X", "::1") == Endpoint("::1", 80, "X")
    assert str(Endpoint("::1", 80, "X")) == "[::1]:80"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("h:0", "X='h:0' has port '0'; expected a port from 1 to 65535"),
        ("h:http", "X='h:http' has port 'http'; expected a port from 1 to 65535"),
        ("https://h/x", "X='https://h/x' is not a server address; expected host or host:port"),
        (":80", "X=':80' has no host; expected host or host:port"),
    ],
)
def test_malformed_overrides_are_named(value: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_endpoint("X", value)
    assert str(info.value).startswith(message)


def test_tpu_env_lines_as_jax_reads_them() -> None:
    values = parse_tpu_env(V4_32_TPU_ENV.format(worker=2) + "MEGASCALE_COORDINATOR_ADDRESS: 'w-0:8080'\nnot a pair\n")
    assert values["TOPOLOGY"] == "2x2x4"
    assert values["CHIPS_PER_HOST_BOUNDS"] == "2,2,1"
    assert values["WORKER_ID"] == "2"
    assert values["MEGASCALE_COORDINATOR_ADDRESS"] == "w-0:8080"  # split at the first ':' only
    assert "not a pair" not in values
