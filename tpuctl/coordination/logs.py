"""Rate-limited logging of refused calls: a stranger hammering the port cannot flood the coordinator's log.

At most one line per (peer host, kind of refusal) every ``every`` seconds; the next line that gets through
says how many were left out in between. The peer is the gRPC peer without its port (a client reconnecting
from new ports is still one peer); at most ``max_peers`` peers are remembered (the oldest forgotten).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

EVERY_S = 10.0
"""Seconds between two log lines for the same peer and kind of refusal."""
MAX_PEERS = 4096


def peer_host(peer: str) -> str:
    """ "ipv4:10.0.0.3:51234" -> "ipv4:10.0.0.3"; "ipv6:[::1]:5000" -> "ipv6:[::1]"."""
    host, colon, port = peer.rpartition(":")
    return host if colon and port.isdigit() and host not in ("ipv4", "ipv6") else peer


@dataclass
class _Seen:
    last: float
    suppressed: int = 0


class RateLimitedLog:
    def __init__(
        self,
        logger: logging.Logger,
        *,
        every: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        max_peers: int = MAX_PEERS,
    ) -> None:
        self._log = logger
        self._every = every
        self._clock = clock
        self._max = max_peers
        self._seen: OrderedDict[tuple[str, str], _Seen] = OrderedDict()
        self.suppressed = 0
        """Lines left out so far, in all."""

    def log(self, level: int, peer: str, kind: str, message: str, *args: object) -> bool:
        """Log ``message % args`` unless this peer had a line of this ``kind`` in the last ``every`` s;
        whether it was logged."""
        if not self._log.isEnabledFor(level):
            return False
        key = (peer_host(peer), kind)
        now = self._clock()
        seen = self._seen.get(key)
        if seen is not None and now - seen.last < self._every:
            seen.suppressed += 1
            self.suppressed += 1
            return False
        tail = ""
        if seen is not None and seen.suppressed:
            tail = f" ({seen.suppressed:,} more like it from {key[0]} in the last {now - seen.last:.0f} s not logged)"
        self._seen[key] = _Seen(now)
        self._seen.move_to_end(key)
        while len(self._seen) > self._max:
            self._seen.popitem(last=False)
        self._log.log(level, message + "%s", *args, tail)
        return True
