"""The local control channel between one-shot commands and this host's agent.

JSON lines over the agent's unix socket, standard library only, so that ``tpuctl barrier`` in a shell
loop costs little more than starting Python (no grpc, no numpy). One request per connection::

    -> {"op": "barrier", "args": {"name": "step", "timeout": 600.0}}
    <- {"progress": "waiting at barrier 'step' for 5 s"}            (zero or more)
    <- {"ok": true, "result": {...}}                                (exactly one)
    <- {"ok": false, "error": {"type": "DeadlineError", "message": "...", "hint": "...", "exit_code": 4}}

A long operation (a barrier) first announces its own deadline, ``<- {"deadline": SECONDS}``: the caller
then waits that long plus ``DEADLINE_MARGIN_S`` (so the agent's precise answer, who is missing, comes
before the caller's own timeout), whatever it was ready to wait before. ``tpuctl barrier`` without
``--timeout`` so learns the spec's barrier timeout without reading ``agent.json`` (which lists every
host: hundreds of kB on a pod).

This module is the caller's side (``call``, or ``ask`` and then ``Request.answer``): a blocking socket with a deadline, standard library only,
and only its cheapest parts: ``_socket`` (the socket module would add about 6 ms building its enums),
:mod:`tpuctl.lightjson`, no typing or enum; :mod:`tpuctl.errors` only to raise or read an error.
The agent's side is :mod:`tpuctl.agent.controlserver` (asyncio). The operations and their answers are
typed in :mod:`tpuctl.agent.protocol`.
"""

# No `from __future__ import annotations` here: that statement imports the __future__ module, about
# 0.15 ms before the light path's request. Annotations naming what only the type checker imports are quoted.
import _socket
import time

from tpuctl import lightjson as json
from tpuctl.agent.statedir import StateDir, not_running

TYPE_CHECKING = False  # typing is not imported on the light path
if TYPE_CHECKING:
    from collections.abc import Callable

    from tpuctl.errors import StateError


class Op:
    """The operations an agent answers on its control socket: their names on the wire (plain strings, no
    enum: ``enum`` is not imported on the light path)."""

    BARRIER = "barrier"
    """Wait at a named barrier: args ``name``, ``timeout``, ``asked_at`` (the caller's ``time.monotonic()`` when
    it asked: the timeout counts from then, however late the agent reads the request); answers
    :class:`~tpuctl.agent.protocol.BarrierPassed`."""
    STATUS = "status"
    """The cluster as the coordinator sees it (a status document, as ``tpuctl status --json``)."""
    DOWN = "down"
    """Leave the cluster (args ``all``: shut every host down); answers ``{"stopping": true}``."""
    INFO = "info"
    """This agent's :class:`~tpuctl.agent.protocol.AgentInfo`."""
    WAIT_ERROR = "wait_error"
    """Long-poll (args ``timeout``) until the cluster errs or shuts down: answers :class:`~tpuctl.agent.protocol.ErrorReport`."""
    ENV = "env"
    """The job environment of this host (``JobEnv.to_message()``), computed by the agent."""

    DUMP = "dump"
    """The black box (args ``timeout``): every host's job stacks, grouped (a ``tpuctl.dump/v1`` document)."""
    PREEMPT = "preempt"
    """A preemption notice for this host (args ``source``, ``reason``, ``seconds``): the notice as the
    coordinator recorded it, and how many processes of this host's job take part (``taking_part``)."""

    GOODPUT = "goodput"
    """The goodput ledger, as the coordinator keeps it (a ``tpuctl.goodput/v1`` document)."""

    ALL = frozenset({BARRIER, STATUS, DOWN, INFO, WAIT_ERROR, ENV, DUMP, GOODPUT, PREEMPT})


DEADLINE_MARGIN_S = 10.0
"""How much longer than the deadline an operation announced the caller waits for its answer."""

MAX_LINE = 1 << 20  # one JSON line; status of a 1000-host cluster fits comfortably

if TYPE_CHECKING:
    Progress = Callable[[str], None]


def call(
    state: StateDir,
    op: str,
    args: "dict[str, object] | None" = None,
    *,
    timeout: float,
    progress: "Progress | None" = None,
) -> "dict[str, object]":
    """Send one request to the agent and return its result; raise the agent's error as ours.

    ``timeout`` bounds the whole exchange (the agent enforces its own, shorter, deadline on the
    cluster operation; this one catches an agent that stopped answering) until the agent announces the
    operation's deadline; from then on that deadline plus ``DEADLINE_MARGIN_S`` bounds it.
    """
    return ask(state, op, args, timeout=timeout).answer(progress)


