"""The spec's hot spares and elastic restart policy: ``spares:``, ``restart: {policy: elastic, min_slices}``.

Each case is a whole spec and the exact problems ``tpuctl validate`` prints (FILE:LINE:COL), or the values
a valid one gives.
"""

from __future__ import annotations

import pytest

from tpuctl.spec.yamlfile import check_spec_text

BASE = """\
cluster: pod-a
accelerator: v4-16
num_slices: 3
backend: sim
hosts: [h0, h1, h2, h3, h4, h5]
"""


def _check(text: str) -> list[str]:
    return check_spec_text(text, "c.yaml").formatted()


def test_spares_and_elastic_give_the_roster_and_min_slices() -> None:
    spec = check_spec_text(
        BASE + "spares: [s0, s1]\nrestart: {policy: elastic, min_slices: 2, max: 5}\n", "c.yaml"
    ).unwrap()
    assert spec.spares == ("s0", "s1")
    assert spec.roster_hosts == ("h0", "h1", "h2", "h3", "h4", "h5", "s0", "s1")
    assert spec.restart.elastic and spec.restart.rejoin
    assert spec.min_slices == 2
    assert spec.is_spare(6) and not spec.is_spare(5)
    assert spec.describe() == "pod-a v4-16 (2x2x2) x 3 slices, 6 hosts + 2 spares, backend sim"


def test_min_slices_defaults_to_every_slice() -> None:
    spec = check_spec_text(BASE + "restart: {policy: elastic}\n", "c.yaml").unwrap()
    assert spec.min_slices == 3 and spec.restart.min_slices == 0
    assert check_spec_text(BASE, "c.yaml").unwrap().min_slices == 3


CASES: list[tuple[str, str, list[str]]] = [
    (
        "spares_need_a_policy_that_reforms",
        BASE + "spares: [s0, s1]\n",
        [
            "c.yaml:6:9: spares: a spare only takes a lost slice's place when the cluster re-forms, but "
            "restart.policy is fail; expected restart: {policy: rejoin} or {policy: elastic}",
        ],
    ),
    (
        "spares_not_whole_slices",
        BASE + "spares: [s0, s1, s2]\nrestart: {policy: rejoin}\n",
        [
            "c.yaml:6:9: spares: 3 entries, but a v4-16 slice has 2 hosts; expected whole slices (a multiple of 2): "
            "a slice is replaced whole",
        ],
    ),
    (
        "spare_repeats_a_host",
        BASE + "spares: [s0, h3]\nrestart: {policy: rejoin}\n",
        ["c.yaml:6:14: spares[1]: 'h3' repeats hosts[3]; expected each spare once, not a host"],
    ),
    (
        "min_slices_larger_than_the_cluster",
        BASE + "restart: {policy: elastic, min_slices: 4}\n",
        [
            "c.yaml:6:40: restart.min_slices: 4 is more than the cluster's 3 slices (v4-16 x 3); expected 1 to 3 "
            "(the fewest slices a generation may go on with)",
        ],
    ),
    (
        "min_slices_zero",
        BASE + "restart: {policy: elastic, min_slices: 0}\n",
        ["c.yaml:6:40: restart.min_slices: 0 is out of range; expected an integer >= 1"],
    ),
    (
        "min_slices_without_elastic",
        BASE + "restart: {policy: rejoin, min_slices: 2}\n",
        [
            "c.yaml:6:39: restart.min_slices: is for policy elastic, but the policy is rejoin; expected restart: "
            "{policy: elastic, min_slices: 2} (a generation may then go on with fewer slices), or no min_slices",
        ],
    ),
    (
        "policy_typo",
        BASE + "restart: {policy: elastik}\n",
        [
            "c.yaml:6:19: restart.policy: 'elastik' is not a restart policy; expected fail, rejoin or elastic; "
            "did you mean 'elastic'?",
        ],
    ),
]


@pytest.mark.parametrize(("name", "text", "expected"), CASES, ids=[c[0] for c in CASES])
def test_problems(name: str, text: str, expected: list[str]) -> None:
    assert _check(text) == expected


def test_a_mesh_policy_elastic_could_not_shrink_is_named_before_the_cluster_starts() -> None:
    """A mesh that cannot be resized to every slice count from min_slices up would fail a generation at
    run time (issue 26): validate names it at its place, with what to change; one that can passes."""
    elastic = "restart: {policy: elastic, min_slices: 1}\n"
    spread = "meshes:\n  - {name: grid, shape: {data: 6, model: 4}, options: {dcn_shape: [3, 1]}}\n"
    assert _check(BASE + elastic + spread) == []
    odd = "meshes:\n  - {name: odd, shape: {data: 4, model: 6}, options: {dcn_shape: {model: 3}}}\n"
    assert _check(BASE + elastic + odd) == []
    two_axes = BASE.replace("num_slices: 3", "num_slices: 4").replace("h5]", "h5, h6, h7]")
    two_axes += elastic + "meshes:\n  - {name: grid, shape: {data: 4, model: 8}, options: {dcn_shape: [2, 2]}}\n"
    [problem] = _check(two_axes)
    assert problem.startswith("c.yaml:8:3: meshes: mesh 'grid' {data: 4, model: 8} cannot go to 1 slices: its dcn_shape [2, 2] spreads the 4 slices over several axes (restart.policy elastic may go down to min_slices 1); give the mesh a dcn_shape"), problem
    assert _check(two_axes.replace(elastic, "restart: {policy: rejoin}\n")) == []  # never shrinks: fine
