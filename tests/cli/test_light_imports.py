"""The commands used in job scripts stay cheap: no grpc, numpy, tensorflow or jax on their path, and on
the light path (barrier, status, env answered by an agent) none of the standard library's costly modules.

Counted, not timed: a probe process runs the command and lists what it imported. The light-path probe
runs ``python -S`` (no site, so no editable install's import hook, which imports pathlib, re and enum
itself) with tpuctl on PYTHONPATH, against a fake agent on a real unix socket, and compares every module
it imported with the few the light path may load.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tpuctl

HEAVY = ("grpc", "numpy", "tensorflow", "jax", "yaml", "prometheus_client")
# barrier, status and env run on the standard library alone (tpuctl.cli.light): not even click
LIGHT_PATH_HEAVY = (*HEAVY, "click", "asyncio", "google")

PROBE = """
import sys
from tpuctl.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
heavy = sorted(m for m in {heavy!r} if m in sys.modules)
print("HEAVY=" + ",".join(heavy))
"""


@pytest.mark.parametrize(
    "args",
    [
        ["barrier", "step"],
        ["barrier", "step", "--timeout", "5s"],
        ["status"],
        ["status", "--json"],
        ["env"],
        ["env", "--format=json"],
        ["--debug", "barrier", "-q", "--timeout=5s", "step"],
        ["down"],
        ["--help"],
    ],
)
def test_agent_commands_import_nothing_heavy(args: list[str], tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            PROBE.format(heavy=HEAVY if args[0] in ("down", "--help") else LIGHT_PATH_HEAVY),
            *args,
            *(["--state-dir", str(tmp_path)] if args != ["--help"] else []),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    heavy_line = [ln for ln in proc.stdout.splitlines() if ln.startswith("HEAVY=")]
    assert heavy_line == ["HEAVY="], proc.stdout + proc.stderr
    if args != ["--help"]:
        assert f"no tpuctl agent is running for state dir {tmp_path}" in proc.stderr


# What barrier, status and env may import beyond what `python -S -c 'import os'` has loaded, besides tpuctl's own
# modules: each costs a fraction of a millisecond (docs/development/performance.md, "The CLI's light path").
LIGHT_PATH_STDLIB = frozenset({"__future__", "_json", "_operator", "_socket"})
# Named for the message: what the light path stopped importing, each a few milliseconds or more.
LIGHT_PATH_FORBIDDEN = (
    *LIGHT_PATH_HEAVY,
    "typing", "pathlib", "re", "json", "enum", "socket", "selectors", "collections", "functools",
    "dataclasses", "inspect", "urllib", "ipaddress", "shlex", "fnmatch", "contextlib", "importlib",
    "decimal", "logging", "threading", "fcntl",
)  # fmt: skip

COUNTING_PROBE = """
import os, sys  # what site imports in every python (os brings stat, posixpath, _collections_abc)
before = set(sys.modules)
from tpuctl.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
else:
    code = None
