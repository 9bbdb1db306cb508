"""The service configuration task 0's agent builds from a spec with spares and policy elastic."""

from __future__ import annotations

from tpuctl.agent.coordinator import service_config
from tpuctl.coordination.plan import Roster, SliceShape
from tpuctl.spec.yamlfile import check_spec_text

SPEC = """\
cluster: pod-a
accelerator: v4-16
num_slices: 3
backend: sim
hosts: [h0, h1, h2, h3, h4, h5]
spares: [s0, s1]
restart: {policy: elastic, min_slices: 2, timeout: 2m, max: 5}
"""


def test_the_roster_covers_hosts_then_spares() -> None:
    config = service_config(check_spec_text(SPEC, "c.yaml").unwrap(), None)
    assert [t.address for t in config.tasks] == ["h0", "h1", "h2", "h3", "h4", "h5", "s0", "s1"]
    assert config.roster == Roster(active=6, spares=2, hosts_per_slice=2)
    assert config.slice_shape == SliceShape("v4-16", "2x2x2", 2)
    restart = config.restart
    assert (restart.rejoin, restart.elastic, restart.min_slices, restart.timeout, restart.max_restarts) == (
        True, True, 2, 120.0, 5,
    )  # fmt: skip


def test_without_elastic_the_service_is_told_no_min_slices() -> None:
    """min_slices means something under policy elastic only (the service refuses it otherwise; 0: never shrink)."""
    text = SPEC.replace("spares: [s0, s1]\n", "").replace("policy: elastic, min_slices: 2", "policy: rejoin")
    config = service_config(check_spec_text(text, "c.yaml").unwrap(), None)
    assert config.roster == Roster(active=6, spares=0, hosts_per_slice=2)
    assert (config.restart.rejoin, config.restart.elastic, config.restart.min_slices) == (True, False, 0)
