"""Ordered sets of task ids for the state machine, each operation O(1) or O(its answer).

Pure: no grpc, no asyncio, no clock.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator


class Missing:
    """The task ids ``0..n-1`` not seen yet, in id order: O(1) to remove one, O(k) for the first k.

    A doubly linked list over ids in two arrays (node ``i + 1`` is id ``i``; nodes 0 and ``n + 1`` are
    the ends). Ids leave (a registration, a barrier arrival); ``add`` puts one back in its place (a
    registrant that failed while its generation was still forming), in O(ids after it up to the next
    missing one); ``put_back`` puts one back first, in O(1) (a barrier arrival withdrawn): from then on
    the order is the ids put back, latest first, then the rest ascending.
    """

    __slots__ = ("_count", "_next", "_present", "_prev")

    def __init__(self, n: int) -> None:
        self._next = array("i", range(1, n + 2))
        self._prev = array("i", range(-1, n + 1))
        self._present = bytearray(b"\x01") * n
        self._count = n

    def __len__(self) -> int:
        return self._count

    def __contains__(self, task_id: object) -> bool:
        return isinstance(task_id, int) and 0 <= task_id < len(self._present) and bool(self._present[task_id])

    def discard(self, task_id: int) -> bool:
        """Remove ``task_id``; whether it was still there."""
        if not self._present[task_id]:
            return False
        self._present[task_id] = 0
        node = task_id + 1
        before, after = self._prev[node], self._next[node]
        self._next[before] = after
        self._prev[after] = before
        self._count -= 1
        return True

    def add(self, task_id: int) -> bool:
        """Put ``task_id`` back in its place; whether it was gone."""
        if self._present[task_id]:
            return False
        after = task_id + 1
        while after < len(self._present) and not self._present[after]:
            after += 1
        node, after_node = task_id + 1, after + 1  # node n + 1 is the end
        before = self._prev[after_node]
        self._next[before] = node
        self._prev[node] = before
        self._next[node] = after_node
        self._prev[after_node] = node
        self._present[task_id] = 1
        self._count += 1
        return True

    def put_back(self, task_id: int) -> bool:
        """Put ``task_id`` back first, in O(1) whatever the ids around it; whether it was gone."""
        if self._present[task_id]:
            return False
        node, after = task_id + 1, self._next[0]
        self._next[0] = node
        self._prev[node] = 0
        self._next[node] = after
        self._prev[after] = node
        self._present[task_id] = 1
        self._count += 1
        return True

    def first(self, k: int) -> list[int]:
        """The first ``k`` ids still missing (fewer if fewer are): the lowest, unless some were put back
        (``put_back``): those come first."""
        out: list[int] = []
        end = len(self._present) + 1
        node = self._next[0]
        while node != end and len(out) < k:
            out.append(node - 1)
            node = self._next[node]
        return out

    def __iter__(self) -> Iterator[int]:
        """Every id still missing, in ``first``'s order: O(missing)."""
        end = len(self._present) + 1
        node = self._next[0]
        while node != end:
            yield node - 1
            node = self._next[node]
