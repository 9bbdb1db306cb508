"""The soak's schedule generator (tools/soak/schedule.py): a seed in, a short list of timed steps out, pure.

Golden schedules pin what a seed means (a seed printed by a failed soak must replay the same steps);
properties over many seeds say what every schedule is: sorted, short, each fault undone on its host,
durations of stops and cuts around the heartbeat timeout as labelled, a retry round marked "must pass"
only when nothing else overlaps it.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tools.soak import schedule as s
from tools.soak.schedule import Step

SEEDS = range(2000)
HB = s.HEARTBEAT_TIMEOUT_S

GOLDEN = {
    5: [
        Step(2.6, s.DOWN, 1),
        Step(3.77, s.DOWN, 5),
        Step(5.12, s.RESTART, 1),
        Step(8.54, s.RESTART, 5, fresh=True),
    ],
    1560: [
        Step(0.76, s.STOP, 0, 6.78, expect=s.FAIL),
        Step(1.28, s.CUT, 3, 3.09, expect=s.MAYBE),
        Step(3.03, s.KILL, 4),
        Step(4.37, s.HEAL, 3),
        Step(6.58, s.RESTART, 4),
        Step(7.54, s.CONT, 0),
    ],
    2548: [
        Step(0.44, s.BARRIER_SOME, seconds=1.2, hosts=(0, 1, 4, 5)),
        Step(0.46, s.STOP, 0, 1.14, expect=s.SURVIVE),
        Step(1.6, s.CONT, 0),
        Step(2.06, s.BARRIER_ALL, seconds=s.RETRY_TIMEOUT_S, hosts=tuple(range(8)), expect=s.PASS),
    ],
}


@pytest.mark.parametrize("seed", sorted(GOLDEN))
def test_a_seed_always_means_the_same_schedule(seed: int) -> None:
    assert list(s.generate(seed).steps) == GOLDEN[seed]
    assert s.generate(seed) == s.generate(seed)


def test_schedules_differ_from_seed_to_seed() -> None:
    assert len({s.generate(seed).steps for seed in range(200)}) == 200


def test_every_schedule_is_sorted_short_and_hits_distinct_hosts() -> None:
    for seed in SEEDS:
        steps = s.generate(seed).steps
        assert [x.at for x in steps] == sorted(x.at for x in steps), seed
        assert steps[0].at >= 0 and s.generate(seed).length < 25.0, seed
        faults = [x for x in steps if x.action in (s.KILL, s.STOP, s.CUT, s.DOWN)]
        assert len({x.task for x in faults}) == len(faults), f"seed {seed}: a host hit twice"
        assert 1 <= len(faults) + sum(x.action in (s.BARRIER_SOME, s.DOWN_ALL) for x in steps) <= 3, seed
        assert all(0 <= x.task < s.HOSTS for x in faults), seed


def test_every_fault_is_undone_on_its_host_afterwards() -> None:
    undo = {s.KILL: s.RESTART, s.DOWN: s.RESTART, s.STOP: s.CONT, s.CUT: s.HEAL}
    for seed in SEEDS:
        steps = s.generate(seed).steps
        for i, step in enumerate(steps):
            if step.action not in undo:
                continue
            later = [x for x in steps[i + 1:] if x.action == undo[step.action] and x.task == step.task]
            assert len(later) == 1, f"seed {seed}: {step} is not undone exactly once"
            if step.action in (s.STOP, s.CUT):
                assert later[0].at == pytest.approx(step.at + step.seconds, abs=0.011), seed
        restarts = [x for x in steps if x.action == s.RESTART]
        assert len(restarts) == sum(x.action in (s.KILL, s.DOWN) for x in steps), seed


def test_stops_and_cuts_last_as_long_as_labelled_against_the_heartbeat_timeout() -> None:
    seen: Counter[str] = Counter()
    for seed in SEEDS:
        for x in s.generate(seed).steps:
            if x.action in (s.STOP, s.CUT):
                seen[x.expect] += 1
                low, high = {s.SURVIVE: (0.15, 0.45), s.MAYBE: (0.8, 1.25), s.FAIL: (1.5, 2.5)}[x.expect]
                assert low * HB - 0.01 <= x.seconds <= high * HB + 0.01, (seed, x)
    assert seen[s.MAYBE] > seen[s.SURVIVE] > 0 and seen[s.FAIL] > 0  # mostly around the timeout


def test_barrier_rounds_a_short_one_on_some_hosts_then_the_retry_on_every_host() -> None:
    for seed in SEEDS:
        steps = s.generate(seed).steps
        some = [x for x in steps if x.action == s.BARRIER_SOME]
        every = [x for x in steps if x.action == s.BARRIER_ALL]
        assert len(some) == len(every) <= 3, seed
        for short in some:
            assert 1 <= len(short.hosts) < s.HOSTS and len(set(short.hosts)) == len(short.hosts), seed
            assert 1.0 <= short.seconds <= 2.5, seed
            end = short.at + short.seconds
            after = [x for x in every if end + 0.29 <= x.at <= end + 1.51]  # rounded to 10 ms
            assert after, f"seed {seed}: no retry 0.3-1.5 s after {short.describe()} timed out"
        assert all(x.hosts == tuple(range(s.HOSTS)) and x.seconds == s.RETRY_TIMEOUT_S for x in every), seed


def partner(retry: Step, steps: tuple[Step, ...]) -> Step:
    """The short round a retry retries: the one that timed out 0.3-1.5 s before it."""
    return next(x for x in steps if x.action == s.BARRIER_SOME and 0.29 <= retry.at - x.at - x.seconds <= 1.51)


def test_a_retry_must_pass_exactly_when_no_other_fault_overlaps_it() -> None:
    """Checked against a plain reading of the rule: no kill, down or long stop/cut of another episode
    from 0.5 s before it to its undoing + heartbeat timeout + 6 s, no down --all, and no round of another
    barrier episode overlaps the round."""
    marked = 0
    for seed in SEEDS:
        steps = s.generate(seed).steps
        for retry in (x for x in steps if x.action == s.BARRIER_ALL):
            end = retry.at + retry.seconds
            clear = True
            for fault in steps:
                other_round = fault.action in (s.BARRIER_SOME, s.BARRIER_ALL) and fault not in (retry, partner(retry, steps))
                if other_round and fault.at - 0.5 < end and retry.at < fault.at + fault.seconds:
                    clear = False
                if fault.action == s.DOWN_ALL and fault.at - 0.5 < end:
                    clear = False
                if fault.action in (s.KILL, s.DOWN) or (fault.action in (s.STOP, s.CUT) and fault.expect != s.SURVIVE):
                    undo = next(x for x in steps if x.task == fault.task and x.at >= fault.at and x.action in (s.RESTART, s.CONT, s.HEAL))
                    if fault.at - 0.5 < end and retry.at < undo.at + HB + 6.0:
                        clear = False
            assert (retry.expect == s.PASS) == clear, (seed, retry)
            marked += clear
    assert marked > 50


def test_down_all_is_the_last_episode_and_every_host_starts_again_after_it() -> None:
    count = 0
    for seed in SEEDS:
        steps = s.generate(seed).steps
        downs = [i for i, x in enumerate(steps) if x.action == s.DOWN_ALL]
        assert len(downs) <= 1, seed
        if downs:
            count += 1
            (i,) = downs
            assert [x.action for x in steps[i + 1:]] == [s.RESTART_ALL], f"seed {seed}: steps after down --all"
    assert count > 20


def test_every_fault_kind_is_injected_and_the_slice_covers_every_kind() -> None:
    total: Counter[str] = Counter()
    for seed in range(500):
        total.update(s.generate(seed).kinds())
    assert set(total) == set(s.FAULT_KINDS)
    slice_kinds: set[str] = set()
    for seed in s.SLICE:
        slice_kinds |= set(s.generate(seed).kinds())
    assert slice_kinds == set(s.FAULT_KINDS)
    steps = [x for seed in s.SLICE for x in s.generate(seed).steps]
    assert any(x.action == s.KILL and x.task == 0 for x in steps), "the slice kills the coordinator"
    assert any(x.action == s.STOP and x.task == 0 and x.expect == s.FAIL for x in steps), "and freezes it"
    assert any(x.action == s.CUT and x.expect != s.SURVIVE for x in steps), "a cut about the heartbeat timeout"
    assert any(x.action == s.BARRIER_ALL and x.expect == s.PASS for x in steps), "a retry that must pass"


def test_covering_seeds_picks_a_few_seeds_that_cover_every_kind() -> None:
    chosen = s.covering_seeds(range(3000))
    assert len(chosen) <= 4
    covered = set().union(*(s.generate(seed).kinds() for seed in chosen))
    assert covered == set(s.FAULT_KINDS)
    with pytest.raises(ValueError, match="do not cover every fault kind"):
        s.covering_seeds([5])


def test_a_schedule_describes_itself_one_step_a_line() -> None:
    text = s.generate(2548).describe()
    assert text.splitlines() == [
        "schedule seed 2548:",
        "   0.44s barrier 'step' --timeout 1.2s on tasks 0,1,4,5",
        "   0.46s stop task 0 for 1.14s (survive)",
        "   1.60s cont task 0",
        "   2.06s barrier 'step' --timeout 10.0s on every host (must pass)",
    ]


def test_a_swapped_schedule_hits_the_serving_task_where_the_schedule_hit_task_0() -> None:
    """The runner maps the schedule's task 0 (the coordinator's share of the faults) to whichever task
    serves when it starts (a successor, once the coordinator moved); the other task takes task 0's place."""
    schedule = s.Schedule(7, (
        s.Step(1.0, s.KILL, task=0),
        s.Step(2.0, s.STOP, task=2, seconds=1.0, expect=s.FAIL),
        s.Step(3.0, s.BARRIER_SOME, seconds=2.0, hosts=(0, 1, 3)),
        s.Step(4.0, s.RESTART_ALL),
    ))  # fmt: skip
    swapped = schedule.swapped(0, 2)
    assert [(s.action, s.task, s.hosts) for s in swapped.steps] == [
        (s.KILL, 2, ()), (s.STOP, 0, ()), (s.BARRIER_SOME, -1, (1, 2, 3)), (s.RESTART_ALL, -1, ()),
    ]  # fmt: skip
    assert swapped.kinds() == schedule.kinds() and schedule.swapped(0, 0) == schedule
