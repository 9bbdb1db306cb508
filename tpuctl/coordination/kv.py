"""The coordination service's key-value store: bytes by key, listed by prefix in O(answer).

Pure: no grpc, no asyncio, no clock. Keys are kept sorted (``bisect``), so a prefix listing visits only
its own entries; ``version`` changes on every write, so a listing's encoded answer can be shared by every
caller until the next write.
"""

from __future__ import annotations

import bisect

from tpuctl.coordination.values import Counters, Reason, Refused, check_name, shown


class KeyValueStore:
    def __init__(self, counters: Counters) -> None:
        self._values: dict[str, bytes] = {}
        self._keys: list[str] = []
        self._counters = counters
        self.version = 0

    def set(self, key: str, value: bytes, *, allow_overwrite: bool) -> None:
        check_name("key", key)
        if key in self._values:
            if not allow_overwrite:
                raise Refused(
                    Reason.KEY_EXISTS,
                    f"key {shown(key)} already exists",
                    hint="allow overwriting if replacing it is intended",
                )
        else:
            bisect.insort(self._keys, key)
        self._values[key] = value
        self.version += 1

    def get(self, key: str) -> bytes | None:
        check_name("key", key)
        return self._values.get(key)

    def dir(self, prefix: str) -> list[tuple[str, bytes]]:
        """Every entry whose key starts with ``prefix`` (a plain string prefix), sorted by key."""
        keys = self._keys
        start = bisect.bisect_left(keys, prefix)
        end = start
        while end < len(keys) and keys[end].startswith(prefix):
            end += 1
        self._counters.touched += end - start + 1
        return [(key, self._values[key]) for key in keys[start:end]]