def ask(state: StateDir, op: str, args: "dict[str, object] | None" = None, *, timeout: float) -> "Request":
    """Send one request to the agent and return at once: :meth:`Request.answer` reads the answer.

    :func:`call` in two halves, so a command can do its own work while the agent does the cluster's
    (``tpuctl status`` loads what it renders the answer with while the agent asks the coordinator).
    ``timeout`` counts from here.
    """
    state.check()  # never talk to a socket in a folder someone else could have prepared
    deadline = time.monotonic() + timeout
    sock = _connect(state, max(0.1, min(timeout, 5.0)))
    try:
        request = Request(state, op, sock, deadline, timeout)
        try:
            sock.sendall(json.dumps({"op": op, "args": args or {}}).encode() + b"\n")
        except ConnectionError as exc:
            raise request.closed_during(exc) from None
    except BaseException:
        sock.close()
        raise
    return request


class Request:
    """A request sent to the agent (:func:`ask`) whose answer is still to be read."""

    def __init__(self, state: StateDir, op: str, sock: _socket.socket, deadline: float, timeout: float) -> None:
        self.state, self.op = state, op
        self._sock, self._deadline, self._timeout = sock, deadline, timeout

    def answer(self, progress: "Progress | None" = None) -> "dict[str, object]":
        """The agent's result (progress lines go to ``progress``); the agent's error raised as ours.
        Closes the connection."""
        try:
            return self._read(progress)
        except ConnectionError as exc:  # reset or broken pipe: the agent died mid-call (kill -9)
            raise self.closed_during(exc) from None
        finally:
            self._sock.close()

    def closed_during(self, exc: OSError) -> "StateError":
        from tpuctl.errors import StateError

        return StateError(
            f"the tpuctl agent in {self.state.path} closed the connection during {self.op!r} ({exc.strerror or exc})",
            hint=f"it may have exited; check {self.state.log_file}",
        )

    def _read(self, progress: "Progress | None") -> "dict[str, object]":
        state, op, sock = self.state, self.op, self._sock
        deadline, timeout = self._deadline, self._timeout
        reader = _LineReader(sock)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                from tpuctl.errors import DeadlineError

                raise DeadlineError(
                    f"the tpuctl agent in {state.path} did not answer {op!r} within {timeout:.1f} s",
                    hint=f"check its log: {state.log_file}",
                )
            sock.settimeout(min(left, 1.0))
            try:
                line = reader.readline()
            except TimeoutError:
                continue
            if line is None:
                from tpuctl.errors import StateError

                raise StateError(
                    f"the tpuctl agent in {state.path} closed the connection during {op!r}",
                    hint=f"it may have exited; check {state.log_file}",
                )
            message = json.loads(line)
            if "deadline" in message:  # the operation's own deadline; a value that is not one is ignored
                announced = message["deadline"]
                if isinstance(announced, (int, float)) and not isinstance(announced, bool) and 0 <= announced < 1e7:
                    timeout = announced + DEADLINE_MARGIN_S
                    deadline = time.monotonic() + timeout
                continue
            if "progress" in message:
                if progress is not None:
                    progress(str(message["progress"]))
                continue
            if message.get("ok"):
                result = message.get("result", {})
                return result if isinstance(result, dict) else {}
            from tpuctl.errors import error_from_payload  # here: the light path loads the error types for one

            raise error_from_payload(message.get("error", {}))


CONNECT_RETRY_S = (0.002, 0.01, 0.05)
"""Pauses between tries to connect while the agent's queue of connections is full (the last repeats)."""


def _connect(state: StateDir, limit: float) -> "_socket.socket":
    """A socket connected to the agent within ``limit`` s. A full queue of connections (hundreds of local
    commands at once: a unix socket then refuses with EAGAIN) is a busy moment: tried again until
    ``limit``, then a ``DeadlineError`` saying so, never an internal error."""
    give_up = time.monotonic() + limit
    tries = 0
    while True:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.settimeout(limit)
        try:
            sock.connect(state.socket)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            raise _not_answering(state) from None
        except BlockingIOError:
            sock.close()
            if time.monotonic() >= give_up:
                from tpuctl.errors import DeadlineError

                raise DeadlineError(
                    f"the tpuctl agent in {state.path} took no new local command within {limit:.1f} s: its queue "
                    f"of connections on {state.socket} stayed full",
                    hint="too many tpuctl commands at once on this host; try again, or fewer at a time",
                ) from None
            time.sleep(CONNECT_RETRY_S[min(tries, len(CONNECT_RETRY_S) - 1)])
            tries += 1
        except BaseException:
            sock.close()
            raise


def _not_answering(state: StateDir) -> "StateError":
    from tpuctl.errors import StateError

    pid = state.live_pid()
    if pid is None:
        return not_running(state)
    return StateError(
        f"the tpuctl agent (pid {pid}) in {state.path} is not answering on {state.socket}",
        hint=f"it may still be starting, or stuck; see {state.log_file}",
    )


class _LineReader:
    def __init__(self, sock: _socket.socket) -> None:
        self._sock = sock
        self._buffer = b""

    def readline(self) -> str | None:
        while b"\n" not in self._buffer:
            chunk = self._sock.recv(65536)
            if not chunk:
                return None
            self._buffer += chunk
            if len(self._buffer) > MAX_LINE:
                from tpuctl.errors import StateError

                raise StateError("the tpuctl agent sent an oversized reply")
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()
