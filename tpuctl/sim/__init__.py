"""Simulated clusters on one machine: N real ``tpuctl init`` processes on 127.0.0.x (``tpuctl sim``).

* :mod:`tpuctl.sim.cluster`: spawn, wait for and stop the hosts of a simulated cluster;
* :mod:`tpuctl.sim.run`: ``tpuctl sim run``, one command on every host;
* :mod:`tpuctl.sim.status`: ``tpuctl sim status``, every host's agent in one table.
"""
