"""A cluster's generations: which one is current, how one ends, and what ended each earlier one.

Under restart policy fail (the default) the first failure is final. Under policy rejoin, a failure of a
formed generation g (no heartbeat, an error report, a disconnect) *ends* g instead, while restarts are
left: every wait of g fails at once with the failure (``ClusterFailure.rejoin``), and generation g + 1
starts forming at once. Every task registers into g + 1: a survivor with the incarnation and retry
secret (or the previous credential) it held, so nobody else can take its place; a failed task's new
process afresh. While a generation forms, a registrant that fails only becomes missing again. A
generation that has not formed ``restart.timeout`` after it started, or a failure with no restarts
left, is final, naming what ended every generation.

Everything task-scoped is per generation: a call carries its generation (``TaskRef.generation``) and one
of another generation is refused ``OLD_GENERATION`` naming both; barrier and gather counts and the
key-value store start empty in every generation. An ended generation's error stays readable by
``poll_error`` (it is public, like status), so a late watcher learns why its generation ended.

``Generations`` holds the history (at most ``restart.max_restarts`` ended generations) and words the
failures and refusals that name generations; the state machine (``state.py``) decides when a
generation ends and starts the next. Pure: no grpc, no asyncio, no clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tpuctl.coordination.values import (
    SAMPLE,
    BarrierId,
    ClusterFailure,
    Reason,
    Refused,
    RestartPolicy,
    TaskFailure,
    TaskRef,
    clip,
)


class Generations:
    """The current generation of one coordination service and the ends of the earlier ones."""

    def __init__(self, first: int, policy: RestartPolicy, *, service_incarnation: int, coordinator_task: int = 0) -> None:
        self.current = first
        """The current generation: 1, then one more after every restart."""
        self.first = first
        """The generation this service started at (above 1: task 0 restarted and a host remembered)."""
        self.policy = policy
        self.service_incarnation = service_incarnation
        self.coordinator_task = coordinator_task
        """The task whose host runs this service (a successor's, after the coordinator's host was lost)."""
        self.gave_way: tuple[int, int] | None = None
        """(the generation this service started at, the one a host remembered): the first gave way to one
        above the second before it formed."""
        self._ended: dict[int, ClusterFailure] = {}
        """What ended each earlier generation of this service (at most ``restart.max_restarts``)."""

    @property
    def restarts(self) -> int:
        """Restarts used so far (a restarted coordinator's predecessors' count too)."""
        return self.current - 1

    @property
    def any_ended(self) -> bool:
        """A generation of this service has ended (the current one is a restart)."""
        return bool(self._ended)

    def ended(self, generation: int) -> ClusterFailure | None:
        """What ended ``generation`` (None: it is the current one, or this service never had it)."""
        return self._ended.get(generation)

    def end(
        self, failures: Sequence[TaskFailure], *, shutdown: bool, final: bool = False, next: str = ""
    ) -> ClusterFailure:
        """The first failures of the formed current generation: its end, a restart (``rejoin``, recorded
        here; the caller starts the next generation) while policy rejoin has restarts left, else the
        cluster's final failure, naming what ended the earlier generations. ``final``: no restart
        whatever the policy (the watchdog's ``on_hang: fail``); ``next``: how the next generation forms, when
        it is not simply the same hosts again (``ClusterFailure.next``); with no failures, the generation
        ends to grow."""
        policy = self.policy
        rejoin = policy.rejoin and not shutdown and not final and self.restarts < policy.max_restarts
        end = ClusterFailure(
            tuple(failures[:SAMPLE]), len(failures), shutdown=shutdown, generation=self.current, rejoin=rejoin,
            earlier="" if rejoin else self.earlier(exhausted=policy.rejoin and not shutdown),
            next=next if rejoin else "",
        )  # fmt: skip
        if rejoin:
            self._ended[self.current] = end
        return end

    def also_ended(self, failures: Sequence[TaskFailure]) -> None:
        """Deaths found while the current generation formed (survivors that never re-registered) join what
        ended the generation before (its sample up to ``SAMPLE``, its count in full)."""
        last = self.current - 1
        end = self._ended.get(last)
        if end is None or not failures:
            return
        room = max(0, SAMPLE - len(end.failures))
        self._ended[last] = dataclasses.replace(
            end, failures=end.failures + tuple(failures[:room]), total=end.total + len(failures)
        )

    def earlier(self, *, exhausted: bool = False) -> str:
        """What ended the earlier generations, for a final failure (bounded: at most ``max`` restarts)."""
        parts = [
            f"generation {g} ended: {clip(str(dataclasses.replace(f, rejoin=False)), 300)}"
            for g, f in sorted(self._ended.items())
        ]
        if self.first > 1:
            before = self.first - 1
            span = "generation 1" if before == 1 else f"generations 1 to {before}"
            why = "task 0 restarted" if self.coordinator_task == 0 else f"task {self.coordinator_task} took the service over"
            parts.insert(0, f"{span} ended before this coordinator started ({why})")
        if exhausted:
            parts.append(f"no restarts left ({self.restarts} of {self.policy.max_restarts} used)")
        return clip("; ".join(parts), 2000)

    def history(self) -> tuple[str, ...]:
        """A line per ended generation, for status."""
        return tuple(f"generation {g}: {clip(str(f), 400)}" for g, f in sorted(self._ended.items()))

    def other(self, caller: TaskRef) -> Refused:
        """The refusal of a task-scoped call of a generation other than the current one."""
        ended = self._ended.get(caller.generation)
        if ended is not None:
            why = f"generation {caller.generation} ended: {clip(str(ended), 500)}"
        elif self.gave_way is not None and caller.generation == self.gave_way[0]:
            why = (
                f"generation {caller.generation} gave way to generation {self.first} before it formed: a host "
                f"remembered generation {self.gave_way[1]} (the coordinator restarted)"
            )
        elif caller.generation > self.current or caller.generation < self.first:
            why = f"this coordinator (service incarnation {self.service_incarnation}) never had generation {caller.generation}: it restarted"
        else:
            why = f"generation {caller.generation} is not one of this coordinator's"
        return Refused(
            Reason.OLD_GENERATION,
            f"task {caller.task_id}: the call is of generation {caller.generation}, the cluster is at generation "
            f"{self.current} ({why})",
            hint="this host's agent re-registers into the current generation by itself; restart the job under it",
        )

    def check_barrier(self, barrier: BarrierId) -> None:
        """Refuse the outcome of a barrier or gather of a generation other than the current one."""
        if barrier.generation != self.current:
            ended = self._ended.get(barrier.generation)
            raise Refused(
                Reason.CLUSTER_FAILED,
                f"{barrier} of generation {barrier.generation} cannot pass: "
                + (f"generation {barrier.generation} ended: {ended}" if ended else "that generation is over"),
            )

    def check_kv(self, generation: int) -> None:
        """Refuse a key-value call of a generation other than the current one (0: the current one)."""
        if generation and generation != self.current:
            raise Refused(
                Reason.OLD_GENERATION,
                f"key-value call of generation {generation}; the cluster is at generation {self.current} "
                "(every generation starts with an empty key-value store)",
                hint="restart the job under this host's agent: it is in the new generation",
            )
