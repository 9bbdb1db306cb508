"""The black box: every host's job stacks, digested on the host, grouped by the coordinator.

* parsing what the stacks were taken with (``py-spy dump --json``, :mod:`faulthandler`'s text) into
  :class:`Thread` values;
* a host's :class:`Digest`: the *signature* of the thread that matters (the one in the job's own code, the
  main thread first), its state, how the stacks were taken and where the host keeps its full dump: fixed
  size, whatever the job;
* :func:`assemble`: the cluster's report from one digest (or None: no answer) per host, O(hosts), grouped by
  state and signature, the odd ones out first, at most :data:`MAX_REPORT_BYTES` of JSON at any cluster size;
  :func:`render_text` prints it.

Pure: no clock, no I/O, nothing of the host read here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from tpuctl.messages import count

SCHEMA = "tpuctl.dump/v1"
MAX_SIGNATURE_BYTES = 512
MAX_PATH_BYTES = 240
MAX_NOTE_BYTES = 160
MAX_STATE_BYTES = 40
MAX_METHOD_BYTES = 16
SIGNATURE_FRAMES = 4
MAX_REPORT_BYTES = 64 * 1024
"""The report's bound as JSON (UTF-8), at any cluster size; its text is of the same size."""
MAX_GROUPS = 24
"""Groups listed in full (the smallest ``MAX_GROUPS - 1`` and the largest); the rest are counted."""
HOSTS_PER_GROUP = 3
"""Hosts a group names, with where their full dumps lie; the rest are counted."""
SAMPLE = 10
"""Hosts named among those that did not answer (or lacked ptrace rights) before "... and N more"."""

STOPPED = "stopped (SIGSTOP or a debugger)"
RUNNING = "running"
ZOMBIE = "exited, not reaped (zombie)"
NO_JOB = "no job"
NOT_PYTHON = "not a Python process"
PY_SPY = "py-spy"
SIGNAL = "signal handler"
NONE = "none"


@dataclass(frozen=True)
class Frame:
    name: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.name} ({self.path.rsplit('/', 1)[-1]}:{self.line})"


@dataclass(frozen=True)
class Thread:
    ident: str
    name: str
    main: bool
    frames: tuple[Frame, ...]
    """Innermost (most recent call) first."""


@dataclass(frozen=True)
class Digest:
    """One host's answer to a dump order: fixed size (every field is clipped by :func:`digest`)."""

    signature: str
    state: str
    method: str
    path: str = ""
    note: str = ""
    no_ptrace: bool = False
    processes: int = 0


def clip_bytes(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes (an ellipsis marks a cut)."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: max(0, limit - 3)].decode(errors="ignore") + "..."


def digest(
    signature: str, state: str, method: str, path: str = "", note: str = "", no_ptrace: bool = False, processes: int = 0
) -> Digest:
    """A :class:`Digest` with every field within its bound (what a host sent is clipped again on arrival)."""
    return Digest(
        clip_bytes(signature, MAX_SIGNATURE_BYTES), clip_bytes(state, MAX_STATE_BYTES),
        clip_bytes(method, MAX_METHOD_BYTES), clip_bytes(path, MAX_PATH_BYTES), clip_bytes(note, MAX_NOTE_BYTES),
        bool(no_ptrace), max(0, min(int(processes), 1 << 20)),
    )  # fmt: skip


# --- parsing ---------------------------------------------------------------------------------------------


def parse_py_spy(data: str | bytes, pid: int | None = None) -> list[Thread]:
    """The threads of ``py-spy dump --json`` (its 0.3/0.4 shape: a list of threads, frames innermost first).
    Raises ValueError on anything else."""
    threads = json.loads(data)
    if not isinstance(threads, list):
        raise ValueError("py-spy's JSON is not a list of threads")
    out = []
    for thread in threads:
        if not isinstance(thread, dict):
            raise ValueError("py-spy's JSON has a thread that is not an object")
        frames = tuple(
            Frame(str(f.get("name", "?")), str(f.get("filename", "?")), _int(f.get("line")))
            for f in thread.get("frames") or ()
            if isinstance(f, dict)
        )
        name = str(thread.get("thread_name") or "")
        main = name == "MainThread" or (pid is not None and thread.get("os_thread_id") == pid)
        out.append(Thread(f"{_int(thread.get('thread_id')):#x}", name, main, frames))
    return out


_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(.*)\])? \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*)$')


