"""``barrier``, ``progress``, ``status`` and ``env`` without click: the commands job scripts run once per step.

``tpuctl barrier step`` in a training loop should cost little more than starting Python, so these three
commands are parsed here, by hand, before click or asyncio (both slow to import) could load: the standard
library, tpuctl's error types and the control socket's client are all they import, and of the standard
library only modules that cost next to nothing: no typing, pathlib, re, json, enum, socket or collections
(:mod:`tpuctl.records`, :mod:`tpuctl.lightjson`, ``_socket``; ``tests/cli/test_light_imports.py`` lists
what must not load).
The agent does the cluster work; a command here sends one request and prints the answer. It sends
the request first (:func:`tpuctl.agent.control.ask`) and loads what reads the answer (the barrier's
record, status's health, env's job environment) while the agent works on it; a format or log option's
module loads only when one is given.

Only the plain forms are handled here (the options each command documents, ``--opt value`` or
``--opt=value``), with the data commands' one convention (:mod:`tpuctl.cli.formats`: ``--format``,
``-o/--output``, ``--json``; a wrong format is refused here with the message click's commands give).
Anything else — ``--help``, a misspelt option, a missing argument — returns None and
the caller hands the same arguments to click, which prints its usual help or usage error. So there is
one set of messages and one ``--help`` per command; the click commands call the functions below too.
"""

# No `from __future__ import annotations` here: that statement imports the __future__ module, a cost
# paid before the light path's request. Annotations naming what only the type checker imports are quoted.
import os
import sys
import time

from tpuctl import lightjson as json
from tpuctl.agent.control import DEADLINE_MARGIN_S, Op, ask
from tpuctl.agent.statedir import resolve_state_dir

TYPE_CHECKING = False  # typing is not imported here (nor collections.abc): each costs milliseconds
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from tpuctl.health import Health

ACCEPT_TIMEOUT_S = 10.0
"""How long ``tpuctl barrier`` without ``--timeout`` waits for its agent to take the barrier and announce
its deadline (the spec's ``barrier_timeout``); then it waits that long plus ``DEADLINE_MARGIN_S``."""
STATUS_TIMEOUT_S = 10.0
PROGRESS_TIMEOUT_S = 2.0  # `tpuctl progress`: an agent too busy to take a line within this misses the step
ENV_TIMEOUT_S = 10.0
MAX_LISTED_BARRIER_TASKS = 10  # `tpuctl status` names at most this many missing tasks per barrier
STATUS_SCHEMA = "tpuctl.status/v1"
# The spellings below are tpuctl.cli.formats' and tpuctl.loglevel's (tests/cli/test_light_imports.py
# checks that they agree): a command without a format or log option loads neither module.
TEXT, JSON = "text", "json"  # formats.TEXT, formats.JSON
FORMAT_NAMES = ("--format", "-f", "--output", "-o")  # formats.FORMAT_NAMES
LOG_LEVEL_ENV = "TPUCTL_LOG_LEVEL"  # loglevel.LOG_LEVEL_ENV
ENV_FORMATS = (TEXT, JSON)
ENV_ALIASES = {"sh": TEXT}
"""``tpuctl env``'s text is sh export lines: ``--format sh`` is the same as ``text``."""
DEBUG = 10  # loglevel.LEVELS["debug"]
MAX_BARRIER_NAME = 1024
"""The coordination service's limit on names (``tpuctl.coordination.values.MAX_NAME_CHARS``), checked before
any call; not imported from there, which would load the coordination package on this path."""


