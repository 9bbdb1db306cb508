"""The timeline's journal in task 0's state dir, and the service's ledger that writes it: reloaded by a
restarted coordinator, bounded whatever happens, written atomically, a corrupt one refused clearly; and the
service's ledger following a real coordination state (no grpc, no clock: times handed in)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tpuctl.coordination.ledger import FORMED_BARRIER, ServiceLedger
from tpuctl.coordination.state import CoordinationState
from tpuctl.coordination.values import (
    PROTOCOL_VERSION,
    ClusterFailure,
    Registration,
    RestartPolicy,
    ServiceConfig,
    TaskFailure,
    TaskInfo,
    TaskRef,
    TaskSpec,
    Wakeup,
)
from tpuctl.goodput.journal import COMPACT_AT, CUT_SHORT, MARK_EVERY_S, READ_LIMIT, JournalError, load
from tpuctl.goodput.ledger import account
from tpuctl.goodput.timeline import HostMark, PreemptionNotice, Timeline
from tpuctl.watchdog.pace import PaceReport

T0 = 1_700_000_000.0


def totals(timeline: Timeline, now: float) -> dict[str, int]:
    return account(timeline, now).totals


def run_a_generation(ledger: ServiceLedger, at: float) -> None:
    """Registered 1 s after ``at``, formed at 2 s, progress from 3 s, checkpoint, a failure at 9 s, ended at 10 s."""
    t = ledger.timeline
    t.registered(at + 1.0)
    t.formed(at + 2.0)
    ledger.pace(0, PaceReport(1, 0.0, 0.1, 1, False), generation=t.current.number, wall=at + 3.0, transit=0.0)
    ledger.pace(0, PaceReport(40, 1.0, 0.1, 30, False, checkpointed=20), generation=t.current.number, wall=at + 7.0, transit=0.0)
    t.ended(at + 10.0, failed_at=at + 9.0, cause="task 1 failed", failures=[HostMark(1, at + 9.0, "killed")], total=1)
    t.next_generation(t.current.number + 1, at + 10.0)
    ledger.tick(at + 10.0)


def test_the_journal_reloads_to_the_same_ledger(tmp_path: Path) -> None:
    path = tmp_path / "goodput.jsonl"
    ledger = ServiceLedger.open("pod", generation=1, started=T0, now=T0 + 0.5, journal_path=path)
    run_a_generation(ledger, T0)
    ledger.record(PreemptionNotice(2, "sigterm", T0 + 40.0, T0 + 11.0))
    ledger.close(T0 + 12.0)
    assert os.stat(path).st_mode & 0o777 == 0o600
    again = load(path)
    assert totals(again, T0 + 12.0) == totals(ledger.timeline, T0 + 12.0)
    assert again.current.notices == ledger.timeline.current.notices
    # the service stopped: the ledger ended there, like a shutdown (read later, the cluster is down)
    assert again.current.end == T0 + 12.0 and again.current.shutdown
    assert account(again, T0 + 100.0).to_json()["bucket"] is None
    assert [name for name in os.listdir(tmp_path)] == ["goodput.jsonl"]  # no temp file left behind


def test_a_restarted_coordinator_continues_the_journal_and_counts_its_absence_as_restart(tmp_path: Path) -> None:
    path = tmp_path / "goodput.jsonl"
    first = ServiceLedger.open("pod", generation=1, started=T0, now=T0 + 0.5, journal_path=path)
    first.timeline.registered(T0 + 1.0)
    first.timeline.formed(T0 + 2.0)
    first.pace(0, PaceReport(1, 0.0, 0.1, 1, False), generation=1, wall=T0 + 3.0, transit=0.0)
    first.tick(T0 + 3.0)
    first.pace(0, PaceReport(30, 0.0, 0.1, 29, False), generation=1, wall=T0 + 9.0, transit=0.0)
    first.tick(T0 + 9.0)  # the last mark before task 0's agent is killed (no close: it died)
    # task 0's agent comes back with the same state dir at T0+20: the service starts at generation 2
    second = ServiceLedger.open("pod", generation=2, started=T0 + 19.5, now=T0 + 20.0, journal_path=path)
    t = second.timeline
    assert t.started == T0 and [g.number for g in t.generations] == [1, 2]
    ended = t.generations[0]
    assert ended.failed_at == T0 + 9.0 and ended.end == T0 + 20.0 and "coordinator stopped" in ended.cause
    t.registered(T0 + 22.0)
    t.formed(T0 + 22.5)
    ledger = account(t, T0 + 25.0)
    assert {b: v / 1000 for b, v in ledger.generations[0].totals.items() if v} == {
        "bring_up": 2.0, "startup": 1.0, "productive": 6.0, "restart": 11.0,
    }  # fmt: skip
    assert {b: v / 1000 for b, v in ledger.generations[1].totals.items() if v} == {
        "waiting": 2.0, "restart": 0.5, "startup": 2.5,
    }  # fmt: skip


def test_task_0_back_with_a_new_state_dir_starts_a_ledger_that_says_what_it_does_not_count(tmp_path: Path) -> None:
    """No journal, and a host says the cluster is at generation 3 (the service continues above it)."""
    state = new_state(rejoin=True)
    ledger = ServiceLedger.open("test", generation=1, started=T0, now=T0, journal_path=tmp_path / "goodput.jsonl")
    state.register(registration(1, generation=2), now=1.0)  # a survivor remembers generation 2
    for task in (0, 2, 3):
        state.register(registration(task), now=1.0)
    ledger.observe(state, state.take_wakeup(), now=1.0, wall=T0 + 1.0)
    gen = ledger.timeline.current
    assert state.generation == 3 and gen.number == 3 and not gen.bring_up and gen.registered == T0 + 1.0
    assert any("generations 1 to 2 ran under an earlier coordinator" in n for n in ledger.timeline.notes)
    document = json.loads(ledger.document(T0 + 2.0))
    assert document["totals"]["waiting"] == 1.0 and document["totals"]["restart"] == 1.0
    assert any("not counted" in note for note in document["notes"])


def test_a_new_life_of_the_cluster_starts_a_new_journal_and_keeps_the_last_one(tmp_path: Path) -> None:
    path = tmp_path / "goodput.jsonl"
    ServiceLedger.open("pod", generation=1, started=T0, now=T0, journal_path=path).close(T0 + 5.0)
    again = ServiceLedger.open("pod", generation=1, started=T0 + 100.0, now=T0 + 100.0, journal_path=path)
    assert again.timeline.started == T0 + 100.0
    assert load(tmp_path / "goodput.previous.jsonl").started == T0


def test_the_journal_stays_bounded_through_days_of_marks_and_a_storm_of_generations(tmp_path: Path) -> None:
    path = tmp_path / "goodput.jsonl"
    ledger = ServiceLedger.open("pod", generation=1, started=T0, now=T0, journal_path=path)
    t = ledger.timeline
    t.registered(T0 + 1.0)
    t.formed(T0 + 2.0)
    at, largest = T0 + 3.0, 0
    for step in range(1, 4_000):  # 5.5 hours of progress marks at the mark rate (about 4 MB of lines)
        ledger.pace(step % 4, PaceReport(step, 0.0, 1.0, 50, False, checkpointed=step - 5), generation=1, wall=at, transit=0.0)
        at += MARK_EVERY_S
        largest = max(largest, path.stat().st_size)
    for number in range(2, 50):  # 50 generations, each ended by 10,000 failed hosts
        ledger.observe(_Stub(number), Wakeup(), now=0.0, wall=at)  # type: ignore[arg-type]  # the state is at the next generation
        for task in range(12):  # the named ones come back, and others
            ledger.registered(_Stub(number), task, now=0.0, wall=at + 0.5)  # type: ignore[arg-type]
        ledger.tick(at + 1.0)
        at += 2.0
        largest = max(largest, path.stat().st_size)
    assert largest <= COMPACT_AT + 64 * 1024, largest
    reloaded = load(path)
    assert len(reloaded.generations) <= 32 and reloaded.folded is not None and reloaded.folded.failed_hosts >= 16 * 10_000
    assert totals(reloaded, at) == totals(t, at)


_TASKS = tuple(TaskInfo(task, f"10.0.{task // 256}.{task % 256}") for task in range(10_000))


class _Stub:
    """A coordination state at ``generation``, whose generation before ended with 10,000 hosts failed."""

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.failure = None
        self.registration_complete = False
        self.failed_since = -1.0
        self.failed_seen = {task: -1.0 for task in range(10)}
        self.generations = self
        self.tasks = _TASKS

    def ended(self, generation: int) -> ClusterFailure:
        cause = "no heartbeat: " + "x" * 300
        failures = tuple(TaskFailure(_TASKS[task], cause) for task in range(10))
        return ClusterFailure(failures, 10_000, generation=generation, rejoin=True)


def test_a_last_line_cut_short_is_dropped_and_said(tmp_path: Path) -> None:
    path = tmp_path / "goodput.jsonl"
    ledger = ServiceLedger.open("pod", generation=1, started=T0, now=T0, journal_path=path)
    run_a_generation(ledger, T0)
    ledger.close(T0 + 11.0)
    with path.open("a") as handle:
        handle.write('{"generation": {"number": 2, "sta')  # the process died in the middle of a write
    timeline = load(path)
    assert CUT_SHORT in timeline.notes and [g.number for g in timeline.generations] == [1, 2]


HEADER = '{"journal": "tpuctl.goodput-journal/v1", "cluster": "pod", "started": 1}\n'


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"journal": "tpuctl.goodput-journal/v1", "cluster": "pod", "started": 1}\n{"seen": 2\n{"seen": 3}\n', "line 2: not a JSON record"),
        (HEADER + json.dumps({"generation": {**Timeline("pod", T0).current.to_json(), "number": "two"}}) + "\n",
         "line 2: generation: 'number' is not an integer"),
        (HEADER + json.dumps({"generation": {**Timeline("pod", T0).current.to_json(), "pauses": [["slept", 1, 2, 3, None]]}}) + "\n",
         "line 2: generation: a pause is neither 'hung' nor 'idle'"),
        ('{"journal": "tpuctl.goodput-journal/v1", "cluster": "pod", "started": 1}\n{"weather": 1}\n', "line 2: unknown record 'weather'"),
        ('{"schema": "tpuctl.status/v1"}\n', "line 1: not a tpuctl goodput journal"),
        ('{"journal": "tpuctl.goodput-journal/v1", "cluster": "pod", "started": 1}\n', "the journal has no generation"),
        ("\x00\x01garbage\n", "line 1: not a JSON record"),
    ],
)  # fmt: skip
def test_a_corrupt_journal_is_refused_naming_the_file_the_line_and_the_problem(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "goodput.jsonl"
    path.write_text(content)
    with pytest.raises(JournalError) as excinfo:
        load(path)
    assert str(path) in excinfo.value.message and expected in excinfo.value.message, excinfo.value.message
    assert excinfo.value.hint is not None and "move" in excinfo.value.hint and excinfo.value.exit_code == 5


def test_what_is_not_a_journal_file_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "goodput.jsonl"
    folder.mkdir()
    with pytest.raises(JournalError, match="a folder, not a regular file"):
        load(folder)
    big = tmp_path / "big.jsonl"
    with big.open("wb") as handle:
        handle.truncate(READ_LIMIT + 1)
    with pytest.raises(JournalError, match="over"):
        load(big)


def test_a_coordinator_finding_a_corrupt_journal_moves_it_aside_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "goodput.jsonl"
    path.write_text("not json\n")
    ledger = ServiceLedger.open("pod", generation=2, started=T0, now=T0, journal_path=path)
    assert (tmp_path / "goodput.jsonl.corrupt").read_text() == "not json\n"
    notes = json.loads(ledger.document(T0 + 1.0))["notes"]
    assert any("line 1: not a JSON record" in n and "moved to" in n for n in notes), notes
    assert load(path).current.number == 2  # a new journal


def test_a_journal_that_cannot_be_written_leaves_the_ledger_in_memory(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "goodput.jsonl"
    ledger = ServiceLedger.open("pod", generation=1, started=T0, now=T0, journal_path=path)
    assert ledger.journal is not None
    ledger.journal.close()
    path.unlink()
    path.mkdir()  # what was the journal is a folder now: every write fails (even as root)
    run_a_generation(ledger, T0)
    assert caplog.text.count("cannot be written") == 1, caplog.text  # said once, not on every event
    assert json.loads(ledger.document(T0 + 12.0))["totals"]["lost"] == 5.0  # from step 20 (T0+4) to the failure


# --- the service's ledger following a coordination state ----------------------------------------------------


def new_state(tasks: int = 4, *, rejoin: bool = True) -> CoordinationState:
    config = ServiceConfig(
        cluster="test", tasks=tuple(TaskSpec(f"127.0.0.{i + 1}") for i in range(tasks)), heartbeat_timeout=3.0,
        register_timeout=30.0, barrier_timeout=30.0, restart=RestartPolicy(rejoin, 60.0, 3),
    )  # fmt: skip
    return CoordinationState(config, service_incarnation=77)


def registration(task: int, *, incarnation: int | None = None, generation: int = 0, previous: bytes = b"") -> Registration:
    incarnation = incarnation or 1000 + task
    return Registration(
        protocol_version=PROTOCOL_VERSION, cluster="test", task_id=task, incarnation=incarnation,
        hostname=f"host-{task}", peer=f"ipv4:127.0.0.1:{5000 + task}", credential=f"c-{task}-{incarnation}".encode().ljust(32, b"."),
        retry_secret=b"retry" + incarnation.to_bytes(11, "big"), generation=generation, previous_credential=previous,
    )  # fmt: skip


def form(state: CoordinationState, ledger: ServiceLedger, refs: list[TaskRef], *, now: float) -> None:
    """Every host passes init's final barrier; the ledger sees what the service's wake-up would show it."""
    for ref in refs:
        state.barrier_arrive(ref, FORMED_BARRIER, 10.0, now=now)
    ledger.observe(state, state.take_wakeup(), now=now, wall=T0 + now)


def test_the_service_ledger_follows_the_state_through_a_failure_and_the_hosts_return() -> None:
    state = new_state()
    ledger = ServiceLedger.open("test", generation=1, started=T0, now=T0)
    refs = [state.register(registration(t), now=1.0).task for t in range(4)]
    ledger.observe(state, state.take_wakeup(), now=1.0, wall=T0 + 1.0)
    for ref in refs:
        state.session_opened(ref, 10 + ref.task_id, now=1.0)
    form(state, ledger, refs, now=2.0)
    assert ledger.timeline.current.registered == T0 + 1.0 and ledger.timeline.current.formed == T0 + 2.0
    ledger.pace(0, PaceReport(5, 0.0, 0.1, 4, False, checkpointed=3), generation=1, wall=T0 + 3.0, transit=0.0)
    state.session_closed(refs[2], 12, now=6.0)  # task 2's process killed: its connection closes at once
    failures = state.expire(now=10.0)  # the heartbeat timeout (3 s) after the keepalive window before it
    assert [f.task.task_id for f in failures] == [2]
    ledger.observe(state, state.take_wakeup(), now=10.0, wall=T0 + 10.0)
    gen1, gen2 = ledger.timeline.generations
    assert gen1.end == T0 + 10.0 and gen1.failed_at == T0 + 6.0  # when its session ended, not when detected
    assert [(f.task, f.at) for f in gen1.failures] == [(2, T0 + 6.0)] and "no heartbeat" in gen1.failures[0].cause
    assert gen2.number == 2 and gen2.start == T0 + 10.0 and not gen2.bring_up
    # the survivors and the failed host's new process register into generation 2
    again = [state.register(registration(t, generation=1, previous=refs[t].credential), now=10.1).task for t in (0, 1, 3)]
    ledger.observe(state, state.take_wakeup(), now=10.1, wall=T0 + 10.1)
    back = state.register(registration(2, incarnation=99), now=13.0).task
    ledger.registered(state, 2, now=13.0, wall=T0 + 13.0)
    ledger.observe(state, state.take_wakeup(), now=13.0, wall=T0 + 13.0)
    form(state, ledger, [*again, back], now=13.5)
    assert [(r.task, r.at, r.address) for r in gen2.returns] == [(2, T0 + 13.0, "127.0.0.3")]
    assert json.loads(ledger.document(T0 + 14.0))["generations"][0]["failures"][0]["address"] == "127.0.0.3"
    assert (gen2.registered, gen2.formed) == (T0 + 13.0, T0 + 13.5)
    summary = ledger.summary(T0 + 14.0)
    assert summary.bucket == "startup" and summary.generation == 2 and summary.wall_seconds == 14.0


def test_a_final_failure_ends_the_ledger_and_it_still_answers() -> None:
    state = new_state(rejoin=False)
    ledger = ServiceLedger.open("test", generation=1, started=T0, now=T0)
    refs = [state.register(registration(t), now=1.0).task for t in range(4)]
    form(state, ledger, refs, now=2.0)
    state.report_error(refs[1], "out of memory", now=5.0)
    ledger.observe(state, state.take_wakeup(), now=5.0, wall=T0 + 5.0)
    document = json.loads(ledger.document(T0 + 50.0, str(state.failure)))
    assert document["until"] == T0 + 5.0 and document["bucket"] is None
    assert document["generations"][0]["final"] and "out of memory" in document["generations"][0]["ended"]
    assert "out of memory" in document["error"]


def test_a_host_back_at_once_ends_its_generation_by_registering_and_its_return_is_marked() -> None:
    """kill -9 of a host's agent and `tpuctl init` again at once: its new process brings its predecessor's
    credential, which fails the old registration there and then (no heartbeat timeout): the generation ends,
    from the old process's session end, and the registration is the host's return."""
    state = new_state()
    ledger = ServiceLedger.open("test", generation=1, started=T0, now=T0)
    refs = [state.register(registration(t), now=1.0).task for t in range(4)]
    for ref in refs:
        state.session_opened(ref, 10 + ref.task_id, now=1.0)
    form(state, ledger, refs, now=2.0)
    state.session_closed(refs[2], 12, now=5.0)  # killed
    state.register(registration(2, incarnation=99, generation=1, previous=refs[2].credential), now=5.5)
    ledger.registered(state, 2, now=5.5, wall=T0 + 5.5)
    gen1, gen2 = ledger.timeline.generations
    assert gen1.failed_at == T0 + 5.0 and gen1.end == T0 + 5.5 and "restarted: a new process" in gen1.failures[0].cause
    assert [(r.task, r.at) for r in gen2.returns] == [(2, T0 + 5.5)]


def test_a_deadline_s_lost_steps_told_after_the_generation_ended_count_in_that_generation() -> None:
    from tpuctl.goodput.timeline import StepsLost

    ledger = ServiceLedger.open("pod", generation=1, started=T0, now=T0)
    run_a_generation(ledger, T0)  # generation 1 ended at T0+10, generation 2 began
    ledger.record(StepsLost(1, 30, T0 + 9.5))  # its deadline passed at T0+9.5, told once generation 2 began
    assert ledger.timeline.generations[0].lost is not None and ledger.timeline.current.lost is None
    document = json.loads(ledger.document(T0 + 11.0))
    assert document["generations"][0]["buckets"]["lost"] == 3.0  # 30 steps of 0.1 s before the failure


def test_progress_figures_cost_the_journal_a_mark_now_and_then_never_a_sync_per_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10,000 hosts whose job checkpoints every step: each report carries a new checkpoint and, at the
    generation's start, an earlier first step; none of it is an event to sync, only a figure for the marks."""
    synced: list[int] = []
    monkeypatch.setattr("tpuctl.goodput.journal.os.fsync", synced.append)
    path = tmp_path / "goodput.jsonl"
    ledger = ServiceLedger.open("pod", generation=1, started=T0, now=T0, journal_path=path)
    ledger.timeline.registered(T0 + 1.0)
    ledger.timeline.formed(T0 + 2.0)
    before, writes = len(synced), 0
    for n in range(10_000):  # 100 reports a second for 100 s
        at = T0 + 3.0 + n / 100
        size = path.stat().st_size
        ledger.pace(n, PaceReport(n, 1.0 - n / 20_000, 0.1, 50, False, checkpointed=n), generation=1, wall=at, transit=0.0)
        writes += path.stat().st_size != size
    assert len(synced) - before <= 1  # the first step: the one event
    assert writes <= 100 / MARK_EVERY_S + 2
    assert ledger.timeline.current.checkpoint == 9_999
