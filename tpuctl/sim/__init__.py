"""Simulated clusters on one machine: N real ``tpuctl init`` processes on 127.0.0.x (``tpuctl sim``).

* :mod:`tpuctl.sim.cluster`: spawn, wait for and stop the hosts of a simulated cluster.
"""
