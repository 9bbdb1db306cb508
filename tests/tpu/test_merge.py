"""The core-ID merge: DTensor's all_core_ids, and the checks DTensor leaves out.

v4-16 megacore (2x2x2 chips, two hosts of one z-plane each); a chip shows one device, core 0::

    z=0   y\\x  0  1        z=1   y\\x  0  1
          0     0  2              0     8 10      task 0 reports [0, 2, 4, 6]
          1     4  6              1    12 14      task 1 reports [8, 10, 12, 14]
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from topology_cases import SLICE_IDS, SLICES, make_slice, sim_reports

from tpuctl.errors import ClusterError
from tpuctl.tpu.slice import resolve_slice
from tpuctl.tpu.topology import (
    CoreLocation,
    MergedCores,
    core_id_of,
    core_location,
    expected_core_ids,
    merge_core_ids,
)

V4_16 = resolve_slice(accelerator="v4-16")
V5E_16 = resolve_slice(accelerator="v5litepod-16")

# --- core ids <-> locations ------------------------------------------------------------------------

# (accelerator, megacore, core id) -> (x, y, z, core)
LOCATIONS = [
    ("v4-16", None, 0, (0, 0, 0, 0)),
    ("v4-16", None, 2, (1, 0, 0, 0)),
    ("v4-16", None, 14, (1, 1, 1, 0)),
    ("v4-16", False, 13, (0, 1, 1, 1)),
    ("v3-32", None, 9, (0, 1, 0, 1)),  # 4x4 chips, 2 cores: chip 4 = (0, 1)
    ("v3-32", None, 31, (3, 3, 0, 1)),
    ("v5litepod-16", None, 6, (2, 1, 0, 0)),
    ("tpu7x-16", None, 11, (1, 0, 1, 1)),
    ("v5p-128", None, 126, (3, 3, 3, 0)),
]


@pytest.mark.parametrize(("accelerator", "megacore", "core_id", "expected"), LOCATIONS)
def test_core_location_golden(accelerator: str, megacore: bool | None, core_id: int, expected: tuple[int, ...]) -> None:
    tpu = resolve_slice(accelerator=accelerator, megacore=megacore)
    loc = core_location(core_id, tpu)
    assert loc == CoreLocation(*expected)
    assert core_id_of(loc.coords, loc.core, tpu) == core_id


@pytest.mark.parametrize(("label", "kw"), SLICES, ids=SLICE_IDS)
def test_core_location_inverts_core_id_of(label: str, kw: dict[str, Any]) -> None:
    tpu = make_slice(kw)
    for core_id in range(tpu.tensorcores_per_slice):
        loc = core_location(core_id, tpu)
        assert core_id_of(loc.coords, loc.core, tpu) == core_id
        assert all(0 <= c < n for c, n in zip(loc.coords, tpu.topology, strict=True))


@pytest.mark.parametrize("bad", [-1, 16, 2.0, True, "3"])
def test_core_location_refuses_ids_outside_the_slice(bad: Any) -> None:
    with pytest.raises(ClusterError, match=r"not a TensorCore of v4-16 .* ids are 0\.\.15"):
        core_location(bad, V4_16)


def test_expected_core_ids_megacore_are_even() -> None:
    assert list(expected_core_ids(V4_16)) == list(range(0, 16, 2))
    assert list(expected_core_ids(resolve_slice(accelerator="v4-16", megacore=False))) == list(range(16))
    assert list(expected_core_ids(V5E_16)) == list(range(16))


# --- golden merges ---------------------------------------------------------------------------------


def test_merge_golden_v4_16_megacore() -> None:
    merged = merge_core_ids({1: [8, 10, 12, 14], 0: [0, 2, 4, 6]}, V4_16)
    assert merged == MergedCores((0, 2, 4, 6, 8, 10, 12, 14), (4, 4))
    assert merged.core_ids_of_task(1) == (8, 10, 12, 14)
    assert (merged.num_tasks, merged.devices_per_task) == (2, 4)


def test_merge_golden_v5litepod_16() -> None:
    # Host blocks are 2x2 chips, so a host's ids are not contiguous (x-minor numbering).
    reports = {0: [0, 1, 4, 5], 1: [2, 3, 6, 7], 2: [8, 9, 12, 13], 3: [10, 11, 14, 15]}
    assert sim_reports(V5E_16) == reports
    merged = merge_core_ids(reports, V5E_16)
    assert merged.all_core_ids == (0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15)


def test_merge_takes_numpy_integers() -> None:
    np = pytest.importorskip("numpy")
    merged = merge_core_ids({0: np.array([0, 2, 4, 6], np.int32), 1: [np.int64(8), 10, 12, 14]}, V4_16)
    assert merged.all_core_ids == (0, 2, 4, 6, 8, 10, 12, 14)
    assert all(type(i) is int for i in merged.all_core_ids)
    assert core_location(np.int32(14), V4_16) == CoreLocation(1, 1, 1, 0)


def test_merge_multislice_ids_repeat_per_slice() -> None:
    tpu = resolve_slice(accelerator="v4-8", num_slices=2)
    merged = merge_core_ids({0: [0, 2, 4, 6], 1: [0, 2, 4, 6]}, tpu)
    assert merged.all_core_ids == (0, 2, 4, 6, 0, 2, 4, 6)


def test_merge_keeps_the_order_each_host_reported() -> None:
    # DTensor does not require a host to own any particular cores, only that they are distinct.
    merged = merge_core_ids({0: [14, 12, 10, 8], 1: [6, 4, 2, 0]}, V4_16)
    assert merged.all_core_ids == (14, 12, 10, 8, 6, 4, 2, 0)


@pytest.mark.parametrize(("label", "kw"), SLICES, ids=SLICE_IDS)
def test_merge_of_sim_reports_is_every_device_in_runtime_order(label: str, kw: dict[str, Any]) -> None:
    tpu = make_slice(kw)
    merged = merge_core_ids(sim_reports(tpu), tpu)
    assert merged.device_counts == (tpu.devices_per_host,) * tpu.num_hosts
    per = tpu.hosts_per_slice * tpu.devices_per_host
    for s in range(tpu.num_slices):
        assert sorted(merged.all_core_ids[s * per : (s + 1) * per]) == list(expected_core_ids(tpu))


# --- properties ------------------------------------------------------------------------------------

slices = st.sampled_from([kw for _, kw in SLICES]).map(make_slice)


@settings(max_examples=60, deadline=None)
@given(tpu=slices, seed=st.randoms(use_true_random=False))
def test_arrival_order_does_not_matter(tpu: Any, seed: random.Random) -> None:
    reports = sim_reports(tpu)
    order = list(reports)
    seed.shuffle(order)
    arrived = {t: reports[t] for t in order}
    assert merge_core_ids(arrived, tpu) == merge_core_ids(reports, tpu)


@settings(max_examples=60, deadline=None)
@given(tpu=slices, data=st.data())
def test_a_short_or_long_host_is_named_with_its_count(tpu: Any, data: st.DataObject) -> None:
    reports = sim_reports(tpu)
    task = data.draw(st.integers(0, tpu.num_hosts - 1), label="task")
    count = data.draw(st.integers(0, 2 * tpu.devices_per_host).filter(lambda n: n != tpu.devices_per_host))
    reports[task] = (reports[task] * 3)[:count]
    with pytest.raises(ClusterError) as info:
        merge_core_ids(reports, tpu)
    assert f"every host has {tpu.devices_per_host} TPU devices" in info.value.message
    assert f"task {task} reported {count} device(s)" in info.value.message
    assert "per-host counts: " in str(info.value.hint)


@settings(max_examples=60, deadline=None)
@given(tpu=slices.filter(lambda s: s.hosts_per_slice > 1), data=st.data())
def test_a_duplicate_names_both_tasks(tpu: Any, data: st.DataObject) -> None:
    reports = sim_reports(tpu)
    first, second = data.draw(st.lists(st.integers(0, tpu.hosts_per_slice - 1), min_size=2, max_size=2, unique=True))
    i = data.draw(st.integers(0, tpu.devices_per_host - 1))
    j = data.draw(st.integers(0, tpu.devices_per_host - 1))
    stolen = reports[first][i]
    reports[second][j] = stolen
    with pytest.raises(ClusterError) as info:
        merge_core_ids(reports, tpu)
    low, high = sorted((first, second))
    where = " of slice 0" if tpu.num_slices > 1 else ""
    assert f"core id {stolen}{where} is claimed by task {low} (device " in info.value.message
    assert f") and task {high} (device " in info.value.message


# --- refusals --------------------------------------------------------------------------------------


def test_missing_and_unknown_tasks_are_named() -> None:
    with pytest.raises(ClusterError) as info:
        merge_core_ids({0: [0, 2, 4, 6], 5: [8, 10, 12, 14]}, V4_16)
    assert str(info.value).startswith(
        "core-ID merge for v4-16 (2x2x2, 2 hosts): no core ids from task(s) 1; core ids from unknown task(s) 5 "
        "(expected tasks 0..1)\nhint: "
    )


def test_count_mismatch_lists_every_wrong_host_and_the_missing_ids() -> None:
    reports = sim_reports(V5E_16)
    reports[1] = [2, 3, 6]
    reports[3] = []
    with pytest.raises(ClusterError) as info:
        merge_core_ids(reports, V5E_16)
    assert info.value.message == (
        "core-ID merge for v5litepod-16 (4x4, 4 hosts): every host has 4 TPU devices, but\n"
        "  task 1 reported 3 device(s)\n"
        "  task 3 reported 0 device(s)\n"
        "  missing core id(s): 7, 10, 11, 14, 15"
    )
    assert info.value.hint is not None and info.value.hint.endswith("per-host counts: 4, 3, 4, 0")


def test_duplicate_within_one_host_is_named() -> None:
    with pytest.raises(ClusterError, match=r"core id 2 is claimed by task 0 \(device 1\) and task 0 \(device 2\)"):
        merge_core_ids({0: [0, 2, 2, 6], 1: [8, 10, 12, 14]}, V4_16)


def test_duplicate_across_slices_is_fine_but_not_within_one() -> None:
    tpu = resolve_slice(accelerator="v4-16", num_slices=2)
    reports = sim_reports(tpu)
    reports[3] = [0, 2, 4, 6]  # slice 1's second host claims slice 1's first host's cores
    with pytest.raises(ClusterError, match=r"core id 0 of slice 1 is claimed by task 2 \(device 0\) and task 3"):
        merge_core_ids(reports, tpu)


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (16, r"core id 16 is outside the slice \(ids 0\.\.15\)"),
        (-2, r"core id -2 is outside the slice"),
        (3, r"core id 3 is odd: a megacore device is core 0 of its chip"),
        ("4", r"core id '4' is not an integer"),
        (True, r"core id True is not an integer"),
    ],
)
def test_bad_ids_are_refused(bad: Any, why: str) -> None:
    with pytest.raises(ClusterError, match=r"1 bad core id\(s\)\n  task 1 device 2: " + why):
        merge_core_ids({0: [0, 2, 4, 6], 1: [8, 10, bad, 14]}, V4_16)


def test_many_problems_are_capped() -> None:
    tpu = resolve_slice(accelerator="v5litepod-16")
    with pytest.raises(ClusterError) as info:
        merge_core_ids({t: [99] * 4 for t in range(4)}, tpu)
    assert "16 bad core id(s)" in info.value.message
    assert info.value.message.endswith("... and 8 more")
