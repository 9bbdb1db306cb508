"""Starting a host's agent: resolve what ``tpuctl init`` was asked, fork the agent, relay its progress.

``launch`` forks the agent (it keeps the spec already loaded: no second interpreter start), detaches
it into its own session with its output in the state dir's log, and relays its JSON-line events from a
pipe until it reports ready or failed, within a deadline derived from the spec. ``run_foreground``
runs it attached instead. Callable without click; ``tpuctl init`` is a thin command over it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tpuctl.agent.bringup import AgentOptions
from tpuctl.agent.control import error_from_payload
from tpuctl.agent.reporter import Reporter
from tpuctl.agent.statedir import StateDir, resolve_state_dir
from tpuctl.errors import DeadlineError, StateError, TpuctlError

# Time init waits for its background agent beyond the spec's own deadlines (process start, imports).
STARTUP_SLACK_S = 30.0
LOG_TAIL_LINES = 20


def build_options(config: str | None, task_id: int | None, output: str | None, state_dir: str | None) -> AgentOptions:
    """Resolve the spec, this host's task id, the output path and the state dir (no side effects)."""
    from tpuctl.spec import hostenv
    from tpuctl.spec.detect import resolve_task_id, spec_from_tpu_env
    from tpuctl.spec.yamlfile import load_spec

    environ = hostenv.environ()
    spec = load_spec(config) if config else spec_from_tpu_env(environ)
    task = resolve_task_id(spec, task_id=task_id, environ=environ, local_names=hostenv.local_names())
    state = resolve_state_dir(state_dir)
    return AgentOptions(
        spec=spec,
        task=task,
        state=state,
        output=Path(output or spec.output).absolute(),
        address=spec.hosts[task],
        config_path=str(Path(config).absolute()) if config else None,
    )


def refuse_if_running(state: StateDir) -> None:
    pid = state.live_pid()
    if pid is None:
        return
    try:
        info = state.read_info()
        what = f"cluster {info.cluster!r} as task {info.task}"
    except TpuctlError:
        what = "starting up"
    raise StateError(
        f"this host is already up: a tpuctl agent (pid {pid}) runs for state dir {state.path}, {what}",
        hint="`tpuctl status` shows the cluster; `tpuctl down` stops this host's agent first",
    )


def run_foreground(options: AgentOptions, reporter: Reporter) -> int:
    """``init --foreground``: run the agent in this process, logging to stderr, until it stops."""
    import asyncio

    from tpuctl.agent.bringup import Agent, configure_logging

    configure_logging(None)
    return asyncio.run(Agent(options, reporter).run())


def launch(options: AgentOptions, progress: Callable[[str], None]) -> dict[str, Any]:
    """Fork the agent (it keeps the spec already loaded here: no second interpreter start), detach it
    into its own session with its output in the state dir's log, and relay its progress until it
    reports ready or failed."""
    state = options.state
    state.ensure()
    read_fd, write_fd = os.pipe()
    log_fd = os.open(state.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the agent
        code = 1
        try:
            os.close(read_fd)
            os.setsid()
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            code = _agent_child(options, write_fd)
        finally:
            os._exit(code)
    os.close(write_fd)
    os.close(log_fd)
    deadline = time.monotonic() + _init_limit(options)
    for message in _events(read_fd, deadline):
        if message.get("event") == "progress":
            progress(str(message.get("text", "")))
        elif message.get("event") == "ready":
            return dict(message.get("summary", {}))
        elif message.get("event") == "failed":
            _reap(pid, deadline)
            raise error_from_payload(message.get("error", {}))
    if time.monotonic() >= deadline and _reap(pid, time.monotonic() + 0.1) is None:
        os.kill(pid, signal.SIGTERM)  # it leaves the cluster cleanly
        raise DeadlineError(
            f"task {options.task}: the cluster was not up within {_init_limit(options):.0f} s; stopped this host's agent",
            hint=f"its log {state.log_file} ends with:\n" + _tail(state.log_file),
        )
    exit_code = _reap(pid, deadline)
    raise StateError(
        f"task {options.task}: the tpuctl agent exited (code {exit_code}) before the cluster was up",
        hint=f"its log {state.log_file} ends with:\n" + _tail(state.log_file),
    )


def _init_limit(options: AgentOptions) -> float:
    """The longest init can take: registration, three cluster-wide waits (core IDs, creation time, the
    final barrier), a real backend's probe, and slack for process start-up."""
    from tpuctl.backends.probe import PROBE_TIMEOUT_S

    spec = options.spec
    probe = PROBE_TIMEOUT_S if spec.backend != "sim" else 0.0
    return spec.coordinator.register_timeout + 3 * spec.barrier_timeout + probe + STARTUP_SLACK_S


def _events(fd: int, deadline: float) -> Iterator[dict[str, Any]]:
    """The agent's JSON-line events until it closes the pipe or ``deadline`` passes."""
    buffer = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                yield json.loads(line)
    finally:
        os.close(fd)


def _agent_child(options: AgentOptions, write_fd: int) -> int:
    import asyncio

    from tpuctl.agent.bringup import Agent, configure_logging
    from tpuctl.agent.reporter import PipeReporter

    configure_logging(options.state.log_file)
    reporter = PipeReporter(os.fdopen(write_fd, "w"))
    try:
        return asyncio.run(Agent(options, reporter).run())
    except BaseException as exc:  # never let the child fall back into click's code
        import logging

        logging.getLogger("tpuctl.agent.bringup").exception("agent crashed: %s", exc)
        reporter.failed(StateError(f"task {options.task}: the tpuctl agent crashed: {exc!r}"))
        return 1


def _reap(pid: int, deadline: float) -> int | None:
    """The agent's exit code once it has exited (it exits right after reporting a failure)."""
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    return None


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-LOG_TAIL_LINES:]) or "(empty log)"
