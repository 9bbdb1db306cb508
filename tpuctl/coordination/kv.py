"""The coordination service's key-value store: bytes by key, listed by prefix in O(answer), under quotas.

Pure: no grpc, no asyncio, no clock. Keys are kept sorted (``bisect``), so a prefix listing visits only
its own entries; ``version`` changes on every write, so a listing's encoded answer can be shared by every
caller until the next write.

Quotas (``KvLimits``): every entry is charged to the task that last wrote it (its key's characters plus
its value's bytes); a write that would take its writer or the whole store past a limit is refused
``QUOTA``, naming the limit and the current use, and changes nothing. Overwriting moves the entry's
charge to the new writer.
"""

from __future__ import annotations

import bisect
from collections import Counter

from tpuctl.coordination.values import Counters, KvLimits, Reason, Refused, check_name
from tpuctl.messages import count, shown

_SERVICE = -1
"""The owner of an entry the service wrote itself (counted in the total only)."""


def _size(n: int) -> str:
    """1536 -> "1,536 bytes (1.5 KiB)"."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{count(n)} bytes ({n / scale:.1f} {unit})"
    return f"{count(n)} bytes"


class KeyValueStore:
    def __init__(self, counters: Counters, limits: KvLimits | None = None, *, version: int = 0) -> None:
        """``version``: where ``version`` starts (a new generation's store continues its predecessor's,
        so a listing cached for the old store never passes for the new one)."""
        self._values: dict[str, bytes] = {}
        self._owners: dict[str, int] = {}
        self._keys: list[str] = []
        self._counters = counters
        self.limits = limits or KvLimits()
        self._task_keys: Counter[int] = Counter()
        self._task_bytes: Counter[int] = Counter()
        self.total_keys = 0
        self.total_bytes = 0
        self.version = version

    def set(self, key: str, value: bytes, *, allow_overwrite: bool, owner: int | None = None) -> None:
        """Store ``value`` at ``key``, charged to task ``owner`` (None: the service's own write)."""
        check_name("key", key)
        limits, who = self.limits, _SERVICE if owner is None else owner
        if len(value) > limits.max_value:
            raise Refused(
                Reason.QUOTA,
                f"the value for key {shown(key)} is {_size(len(value))}; a value may be at most "
                f"{_size(limits.max_value)}",
                hint="store large data elsewhere (a shared file system, a bucket) and its location here",
            )
        old = self._values.get(key)
        if old is not None and not allow_overwrite:
            raise Refused(
                Reason.KEY_EXISTS,
                f"key {shown(key)} already exists",
                hint="allow overwriting if replacing it is intended",
            )
        size = len(key) + len(value)
        old_size = 0 if old is None else len(key) + len(old)
        old_owner = self._owners.get(key)
        # What the writer and the store would hold after the write.
        mine_keys = self._task_keys[who] + (0 if old_owner == who else 1)
        mine_bytes = self._task_bytes[who] + size - (old_size if old_owner == who else 0)
        all_keys = self.total_keys + (0 if old is not None else 1)
        all_bytes = self.total_bytes + size - old_size
        if owner is not None:
            if mine_keys > limits.task_keys:
                raise self._over(key, f"task {owner} holds {count(self._task_keys[who])} keys", "keys per task",
                                 count(limits.task_keys))  # fmt: skip
            if mine_bytes > limits.task_bytes:
                raise self._over(key, f"task {owner} holds {_size(self._task_bytes[who])}", "per task",
                                 _size(limits.task_bytes))  # fmt: skip
        if all_keys > limits.total_keys:
            raise self._over(key, f"the store holds {count(self.total_keys)} keys", "keys in all", count(limits.total_keys))
        if all_bytes > limits.total_bytes:
            raise self._over(key, f"the store holds {_size(self.total_bytes)}", "in all", _size(limits.total_bytes))
        if old is None:
            bisect.insort(self._keys, key)
        else:
            assert old_owner is not None
            self._task_keys[old_owner] -= 1
            self._task_bytes[old_owner] -= old_size
        self._values[key] = value
        self._owners[key] = who
        self._task_keys[who] += 1
        self._task_bytes[who] += size
        self.total_keys, self.total_bytes = all_keys, all_bytes
        self.version += 1

    def usage(self, owner: int) -> tuple[int, int]:
        """Keys and bytes charged to task ``owner``."""
        return self._task_keys[owner], self._task_bytes[owner]

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

    @staticmethod
    def _over(key: str, use: str, limit: str, bound: str) -> Refused:
        return Refused(
            Reason.QUOTA,
            f"key-value quota exceeded setting key {shown(key)}: {use}; the limit is {bound} {limit}",
            hint="overwrite or reuse keys instead of adding new ones; the key-value store is for small "
            "coordination data",
        )
