"""What must hold after every soak schedule, judged from what the runner recorded: the agents' log lines,
the mapping files' timeline, the faults and when each host was disturbed, and the check round's outputs.
Pure: no clock, no files, no processes (the runner reads; these decide).

The invariants, one name each (a :class:`Violation` carries it):

* ``reform``: after the schedule every host's agent is up, in one generation, with byte-identical
  mapping files whose generation and incarnation are what ``tpuctl status`` says; status exits 0 on every
  host, healthy, not forming;
* ``stale-mapping``: a host whose generation ended (its agent logged that it re-forms) keeps no mapping of
  it; ``unformed-mapping``: no mapping file of a generation that never formed (one that appeared on a single
  host and that no other host formed);
* ``detection``: every failure (a kill, a ``tpuctl down``, a stop or a cut that outlasted the heartbeat
  timeout) is named (``task N (ADDRESS)``; for the coordinator also its service's address, or its role)
  in the log of every host that was undisturbed meanwhile, within heartbeat timeout + 2 s of the fault (a
  stop or cut around the timeout counts as a failure only when some host named it before the victim had been
  back that long; the history of earlier generations a line carries, after ``; earlier: ``, names nothing).
  The coordinator is whichever task serves at the time (it moves to a successor when its host is lost,
  ``coordinator.successors``): the one most hosts last registered with (``Coordinators``); ``down-all``: every
  undisturbed agent exits within that time of ``tpuctl down --all`` (a host disturbed until less than that
  time before is still reconnecting; none while the coordinator, task 0, is: ``told_of_down_all``; none when the command said its own agent
  could not take it, ``down_all_refused``);
* ``survive``: a stop or a cut of at most 0.45 x the heartbeat timeout ends no generation (a host that was
  disturbed itself meanwhile judges by its own silence);
* ``deadline``: no command outlived its deadline (the soak killed it there);
* ``traceback``: no traceback, internal error or agent crash in any command's output or agent log;
* ``barrier``: the check round (every host calls the barrier of the schedule) passes; so does a retry round
  of the schedule that overlapped no other fault; a round some hosts skipped never passes, unless each of
  them passed a call of the same name made for another round while this one's calls ran (a host's k-th call
  joins the name's k-th instance, whichever round the soak made it for: ``joined_elsewhere``), and no round
  tells a host that it is itself missing.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) (.*)$")
REFORMING = "re-forming as the next generation"
HISTORY = "; earlier: "
"""What follows it in a line is what ended earlier generations (``ClusterFailure``'s history), not news."""
RETRYING = "(will retry)"  # a heartbeat that failed once: not yet a verdict on anyone
VERDICT_LEVELS = ("WARNING", "ERROR")  # a host's verdict on the coordinator is logged at these
FORMED = re.compile(r"task \d+: generation (\d+) formed")
REGISTERED = re.compile(r"task (\d+): registered with ([^\s;]+)")  # every host, every generation: whose service
TRACEBACK_MARKS = ("Traceback (most recent call last)", "internal error", "agent crashed")
STALE_GRACE_S = 1.5  # the agent removes its mapping right after it logs that it re-forms
FORMED_WINDOW_S = 10.0  # another host's evidence of the same generation within this much of the sample


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str
    known: str = ""
    """Which known defect it looks like (a hint for the report; a person classifies)."""


@dataclass(frozen=True)
class LogLine:
    task: int
    at: float  # epoch seconds
    level: str
    text: str


@dataclass(frozen=True)
class Fault:
    """A fault whose failure the other hosts must name: kill, stop, partition, down, down-all."""

    kind: str
    task: int
    at: float  # epoch seconds
    until: float  # stop, cut: when it was undone; kill, down: when the host's new init started (inf: never)
    expect: str  # "fail", "maybe" (around the heartbeat timeout) or "survive"


@dataclass(frozen=True)
class Disturbed:
    """Host ``task`` could not be expected to hear anything in [start, end] (frozen, cut off, dead, new)."""

    task: int
    start: float
    end: float


@dataclass(frozen=True)
class MappingSample:
    """Host ``task``'s mapping file as seen at ``at``: its digest (None: no file), incarnation, generation."""

    task: int
    at: float
    digest: str | None
    incarnation: str = ""
    generation: int = 0


def parse_log(task: int, text: str) -> tuple[list[LogLine], list[str]]:
    """An agent log's lines (a line without a timestamp joins the one before) and the texts that carry a
    traceback mark."""
    lines: list[LogLine] = []
    for raw in text.splitlines():
        m = LINE.match(raw)
        if m:
            at = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            lines.append(LogLine(task, at, m.group(2), m.group(3)))
        elif lines and raw.strip():
            last = lines[-1]
            lines[-1] = LogLine(task, last.at, last.level, f"{last.text}\n{raw}")
    marked = [line.text for line in lines if any(mark in line.text for mark in TRACEBACK_MARKS)]
    if not lines and any(mark in text for mark in TRACEBACK_MARKS):
        marked.append(text)
    return lines, marked


def tracebacks(outputs: Iterable[tuple[str, str]]) -> list[Violation]:
    """``outputs``: (where, text). One violation per text with a traceback mark, its first marked line."""
    found = []
    for where, text in outputs:
        for line in text.splitlines():
            if any(mark in line for mark in TRACEBACK_MARKS):
                found.append(Violation("traceback", f"{where}: {line.strip()[:300]}"))
                break
    return found


class Coordinators:
    """Which task serves the cluster at any time, from the agents' registration lines: each host's view is
    the service it last registered with (``task N: registered with ADDRESS``); the coordinator is the task
    whose service most hosts' views name (a host cut off that serves itself is one view; on a tie the
    lowest task). ``targets``: service address (``HOST:PORT``) to task. O(lines) to build; ``at`` replays."""

    def __init__(self, targets: dict[str, int], initial: dict[int, int] | None = None) -> None:
        self.targets = targets
        self.initial = dict(initial or {})
        self.changes: list[tuple[float, int, int]] = []  # (when, host, the task whose service it registered with)

    def add(self, lines: Iterable[LogLine]) -> None:
        for line in lines:
            m = REGISTERED.search(line.text)
            if m and int(m.group(1)) == line.task and m.group(2) in self.targets:
                self.changes.append((line.at, line.task, self.targets[m.group(2)]))
        self.changes.sort(key=lambda change: change[0])

    def views(self, when: float = float("inf")) -> dict[int, int]:
        views = dict(self.initial)
        for at, host, task in self.changes:
            if at > when:
                break
            views[host] = task
        return views

    def at(self, when: float = float("inf")) -> int:
        """The coordinator at ``when`` (task 0 before any host registered)."""
        counts: dict[int, int] = {}
        for task in self.views(when).values():
            counts[task] = counts.get(task, 0) + 1
        return min(counts, key=lambda task: (-counts[task], task)) if counts else 0

    def since(self, when: float) -> Coordinators:
        """The same, with the views at ``when`` as the start (for the next schedule)."""
        return Coordinators(self.targets, self.views(when))


def _disturbed(task: int, start: float, end: float, disturbed: Sequence[Disturbed]) -> bool:
    return any(d.task == task and d.start <= end and start <= d.end for d in disturbed)


def detection(
    faults: Sequence[Fault],
    lines: Sequence[LogLine],
    disturbed: Sequence[Disturbed],
    names: Callable[[int], tuple[str, ...]],
    *,
    hosts: int,
    limit: float,
    coordinator: Callable[[float], int] = lambda when: 0,
) -> tuple[list[Violation], list[tuple[str, float]]]:
    """Every failure named on every undisturbed host within ``limit`` s. Returns the violations and the
    detection times measured: (fault kind, seconds from the fault to the last host's naming).
    ``coordinator(when)``: the task serving the cluster then (``Coordinators.at``)."""
    violations: list[Violation] = []
    measured: list[tuple[str, float]] = []
    lines = sorted(lines, key=lambda line: line.at)
    for fault in faults:
        if fault.kind == "down-all":
            continue  # judged by the runner: every agent must exit
        window = (fault.at - 0.2, fault.at + limit)
        serving = coordinator(fault.at - 0.5)
        if fault.task != serving and _disturbed(serving, fault.at - 0.5, window[1], disturbed):
            continue  # every word between hosts goes through the coordinator: with it frozen, cut off or dead, no one can hear
        observers = [t for t in range(hosts) if t != fault.task and not _disturbed(t, fault.at - 0.5, window[1], disturbed)]
        own = [d for d in disturbed if not (d.task == fault.task and d.start == fault.at)]
        if fault.kind == "partition" and fault.task != serving and not _disturbed(fault.task, fault.at, window[1], own):
            observers.append(fault.task)  # the host cut off must learn too: it names the coordinator
        first: dict[int, float] = {}
        absorbed: set[int] = set()  # hosts that re-formed anyway while the victim was away, then formed with it
        reforming: set[int] = set()
        for line in lines:
            if fault.at - limit <= line.at <= window[1] and REFORMING in line.text and line.task not in first:
                reforming.add(line.task)
            if line.at > fault.until and line.task in reforming and FORMED.search(line.text):
                absorbed.add(line.task)
            if line.at < window[0] or line.task in first or RETRYING in line.text:
                continue
            if fault.task == serving and line.level not in VERDICT_LEVELS:
                continue  # the coordinator's address is in every registration line: only a verdict names it
            # the host cut off names the coordinator it lost, or itself, failed by the others; a verdict on
            # the coordinator may name it by its role ("the coordinator restarted")
            wanted = (*names(serving), *names(fault.task)) if line.task == fault.task else names(fault.task)
            text = line.text.split(HISTORY, 1)[0]  # what ended earlier generations names no fault of now
            by_role = (line.task == fault.task or fault.task == serving) and "coordinator" in text
            if any(name in text for name in wanted) or by_role:
                first[line.task] = line.at
        # Did the service judge it failed? Only a naming before the victim had been back for ``limit`` s
        # says so: a later one is about something else (seed 50340: a later `tpuctl down --all`).
        judged_by = fault.until + limit
        failed = fault.expect == "fail" or any(
            (t in observers or t == serving) and at <= judged_by for t, at in first.items() if t != fault.task
        )
        if fault.expect == "survive" or not failed or not observers:
            continue
        # A host that was re-forming anyway (another host failed) while the victim was away, and formed with
        # the victim back, has nothing to name: the failure was absorbed into a re-forming it did not delay
        # (had the victim stayed away, the re-forming's own progress lines would have named it).
        late = {t: first.get(t) for t in observers
                if (first.get(t) is None or first[t] > window[1]) and t not in absorbed}  # fmt: skip
        if late:
            said = ", ".join(f"task {t} " + ("never" if at is None else f"after {at - fault.at:.1f} s") for t, at in sorted(late.items()))
            violations.append(Violation(
                "detection",
                f"{fault.kind} of task {fault.task} at {_clock(fault.at)} ({fault.expect}): not named within "
                f"{limit:g} s by {said}",
            ))  # fmt: skip
        elif any(t in first for t in observers):
            measured.append((fault.kind, max(first[t] for t in observers if t in first) - fault.at))
    return violations, measured


NOT_TAKEN = ("the cluster was not shut down", "no tpuctl agent is running")


def down_all_refused(code: int | None, err: str) -> bool:
    """``tpuctl down --all`` ended (exit 5, documented in ``tpuctl down --help``) saying its agent could not
    take the command (still joining the cluster, or not answering: stopped alone), or that no agent ran for
    its state dir yet (a ``tpuctl init`` just started there): no other host was told anything."""
    return code == 5 and any(words in err for words in NOT_TAKEN)


def told_of_down_all(
    down_at: float, disturbed: Sequence[Disturbed], *, hosts: int, reconnect: float, coordinator: int = 0
) -> list[int]:
    """The hosts whose agents a ``tpuctl down --all`` at ``down_at`` must stop (``down-all``): not those
    disturbed then, nor those whose disturbance ended less than ``reconnect`` s before (the heartbeat
    timeout + 2 s: a host just resumed or healed is still reconnecting, gRPC's own backoff included, or
    registering again after the others dropped it; task 0 stops the service once the shutdown is out, so
    such a host finds the coordinator gone, as after a partition, and waits for it, as it must); none while
    the coordinator (the task serving when the schedule started, ``coordinator``) is so disturbed itself."""
    excused = {d.task for d in disturbed if d.start < down_at and d.end != float("inf") and d.end >= down_at - reconnect}
    if any(d.task == coordinator and d.start < down_at and d.end >= down_at - reconnect for d in disturbed):
        # The shutdown goes out through the coordinator: with task 0 dead, frozen, cut off or just back,
        # `tpuctl down --all` reaches nobody and says so (seed 50272: task 0 killed, its new init 2.4 s before
        # the down, its service not listening yet: "coordinator unreachable ... Connection refused"), or every
        # host may still be reconnecting to it (seed 50486: task 0 healed 0.83 s before; task 2's connection
        # had broken under the cut and missed the shutdown).
        return []
    return [t for t in range(hosts) if t not in excused]


def survived(
    faults: Sequence[Fault], lines: Sequence[LogLine], names: Callable[[int], tuple[str, ...]],
    disturbed: Sequence[Disturbed] = (), *, limit: float = 0.0, coordinator: Callable[[float], int] = lambda when: 0,
    heartbeat_timeout: float = 0.0,
) -> list[Violation]:  # fmt: skip
    """A stop or cut well under the heartbeat timeout must end no generation: no host may log that it
    re-forms because of the victim while the fault lasted or within 1 s after. A host that was itself
    disturbed by another fault within ``limit`` s before its line judged by its own silence, not the
    victim's (seed 50158: task 2, cut off for 4.67 s, lost the coordinator while task 0 was cut for 0.47 s).
    Nor is a short fault of a host held against it when the coordinator (``coordinator(when)``) was itself
    disturbed within ``heartbeat_timeout`` s before it or during it: the victim heard nothing from the
    coordinator for both together (seed 80435: task 0 stopped 3.16 s, task 5 cut for 1.26 s from 0.18 s
    before task 0 resumed: 4.2 s of silence for task 5, past the heartbeat timeout, so it judged task 0 lost)."""
    found = []
    for fault in faults:
        if fault.expect != "survive":
            continue
        others = [d for d in disturbed if not (d.task == fault.task and d.start == fault.at)]
        serving = coordinator(fault.at - 0.5)
        if serving != fault.task and _disturbed(serving, fault.at - heartbeat_timeout, fault.until, others):
            continue
        for line in lines:
            if _disturbed(line.task, line.at - limit, line.at, others):
                continue
            if fault.at <= line.at <= fault.until + 1.0 and REFORMING in line.text and any(
                name in line.text for name in names(fault.task)
            ):
                found.append(Violation(
                    "survive",
                    f"{fault.kind} of task {fault.task} for {fault.until - fault.at:.2f} s ended a generation: task "
                    f"{line.task} at {_clock(line.at)}: {line.text[:300]}",
                ))  # fmt: skip
                break
    return found


def _timeline(samples: Sequence[MappingSample], task: int) -> list[MappingSample]:
    return sorted((s for s in samples if s.task == task), key=lambda s: s.at)


def _at(timeline: list[MappingSample], when: float) -> MappingSample | None:
    last = None
    for sample in timeline:
        if sample.at > when:
            break
        last = sample
    return last


def stale_mappings(samples: Sequence[MappingSample], lines: Sequence[LogLine], *, hosts: int) -> list[Violation]:
    """A host that logged it re-forms has removed its mapping of the ended generation ``STALE_GRACE_S``
    later (a later file of another generation is fine)."""
    found = []
    for task in range(hosts):
        timeline = _timeline(samples, task)
        for line in (x for x in lines if x.task == task and REFORMING in x.text):
            before, after = _at(timeline, line.at - 0.05), _at(timeline, line.at + STALE_GRACE_S)
            if before is None or before.digest is None or after is None or after.digest != before.digest:
                continue
            # unchanged since: still there, unless it went and came back (then a later sample differs)
            found.append(Violation(
                "stale-mapping",
                f"task {task} logged at {_clock(line.at)} that it re-forms, but its mapping of generation "
                f"{before.generation} was still there {STALE_GRACE_S:g} s later",
            ))  # fmt: skip
    return found


def unformed_mappings(samples: Sequence[MappingSample], lines: Sequence[LogLine]) -> list[Violation]:
    """Every mapping seen is of a generation that formed: another host held the same generation of the
    same service, or logged that it formed, within ``FORMED_WINDOW_S``."""
    found = []
    seen: dict[tuple[str, int], set[int]] = {}
    for s in samples:
        if s.digest is not None:
            seen.setdefault((s.incarnation, s.generation), set()).add(s.task)
    formed_at = [(int(m.group(1)), line.task, line.at) for line in lines if (m := FORMED.search(line.text))]
    for (incarnation, generation), tasks in sorted(seen.items()):
        if len(tasks) > 1:
            continue
        (task,) = tasks
        when = min(s.at for s in samples if s.task == task and s.generation == generation and s.incarnation == incarnation)
        if any(g == generation and t != task and abs(at - when) <= FORMED_WINDOW_S for g, t, at in formed_at):
            continue
        found.append(Violation(
            "unformed-mapping",
            f"task {task} had a mapping of generation {generation} (service incarnation {incarnation}) at "
            f"{_clock(when)} that no other host formed",
        ))  # fmt: skip
    return found


@dataclass(frozen=True)
class HostCheck:
    """What the check round found on one host: ``tpuctl status -o json`` (code, document or None, text)
    and the mapping file (bytes or None)."""

    task: int
    status_code: int | None
    status: dict[str, object] | None
    status_text: str
    mapping: bytes | None


def same_generation(checks: Sequence[HostCheck]) -> list[Violation]:
    """Every host healthy in one generation, with byte-identical mapping files that say that generation."""
    import json

    found = []
    for c in checks:
        if c.status_code != 0 or c.status is None:
            found.append(Violation("reform", f"task {c.task}: tpuctl status exited {c.status_code}: {first_error(c.status_text)}"))
        elif c.status.get("forming") or c.status.get("error"):
            found.append(Violation("reform", f"task {c.task}: tpuctl status says forming={c.status.get('forming')}, error={c.status.get('error')!r}"))
        if c.mapping is None:
            found.append(Violation("reform", f"task {c.task}: no mapping file"))
    generations = {c.task: c.status.get("generation") for c in checks if c.status is not None}
    if len(set(generations.values())) > 1:
        found.append(Violation("reform", f"hosts in different generations: {_grouped(generations)}"))
    digests = {c.task: c.mapping for c in checks if c.mapping is not None}
    if len(set(digests.values())) > 1:
        found.append(Violation("reform", f"mapping files differ: {_grouped({t: _digest(m) for t, m in digests.items()})}"))
    for c in checks:
        if c.mapping is None or c.status is None:
            continue
        try:
            doc = json.loads(c.mapping)
        except ValueError:
            found.append(Violation("reform", f"task {c.task}: its mapping file is not JSON"))
            continue
        said = (c.status.get("generation"), c.status.get("service_incarnation"))
        if (doc.get("generation"), doc.get("incarnation")) != said:
            found.append(Violation(
                "reform",
                f"task {c.task}: mapping of generation {doc.get('generation')} (service {doc.get('incarnation')}), "
                f"status says generation {said[0]} (service {said[1]})",
            ))  # fmt: skip
    return found


def joined_elsewhere(
    round_: Sequence[tuple[int, int | None, float, float | None]],
    others: Sequence[tuple[int, int | None, float, float | None]],
) -> set[int]:
    """The hosts outside a barrier round that may have been counted in its instance: each passed a call of
    the same name made for another round of the schedule, and that call ran while this round's calls did.
    Calls are (task, exit code, started, ended; None: still running), times on one clock.

    A host's k-th call to a name joins the name's k-th instance, whichever round the soak made it for: when
    two barrier episodes overlap, a host that skipped the first round and calls in the second completes the
    instance where the first round's callers wait, and every one of them passes (seed 30063: tasks 0-2, 4-7
    at 1.86 s with a 2 s timeout; task 3's first call at 2.33 s, made for the round of tasks 1, 3, 5, 6,
    passed that instance, #1, with them). A pass needs every host's arrival, so each of them passed."""
    if not round_:
        return set()
    start = min(started for _, _, started, _ in round_)
    end = max(float("inf") if ended is None else ended for _, _, _, ended in round_)
    callers = {task for task, _, _, _ in round_}
    return {
        task for task, code, started, ended in others
        if task not in callers and code == 0 and started <= end and (ended is None or ended >= start)
    }  # fmt: skip


def counted_ahead(
    round_: Sequence[tuple[int, int | None, float, float | None]],
    others: Sequence[tuple[int, int | None, float, float | None]],
) -> set[int]:
    """The hosts of a barrier round whose call of another round, made before this round began, passed while
    this round's calls ran. Calls join by count: that call was counted in the instance this round's other
    callers met, so this host's call of this round is its next one and waits in the next instance alone
    (seed 2548: tasks 0, 1, 4, 5 called with a 1.2 s timeout while the coordinator was stopped; the
    withdrawals reached it after the other hosts' calls of the next round, the instance passed with all
    eight, as documented for a pass that races a withdrawal, and their calls of that round timed out at #3)."""
    if not round_:
        return set()
    start = min(started for _, _, started, _ in round_)
    callers = {task for task, _, _, _ in round_}
    return {
        task for task, code, started, ended in others
        if task in callers and code == 0 and started < start and (ended is None or ended >= start)
    }  # fmt: skip


def barrier_outcomes(
    results: Sequence[tuple[int, int | None, str]], *, callers: Sequence[int], hosts: int, must_pass: bool, what: str,
    joined: Iterable[int] = (), ahead: Iterable[int] = (),
) -> list[Violation]:  # fmt: skip
    """A barrier round's outcomes, (task, exit code, stderr) per caller: a round every host called and
    that had to pass did on every host, but for the hosts in ``ahead`` (``counted_ahead``: their earlier
    call was counted in this round's instance), which may time out, and only time out; a round some hosts
    skipped passed nowhere, unless every host it skipped is in ``joined`` (``joined_elsewhere``: a call of
    another round may have been counted in it); no host is told it is itself missing. One violation per
    kind of problem and round, naming the hosts."""
    found = []
    full = len(callers) == hosts
    codes = " ".join(f"{task}:{'-' if code is None else code}" for task, code, _ in results)
    excused = set(ahead)
    failed = [
        (task, err) for task, code, err in results
        if code != 0 and not (task in excused and code == 4 and re.search(r"#\d+ timed out after", err))
    ]  # fmt: skip
    if must_pass and full and failed:
        task, err = failed[0]
        known = next((k for t, e in failed if (k := _barrier_known(e, t))), "")
        found.append(Violation(
            "barrier", f"{what}: failed on {len(failed)} of {len(results)} hosts (exit codes {codes}); task {task}: "
            f"{first_error(err)}", known=known,
        ))  # fmt: skip
    passed = [task for task, code, _ in results if code == 0]
    absent = sorted(set(range(hosts)) - set(callers) - set(joined))
    if not full and passed and absent:
        found.append(Violation(
            "barrier", f"{what}: tasks {passed} passed a round only tasks {list(callers)} called (no call of "
            f"tasks {absent} ran meanwhile and passed)", known="(1)"))  # fmt: skip
    itself = [(task, err) for task, code, err in results if re.search(rf"missing:[^\n]*\btask {task} \(", err)]
    if itself:
        task, err = itself[0]
        found.append(Violation(
            "barrier", f"{what}: tasks {[t for t, _ in itself]} were told they are themselves missing; task {task}: "
            f"{first_error(err)}", known="(1)",
        ))  # fmt: skip
    return found


def _barrier_known(err: str, task: int) -> str:
    """Defect (1), barrier counters out of step after a timeout: a timeout the caller never asked for, a
    round number past the others', the caller named as missing."""
    if re.search(r"#\d+ timed out after", err) or re.search(rf"missing:.*\btask {task} \(", err):
        return "(1)"
    return ""


def first_error(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("tpuctl: error") or "error" in line.lower():
            return line[:300]
    return (lines[-1] if lines else "(no output)")[:300]


def _grouped(values: dict[int, object]) -> str:
    groups: dict[str, list[int]] = {}
    for task, value in sorted(values.items()):
        groups.setdefault(str(value), []).append(task)
    return "; ".join(f"{value}: tasks {tasks}" for value, tasks in groups.items())


def _digest(data: bytes | None) -> str:
    import hashlib

    return "-" if data is None else hashlib.sha256(data).hexdigest()[:12]


def _clock(at: float) -> str:
    return datetime.datetime.fromtimestamp(at).strftime("%H:%M:%S.%f")[:-3]
