"""The error hierarchy: every user-visible failure is a ``TpuctlError`` carrying its exit code.

Exit codes (documented in docs/reference/exit-codes.md):

== ===========================================================================
0  success
1  internal error (a bug in tpuctl: please report it with ``--debug`` output)
2  bad input: command line, cluster spec, accelerator type, topology, a TLS file that cannot work
3  cluster failure: a host failed, was rejected, or the coordinator is unreachable; a TLS certificate refused
4  deadline exceeded: registration, barrier or key-value wait timed out
5  local state: agent already running, not running, or state dir unusable
6  no TPU found by a real backend (``tensorflow``/``jax``) on this host
7  bad device mapping file (missing, truncated, wrong schema, inconsistent)
130 interrupted (Ctrl-C); ``tpuctl init`` exits 128 + N for signal N (129 SIGHUP, 143 SIGTERM)
== ===========================================================================

An error crosses a process boundary as JSON (the agent's control socket, its events to ``init``, the backend
probe's answer): :func:`error_payload` writes it, :func:`error_from_payload` reads it back as its own class.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported on the light path (``tpuctl barrier`` reads an error with these)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import TypedDict

    class ErrorPayload(TypedDict):
        """A ``TpuctlError`` as JSON: what an agent or a probe child sends in place of raising it."""

        type: str
        message: str
        hint: str | None
        exit_code: int


EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_INPUT = 2
EXIT_CLUSTER = 3
EXIT_DEADLINE = 4
EXIT_STATE = 5
EXIT_NO_TPU = 6
EXIT_MAPPING = 7
EXIT_INTERRUPTED = 130


class TpuctlError(Exception):
    """Root of every error tpuctl reports to a user.

    ``message`` says what is wrong (with the offending value); ``hint`` says what to do about it.
    """

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\nhint: {self.hint}"
        return self.message


class InputError(TpuctlError):
    """Bad user input that is not a spec file: a flag, an accelerator type, a topology."""

    exit_code = EXIT_INPUT


class TopologyError(InputError):
    """A slice the hardware cannot have (unknown type, impossible topology, host count)."""


class SpecError(InputError):
    """One or more problems in a cluster spec; ``problems`` holds every one, already formatted."""

    def __init__(self, problems: list[str], *, source: str = "cluster spec") -> None:
        self.problems = list(problems)
        count = len(self.problems)
        noun = "problem" if count == 1 else "problems"
        super().__init__(f"{source}: {count} {noun}\n" + "\n".join(self.problems))


class ClusterError(TpuctlError):
    """The cluster cannot proceed: a host failed, a call was rejected, a peer disagrees."""

    exit_code = EXIT_CLUSTER


class CoordinatorUnreachable(ClusterError):
    """No coordination service answers at the spec's address."""


class TlsRefused(ClusterError):
    """A TLS handshake with the coordinator failed for a reason waiting cannot heal: its certificate
    expired, is not valid yet, names another host, or was not signed by this host's CA
    (``coordinator_certificate``); or the coordinator refused this host's client certificate (mutual TLS)."""

    def __init__(self, message: str, *, hint: str | None = None, coordinator_certificate: bool = False) -> None:
        super().__init__(message, hint=hint)
        self.coordinator_certificate = coordinator_certificate


class GenerationOver(ClusterError):
    """The call was of a cluster generation that ended (the cluster re-forms, or the coordinator
    restarted): the caller must register into the current one."""


class StandbyError(ClusterError):
    """This host stands by (a spare, or a host of a slice the generation left out): it has no job environment
    and takes part in no barrier until a generation takes it in (exit 3, as the cluster's state)."""


class DeadlineError(TpuctlError):
    """A wait ran past its deadline (registration, barrier, key-value get)."""

    exit_code = EXIT_DEADLINE


class StateError(TpuctlError):
    """Local agent state is not what the command needs (already up, not up, unusable dir)."""

    exit_code = EXIT_STATE


class NoTpuError(TpuctlError):
    """A real-TPU backend found no TPU on this host."""

    exit_code = EXIT_NO_TPU


class MappingError(TpuctlError):
    """A device mapping file is missing, truncated, of an unknown schema, or inconsistent."""

    exit_code = EXIT_MAPPING


class InterruptError(TpuctlError):
    """A signal ended the command: exit 128 + its number (130 for SIGINT, Ctrl-C; 143 SIGTERM; 129 SIGHUP),
    as a shell reports a process the signal killed. The message starts "interrupted" and is printed
    without "error:"."""

    def __init__(self, message: str, *, signal_number: int = EXIT_INTERRUPTED - 128, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.exit_code = 128 + signal_number


def error_payload(exc: TpuctlError) -> ErrorPayload:
    """``exc`` as JSON (the agent's control socket, its events to ``init``, the backend probe's answer)."""
    return {"type": type(exc).__name__, "message": exc.message, "hint": exc.hint, "exit_code": exc.exit_code}


def error_from_payload(payload: Mapping[str, object]) -> TpuctlError:
    """The error an :func:`error_payload` describes, of its own class (a class this tpuctl does not know,
    or a ``SpecError``, whose problems do not travel: a ``TpuctlError`` with the payload's exit code)."""
    types = {
        cls.__name__: cls
        for cls in globals().values()
        if isinstance(cls, type) and issubclass(cls, TpuctlError) and cls is not SpecError
    }
    cls = types.get(str(payload.get("type")), TpuctlError)
    hint = payload.get("hint")
    exc = cls(str(payload.get("message", "agent error")), hint=None if hint is None else str(hint))
    if cls is TpuctlError or cls is InterruptError:
        code = payload.get("exit_code", EXIT_INTERNAL)
        exc.exit_code = int(code) if isinstance(code, (int, float, str)) else EXIT_INTERNAL
    return exc
