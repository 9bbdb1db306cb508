"""The GCE metadata server, where a Cloud TPU VM keeps its slice: the one network edge of detection.

Standard library only (``http.client``), no proxy (the metadata server is link-local; an
``http_proxy`` must not see these requests), no redirects. Every request carries
``Metadata-Flavor: Google`` and every answer must carry it back (google-auth checks the same: a
captive portal or a stray web server answering 200 is not a metadata server).

Where the server is, first answer wins:

1. ``GCE_METADATA_HOST`` (google-auth's name): ``host``, ``host:port``, ``[v6]:port``, optionally ``http://``;
2. ``GCE_METADATA_IP`` (JAX's and TensorFlow's name), same forms;
3. ``metadata.google.internal``, then ``169.254.169.254`` (port 80).

Bounded: each connection attempt waits at most ``connect_timeout`` (1 s); one client spends at most
``deadline`` (3 s) over all its requests and retries, so a machine without a metadata server gets
:class:`MetadataUnavailable` (naming every address tried and why) in about a second, never a hang.
A 5xx answer is retried (at most 3 attempts, 0.2 s apart, within the deadline); a 404 means the key is
absent (``None``). Once no server answered, later calls fail at once with the same error.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

HOST_ENV = "GCE_METADATA_HOST"
IP_ENV = "GCE_METADATA_IP"
DEFAULT_HOST = "metadata.google.internal"
DEFAULT_IP = "169.254.169.254"
ATTRIBUTES_PATH = "/computeMetadata/v1/instance/attributes/"
FLAVOR_HEADER = "Metadata-Flavor"
FLAVOR = "Google"
CONNECT_TIMEOUT_S = 1.0
DEADLINE_S = 3.0
MAX_ATTEMPTS = 3
RETRY_PAUSE_S = 0.2
MAX_BYTES = 1 << 20


class MetadataUnavailable(Exception):
    """No metadata server answered; ``tried`` names each address and what happened there."""

    def __init__(self, tried: list[str]) -> None:
        self.tried = list(tried)
        super().__init__("no metadata server answered: " + "; ".join(self.tried))


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    origin: str
    """``GCE_METADATA_HOST``, ``GCE_METADATA_IP`` or ``default``."""

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_endpoint(name: str, value: str) -> Endpoint:
    """``host``, ``host:port``, ``[v6]:port``, ``v6`` (optionally ``http://`` and a trailing ``/``).

    ValueError with ``NAME='value': what; expected ...`` when it is none of these.
    """
    expected = "expected host or host:port, e.g. 127.0.0.1:8080 or metadata.google.internal"
    text = value.strip()
    if text.startswith("http://"):
        text = text[len("http://") :]
    text = text.rstrip("/")
    if not text or "/" in text or "://" in text or any(c.isspace() for c in text):
        raise ValueError(f"{name}={value!r} is not a server address; {expected}")
    host, port_text = text, ""
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or (text[close + 1 :] and not text[close + 1 :].startswith(":")):
            raise ValueError(f"{name}={value!r} is not a server address; {expected}")
        host, port_text = text[1:close], text[close + 2 :]
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    if port_text and (not port_text.isdigit() or not 1 <= int(port_text) <= 65535):
        raise ValueError(f"{name}={value!r} has port {port_text!r}; expected a port from 1 to 65535")
    if not host:
        raise ValueError(f"{name}={value!r} has no host; {expected}")
    return Endpoint(host, int(port_text) if port_text else 80, name)


def endpoints(environ: Mapping[str, str]) -> list[Endpoint]:
    """Where to ask, in order (see the module docstring); ValueError for a malformed override."""
    found = [parse_endpoint(name, environ[name]) for name in (HOST_ENV, IP_ENV) if environ.get(name, "").strip()]
    return found or [Endpoint(DEFAULT_HOST, 80, "default"), Endpoint(DEFAULT_IP, 80, "default")]


def _reason(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, socket.gaierror):
        return "the name does not resolve"
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"no answer within {timeout:g} s"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    import http.client

    if isinstance(exc, http.client.HTTPException):
        return f"not an HTTP answer ({type(exc).__name__})"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc) or type(exc).__name__
    return str(exc) or type(exc).__name__


class MetadataClient:
    """``get(key)``: an instance attribute's text, ``None`` when absent; bounded as the module says."""

    def __init__(
        self,
        where: list[Endpoint],
        *,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        deadline: float = DEADLINE_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.endpoints = list(where)
        self.connect_timeout = connect_timeout
        self.deadline = deadline
        self._clock = clock
        self._sleep = sleep
        self._ends_at: float | None = None
        self.answered: Endpoint | None = None
        """The server that answered (later requests go there only)."""
        self._failed: MetadataUnavailable | None = None
        self.cache: dict[str, str | None] = {}

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> MetadataClient:
        """A client for the server ``environ`` names (ValueError for a malformed override)."""
        return cls(endpoints(environ))

    def describe(self) -> str:
        """``127.0.0.1:8080 from GCE_METADATA_HOST``: the server that answered, else the ones to try."""
        shown = [self.answered] if self.answered else self.endpoints
        return ", ".join(f"{e} from {e.origin}" if e.origin != "default" else str(e) for e in shown)

    def get(self, key: str) -> str | None:
        if key in self.cache:
            return self.cache[key]
        if self._failed is not None:
            raise self._failed
        if self._ends_at is None:
            self._ends_at = self._clock() + self.deadline
        tried: list[str] = []
        for endpoint in [self.answered] if self.answered else self.endpoints:
            outcome = self._ask(endpoint, key)
            if isinstance(outcome, _Failed):
                where = f"{endpoint} (from {endpoint.origin})" if endpoint.origin != "default" else str(endpoint)
                tried.append(f"{where}: {outcome.reason}")
                continue
            self.answered = endpoint
            self.cache[key] = outcome.text
            return outcome.text
        self._failed = MetadataUnavailable(tried)
        raise self._failed

    def _remaining(self) -> float:
        assert self._ends_at is not None
        return self._ends_at - self._clock()

    def _ask(self, endpoint: Endpoint, key: str) -> _Answer | _Failed:
        failure = _Failed(f"no answer within the {self.deadline:g} s deadline")
        for attempt in range(MAX_ATTEMPTS):
            if attempt:
                pause = min(RETRY_PAUSE_S, self._remaining())
                if pause <= 0:
                    break
                self._sleep(pause)
            remaining = self._remaining()
            if remaining <= 0:
                break
            outcome = self._request(endpoint, key, remaining)
            if isinstance(outcome, _Answer) or not outcome.retry:
                return outcome
            failure = outcome
        return failure

    def _request(self, endpoint: Endpoint, key: str, remaining: float) -> _Answer | _Failed:
        import http.client  # here, not at import: `tpuctl init --config FILE` never asks a metadata server

        timeout = min(self.connect_timeout, remaining)
        conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout)
        connected = False
        try:
            conn.connect()
            connected = True
            timeout = max(0.05, self._remaining())
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            conn.request("GET", ATTRIBUTES_PATH + key, headers={FLAVOR_HEADER: FLAVOR, "Connection": "close"})
            response = conn.getresponse()
            body = response.read(MAX_BYTES + 1)
        except (OSError, http.client.HTTPException) as exc:
            reason = _reason(exc, timeout)
            if connected and isinstance(exc, TimeoutError | socket.timeout):
                reason = f"connected, but no answer to {key} within {timeout:.1f} s"
            return _Failed(reason, retry=False)
        finally:
            conn.close()
        status = response.status
        if response.getheader(FLAVOR_HEADER, "") != FLAVOR:
            return _Failed(f"answered HTTP {status} without {FLAVOR_HEADER}: {FLAVOR} (not a metadata server)")
        if status == 404:
            return _Answer(None)
        if status >= 500:
            return _Failed(f"answered HTTP {status}", retry=True)
        if status != 200:
            return _Failed(f"answered HTTP {status} for {ATTRIBUTES_PATH}{key}")
        if len(body) > MAX_BYTES:
            return _Failed(f"answered more than {MAX_BYTES} bytes for {key}")
        return _Answer(body.decode("utf-8", errors="replace").strip())


@dataclass(frozen=True)
class _Answer:
    text: str | None


@dataclass(frozen=True)
class _Failed:
    reason: str
    retry: bool = False


def parse_tpu_env(text: str) -> dict[str, str]:
    """The ``tpu-env`` attribute: ``KEY: 'value'`` lines -> {KEY: value} (as JAX reads it: split at the first
    ``:``, strip spaces and one pair of quotes; lines without ``:`` are skipped; a later key wins)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        key, value = line.split(":", 1)
        key, value = key.strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if key:
            values[key] = value
    return values
