"""The goodput ledger: where a cluster's wall time went, from the coordinator's own timeline.

* :mod:`tpuctl.goodput.timeline`: the timeline, one bounded record per generation (when it started,
  registered, formed, first and last progressed, paused, failed and ended; the hosts whose failure
  ended it and their return; preemption notices), fed by the coordinator's events, never per step;
* :mod:`tpuctl.goodput.ledger`: the arithmetic: every instant of the wall in exactly one bucket, per
  generation and in total, and the ledger's JSON document (schema ``tpuctl.goodput/v1``);
* :mod:`tpuctl.goodput.journal`: the timeline on disk in task 0's state dir (append-only lines, bounded,
  compacted atomically), reloaded by a restarted coordinator.

The first two are pure: no clock is read (every call is handed the time, wall-clock seconds), no I/O.
Imports nothing eagerly.
"""
