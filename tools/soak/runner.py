"""Runs soak schedules on one 8-host cluster, heals it after each, checks the invariants, reports.

One cluster serves every schedule: after its steps, every frozen agent is continued, every cut healed,
every host without an agent gets ``tpuctl init`` again, and the cluster must re-form; it starts afresh
(every agent stopped, fresh state dirs) only after a violation (so one defect does not cascade into the
next schedules), after ``tpuctl down --all`` (as a schedule's step) or when its generation number grows
past ``FRESH_AFTER_GENERATION``. Every loop here is bounded in count and time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tools.soak import invariants as inv
from tools.soak import schedule as sched
from tools.soak.cluster import (
    DOWN_DEADLINE_S,
    HEARTBEAT_TIMEOUT_S,
    HOSTS,
    RESTART_TIMEOUT_S,
    Cluster,
    Command,
    Commands,
    Network,
)

LIMIT_S = HEARTBEAT_TIMEOUT_S + 2.0  # every failure named on every host within this
SETTLE_S = RESTART_TIMEOUT_S + 15.0  # the cluster re-forms after a schedule within this
START_S = 60.0  # 8 fresh hosts form within this
CHECK_BARRIER_TIMEOUT_S = 10.0  # healthy hosts pass a round in well under a second
FRESH_AFTER_GENERATION = 300  # keeps `tpuctl status`'s history of ended generations short
INIT_ATTEMPTS = 6  # per host and schedule
POLL_S = 0.05
QUIET_S = 1.0  # the mappings stay unchanged this long before the cluster counts as re-formed
HELD = re.compile(r"retry `tpuctl init` for task (\d+) after ([0-9.]+) s")


@dataclass
class Result:
    """One schedule's outcome."""

    seed: int
    seconds: float
    faults: Counter[str]
    skipped: Counter[str]
    violations: list[inv.Violation]
    detections: list[tuple[str, float]]
    settle_s: float | None
    generation: int | None
    notes: list[str] = field(default_factory=list)
    logs: str = ""  # where its commands' output stayed (schedules with violations)


class Interrupted(BaseException):
    """SIGINT or SIGTERM: the soak stops, cleans up and reports what it ran. A ``BaseException``, as
    ``KeyboardInterrupt`` is: raised wherever the main thread is, it must not be taken for an error that a
    poll tolerates (a first SIGINT was once swallowed that way while a state dir was read)."""


