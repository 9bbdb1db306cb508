"""This host's share of the black box: its job's Python stacks, every thread of every process, kept in full in
``STATE_DIR/blackbox/`` and digested for the coordinator (:class:`~tpuctl.watchdog.blackbox.Digest`).

Which processes: ``tpuctl run`` marks its job (``blackbox/job-PID``, the job leads its own process group);
every live process of that group counts (a ``/proc`` scan, only when a dump is taken).

How, per process, every step bounded in time (and nothing that stops or slows a healthy job):

* py-spy (on ``PATH`` or beside this Python), ``py-spy dump --pid PID --nonblocking --json``: reads the
  process's memory without pausing it, even when it is stopped (SIGSTOP) or stuck in C; needs ptrace
  rights over it (a host without them is said so, and the next way is taken);
* else the start-up hook ``tpuctl run`` puts on a Python job's path (``tpuctl/job/startup``): the signal
  it registered (named in ``blackbox/stacks-PID``) makes faulthandler append every thread's stack to that
  file, polled until it stops growing or a deadline. A stopped process cannot run a handler: it is
  reported stopped (from ``/proc/PID/stat``), with the kernel's wait channel;
* a process that is not Python (no hook, py-spy finds no interpreter) says so, with its wait channel.

Sync and blocking: the agent runs :func:`take` in a thread.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tpuctl
from tpuctl.watchdog.blackbox import (
    NO_JOB,
    NONE,
    NOT_PYTHON,
    PY_SPY,
    RUNNING,
    SIGNAL,
    STOPPED,
    ZOMBIE,
    Digest,
    Thread,
    chosen_thread,
    digest,
    format_threads,
    parse_faulthandler,
    parse_py_spy,
    signature,
)

FOLDER = "blackbox"
KEEP_DUMPS = 16
"""Full dumps kept in ``STATE_DIR/blackbox`` (the oldest removed)."""
MAX_PROCESSES = 16
"""Processes of the job whose stacks are taken (the leader first); the rest are counted."""
PY_SPY_TIMEOUT_S = 5.0
SIGNAL_WAIT_S = 2.0
SIGNAL_POLL_S = 0.02
SIGNAL_QUIET_S = 0.1
"""The hook's file has stopped growing for this long: its dump is complete."""
MAX_HOOK_READ = 4 * 1024 * 1024
PREFIXES = (os.path.dirname(os.path.abspath(tpuctl.__file__)) + os.sep,)
"""tpuctl's own package: not the job's code, for the signature."""


@dataclass
class Taken:
    pid: int
    state: str
    method: str
    threads: list[Thread]
    note: str = ""
    no_ptrace: bool = False
    comm: str = ""


def py_spy() -> str | None:
    """py-spy's path: on ``PATH``, or beside this Python (a virtualenv's ``bin``)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def job_processes(state_dir: Path) -> list[int]:
    """The live processes of the jobs ``tpuctl run`` marked: each job's leader first, then its group."""
    leaders = []
    for mark in sorted((state_dir / FOLDER).glob("job-*")):
        pid = mark.name[4:]
        if pid.isdigit() and Path(f"/proc/{pid}").exists():
            leaders.append(int(pid))
        else:
            with contextlib.suppress(OSError):
                mark.unlink()  # a job that is gone (its `tpuctl run` was killed)
    if not leaders:
        return []
    members: list[int] = []
    wanted = set(leaders)
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) not in wanted:
            stat = _stat(int(entry.name))
            if stat is not None and stat[2] in wanted:
                members.append(int(entry.name))
    return [*leaders, *sorted(members)]


