"""The GCE metadata server's preemption and maintenance signals, watched for the agent: a daemon thread per
key, long-polling ``instance/preempted`` and ``instance/maintenance-event`` with ``?wait_for_change=true``.

The protocol (as :mod:`tpuctl.spec.metadata`, which detection uses, and with the same rules for where the
server is: ``GCE_METADATA_HOST``, then ``GCE_METADATA_IP``, then ``metadata.google.internal`` and
``169.254.169.254``): ``GET /computeMetadata/v1/KEY`` with ``Metadata-Flavor: Google``; the answer must
carry that header back and an ``ETag``. The next request adds ``wait_for_change=true&last_etag=ETAG&
timeout_sec=N``: the server holds it until the value changes (the ETag with it, so a change between two
polls is never missed) or N seconds pass (the same value back).

Bounded and never in the agent's way: each request waits at most N + ``READ_MARGIN_S`` seconds (a first
one ``connect_timeout``), in a thread of its own; the agent hears a value through ``on_value``, which the
thread calls (the agent hands it over to its event loop). Where no server answers the first request and
none was named, the watch is off (said once, at info). A server that answers garbage (no flavor header, no
ETag, a value that is none of the key's), hangs, fails (5xx) or disappears later is named once per kind of
trouble and asked again after a pause that doubles up to ``MAX_BACKOFF_S``; an answer again is said once.
"""

from __future__ import annotations

import http.client
import logging
import socket
import threading
from collections.abc import Callable

from tpuctl.spec.metadata import FLAVOR, FLAVOR_HEADER, Endpoint

log = logging.getLogger("tpuctl.agent.metadata")

PREFIX = "/computeMetadata/v1/"
WAIT_S = 60
"""``timeout_sec`` of a long poll: the server answers at least this often with no change."""
READ_MARGIN_S = 10.0
"""Beyond ``timeout_sec``, before a held request counts as hung."""
CONNECT_TIMEOUT_S = 1.0
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
MAX_BYTES = 1024
VALUES = {
    "instance/preempted": ("TRUE", "FALSE"),
    "instance/maintenance-event": ("NONE", "MIGRATE_ON_HOST_MAINTENANCE", "TERMINATE_ON_HOST_MAINTENANCE"),
}
"""What each key may answer (GCE's documented values); anything else is garbage, except that a
maintenance event of another upper-case name is taken as a value and logged (GCE adds kinds)."""


