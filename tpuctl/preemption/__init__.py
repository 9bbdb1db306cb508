"""Preemption notices and the one checkpoint step every host agrees on, for any framework.

* :mod:`tpuctl.preemption.settings`: the spec's ``preemption:`` section as a value;
* :mod:`tpuctl.preemption.notice`: a notice (a host is going away: who, the source, the deadline it
  implies), the sources tpuctl hears, and the plain records the coordinator keeps of notices and
  agreements (``PreemptionEvent``, for the goodput ledger's timeline);
* :mod:`tpuctl.preemption.agreement`: the agreement, decided once in the coordinator: every live host
  says where its job stands, the step is the largest of those (as JAX's ``PreemptionSyncManager`` does
  with its coordination service, for any framework).

Pure: no clock is read here (every call is handed ``now``), no I/O. Imports nothing eagerly.
"""