def _stat(pid: int) -> tuple[str, str, int] | None:
    """``(comm, state letter, pgid)`` from ``/proc/PID/stat``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = text[text.find("(") + 1 : text.rfind(")")]
    fields = text[text.rfind(")") + 2 :].split()
    return comm, fields[0], int(fields[3])


def _wchan(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/wchan").read_text().strip() or "?"
    except OSError:
        return "?"


def _state(letter: str) -> str:
    return STOPPED if letter in "Tt" else ZOMBIE if letter in "ZX" else RUNNING


def take_one(pid: int, state_dir: Path, spy: str | None, deadline: float) -> Taken:
    stat = _stat(pid)
    if stat is None:
        return Taken(pid, "gone", NONE, [], "the process ended while its stacks were taken")
    comm, letter, _ = stat
    state = _state(letter)
    note = ""
    no_ptrace = False
    if state == ZOMBIE:
        return Taken(pid, state, NONE, [], "", comm=comm)
    if spy is not None:
        threads, why, no_ptrace = _by_py_spy(spy, pid, deadline)
        if threads is not None:
            return Taken(pid, state, PY_SPY, threads, "", comm=comm)
        note = why
    hook = state_dir / FOLDER / f"stacks-{pid}"
    if not hook.exists():
        python = "python" in os.path.basename(_exe(pid))
        what = "a Python process without tpuctl's start-up hook" if python else f"{NOT_PYTHON} ({comm})"
        return Taken(pid, state if python else NOT_PYTHON, NONE, [],
                     _join(note, f"{what}; waiting in {_wchan(pid)}"), no_ptrace, comm)  # fmt: skip
    if state == STOPPED:
        return Taken(pid, state, NONE, [], _join(note, "a stopped process runs no handler"), no_ptrace, comm)
    threads, why = _by_signal(hook, pid, deadline)
    return Taken(pid, state, SIGNAL if threads else NONE, threads, _join(note, why), no_ptrace, comm)


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _by_py_spy(spy: str, pid: int, deadline: float) -> tuple[list[Thread] | None, str, bool]:
    """The threads py-spy read, else why not and whether ptrace rights were missing."""
    timeout = max(0.1, min(PY_SPY_TIMEOUT_S, deadline - time.monotonic()))
    try:
        done = subprocess.run(
            [spy, "dump", "--pid", str(pid), "--nonblocking", "--json"],
            capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, f"py-spy took over {timeout:.1f} s", False
    except OSError as exc:
        return None, f"py-spy did not run: {exc.strerror or exc}", False
    err = done.stderr.decode(errors="replace").strip()
    if done.returncode != 0:
        denied = "ermission" in err or "Operation not permitted" in err
        first = err.splitlines()[0][:100] if err else f"exit code {done.returncode}"
        return None, "py-spy lacks ptrace rights" if denied else f"py-spy: {first}", denied
    try:
        return parse_py_spy(done.stdout, pid), "", False
    except ValueError as exc:
        return None, f"py-spy's output was not understood: {exc}", False


def _by_signal(hook: Path, pid: int, deadline: float) -> tuple[list[Thread], str]:
    """Signal the hook and read what faulthandler appended to its file (polled until quiet or deadline)."""
    try:
        with hook.open("rb") as handle:
            header = handle.readline().decode(errors="replace").split()
            start = hook.stat().st_size
    except OSError as exc:
        return [], f"the stack hook's file is unreadable: {exc.strerror or exc}"
    # "# tpuctl stacks: pid P signal S main 0x..."
    fields = dict(zip(header[3::2], header[4::2], strict=False))
    if not fields.get("signal", "").isdigit():
        return [], "the stack hook's file has no header"
    main = int(fields["main"], 16) if fields.get("main", "").startswith("0x") else None
    try:
        os.kill(pid, int(fields["signal"]))
    except OSError as exc:
        return [], f"could not signal the process: {exc.strerror or exc}"
    end = min(deadline, time.monotonic() + SIGNAL_WAIT_S)
    size, changed = start, time.monotonic()
    while time.monotonic() < end:
        time.sleep(SIGNAL_POLL_S)
        now_size = hook.stat().st_size
        if now_size != size:
            size, changed = now_size, time.monotonic()
        elif size > start and time.monotonic() - changed >= SIGNAL_QUIET_S:
            break
    if size == start:
        return [], f"the stack hook wrote nothing within {SIGNAL_WAIT_S:g} s"
    with hook.open("rb") as handle:
        handle.seek(start)
        text = handle.read(min(size - start, MAX_HOOK_READ)).decode(errors="replace")
    return parse_faulthandler(text, main), ""


def take(state_dir: Path, dump_id: int, budget: float, reason: str = "") -> Digest:
    """Take the job's stacks within ``budget`` s, keep the full dump, return the digest."""
    deadline = time.monotonic() + budget
    pids = job_processes(state_dir)
    if not pids:
        return digest("", NO_JOB, NONE, note="no job of `tpuctl run` runs on this host")
    spy = py_spy()
    taken = []
    for pid in pids[:MAX_PROCESSES]:
        if time.monotonic() >= deadline:
            break
        taken.append(take_one(pid, state_dir, spy, deadline))
    path = _keep(state_dir, dump_id, reason, taken, len(pids))
    lead = next((t for t in taken if t.threads), taken[0] if taken else None)
    if lead is None:
        return digest("", "gone", NONE, path, "the job's processes ended", processes=len(pids))
    thread = chosen_thread(lead.threads, PREFIXES)
    sig = signature(thread.frames, PREFIXES) if thread is not None else ""
    if not sig and lead.state != "gone":
        sig = f"[{lead.comm}: waiting in {_wchan(lead.pid)}]"
    more = f"{len(pids) - 1} more processes in the dump" if len(pids) > 1 else ""
    note = _join(f"pid {lead.pid}", lead.note, more)
    no_ptrace = any(t.no_ptrace for t in taken)
    return digest(sig, lead.state, lead.method, path, note, no_ptrace, len(pids))


def _keep(state_dir: Path, dump_id: int, reason: str, taken: list[Taken], total: int) -> str:
    """Write the full dump (every process, every thread); keep the newest ``KEEP_DUMPS``. Its path."""
    folder = state_dir / FOLDER
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = folder / f"dump-{stamp}-{dump_id}.txt"
    lines = [f"tpuctl black box: dump {dump_id} at {time.strftime('%Y-%m-%d %H:%M:%S %z')} ({reason or 'asked'})"]
    for t in taken:
        lines.append(f"process {t.pid} ({t.comm}): {t.state}, stacks by {t.method}{'; ' + t.note if t.note else ''}")
        lines.extend(format_threads(t.threads))
    if total > len(taken):
        lines.append(f"... and {total - len(taken)} more processes of the job, not dumped")
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        for old in sorted(folder.glob("dump-*.txt"), key=lambda p: p.stat().st_mtime)[:-KEEP_DUMPS]:
            old.unlink()
        forget_dead_hooks(folder)
    except OSError:
        return ""
    return str(path)


def forget_dead_hooks(folder: Path) -> None:
    """Remove the stack files of job processes that exited (every Python process ``tpuctl run`` started
    opens one at start-up: a job that forks Python workers leaves one per worker)."""
    for hook in folder.glob("stacks-*"):
        pid = hook.name[7:]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                hook.unlink()