def parse_faulthandler(text: str, main_ident: int | None = None) -> list[Thread]:
    """The threads of one :func:`faulthandler.dump_traceback` (``all_threads=True``): ``Thread 0x...``
    headers, ``File "...", line N in NAME`` frames, innermost first. ``main_ident``: the main thread's
    ``threading.get_ident()`` (the start-up hook writes it), else the last thread listed is taken as main
    (faulthandler lists the newest thread first)."""
    threads: list[tuple[str, str, list[Frame]]] = []
    for line in text.splitlines():
        header = _THREAD.match(line)
        if header is not None:
            threads.append((header.group(2), header.group(3) or "", []))
            continue
        frame = _FRAME.match(line)
        if frame is not None and threads:
            number = frame.group(2)
            threads[-1][2].append(Frame(frame.group(3), frame.group(1), int(number) if number.isdigit() else 0))
    out = []
    for i, (ident, name, frames) in enumerate(threads):
        main = int(ident, 16) == main_ident if main_ident is not None else i == len(threads) - 1
        out.append(Thread(ident, name, main, tuple(frames)))
    return out


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# --- the signature ---------------------------------------------------------------------------------------

_LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python\d[\d.]*/|^<")


def is_library(path: str, prefixes: Sequence[str] = ()) -> bool:
    """A file of Python's own library, an installed package, a frozen module, or under ``prefixes``
    (tpuctl's own package): not the job's own code."""
    return bool(_LIBRARY.search(path)) or any(path.startswith(p) for p in prefixes)


def chosen_thread(threads: Sequence[Thread], prefixes: Sequence[str] = ()) -> Thread | None:
    """The thread that tells where the job is: the main thread when it is in the job's own code, else
    the first thread that is, else the main thread, else the first."""
    def own(thread: Thread) -> bool:
        return any(not is_library(f.path, prefixes) for f in thread.frames)

    ordered = sorted(threads, key=lambda t: not t.main)  # stable: the main thread first
    for thread in ordered:
        if own(thread):
            return thread
    return ordered[0] if ordered else None


def signature(frames: Sequence[Frame], prefixes: Sequence[str] = ()) -> str:
    """``innermost (file:line) <- ... <- job_code (train.py:88)``: at most :data:`SIGNATURE_FRAMES` frames,
    file base names, at most :data:`MAX_SIGNATURE_BYTES` bytes: the innermost frame, the library frame the
    job's own code called, that code's innermost frame and its caller."""
    if not frames:
        return ""
    own = next((i for i, f in enumerate(frames) if not is_library(f.path, prefixes)), None)
    if own is None:
        picks = list(range(min(SIGNATURE_FRAMES, len(frames))))
    else:
        picks = sorted({i for i in (0, own - 1, own, own + 1) if 0 <= i < len(frames)})[:SIGNATURE_FRAMES]
    return clip_bytes(" <- ".join(str(frames[i]) for i in picks), MAX_SIGNATURE_BYTES)


def format_threads(threads: Iterable[Thread]) -> list[str]:
    """Every thread's every frame, as the full dump keeps them."""
    lines = []
    for thread in threads:
        main = " (main)" if thread.main else ""
        lines.append(f"  thread {thread.ident} {thread.name!r}{main}, most recent call first:")
        lines.extend(f"    {f.name} ({f.path}:{f.line})" for f in thread.frames)
    return lines


# --- the report --------------------------------------------------------------------------------------------


