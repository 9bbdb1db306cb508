"""``tpuctl doctor``: a host's preflight (TPU devices and their holders, libtpu's lock file, hugepages,
the coordinator port, peers, clocks, the state dir).

Modules (imported where used, nothing here eagerly):

* :mod:`tpuctl.doctor.checks`: the checks, pure functions of a :class:`~tpuctl.doctor.host.Host`, and the report;
* :mod:`tpuctl.doctor.host`: the ``Host`` (the ``/dev``, ``/proc``, ``/sys`` and ``/tmp`` roots plus the network
  and clock probes, all injectable) and the scanners of those trees (who holds what open, the TPU devices);
* :mod:`tpuctl.doctor.target`: which cluster to check against (a spec, the running agent, the environment);
* :mod:`tpuctl.doctor.probes`: the real probes (bounded DNS, TCP connect, bind, the kernel's clock state).
"""
