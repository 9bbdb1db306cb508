"""Prometheus metrics: an opt-in ``/metrics`` endpoint on every host's agent (the spec's ``metrics:``).

* :mod:`tpuctl.metrics.coordinator`: the coordination service's series (task 0): aggregates and bounded
  rankings, never one series per host;
* :mod:`tpuctl.metrics.agent`: one host's own series (its agent, its job's steps);
* :mod:`tpuctl.metrics.endpoint`: the HTTP endpoint on a TCP port or a Unix socket, on the agent's event
  loop; the exposition (Prometheus text or OpenMetrics) is ``prometheus_client``'s.

``prometheus_client`` is imported only by these modules, which load only when metrics are on: never on the
light path, nor by an agent without metrics. Imports nothing eagerly. docs/reference/metrics.md lists the
series.
"""