class KeyWatch(threading.Thread):
    """Long-polls one key on the first of ``endpoints`` that answers; ``on_value(key, value)`` with the first
    value and every change. ``explicit``: the server was named (``GCE_METADATA_HOST`` / ``_IP``): never
    turned off, only retried. ``stop()`` ends it within a poll (the thread is a daemon: a held request never
    keeps the agent from exiting)."""

    def __init__(
        self,
        key: str,
        endpoints: list[Endpoint],
        on_value: Callable[[str, str], None],
        *,
        explicit: bool,
        wait_s: int = WAIT_S,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        first_backoff: float = FIRST_BACKOFF_S,
        max_backoff: float = MAX_BACKOFF_S,
    ) -> None:
        super().__init__(name=f"tpuctl-metadata-{key.rsplit('/', 1)[-1]}", daemon=True)
        self.key = key
        self.endpoints = list(endpoints)
        self.on_value = on_value
        self.explicit = explicit
        self.wait_s = wait_s
        self.connect_timeout = connect_timeout
        self.first_backoff = first_backoff
        self.max_backoff = max_backoff
        self.stopped = threading.Event()
        self.answered: Endpoint | None = None
        """The server that answered (every later request goes there)."""
        self.off = False
        """No server answered at the start and none was named: the watch ended."""
        self.polls = 0

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        etag: str | None = None
        value: str | None = None
        said: set[str] = set()  # kinds of trouble named since the last good answer
        failures = 0
        while not self.stopped.is_set():
            outcome = self._poll(etag)
            if isinstance(outcome, str):
                if self.answered is None and not self.explicit:
                    self.off = True
                    log.info("no GCE metadata server answered (%s): preemption notices from it are off", outcome)
                    return
                kind = outcome.split(":", 1)[0]
                pause = min(self.max_backoff, self.first_backoff * 2 ** min(failures, 30))
                if kind not in said:
                    said.add(kind)
                    log.warning("GCE metadata server %s, %s: %s; asking again in %g s (and later, said once)",
                                self._where(), self.key, outcome, pause)  # fmt: skip
                failures += 1
                self.stopped.wait(pause)
                continue
            new_value, etag = outcome
            if said:
                log.info("GCE metadata server %s answers %s again", self._where(), self.key)
                said.clear()
            failures = 0
            if new_value != value:
                value = new_value
                self.on_value(self.key, new_value)

    def _where(self) -> str:
        shown = [self.answered] if self.answered else self.endpoints
        return ", ".join(f"{e} (from {e.origin})" if e.origin != "default" else str(e) for e in shown)

    def _poll(self, etag: str | None) -> tuple[str, str] | str:
        """(value, ETag), or what went wrong (``kind: details``)."""
        self.polls += 1
        path = PREFIX + self.key
        if etag is not None:
            path += f"?wait_for_change=true&last_etag={etag}&timeout_sec={self.wait_s}"
        read_timeout = self.wait_s + READ_MARGIN_S if etag is not None else self.connect_timeout + READ_MARGIN_S
        failed = "unreachable: no server"
        for endpoint in [self.answered] if self.answered else self.endpoints:
            outcome = self._get(endpoint, path, read_timeout)
            if isinstance(outcome, tuple):
                self.answered = endpoint
                return outcome
            failed = outcome
            if self.answered is None and outcome.startswith(("garbage", "failing")):
                self.answered = endpoint  # a server, if a bad one: it is the one to ask again
                return outcome
        return failed

    def _get(self, endpoint: Endpoint, path: str, read_timeout: float) -> tuple[str, str] | str:
        conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=self.connect_timeout)
        try:
            try:
                conn.connect()
            except (OSError, http.client.HTTPException) as exc:
                return f"unreachable: {_reason(exc)}"
            if conn.sock is not None:
                conn.sock.settimeout(read_timeout)
            try:
                conn.request("GET", path, headers={FLAVOR_HEADER: FLAVOR, "Connection": "close"})
                response = conn.getresponse()
                body = response.read(MAX_BYTES + 1)
            except TimeoutError:
                return f"hanging: connected, but no answer within {read_timeout:g} s"
            except (OSError, http.client.HTTPException) as exc:
                return f"garbage: not an HTTP answer ({_reason(exc)})"
        finally:
            conn.close()
        if response.status >= 500:
            return f"failing: HTTP {response.status}"
        if response.getheader(FLAVOR_HEADER, "") != FLAVOR:
            return f"garbage: HTTP {response.status} without {FLAVOR_HEADER}: {FLAVOR} (not a metadata server)"
        if response.status != 200:
            return f"garbage: HTTP {response.status} for {path.split('?')[0]}"
        etag = response.getheader("ETag", "")
        value = body.decode("ascii", errors="replace").strip()
        if len(body) > MAX_BYTES or not value or not (value.isascii() and value.replace("_", "").isalpha()
                                                       and value.isupper()):  # fmt: skip
            return f"garbage: {value[:40]!r} is not a value of {self.key}"
        if self.key == "instance/preempted" and value not in VALUES[self.key]:
            return f"garbage: {value[:40]!r} is not a value of {self.key} (expected TRUE or FALSE)"
        if not etag or len(etag) > 128 or not etag.isascii() or any(c in etag for c in "&? \r\n"):
            return f"garbage: the answer has no usable ETag ({etag[:40]!r})"
        return value, etag


def _reason(exc: BaseException) -> str:
    if isinstance(exc, socket.gaierror):
        return "the name does not resolve"
    if isinstance(exc, TimeoutError | socket.timeout):
        return "no connection in time"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return type(exc).__name__


def watch_metadata(
    on_notice: Callable[[str, str, float], None], environ: dict[str, str], *, backend: str, setting: str
) -> list[KeyWatch]:
    """Start watching both keys where a watch belongs, calling ``on_notice(source, reason, seconds)`` (in a
    watch's thread) for a value that is a notice; the watches started ([] when off). Off with the spec's
    ``preemption: {metadata: off}``, and on backend ``sim`` unless ``GCE_METADATA_HOST`` or
    ``GCE_METADATA_IP`` names a server (a simulated host is no GCE VM: its agent never asks
    169.254.169.254)."""
    from tpuctl.preemption.notice import MAINTENANCE_KEY, PREEMPTED_KEY, gce_notice
    from tpuctl.spec.metadata import HOST_ENV, IP_ENV, endpoints

    named = any(environ.get(name, "").strip() for name in (HOST_ENV, IP_ENV))
    if setting == "off" or (backend == "sim" and not named):
        return []
    try:
        where = endpoints(environ)
    except ValueError as exc:
        log.warning("preemption notices from the GCE metadata server are off: %s", exc)
        return []

    def on_value(key: str, value: str) -> None:
        notice = gce_notice(key, value)
        if notice is not None:
            on_notice(*notice)
        elif value not in ("FALSE", "NONE"):
            log.info("GCE metadata server: %s is %s (not a notice: the VM stays)", key, value)

    watches = [KeyWatch(key, where, on_value, explicit=named) for key in (PREEMPTED_KEY, MAINTENANCE_KEY)]
    for watch in watches:
        watch.start()
    return watches
