"""The real probes ``tpuctl doctor`` runs against the network and the kernel, each bounded in time.

Standard library only. Every socket is closed before a probe returns; DNS (which has no timeout of its
own in ``getaddrinfo``) runs in a daemon thread that is abandoned, not waited for, past its bound.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import socket
import threading
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from tpuctl.agent.statedir import StateDir

OPEN, REFUSED, TIMEOUT, UNREACHABLE = "open", "refused", "timeout", "unreachable"


class ClockState(NamedTuple):
    """What the kernel says of this host's clock discipline (``adjtimex(2)`` with no changes)."""

    synchronized: bool
    max_error_us: int
    est_error_us: int


def resolve(name: str, timeout: float) -> list[str]:
    """The addresses ``name`` resolves to (IPv4 first); OSError when it does not, TimeoutError past ``timeout``."""
    result: list[object] = []

    def lookup() -> None:
        try:
            infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
            result.append(sorted({str(i[4][0]) for i in infos}, key=lambda a: (":" in a, a)))
        except (OSError, UnicodeError) as exc:
            result.append(exc)

    worker = threading.Thread(target=lookup, name=f"doctor-dns-{name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if not result:
        raise TimeoutError(f"no DNS answer within {timeout:g} s")
    answer = result[0]
    if isinstance(answer, UnicodeError):
        raise OSError(f"not a valid host name: {answer}")
    if isinstance(answer, BaseException):
        raise answer
    assert isinstance(answer, list)
    return answer


def connect(address: str, port: int, timeout: float) -> tuple[str, str]:
    """One TCP connection attempt: (``open``/``refused``/``timeout``/``unreachable``, what the OS said)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect((address, port))
        except ConnectionRefusedError:
            return REFUSED, "connection refused"
        except TimeoutError:
            return TIMEOUT, f"no answer within {timeout:g} s"
        except OSError as exc:
            return UNREACHABLE, exc.strerror or str(exc)
    return OPEN, "connected"


def bind(host: str, port: int) -> OSError | None:
    """Bind a listening socket where the coordination service would (SO_REUSEADDR, as gRPC sets it, so a
    closed listener's TIME_WAIT connections do not count); the OS's refusal, or None when the port is free."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:  # socket.gaierror is one too
        return exc
    return None


_TIME_ERROR = 5  # adjtimex's answer for "clock not synchronized"


def clock_state() -> ClockState | None:
    """``adjtimex(2)`` read-only (modes 0) on 64-bit Linux; None where it cannot be asked."""
    if ctypes.sizeof(ctypes.c_long) != 8:
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        adjtimex = libc.adjtimex
    except (OSError, AttributeError):
        return None
    buf = ctypes.create_string_buffer(256)  # struct timex is 208 bytes on 64-bit Linux; modes 0 = only read
    state = adjtimex(buf)
    if state < 0:  # EPERM in some sandboxes, ENOSYS without the syscall
        return None
    words = (ctypes.c_long * 5).from_buffer(buf)  # modes(+pad), offset, freq, maxerror, esterror
    return ClockState(synchronized=state != _TIME_ERROR, max_error_us=int(words[3]), est_error_us=int(words[4]))


def agent_answers(state: StateDir, timeout: float) -> str | None:
    """Ask the agent of ``state`` for its description over ``agent.sock``: None when it answers in time,
    else what went wrong."""
    from tpuctl.agent.control import Op, call
    from tpuctl.errors import TpuctlError

    try:
        call(state, Op.INFO, timeout=timeout)
    except TpuctlError as exc:
        return exc.message
    except OSError as exc:
        return exc.strerror or str(exc)
    return None
