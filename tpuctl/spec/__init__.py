"""The cluster spec: values, their checks, the YAML edge and detection from a TPU host's environment.

* :mod:`tpuctl.spec.model`: ``ClusterSpec`` and friends, and ``check_spec`` over a position tree (pure);
* :mod:`tpuctl.spec.checker`: the position tree (``Node``) and the ``Checker`` that collects problems (pure);
* :mod:`tpuctl.spec.meshes`: the ``meshes:`` section (pure);
* :mod:`tpuctl.spec.yamlfile`: YAML with line/column positions -> ``ClusterSpec`` (the yaml edge);
* :mod:`tpuctl.spec.detect`: which task this host is, and a spec from TPU VM / GKE variables;
* :mod:`tpuctl.spec.hostenv`: the one module that reads this host's environment and names.

Imports nothing eagerly, so the pure modules stay free of yaml.
"""
