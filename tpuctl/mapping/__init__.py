"""The device mapping every host writes and every job loads.

* :mod:`tpuctl.mapping.model`: the ``DeviceMapping`` value, how ``init`` builds it, its checks (pure);
* :mod:`tpuctl.mapping.protobuf`: its protobuf form (``mapping.proto``);
* :mod:`tpuctl.mapping.file`: JSON on disk, the atomic write, the bounded read.

Jobs load it with ``tpuctl.load_mapping()`` (:mod:`tpuctl.job.api`). Imports nothing eagerly.
"""