def say(text: str) -> None:
    """Chatter for people: stderr, so stdout stays data."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


# --- the commands ------------------------------------------------------------------------------------


def run_barrier(name: str, timeout: str | None, quiet: bool, state_dir: str | None) -> int:
    """Wait at barrier ``name`` through this host's agent; progress on stderr unless ``quiet``."""
    problem = barrier_name_problem(name)
    if problem:
        from tpuctl.errors import InputError

        raise InputError(f"barrier name {problem}", hint="use a short UTF-8 name that does not start with tpuctl/")
    seconds = None
    if timeout is not None:
        from tpuctl.durations import OPTION_BOUNDS, parse_duration

        seconds = parse_duration(timeout, what="--timeout", bounds=OPTION_BOUNDS["--timeout"])
    state = resolve_state_dir(state_dir)
    # Without --timeout the agent uses the spec's barrier timeout and announces it first: the command
    # waits ACCEPT_TIMEOUT_S for that, never reading agent.json (it lists every host of the cluster).
    args: dict[str, Any] = {"name": name, "timeout": seconds}
    generation = os.environ.get("TPUCTL_GENERATION", "")  # a job's: refused once its generation is over
    if generation.isascii() and generation.isdigit() and len(generation) < 10:
        args["generation"] = int(generation)
    args["asked_at"] = time.monotonic()  # the timeout counts from here, however long the agent takes to read it
    wait = ACCEPT_TIMEOUT_S if seconds is None else seconds + DEADLINE_MARGIN_S
    answer = ask(state, Op.BARRIER, args, timeout=wait).answer(progress=None if quiet else say)
    passed = _barrier_passed(answer)
    if not quiet:
        say(f"barrier {passed[0]!r} #{passed[1]} passed ({passed[2]:,} hosts)")
    return 0


def run_progress(step: str, checkpointed: bool, state_dir: str | None) -> int:
    """Tell this host's agent the job reached ``step`` (``--checkpointed``: a checkpoint of it is complete).

    One line on the agent's progress socket, as ``tpuctl.job.progress`` sends (the step is the
    calling script's: the parent process's id names it, so a shell loop's calls count as one process).
    The agent answers whether to checkpoint now: ``checkpoint STEP`` on stdout at the step every host
    agreed on after a preemption notice, nothing otherwise (as ``tpuctl.job.should_checkpoint``). The
    answer comes at once, or, while the hosts agree on the step, within the agreement's bound (the agent
    says how long first). No agent listening is said on stderr and is not an error (a job script runs
    without tpuctl too); a step that is not a number is (exit 2)."""
    if not (step.isascii() and step.isdigit()) or len(step) > 16:
        from tpuctl.errors import InputError

        raise InputError(
            f"tpuctl progress: {step[:40]!r} is not a step",
            hint="pass the training step as a whole number from 0 to 10**15, e.g. tpuctl progress 1203",
        )
    state = resolve_state_dir(state_dir)
    state.check()  # never talk to a socket in a folder someone else could have prepared
    generation = os.environ.get("TPUCTL_GENERATION", "")
    gen = int(generation) if generation.isascii() and generation.isdigit() and len(generation) < 10 else 0
    data = b"%s %d %d %d\n" % (b"C" if checkpointed else b"K", int(step), gen, os.getppid())
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    agreed = None
    try:
        sock.settimeout(PROGRESS_TIMEOUT_S)
        sock.connect(state.progress_socket)
        sock.sendall(data)
        if not checkpointed:
            agreed = _checkpoint_answer(sock)
    except TimeoutError:
        say(f"tpuctl progress: the agent in {state.path} did not answer in time; step {step} is not a checkpoint")
    except OSError as exc:
        say(f"tpuctl progress: no agent takes progress in {state.path} ({exc.strerror or exc}); step not counted")
    finally:
        sock.close()
    if agreed is not None:
        _out(f"checkpoint {agreed}\n")
    return 0


def _checkpoint_answer(sock: "Any") -> "int | None":
    """The agent's answer to a ``K`` line: the agreed step when this is the step to checkpoint at (``C STEP``),
    else None (``G``, or the agent closed). ``W SECONDS`` first: the answer waits for the agreement."""
    buffer = b""
    for _ in range(4):  # at most a wait and an answer
        while b"\n" not in buffer:
            data = sock.recv(64)
            if not data or len(buffer) > 64:
                return None
            buffer += data
        line, buffer = buffer.split(b"\n", 1)
        if line.startswith(b"W "):
            try:
                seconds = float(line[2:])
            except ValueError:
                seconds = 0.0
            sock.settimeout(min(max(seconds, 0.0), 3600.0) + PROGRESS_TIMEOUT_S)
            continue
        if line.startswith(b"C ") and line[2:].isdigit():
            return int(line[2:])
        return None
    return None


def _barrier_passed(answer: "Any") -> "tuple[str, int, int]":
    """The agent's barrier answer as (name, instance, hosts). The answer of a barrier the command just
    passed is read here (a one-host barrier is answered sooner than :mod:`tpuctl.agent.protocol` and the
    error types it brings would load); anything else than that well-formed answer goes to
    ``BarrierPassed.from_json``, which names what is wrong."""
    if type(answer) is dict:
        name, instance, hosts = answer.get("name"), answer.get("instance"), answer.get("hosts")
        if type(name) is str and type(instance) is int and type(hosts) is int:
            return name, instance, hosts
    from tpuctl.agent.protocol import BarrierPassed

    passed = BarrierPassed.from_json(answer)
    return passed.name, passed.instance, passed.hosts


