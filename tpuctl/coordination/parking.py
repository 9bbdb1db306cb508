"""Where the service's waiting calls sleep until the state wakes their wait key or their deadline comes."""

from __future__ import annotations

import asyncio

from tpuctl.coordination.values import Counters, WaitKey, Wakeup


class Parking:
    """Where waiting calls sleep: a bare future per parked call, grouped by wait key; a key's futures
    are resolved (and the group dropped) when the key is woken.

    No task and no ``asyncio.wait_for`` per parked call: the call's own handler task awaits its future,
    and one timer handle resolves it at its deadline. Waking N parked calls costs N ``set_result``."""

    def __init__(self, counters: Counters) -> None:
        self._slots: dict[WaitKey, set[asyncio.Future[None]]] = {}
        self._counters = counters

    async def park(self, key: WaitKey, timeout: float) -> None:
        """Sleep until ``key`` is woken or ``timeout`` seconds pass."""
        if timeout <= 0:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = set()
        slot.add(future)
        timer = loop.call_later(timeout, _resolve, future)
        try:
            await future
        finally:
            timer.cancel()
            slot.discard(future)  # O(1); a woken slot was already dropped
            if not slot and self._slots.get(key) is slot:
                del self._slots[key]

    def wake(self, wakeup: Wakeup) -> None:
        if not wakeup.everyone and not wakeup.keys:
            return
        keys = list(self._slots) if wakeup.everyone else wakeup.keys
        for key in keys:
            slot = self._slots.pop(key, None)
            if slot is None:
                continue
            self._counters.touched += 1
            for future in slot:
                if not future.done():
                    future.set_result(None)
                    self._counters.woken += 1


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