class Soak:
    def __init__(self, root: Path, net: Network, *, keep_logs: bool = False, say: Callable[[str], None] = print) -> None:
        self.root = root
        self.net = net
        self.keep_logs = keep_logs
        self.say = say
        self.commands = Commands(root / "commands" / "start")
        self.cluster = Cluster(root / "cluster", net, self.commands)
        self.fresh_starts = 0
        self._log_offsets: dict[Path, int] = {}
        self._mapping_keys: dict[int, tuple[int, int, int] | None] = {}
        self.coordinators = inv.Coordinators(self.cluster.targets())  # who serves: task 0, or a successor
        self.serving = 0  # the task that served when the current schedule started (its task 0)
        # per schedule
        self.lines: list[inv.LogLine] = []
        self.marked: list[tuple[str, str]] = []
        self.samples: list[inv.MappingSample] = []
        self.faults: list[inv.Fault] = []
        self.disturbed: list[inv.Disturbed] = []
        self.violations: list[inv.Violation] = []
        self.notes: list[str] = []
        self.frozen: dict[int, int] = {}  # task -> agent pid, SIGSTOPped
        self.cut: set[int] = set()
        self.inits: dict[int, Command] = {}
        self.init_attempts: Counter[int] = Counter()
        self.retry_at: dict[int, float] = {}  # task -> monotonic time to retry a refused init
        self.needs_fresh_start = True
        self.last_undo = 0.0  # when the latest stop or cut was undone (epoch s)
        self.down_all: Command | None = None  # the schedule's latest `tpuctl down --all`

    # --- the cluster -------------------------------------------------------------------------------

    def start_afresh(self) -> None:
        """Every agent stopped, fresh state dirs, 8 ``tpuctl init``s; the cluster must form (else RuntimeError)."""
        self.fresh_starts += 1
        self.commands.stop_all()
        self.cluster.stop_agents()
        self._ingest_logs()
        self.cluster.wipe()
        self.cluster.remove_archive()
        self._log_offsets.clear()
        self.coordinators = inv.Coordinators(self.cluster.targets())
        for attempt in range(2):
            started = [self.cluster.init(t, "start") for t in range(HOSTS)]
            self._wait(started, START_S)
            if all(c.code == 0 for c in started):
                self.needs_fresh_start = False
                self.inits.clear()
                return
            self.say(f"soak: the cluster did not form (attempt {attempt + 1}): " + "; ".join(
                f"task {c.task}: exit {c.code}: {inv.first_error(c.err())}" for c in started if c.code != 0))  # fmt: skip
            self.commands.stop_all()
            self.cluster.stop_agents()
            self.cluster.wipe()
        raise RuntimeError(f"the cluster does not form; see {self.cluster.root}")

    # --- one schedule ------------------------------------------------------------------------------

    def run_schedule(self, schedule: sched.Schedule) -> Result:
        self.commands.folder = self.root / "commands" / f"seed-{schedule.seed}"
        if self.needs_fresh_start:
            self.start_afresh()
        started = time.monotonic()
        self._reset()
        self._ingest_logs()  # what the logs said before this schedule is not its business
        self.lines.clear()
        self.marked.clear()
        self.coordinators = self.coordinators.since(time.time())
        serving = self.serving = self.coordinators.at()
        if serving != 0:  # the schedule's task 0 is the coordinator: whichever task serves now
            schedule = schedule.swapped(0, serving)
            self.notes.append(f"task {serving} serves the cluster: the schedule's tasks 0 and {serving} swapped")
        self._sample_mappings()
        faults: Counter[str] = Counter()
        skipped: Counter[str] = Counter()
        barriers: list[tuple[sched.Step, list[Command]]] = []
        t0 = time.monotonic()
        for step in schedule.steps:
            self._idle_until(t0 + step.at)
            done = self._perform(step, barriers)
            if step.kind is not None:
                (faults if done else skipped)[step.kind] += 1
        settle = self._heal()
        checks: list[inv.HostCheck] = []
        if settle is not None:
            checks = self._check_round(schedule, barriers)
        self._ingest_logs()
        self._ingest_commands()
        self.violations += inv.tracebacks(self.marked)
        found, detections = inv.detection(self.faults, self.lines, self.disturbed, self.cluster.victim_names,
                                          hosts=HOSTS, limit=LIMIT_S, coordinator=self.coordinators.at)  # fmt: skip
        self.violations += found
        self.violations += inv.survived(self.faults, self.lines, self.cluster.victim_names, self.disturbed, limit=LIMIT_S,
                                        coordinator=self.coordinators.at, heartbeat_timeout=sched.HEARTBEAT_TIMEOUT_S)  # fmt: skip
        self.violations += inv.stale_mappings(self.samples, self.lines, hosts=HOSTS)
        self.violations += inv.unformed_mappings(self.samples, self.lines)
        generation = next((int(c.status["generation"]) for c in checks if c.status and "generation" in c.status), None)  # type: ignore[call-overload]
        result = Result(schedule.seed, time.monotonic() - started, faults, skipped, list(self.violations), detections,
                        settle, generation, list(self.notes))  # fmt: skip
        if result.violations:
            self.needs_fresh_start = True
            result.logs = self._keep_logs(schedule.seed)
        elif not self.keep_logs:
            shutil.rmtree(self.commands.folder, ignore_errors=True)
        if generation is not None and generation > FRESH_AFTER_GENERATION:
            self.needs_fresh_start = True
        return result

    def _reset(self) -> None:
        self.samples.clear()
        self.faults.clear()
        self.disturbed.clear()
        self.violations.clear()
        self.notes.clear()
        self.frozen.clear()
        self.cut.clear()
        self.inits.clear()
        self.init_attempts.clear()
        self.retry_at.clear()
        self.down_all = None
        self.commands.take_finished()

    def _idle_until(self, when: float) -> None:
        """Poll (commands, their deadlines, refused inits to retry, the mapping files) until ``when``."""
        while True:
            self._tick()
            left = when - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(POLL_S, left))

    def _wait(self, commands: list[Command], timeout: float) -> bool:
        """Until every one of ``commands`` ended (True) or ``timeout`` s passed, ticking meanwhile."""
        end = time.monotonic() + max(0.0, timeout)
        while True:
            self._tick()
            if all(c.code is not None for c in commands):
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(POLL_S)

    def _tick(self) -> None:
        self.commands.poll()
        self._sample_mappings()
        now = time.monotonic()
        for task, command in list(self.inits.items()):
            if command.code is None:
                continue
            del self.inits[task]
            if command.code != 0:
                self._init_failed(task, command)
        for task, when in list(self.retry_at.items()):
            if now >= when:
                del self.retry_at[task]
                self._start_init(task)

    def _init_failed(self, task: int, command: Command) -> None:
        err = command.err()
        held = HELD.search(err)
        self.notes.append(f"tpuctl init on task {task} exited {command.code}: {inv.first_error(err)}")
        if self.init_attempts[task] >= INIT_ATTEMPTS:
            return
        wait = min(float(held.group(2)) + 0.2, 10.0) if held else 1.0
        self.retry_at[task] = time.monotonic() + wait

    def _start_init(self, task: int) -> None:
        if task in self.inits or self.cluster.agent_pid(task) is not None:
            return
        self.init_attempts[task] += 1
        self.inits[task] = self.cluster.init(task)

    def _perform(self, step: sched.Step, barriers: list[tuple[sched.Step, list[Command]]]) -> bool:
        """One step; False when it could not be done here (a partition on loopback, no agent to hit)."""
        c, now = self.cluster, time.time()
        if step.action in (sched.KILL, sched.STOP):
            pid = c.agent_pid(step.task)
            if pid is None:
                self.notes.append(f"{step.describe()}: skipped, no agent")
                return False
            os.kill(pid, signal.SIGKILL if step.action == sched.KILL else signal.SIGSTOP)
            if step.action == sched.STOP:
                self.frozen[step.task] = pid
                self._fault("stop", step.task, now, now + step.seconds, step.expect)
            else:
                self._fault("kill", step.task, now, float("inf"), "fail")
            return True
        if step.action in (sched.CONT, sched.HEAL):
            self.last_undo = now
        if step.action == sched.CONT:
            pid = self.frozen.pop(step.task, None)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            return True
        if step.action in (sched.CUT, sched.HEAL):
            if not self.net.partitions:
                return False
            if step.action == sched.CUT:
                self.net.cut(step.task)
                self.cut.add(step.task)
                self._fault("partition", step.task, now, now + step.seconds, step.expect)
            elif step.task in self.cut:
                self.net.heal(step.task)
                self.cut.discard(step.task)
            return True
        if step.action == sched.DOWN:
            c.tpuctl(step.task, "down", ["down"], DOWN_DEADLINE_S)
            self._fault("down", step.task, now, float("inf"), "fail")
            return True
        if step.action == sched.DOWN_ALL:
            self.down_all = c.tpuctl(step.task, "down-all", ["down", "--all"], DOWN_DEADLINE_S)
            self.faults.append(inv.Fault("down-all", step.task, now, now, "fail"))
            self.disturbed += [inv.Disturbed(t, now, float("inf")) for t in range(HOSTS)]
            return True
        if step.action == sched.RESTART:
            self._restart([step.task], step.fresh, now)
            return True
        if step.action == sched.RESTART_ALL:
            self._restart_all(step.fresh, now)
            return True
        if step.action in sched.BARRIERS:
            barriers.append((step, [c.barrier(t, step.seconds, sched.BARRIER) for t in step.hosts]))
            return True
        raise ValueError(f"unknown step {step}")

    def _fault(self, kind: str, task: int, at: float, until: float, expect: str) -> None:
        self.faults.append(inv.Fault(kind, task, at, until, expect))
        self.disturbed.append(inv.Disturbed(task, at, until))

    def _restart(self, tasks: list[int], fresh: bool, now: float) -> None:
        """``tpuctl init`` again on each task whose agent is gone (waiting a little for one that is leaving)."""
        end = time.monotonic() + 5.0
        while time.monotonic() < end and any(self.cluster.agent_pid(t) is not None for t in tasks):
            self._tick()
            time.sleep(POLL_S)
        for task in tasks:
            if self.cluster.agent_pid(task) is not None:
                self.notes.append(f"task {task}: its agent still runs 5 s after it was to go; not restarted")
                continue
            # the new agent cannot know of failures before its own start: disturbed until it has formed
            self.disturbed = [d if not (d.task == task and d.end == float("inf")) else inv.Disturbed(task, d.start, now + 3.0)
                              for d in self.disturbed]  # fmt: skip
            self.faults = [f if not (f.task == task and f.until == float("inf")) else inv.Fault(f.kind, task, f.at, now, f.expect)
                           for f in self.faults]  # fmt: skip
            if fresh:
                self._replace_state(task)
            self._start_init(task)

    def _replace_state(self, task: int) -> None:
        """A fresh state dir for ``task``: what its agent logged so far is read first."""
        self._ingest_log(task)
        self._log_offsets.pop(self.cluster.log(task), None)
        self.cluster.fresh_state(task)
        self._mapping_keys.pop(task, None)

    def _restart_all(self, fresh: bool, now: float) -> None:
        """After ``tpuctl down --all``: every undisturbed agent must have exited within the limit; then
        every host without an agent starts again."""
        down_at = next((f.at for f in reversed(self.faults) if f.kind == "down-all"), now)
        told = inv.told_of_down_all(down_at, self.disturbed, hosts=HOSTS, reconnect=LIMIT_S, coordinator=self.serving)
        end = time.monotonic() + max(0.0, down_at + LIMIT_S - time.time())
        command = self.down_all
        while time.monotonic() < end and any(self.cluster.agent_pid(t) is not None for t in told):
            self._tick()
            if command is not None and inv.down_all_refused(command.code, command.err()):
                # its agent was still joining: stopped alone, as the command says; nobody else was told
                self.notes.append(f"tpuctl down --all on task {command.task}: {inv.first_error(command.err())}")
                told = []
                break
            time.sleep(POLL_S)
        still = [t for t in told if self.cluster.agent_pid(t) is not None]
        if still:
            self.violations.append(inv.Violation(
                "detection", f"tpuctl down --all: the agents of tasks {still} still ran {LIMIT_S:g} s later"))  # fmt: skip
        self.disturbed = [inv.Disturbed(d.task, d.start, now + 3.0) if d.end == float("inf") else d for d in self.disturbed]
        self.faults = [inv.Fault(f.kind, f.task, f.at, now, f.expect) if f.until == float("inf") else f for f in self.faults]
        for task in range(HOSTS):
            if self.cluster.agent_pid(task) is None:
                if fresh:
                    self._replace_state(task)
                self._start_init(task)

    # --- after the steps ---------------------------------------------------------------------------

    def _heal(self) -> float | None:
        """Continue, heal, restart whatever is still hit; wait for one generation with identical mappings
        on every host. Returns how long that took (None: it did not, a ``reform`` violation)."""
        start = time.monotonic()
        for task, pid in list(self.frozen.items()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            del self.frozen[task]
            self.last_undo = time.time()
        for task in list(self.cut):
            self.net.heal(task)
            self.cut.discard(task)
            self.last_undo = time.time()
        others = [c for c in self.commands.running if c.label.split("-")[0] not in ("init", "start")]
        self._wait(others, max((c.deadline for c in others), default=0) - time.monotonic() + 1.0)
        end = start + SETTLE_S
        while time.monotonic() < end:
            self._tick()
            for task in range(HOSTS):
                idle = task not in self.inits and task not in self.retry_at and self.init_attempts[task] < INIT_ATTEMPTS
                if idle and self.cluster.agent_pid(task) is None:
                    self._start_init(task)
            if not self.inits and self._settled():
                return time.monotonic() - start
            time.sleep(0.1)
        states = "; ".join(self._describe(t) for t in range(HOSTS))
        self.violations.append(inv.Violation("reform", f"the cluster did not re-form within {SETTLE_S:g} s: {states}"))
        return None

    def _settled(self) -> bool:
        """Every host's agent up with the same mapping, and quiet: no fault undone within the heartbeat
        timeout + 1 s (a host cut off or frozen for about the timeout may still be declared failed just
        after it is back) and no mapping changed within ``QUIET_S``."""
        now = time.time()
        if now < self.last_undo + HEARTBEAT_TIMEOUT_S + 1.0:
            return False
        if any(sample.at > now - QUIET_S for sample in self.samples[-HOSTS * 2:]):
            return False
        datas = []
        for task in range(HOSTS):
            if self.cluster.agent_pid(task) is None:
                return False
            try:
                datas.append(self.cluster.mapping(task).read_bytes())
            except OSError:
                return False
        return len(set(datas)) == 1

    def _describe(self, task: int) -> str:
        pid = self.cluster.agent_pid(task)
        try:
            doc = json.loads(self.cluster.mapping(task).read_bytes())
            mapping = f"mapping of generation {doc.get('generation')}"
        except (OSError, ValueError):
            mapping = "no mapping"
        return f"task {task}: {'agent ' + str(pid) if pid else 'no agent'}, {mapping}"

    def _check_round(self, schedule: sched.Schedule, barriers: list[tuple[sched.Step, list[Command]]]) -> list[inv.HostCheck]:
        """``tpuctl status`` on every host, then the barrier round (every host, the schedule's barrier)."""
        c = self.cluster
        asked = [c.status(t) for t in range(HOSTS)]
        self._wait(asked, max(x.limit for x in asked) + 1.0)
        checks = []
        for command in asked:
            try:
                doc = json.loads(command.out()) if command.code in (0, 3) else None
            except ValueError:
                doc = None
            try:
                mapping: bytes | None = c.mapping(command.task).read_bytes()
            except OSError:
                mapping = None
            checks.append(inv.HostCheck(command.task, command.code, doc, command.err() + command.out(), mapping))
        self.violations += inv.same_generation(checks)
        for _, commands in barriers:
            self._wait(commands, max(x.limit for x in commands) + 1.0)
        for step, commands in barriers:
            results = [(x.task, x.code, x.err()) for x in commands]
            others = [(x.task, x.code, x.started, x.ended) for s, cs in barriers if s is not step for x in cs]
            calls = [(x.task, x.code, x.started, x.ended) for x in commands]
            joined, ahead = inv.joined_elsewhere(calls, others), inv.counted_ahead(calls, others)
            what = f"the schedule's barrier round at {step.at:.2f}s ({'every host' if step.action == sched.BARRIER_ALL else 'tasks ' + str(list(step.hosts))})"
            self.violations += inv.barrier_outcomes(results, callers=step.hosts, hosts=HOSTS,
                                                    must_pass=step.expect == sched.PASS, what=what, joined=joined,
                                                    ahead=ahead)  # fmt: skip
            if ahead:
                self.notes.append(f"{what}: tasks {sorted(ahead)}' earlier calls were counted in its instance")
        round_ = [c.barrier(t, CHECK_BARRIER_TIMEOUT_S, sched.BARRIER) for t in range(HOSTS)]
        self._wait(round_, max(x.limit for x in round_) + 1.0)
        self.violations += inv.barrier_outcomes([(x.task, x.code, x.err()) for x in round_], callers=range(HOSTS),
                                                hosts=HOSTS, must_pass=True, what="the check round")  # fmt: skip
        return checks

    # --- what was recorded ---------------------------------------------------------------------------

    def _sample_mappings(self) -> None:
        now = time.time()
        for task in range(HOSTS):
            path = self.cluster.mapping(task)
            try:
                st = path.stat()
                key: tuple[int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
            except OSError:
                key = None
            if task in self._mapping_keys and self._mapping_keys[task] == key:
                continue
            self._mapping_keys[task] = key
            if key is None:
                self.samples.append(inv.MappingSample(task, now, None))
                continue
            try:
                data = path.read_bytes()
                doc = json.loads(data)
            except (OSError, ValueError):
                self._mapping_keys.pop(task, None)  # read it again next time
                continue
            self.samples.append(inv.MappingSample(task, now, hashlib.sha256(data).hexdigest(), str(doc.get("incarnation")),
                                                  int(doc.get("generation", 0))))  # fmt: skip

    def _ingest_log(self, task: int) -> None:
        path = self.cluster.log(task)
        offset = self._log_offsets.get(path, 0)
        try:
            with path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read()
        except OSError:
            return
        # only whole lines: the agent may be writing the last one
        cut = data.rfind(b"\n") + 1
        self._log_offsets[path] = offset + cut
        lines, marked = inv.parse_log(task, data[:cut].decode(errors="replace"))
        self.lines += lines
        self.coordinators.add(lines)
        self.marked += [(f"task {task}'s agent.log", text) for text in marked]

    def _ingest_logs(self) -> None:
        for task in range(HOSTS):
            self._ingest_log(task)
        self._log_offsets = {p: o for p, o in self._log_offsets.items() if p.parent.exists()}

    def _ingest_commands(self) -> None:
        self.commands.poll()
        for command in self.commands.take_finished():
            where = f"`{' '.join(command.argv[2:4])}` on task {command.task} ({command.out_path.name[:-4]})"
            self.marked.append((where, command.err() + command.out()))
            if command.overran:
                self.violations.append(inv.Violation(
                    "deadline", f"{where} still ran at its deadline ({command.limit:g} s): {inv.first_error(command.err())}"))  # fmt: skip

    def _keep_logs(self, seed: int) -> str:
        """A violating schedule's evidence: its commands' output and every host's agent log."""
        folder = self.commands.folder
        folder.mkdir(parents=True, exist_ok=True)
        for task in range(HOSTS):
            with contextlib.suppress(OSError):
                shutil.copy(self.cluster.log(task), folder / f"agent-{task}.log")
        for old in sorted(self.cluster.archive.glob("host-*/agent.log")):  # state dirs replaced by fresh ones
            with contextlib.suppress(OSError):
                shutil.copy(old, folder / f"agent-{old.parent.name}.log")
        return str(folder)

    # --- the end -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Every process the soak started, by pid; every namespace it made (Ctrl-C too)."""
        for pid in list(self.frozen.values()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.frozen.clear()
        try:
            self.commands.stop_all()
            self.cluster.stop_agents()
        finally:
            self.net.close()


def interrupt_on_signals() -> None:
    """SIGINT and SIGTERM raise :class:`Interrupted` in the main thread: the soak cleans up and reports."""

    def handler(signum: int, frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
