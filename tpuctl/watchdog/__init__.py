"""The watchdog: what the job's own progress says that heartbeats cannot (a live host whose job is stuck, a
host that drags every step).

* :mod:`tpuctl.watchdog.settings`: the spec's ``watchdog:`` section as a value;
* :mod:`tpuctl.watchdog.pace`: one host's job, as its agent sees it (steps, their times, a stall);
* :mod:`tpuctl.watchdog.judge`: the cluster's verdict, decided once in the coordinator (hang, a host
  behind, stragglers), from O(1)-sized reports per host.

Pure: no clock is read here (every call is handed ``now``), no I/O. Imports nothing eagerly.
"""
