"""The init gather's records (tpuctl.agent.merge): each host's part is checked before the merge uses it."""

from __future__ import annotations

import json

import pytest

from tpuctl.agent.merge import parse_record
from tpuctl.errors import ClusterError


def test_a_good_record_is_taken() -> None:
    task0 = {"cores": [0, 1], "dtensor_port": 9100, "created": 1.5, "jax_port": 9200, "torch_port": 9201}
    assert parse_record(json.dumps(task0).encode(), 0) == task0
    assert parse_record(b'{"cores": [2, 3], "dtensor_port": 9101}', 1)["cores"] == [2, 3]


@pytest.mark.parametrize(
    ("raw", "task"),
    [
        (b"not json", 1),
        (b"[1, 2]", 0),  # not an object, on task 0 too
        (b'{"cores": [0], "dtensor_port": "9100"}', 1),
        (b'{"cores": [0], "dtensor_port": 9100}', 0),  # task 0 must send the creation time and JAX's port
        (b'{"cores": [0], "dtensor_port": 9100, "created": 1.5, "jax_port": 9200}', 0),  # and torch's store port
    ],
)
def test_a_bad_record_names_the_host(raw: bytes, task: int) -> None:
    with pytest.raises(ClusterError, match=rf"task {task} published {len(raw)} bytes that are not tpuctl's init record"):
        parse_record(raw, task)