def assemble(
    digests: Sequence[Digest | None],
    describe: Callable[[int], str],
    *,
    dump_id: int = 0,
    reason: str = "",
    waited: float = 0.0,
    limit: int = MAX_REPORT_BYTES,
) -> dict[str, object]:
    """The black-box report (schema :data:`SCHEMA`) from ``digests[task]`` (None: no answer): hosts grouped
    by state and signature, the smallest groups (the odd ones out) first, each naming up to
    :data:`HOSTS_PER_GROUP` hosts with their full dumps' paths and counting the rest; the hosts that did
    not answer and those lacking ptrace rights, a sample and a count. O(hosts); at most ``limit`` bytes of
    JSON whatever their number."""
    groups: dict[tuple[str, str], list[int]] = {}
    first: dict[tuple[str, str], list[int]] = {}
    silent: list[int] = []
    no_ptrace: list[int] = []
    silent_count = no_ptrace_count = 0
    for task, found in enumerate(digests):
        if found is None:
            silent_count += 1
            if len(silent) < SAMPLE:
                silent.append(task)
            continue
        if found.no_ptrace:
            no_ptrace_count += 1
            if len(no_ptrace) < SAMPLE:
                no_ptrace.append(task)
        key = (found.state, found.signature)
        counted = groups.get(key)
        if counted is None:
            groups[key] = [1]
            first[key] = [task]
        else:
            counted[0] += 1
            if len(first[key]) < HOSTS_PER_GROUP:
                first[key].append(task)
    ordered = sorted(groups, key=lambda k: (groups[k][0], first[k][0]))
    shown = ordered if len(ordered) <= MAX_GROUPS else [*ordered[: MAX_GROUPS - 1], ordered[-1]]

    def group(key: tuple[str, str]) -> dict[str, object]:
        state, sig = key
        hosts = []
        for task in first[key]:
            found = digests[task]
            assert found is not None
            hosts.append({"task": task, "host": describe(task), "method": found.method, "path": found.path,
                          "note": found.note, "processes": found.processes})  # fmt: skip
        return {"hosts": groups[key][0], "state": state, "signature": sig, "sample": hosts}

    listed = [group(k) for k in shown]
    kept = set(shown)
    hidden = [k for k in ordered if k not in kept] if len(shown) < len(ordered) else []
    report: dict[str, object] = {
        "schema": SCHEMA,
        "dump": dump_id,
        "reason": reason,
        "hosts": len(digests),
        "answered": len(digests) - silent_count,
        "waited_seconds": round(waited, 3),
        "groups_total": len(ordered),
        "groups": listed,
        "groups_not_shown": {"groups": len(hidden), "hosts": sum(groups[k][0] for k in hidden)},
        "no_answer": {"count": silent_count, "sample": [describe(t) for t in silent]},
        "no_ptrace": {"count": no_ptrace_count, "sample": [describe(t) for t in no_ptrace]},
    }
    _bound(report, limit)
    return report


def report_bytes(report: dict[str, object]) -> int:
    return len(json.dumps(report, ensure_ascii=False).encode())


def _bound(report: dict[str, object], limit: int) -> None:
    """Make sure: drop samples, then groups (largest-but-one first), until the report fits ``limit``.
    With every field bounded it fits already; this holds whatever a field's escaping costs."""
    groups = report["groups"]
    assert isinstance(groups, list)
    while report_bytes(report) > limit and groups:
        trimmed = next((g for g in reversed(groups) if len(g["sample"]) > 1), None)
        if trimmed is not None:
            trimmed["sample"].pop()
            continue
        dropped = groups.pop(-2 if len(groups) > 1 else -1)
        hidden = report["groups_not_shown"]
        assert isinstance(hidden, dict)
        hidden["groups"] += 1
        hidden["hosts"] += dropped["hosts"]


def render_text(report: dict[str, object]) -> str:
    """The report as text: one line per group (``1 host, task 17 (10.0.0.9): stopped ...: frame <- ...``),
    the odd ones out first, each followed by where its hosts' full dumps lie."""
    lines = []
    hosts, answered = _n(report.get("hosts")), _n(report.get("answered"))
    why = f" ({report['reason']})" if report.get("reason") else ""
    lines.append(f"black box, dump {report.get('dump')}{why}: {count(answered)} of {count(hosts)} hosts answered")
    for group in _list(report.get("groups")):
        n = _n(group.get("hosts"))
        sample = _list(group.get("sample"))
        who = f"{count(n)} host{'s' if n != 1 else ''}"
        if n == 1 and sample:
            who += f", {sample[0].get('host')}"
        state = str(group.get("state") or "")
        sig = str(group.get("signature") or "") or "(no Python stack)"
        prefix = "" if state == RUNNING else f"{state}: "
        lines.append(f"{who}: {prefix}{sig}")
        for host in sample:
            note = f"; {host['note']}" if host.get("note") else ""
            path = host.get("path") or "(no dump kept)"
            lines.append(f"    {host.get('host')}: {path} [{host.get('method')}{note}]")
        if n > len(sample):
            lines.append(f"    ... and {count(n - len(sample))} more")
    hidden = report.get("groups_not_shown")
    if isinstance(hidden, dict) and hidden.get("groups"):
        lines.append(f"... and {count(_n(hidden['groups']))} more groups of {count(_n(hidden.get('hosts')))} hosts "
                     "(`tpuctl dump --json` lists the same; each host's full dump is in its state dir)")  # fmt: skip
    for key, what in (("no_answer", "no answer"), ("no_ptrace", "no ptrace rights for py-spy (the signal handler was used)")):
        part = report.get(key)
        if isinstance(part, dict) and part.get("count"):
            total = _n(part["count"])
            named = [str(s) for s in part["sample"]] if isinstance(part.get("sample"), list) else []
            more = f", ... and {count(total - len(named))} more" if total > len(named) else ""
            lines.append(f"{what}: {count(total)} host{'s' if total != 1 else ''}: {', '.join(named)}{more}")
    return "\n".join(lines)


def _n(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _list(value: object) -> list[dict[str, object]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