def barrier_name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as a barrier name (empty, not UTF-8, tpuctl's own, too long), or None."""
    if not name:
        return "is empty"
    if not name.isascii():
        try:
            name.encode()
        except UnicodeEncodeError:  # bytes the shell passed that are not UTF-8 (Python decoded them as surrogates)
            return f"{os.fsencode(name)!r} is not UTF-8 text"
    if len(name) > MAX_BARRIER_NAME:
        return f"{name[:40]!r}... is {len(name):,} characters long; at most {MAX_BARRIER_NAME:,} are allowed"
    if name.startswith("tpuctl/"):
        return f"{name!r} is reserved: names starting tpuctl/ are tpuctl's own"
    return None


def run_status(fmt: str, state_dir: str | None) -> int:
    """Print the cluster as the coordinator sees it and its health (:mod:`tpuctl.health`); 3 when failed."""
    request = ask(resolve_state_dir(state_dir), Op.STATUS, timeout=STATUS_TIMEOUT_S)
    from tpuctl.health import cluster_health  # loaded while the agent asks the coordinator: status's alone

    if fmt != JSON:
        import tpuctl.messages  # noqa: F401  # render_status's, loaded meanwhile too
    result = request.answer()
    health = cluster_health(result)
    document = {"schema": STATUS_SCHEMA, **dict(sorted(result.items())), "health": health.to_json()}
    _out((json.dumps(document, indent=2) if fmt == JSON else render_status(result, health)) + "\n")
    if health.ok:
        return 0
    from tpuctl.errors import EXIT_CLUSTER

    # The text on stdout names every problem under `health`: stderr says the verdict, not the cause again.
    say(
        f"tpuctl: error: {health.headline(result.get('cluster'))}"
        if fmt == JSON
        else f"tpuctl: error: {health.verdict_line(result.get('cluster'))}"
    )
    return EXIT_CLUSTER


def run_env(fmt: str, state_dir: str | None) -> int:
    """Print this host's job environment (``text``: sh export lines; ``json``), computed by its agent."""
    request = ask(resolve_state_dir(state_dir), Op.ENV, timeout=ENV_TIMEOUT_S)
    from tpuctl.job.env import JobEnv  # loaded while the agent answers: env's alone

    env = JobEnv.from_message(request.answer())
    _out(env.to_json() if fmt == JSON else env.to_sh())
    return 0


def render_status(result: "dict[str, Any]", health: "Health | None" = None) -> str:
    """The status document as text: a header, the health, a row per task, open barriers, the cluster's error."""
    from tpuctl.health import cluster_health, heartbeat_text
    from tpuctl.messages import CELL_CHARS, table  # status's text alone

    health = health or cluster_health(result)
    here = f"task {result.get('task')}"
    if result.get("role") == "standby":  # a spare, or a host of a slice the generation left out
        here += f", standing by in generation {result.get('generation')}: it takes a place when the cluster needs it"
    lines = [
        f"cluster      {result.get('cluster')}  (this host: {here})",
        f"coordinator  {result.get('coordinator')}  "
        + (
            f"(service incarnation {result['service_incarnation']})"
            if result.get("service_incarnation")
            else f"(not answering: {result['coordinator_unreachable']})"
            if result.get("coordinator_unreachable")
            else "(service incarnation unknown)"
        ),
    ]
    if result.get("mapping"):
        lines.append(f"mapping      {result['mapping']}")
    if result.get("generation", 1) != 1 or result.get("forming") or result.get("rejoining"):
        lines.append(
            f"generation   {result.get('generation')}"
            + ("  (forming: waiting for the hosts marked waiting)" if result.get("forming") else "")
        )
    for ended in result.get("ended", [])[-3:]:
        lines.append(f"  ended      {ended}")
    plan = result.get("plan")
    if isinstance(plan, dict) and plan.get("description"):
        lines.append(f"plan         {plan.get('slices')} slices: {plan['description']}")
    elif plan:
        lines.append(f"plan         {plan}")
    lines.append(f"health       {health.verdict}")
    lines += [f"             {problem}" for problem in health.problems[:MAX_LISTED_BARRIER_TASKS]]
    if len(health.problems) > MAX_LISTED_BARRIER_TASKS:
        lines.append(
            f"             ... and {len(health.problems) - MAX_LISTED_BARRIER_TASKS:,} more (--format json lists all)"
        )
    if type(result.get("goodput")) is dict:
        lines.append(goodput_line(result["goodput"]))
    lines.append("")
    tasks = result.get("tasks", [])
    roles = any("role" in task for task in tasks)  # spares or policy elastic: a host's role and rank
    rows: list[tuple[str, ...]] = [
        ("TASK", "STATE", "ADDRESS", "FINGERPRINT", "HEARTBEAT") + (("ROLE", "RANK") if roles else ())
    ]
    for task in tasks:
        row: tuple[str, ...] = (
            str(task.get("task")),
            str(task.get("state")),
            str(task.get("address") or "-"),
            str(task.get("fingerprint") or "-"),
            heartbeat_text(task),
        )
        if roles:
            rank = task.get("rank")
            row += (str(task.get("role") or "-"), "-" if rank is None else str(rank))
        rows.append(row)
    lines += table(rows, widths=CELL_CHARS)
    lines += _spare_lines(result.get("spares"))
    lines += _rendezvous_lines(result)
    lines += _watchdog_lines(result.get("watchdog"))
    lines += _preemption_lines(result.get("preemption"))
    error = result.get("error")
    if error and not any(p.cause and p.cause in str(error) for p in health.problems):
        # Only an error no health line says (as a failed task's cause, or itself when no task failed):
        # each cause is printed once; --format json has its whole text in `error`.
        lines += ["", f"cluster error: {error}"]
    return "\n".join(lines)


def _spare_lines(spares: "Any") -> "list[str]":
    """The standby roster slices (spares, left-out slices) and what each can replace; [] without any."""
    if not isinstance(spares, list) or not spares:
        return []
    lines = ["", "spares"]
    for spare in spares[:MAX_LISTED_BARRIER_TASKS]:
        if not isinstance(spare, dict):
            continue
        first, last = (list(spare.get("tasks") or []) + [None, None])[:2]
        tasks = f"task {first}" if first == last else f"tasks {first}-{last}"
        kind = "spare slice" if spare.get("spare") else "roster slice"
        hosts = 1 + last - first if isinstance(first, int) and isinstance(last, int) else "?"
        state = f"{spare.get('registered', '?')} of {hosts} hosts standing by"
        replaces = spare.get("can_replace")
        lines.append(
            f"  {kind} {spare.get('roster_slice')} ({tasks}): {state}"
            + (f"; can replace {replaces}" if replaces else "; not ready (every host of it must stand by)")
        )
    if len(spares) > MAX_LISTED_BARRIER_TASKS:
        lines.append(f"  ... and {len(spares) - MAX_LISTED_BARRIER_TASKS:,} more (--format json lists all)")
    return lines


def _rendezvous_lines(result: "dict[str, Any]") -> "list[str]":
    """The open barriers and gathers (who is missing), then the recently failed ones (when, why, who was
    missing: a sample and a count, as the service keeps them)."""
    from tpuctl.messages import sample, shown

    lines = []
    for barrier in result.get("barriers", []):
        lines.append(
            f"{barrier.get('kind', 'barrier')} {shown(str(barrier.get('name')))} #{barrier.get('instance')}: "
            f"waiting for task(s) {sample(barrier.get('missing', []), limit=MAX_LISTED_BARRIER_TASKS)} "
            f"({len(barrier.get('arrived', [])):,} arrived, times out in {barrier.get('seconds_left', 0):.0f} s)"
        )
    failed = result.get("failed_barriers", [])
    if failed:
        lines.append("recently failed (every host's next call to the name joins a new round):")
    for barrier in failed:
        missing = sample(barrier.get("missing", []), limit=MAX_LISTED_BARRIER_TASKS, total=barrier.get("missing_count"))
        lines.append(
            f"  {barrier.get('kind', 'barrier')} {shown(str(barrier.get('name')))} #{barrier.get('instance')}, "
            f"{barrier.get('seconds_ago', 0):.0f} s ago: {barrier.get('reason')}; missing task(s) {missing} "
            f"({barrier.get('arrived', 0):,} arrived)"
        )
    return ["", *lines] if lines else []


BUCKET_LABELS = {
    "bring_up": "bring-up", "waiting": "waiting for hosts", "startup": "start-up and compilation",
    "productive": "productive", "hung": "hung", "restart": "detection and restart", "lost": "lost work",
}  # fmt: skip
"""The goodput ledger's bucket names (``tpuctl.goodput.ledger.LABELS``, not imported on this path; a test
checks they agree)."""


def goodput_line(goodput: "dict[str, Any]") -> str:
    """Status's one line of the goodput ledger: ``goodput      62.3 % of 25 min (now: productive, generation 2)``."""
    wall = goodput.get("wall_seconds") or 0
    span = (
        f"{wall:.0f} s"
        if wall < 90
        else f"{wall / 60:.0f} min"
        if wall < 5400
        else f"{wall // 3600:.0f} h {wall % 3600 // 60:.0f} min"
    )
    bucket = goodput.get("bucket")
    now = f"now: {BUCKET_LABELS.get(bucket, bucket)}" if bucket else "the cluster is down"
    return f"goodput      {100 * (goodput.get('fraction') or 0):.1f} % of {span} ({now}, generation {goodput.get('generation')})"


def _watchdog_lines(watchdog: "Any") -> "list[str]":
    """The job's progress as the watchdog sees it: the step range, the hosts furthest behind, verdicts."""
    if type(watchdog) is not dict:
        return []
    steps = watchdog.get("steps") or {}
    lines = [
        "",
        f"steps: {steps.get('low', 0):,} / {steps.get('median', 0):,} / {steps.get('high', 0):,} (min / median / max "
        f"of {watchdog.get('armed', 0):,} reporting hosts; {watchdog.get('stalled', 0):,} stalled)",
    ]
    slowest = [h for h in watchdog.get("slowest", []) if type(h) is dict and h.get("step", 0) < steps.get("high", 0)]
    if slowest:
        behind = ", ".join(
            f"task {h.get('task')} at {h.get('step', 0):,} ({h.get('step_age', 0):.0f} s ago)" for h in slowest
        )
        lines.append(f"furthest behind: {behind}")
    return lines


def _preemption_lines(preemption: "Any") -> "list[str]":
    """The latest preemption notices (a few) and the agreement on a checkpoint step."""
    if type(preemption) is not dict:
        return []
    lines = [""]
    notices = [n for n in preemption.get("notices", []) if type(n) is dict]
    for notice in notices[:3]:
        why = f" ({notice.get('reason')})" if notice.get("reason") else ""
        lines.append(
            f"preemption: task {notice.get('task')} ({notice.get('address')}) goes: {notice.get('source')}{why}, "
            f"deadline in {notice.get('deadline_in', 0):.0f} s"
        )
    more = preemption.get("count", 0) - min(3, len(notices))
    if more > 0:
        lines.append(f"            ... and {more:,} more notices (--format json lists the first 10)")
    agreement = preemption.get("agreement") or {}
    state = agreement.get("state")
    if state == "agreed":
        lines.append(
            f"checkpoint: every host saves step {agreement.get('step'):,} ({preemption.get('saved', 0):,} saved so far)"
        )
    elif state == "pending":
        lines.append(f"checkpoint: agreeing on a step ({agreement.get('reported', 0):,} of "
                     f"{agreement.get('hosts', 0):,} hosts said where their jobs stand)")  # fmt: skip
    else:
        lines.append(f"checkpoint: no agreed step: {agreement.get('reason')}")
    return lines


# --- the hand parser ---------------------------------------------------------------------------------

# command -> {option: (destination, takes a value)}
_FORMAT = {**{name: ("fmt", True) for name in FORMAT_NAMES}, "--json": ("as_json", False)}
_OPTIONS: dict[str, dict[str, tuple[str, bool]]] = {
    "barrier": {"--timeout": ("timeout", True), "--quiet": ("quiet", False), "-q": ("quiet", False)},
    "status": _FORMAT,
    "env": _FORMAT,
    "progress": {"--checkpointed": ("checkpointed", False)},
}
_STATE_DIR = {"--state-dir": ("state_dir", True)}


def parse(args: "Sequence[str]") -> "tuple[str, dict[str, Any]] | None":
    """``["barrier", "step", "-q"]`` -> ("barrier", {...}); None for anything but the plain forms.

    The log options (``--log-level LEVEL``, ``-v``, ``--verbose``; before the command too) come back as
    ``log_level`` (None when none was given) in the values.
    """
    args = list(args)
    levels: dict[str, Any] = {"verbose": 0}
    while args and (args[0] == "--debug" or _log_option(args, 0, levels)):
        if args and args[0] == "--debug":
            args.pop(0)
    if not args or args[0] not in _OPTIONS:
        return None
    command, rest = args[0], args[1:]
    options = {**_OPTIONS[command], **_STATE_DIR}
    values: dict[str, Any] = {"state_dir": None}
    positional: list[str] = []
    i = 0
    while i < len(rest):
        token = rest[i]
        if token == "--":
            positional += rest[i + 1 :]
            break
        if _log_option(rest, i, levels):
            continue
        name, eq, value = token.partition("=")
        if (name in options and name.startswith("--")) or token in options:
            dest, takes_value = options[name if eq else token]
            if takes_value:
                if not eq:
                    if i + 1 >= len(rest):
                        return None
                    i += 1
                    value = rest[i]
                values[dest] = value
            elif eq:
                return None
            else:
                values[dest] = True
        elif token.startswith("-") and token != "-":
            return None  # --help, or an option click should explain
        else:
            positional.append(token)
        i += 1
    if levels.get("missing"):
        return None  # --log-level without its value: click says so
    level = None
    if levels.get("log_level") is not None or levels["verbose"] or os.environ.get(LOG_LEVEL_ENV):
        from tpuctl.loglevel import chosen_level

        level = chosen_level(levels.get("log_level"), levels["verbose"], os.environ.get(LOG_LEVEL_ENV))
    if command == "barrier":
        if len(positional) != 1:
            return None
        return command, {"name": positional[0], "timeout": values.get("timeout"),
                         "quiet": bool(values.get("quiet")), "state_dir": values["state_dir"], "log_level": level}  # fmt: skip
    if command == "progress":
        if len(positional) != 1:
            return None
        return command, {"step": positional[0], "checkpointed": bool(values.get("checkpointed")),
                         "state_dir": values["state_dir"], "log_level": level}  # fmt: skip
    if positional:
        return None
    as_json, given = bool(values.get("as_json")), values.get("fmt")
    if given in (None, TEXT, JSON) and not (as_json and given == TEXT):
        fmt = JSON if as_json else given or TEXT  # choose_format's answer for these, without loading it
    else:  # another spelling, an alias, a wrong value, or --json beside --format text: its messages
        from tpuctl.cli.formats import choose_format

        if command == "status":
            fmt = choose_format(command, values.get("fmt"), as_json)
        else:
            fmt = choose_format(command, values.get("fmt"), as_json, ENV_FORMATS, aliases=ENV_ALIASES)
    return command, {"fmt": fmt, "state_dir": values["state_dir"], "log_level": level}


def _log_option(args: list[str], i: int, levels: "dict[str, Any]") -> bool:
    """Take the log option at ``args[i]`` (removing it and its value) into ``levels``; False if none."""
    if i >= len(args):
        return False
    token = args[i]
    if token == "--verbose" or (len(token) > 1 and token.strip("-v") == "" and token.startswith("-v")):
        levels["verbose"] += 1 if token == "--verbose" else len(token) - 1
        del args[i]
        return True
    if token == "--log-level" or token.startswith("--log-level="):
        if token == "--log-level":
            if i + 1 >= len(args):
                levels["missing"] = True
                del args[i]
                return True
            levels["log_level"] = args[i + 1]
            del args[i : i + 2]
        else:
            levels["log_level"] = token.partition("=")[2]
            del args[i]
        return True
    return False


def run_light(args: "Sequence[str]") -> int | None:
    """Run ``args`` here when they are a plain barrier/progress/status/env call; None means "ask click"."""
    parsed = parse(args)
    if parsed is None:
        return None
    command, values = parsed
    level = values.pop("log_level")
    started = time.monotonic()
    if command == "barrier":
        code = run_barrier(**values)
    elif command == "progress":
        code = run_progress(**values)
    elif command == "status":
        code = run_status(**values)
    else:
        code = run_env(**values)
    if level is not None and level <= DEBUG:
        state = resolve_state_dir(values["state_dir"])
        say(f"tpuctl: debug: {command}: {(time.monotonic() - started) * 1e3:.1f} ms, agent socket {state.socket}")
    return code