new = sorted(m for m in set(sys.modules) - before if m != "tpuctl" and not m.startswith("tpuctl."))
print("CODE=" + str(code))
print("NEW=" + ",".join(new))
"""

AGENT_INFO = {
    "schema_version": 1, "cluster": "c", "task": 0, "num_tasks": 1, "coordinator": "127.0.0.1:1",
    "mapping": "/nonexistent/mapping.json", "job_ports": {"dtensor": [2], "jax": 3, "torch": 4}, "barrier_timeout": 30.0,
}  # fmt: skip
ANSWERS = {
    "status": {"cluster": "c", "task": 0, "coordinator": "127.0.0.1:1", "heartbeat_timeout": 30.0,
               "tasks": [{"task": 0, "address": "127.0.0.1", "state": "connected", "heartbeat_age": 0.5}]},
    "env": {"set": [["TPUCTL_TASK_ID", "0"], ["QUOTED", "a b'c"]], "unset": ["TPU_PROCESS_PORT"]},
    "barrier": {"name": "step", "instance": 1, "hosts": 1},
}  # fmt: skip


class FakeAgent:
    """A unix socket in an owner-only state dir answering each request with ``ANSWERS[op]`` (a barrier
    after one progress line), and an ``agent.json``: what a command on the light path reads."""

    def __init__(self, state_dir: Path) -> None:
        state_dir.mkdir(mode=0o700)
        (state_dir / "agent.json").write_text(json.dumps(AGENT_INFO))
        self.ops: list[str] = []
        self.requests: list[dict[str, object]] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(state_dir / "agent.sock"))
        self.server.listen(8)
        self.server.settimeout(30)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        for _ in range(100):  # bounded: one connection per command the test runs
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                request = json.loads(conn.makefile("rb").readline())
                self.ops.append(request["op"])
                self.requests.append(request)
                if request["op"] == "barrier":
                    conn.sendall(json.dumps({"deadline": 30.0}).encode() + b"\n")  # as the agent announces it
                    conn.sendall(json.dumps({"progress": "waiting at barrier 'step' for 5 s"}).encode() + b"\n")
                answer = {"ok": True, "result": ANSWERS[request["op"]]}
                conn.sendall(json.dumps(answer).encode() + b"\n")

    def close(self) -> None:
        # Closing alone does not wake a thread blocked in accept() (Linux): shutdown does, at once.
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "the fake agent's thread did not end"


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[FakeAgent]:
    fake = FakeAgent(tmp_path / "state")
    yield fake
    fake.close()



def run_probe(probe: str, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``probe`` (which runs the light command ``args`` and prints what it counted) in a ``python -S``
    process with this checkout's tpuctl, no log level from the environment, a state dir under ``tmp_path``."""
    env = {**os.environ, "PYTHONPATH": str(Path(tpuctl.__file__).resolve().parents[1])}
    env.pop("TPUCTL_LOG_LEVEL", None)
    return subprocess.run(
        [sys.executable, "-S", "-c", probe, *args, "--state-dir", str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )

@pytest.mark.parametrize(
    "args",
    [
        ["barrier", "step"],
        ["barrier", "step", "-q", "--timeout", "1m30s"],
        ["status"],
        ["status", "--json"],
        ["-v", "status", "-o", "text"],
        ["env"],
        ["env", "--format=json"],
        ["--log-level", "debug", "env", "--format", "sh"],
    ],
)
def test_the_light_path_imports_only_cheap_modules(args: list[str], agent: FakeAgent, tmp_path: Path) -> None:
    """Counted in a ``python -S`` process: typing, pathlib, re, json, enum, socket, collections and the
    like never load on the light path (each cost milliseconds of a command that should cost little more
    than ``python -c pass``)."""
    proc = run_probe(COUNTING_PROBE, args, tmp_path)
    lines = dict(line.split("=", 1) for line in proc.stdout.splitlines() if line.startswith(("CODE=", "NEW=")))
    assert lines.get("CODE") == "0", proc.stdout + proc.stderr
    new = set(filter(None, lines["NEW"].split(",")))
    forbidden = sorted(new & set(LIGHT_PATH_FORBIDDEN))
    assert not forbidden, f"tpuctl {' '.join(args)} imported {forbidden}; all it imported: {sorted(new)}"
    assert new <= LIGHT_PATH_STDLIB, f"tpuctl {' '.join(args)} imported more: {sorted(new - LIGHT_PATH_STDLIB)}"
    assert agent.ops == [next(a for a in args if a in ANSWERS)]
    if args[0] == "env" and "json" not in args[-1]:
        assert "export QUOTED='a b'\"'\"'c'" in proc.stdout


def test_the_installed_command_imports_no_more_than_the_light_path(agent: FakeAgent, tmp_path: Path) -> None:
    """The ``tpuctl`` this environment installed (bin/ beside its python) is run as it is, without site:
    it imports nothing the light path does not (pip's wrapper for a console_scripts entry point imports
    ``re`` first, which alone costs about half of what ``tpuctl barrier`` may: pyproject.toml installs
    bin/tpuctl as a plain script instead)."""
    script = Path(sys.executable).parent / "tpuctl"
    assert script.is_file(), f"{script}: not installed (make install)"
    env = {**os.environ, "PYTHONPATH": str(Path(tpuctl.__file__).resolve().parents[1])}
    env.pop("TPUCTL_LOG_LEVEL", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-S",
            "-X",
            "importtime",
            str(script),
            "barrier",
            "step",
            "-q",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "tpuctl.cli.light" in imported, proc.stderr  # the script ran tpuctl's light path
    forbidden = sorted(imported & set(LIGHT_PATH_FORBIDDEN))
    assert not forbidden, f"{script} imported {forbidden}"
    assert agent.ops == ["barrier"]


def test_barrier_without_timeout_does_not_read_agent_json(agent: FakeAgent, tmp_path: Path) -> None:
    """agent.json lists every host (hundreds of kB on a pod): ``tpuctl barrier`` leaves the timeout to the
    agent (the spec's, announced back on the socket) and never opens it, here unreadable garbage."""
    (tmp_path / "state" / "agent.json").write_text("{not json")
    env = {**os.environ, "PYTHONPATH": str(Path(tpuctl.__file__).resolve().parents[1])}
    proc = subprocess.run(
        [sys.executable, "-S", "-c", COUNTING_PROBE, "barrier", "step", "--state-dir", str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert "CODE=0" in proc.stdout, proc.stdout + proc.stderr
    assert "barrier 'step' #1 passed (1 hosts)" in proc.stderr
    (request,) = agent.requests
    args = request["args"]
    assert isinstance(args, dict)
    asked_at = args.pop("asked_at")  # the timeout counts from when it asked (this host's clock)
    assert isinstance(asked_at, float) and 0 < time.monotonic() - asked_at < 60
    assert request == {"op": "barrier", "args": {"name": "step", "timeout": None}}


# tpuctl's own modules each plain form loads (each costs about 0.1 ms: finding, reading and unmarshalling a
# .pyc, creating its classes), and the ones the answer needs, loaded while the agent works on it.
# tpuctl.errors (ten exception classes) is of the answer too: nothing before the request raises. Nor does
# anything before it import __future__ (`from __future__ import annotations` does, about 0.15 ms).
LIGHT_PATH_TPUCTL = frozenset(
    {"tpuctl", "tpuctl.cli", "tpuctl.cli.light", "tpuctl.lightjson", "tpuctl.agent", "tpuctl.agent.control",
     "tpuctl.agent.statedir"}
)  # fmt: skip
BARRIER_ANSWER: set[str] = set()  # a well-formed answer is read in place (light._barrier_passed)
STATUS_ANSWER = {"__future__", "tpuctl.records", "tpuctl.health"}  # a healthy cluster: no error, none loaded
ENV_ANSWER = {"__future__", "tpuctl.records", "tpuctl.job", "tpuctl.job.env"}

ORDER_PROBE = """
import sys
from tpuctl.agent import control

ask, answer = control.ask, control.Request.answer

def own():
    return sorted(m for m in sys.modules if m in ("tpuctl", "__future__") or m.startswith("tpuctl."))

def asking(*args, **kwargs):
    print("ASKED=" + ",".join(own()))
    return ask(*args, **kwargs)

def answering(self, *args, **kwargs):
    print("ANSWER=" + ",".join(own()))
    return answer(self, *args, **kwargs)

control.ask, control.Request.answer = asking, answering
from tpuctl.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    print("CODE=" + str(exit.code))
print("END=" + ",".join(own()))
"""


@pytest.mark.parametrize(
    ("args", "options", "answer"),
    [
        (["barrier", "step"], set(), BARRIER_ANSWER),
        (["status"], set(), STATUS_ANSWER | {"tpuctl.messages"}),  # its text's table
        (["status", "--json"], set(), STATUS_ANSWER),
        (["status", "--format", "json"], set(), STATUS_ANSWER),
        (["env"], set(), ENV_ANSWER),
        (["-v", "env", "-o", "sh"], {"tpuctl.cli.formats", "tpuctl.loglevel"}, ENV_ANSWER),
    ],
)
def test_the_light_path_asks_first_and_loads_what_the_answer_needs_meanwhile(
    args: list[str], options: set[str], answer: set[str], agent: FakeAgent, tmp_path: Path
) -> None:
    """Counted, not timed: each plain form loads only tpuctl's few light modules before it sends its request
    (a format or log option adds the module that reads it), and what reads the answer (the barrier's record,
    status's health, env's job environment) while the agent works on it: on a pod that is the coordinator's
    round trip, about 2 ms."""
    proc = run_probe(ORDER_PROBE, args, tmp_path)
    lines = {k: set(filter(None, v.split(","))) for k, _, v in (ln.partition("=") for ln in proc.stdout.splitlines())}
    assert lines.get("CODE") == {"0"}, proc.stdout + proc.stderr
    assert lines["ASKED"] == LIGHT_PATH_TPUCTL | options
    assert lines["ANSWER"] == lines["END"] == LIGHT_PATH_TPUCTL | options | answer


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ({"name": "step", "instance": "3", "hosts": 8}, "field 'instance' is '3'; expected an integer"),
        ({"name": "step", "instance": 3, "hosts": True}, "field 'hosts' is True; expected an integer"),
        ({"instance": 3, "hosts": 8}, "field 'name' is None; expected a string"),
        (["step", 3, 8], "is not a JSON object"),
    ],
)
def test_a_barrier_answer_the_light_path_cannot_read_is_named_by_the_protocol(answer: object, message: str) -> None:
    """The light path reads a well-formed barrier answer in place; anything else goes to the protocol's
    parser, which names the field and the hint, as before."""
    from tpuctl.agent.protocol import ProtocolError
    from tpuctl.cli.light import _barrier_passed

    assert _barrier_passed({"name": "step", "instance": 3, "hosts": 8}) == ("step", 3, 8)
    with pytest.raises(ProtocolError, match=re.escape(message)) as caught:
        _barrier_passed(answer)
    assert "the agent's barrier answer" in caught.value.message and caught.value.hint


def test_the_light_paths_spellings_are_the_conventions() -> None:
    """tpuctl.cli.light spells the format and log options itself, so that a command without them loads
    neither tpuctl.cli.formats nor tpuctl.loglevel: the same names and values."""
    from tpuctl import loglevel
    from tpuctl.cli import formats, light

    assert (formats.TEXT, formats.JSON, formats.FORMAT_NAMES) == (light.TEXT, light.JSON, light.FORMAT_NAMES)
    assert (loglevel.LOG_LEVEL_ENV, loglevel.LEVELS["debug"]) == (light.LOG_LEVEL_ENV, light.DEBUG)


@pytest.mark.parametrize("args", [["progress", "1203"], ["progress", "--checkpointed", "1200"]])
def test_progress_sends_one_line_and_imports_only_cheap_modules(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tpuctl progress STEP`` in a shell job's loop: one line to the agent's progress socket, the
    script's process id and the job's generation in it, on the standard library's cheapest modules."""
    import socket

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(state / "progress.sock"))
    listener.listen(4)
    listener.settimeout(10)
    received = bytearray()

    def agent() -> None:  # answers `tpuctl progress STEP` (K): go on, no checkpoint at this step
        connection, _ = listener.accept()
        with connection:
            connection.settimeout(10)
            while chunk := connection.recv(64):
                received.extend(chunk)
                if received.startswith(b"K ") and received.endswith(b"\n"):
                    connection.sendall(b"G\n")

    answering = threading.Thread(target=agent, daemon=True)
    answering.start()
    try:
        monkeypatch.setenv("TPUCTL_GENERATION", "3")  # the job's generation, as tpuctl run sets it
        proc = run_probe(COUNTING_PROBE, args, tmp_path)
        lines = dict(line.split("=", 1) for line in proc.stdout.splitlines() if line.startswith(("CODE=", "NEW=")))
        assert lines.get("CODE") == "0", proc.stdout + proc.stderr
        assert "did not answer" not in proc.stderr, proc.stderr
        new = set(filter(None, lines["NEW"].split(",")))
        assert new <= LIGHT_PATH_STDLIB, f"tpuctl {' '.join(args)} imported more: {sorted(new - LIGHT_PATH_STDLIB)}"
        answering.join(10)
        # progress asks whether to checkpoint (K), --checkpointed only reports (C)
        kind = "C" if "--checkpointed" in args else "K"
        assert received.decode() == f"{kind} {args[-1]} 3 {os.getpid()}\n"  # the probe's parent: this test
    finally:
        listener.close()
