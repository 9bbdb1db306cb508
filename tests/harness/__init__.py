"""The one multi-process test harness: real processes with log files, deadlines and SIGTERM-then-SIGKILL.

* :mod:`harness.processes` (re-exported here; stdlib only): :class:`Processes` (start, wait, run, stop,
  logs), :func:`wait_until`, :func:`stop_pids`, :func:`alive`, :func:`state`;
* :mod:`harness.clusters`: :class:`LocalCluster` (one ``tpuctl init`` per host) and :class:`SimCluster`
  (``tpuctl sim up``, then ``tpuctl run`` jobs), both on loopback and built on :class:`Processes`.

``tests/`` is on ``sys.path`` (``pythonpath`` in pyproject's pytest options), so every test imports it as
``harness``, whatever its folder. The ``processes`` fixture (``tests/conftest.py``) gives a test its own
:class:`Processes`, and a failing test shows the logs of every harness open at the time.
"""

from .processes import TPUCTL, Finished, Proc, Processes, alive, state, stop_pids, wait_until

__all__ = ["TPUCTL", "Finished", "Proc", "Processes", "alive", "state", "stop_pids", "wait_until"]
