"""The serving process's policy for Python's cyclic garbage collector (``Heap``, the servicer's
``freeze_heap``).

Once every host has registered, the service holds tens of long-lived objects per host (its session,
gRPC's call objects, their coroutines), and every collection of the older generations would walk them all
again, though none of them becomes garbage while the cluster stands. So they are frozen (``gc.freeze``:
moved out of the collected generations, O(1)) when registration completes, and thawed when the generation
ends or the service stops, so that what the ended sessions leave in cycles is collected again. The
youngest generation is collected every ``Heap.YOUNG`` allocations instead of 700, so the arrivals waiting
at a barrier are not walked again at every collection (docs/PERFORMANCE.md, "The collector", measures
both).

It is the process's collector: only a process that serves and little else should ask for it (``tpuctl
init``'s task 0, the scale bench), not a test process with many servers.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpuctl.coordination.state import CoordinationState


class Heap:
    """Freezes the heap while a generation stands, and raises the youngest generation's threshold while
    the service runs; does nothing unless ``enabled``."""

    YOUNG = 10_000

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.frozen = False
        self.generation = 0
        self._thresholds: tuple[int, int, int] | None = None

    def start(self) -> None:
        if self.enabled and self._thresholds is None:
            self._thresholds = gc.get_threshold()
            gc.set_threshold(max(self.YOUNG, self._thresholds[0]), *self._thresholds[1:])

    def formed(self, generation: int) -> None:
        if self.frozen and self.generation != generation:
            self.thaw()  # an earlier generation's freeze whose thaw has not come yet
        if self.enabled and not self.frozen:
            gc.collect(1)  # the young garbage of registration is not frozen with the cluster (cheap: no full pass)
            gc.freeze()
            self.frozen = True
            self.generation = generation

    def check(self, state: CoordinationState) -> None:
        """Thaw once the frozen generation is over (failed for good, or re-forming as the next one)."""
        if self.frozen and (state.failure is not None or state.generation != self.generation):
            self.thaw()

    def thaw(self) -> None:
        if self.frozen:
            gc.unfreeze()
            self.frozen = False

    def stop(self) -> None:
        self.enabled = False  # a registration during the server's grace must not freeze it again
        self.thaw()
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None
